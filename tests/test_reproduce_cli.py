"""tools/reproduce.py's options reach gencomm.reproduce.reproduce; bad values fail before any step runs."""
import importlib.util
from pathlib import Path

import pytest

from gencomm import reproduce

ROOT = Path(__file__).resolve().parents[1]


def _cli():
    spec = importlib.util.spec_from_file_location("reproduce_cli", ROOT / "tools" / "reproduce.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_test_scenes_option_reaches_the_main_job(tmp_path, monkeypatch):
    seen = {}

    def fake(out, data, profile, seed, seeds, **kw):
        seen.update(kw, profile=profile)
        (out / "REPORT.md").parent.mkdir(parents=True, exist_ok=True)
        (out / "REPORT.md").write_text("report")
        return out / "REPORT.md"
    monkeypatch.setattr(reproduce, "reproduce", fake)
    assert _cli().main(["--out", str(tmp_path), "--test_scenes", "0", "--no_benchmark"]) == 0
    assert seen["test_scenes"] == 0 and seen["profile"] == "default" and seen["benchmark"] is False
    assert _cli().main(["--out", str(tmp_path)]) == 0 and seen["test_scenes"] is None  # the profile's


def test_negative_test_scenes_fail_before_anything_is_written(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(reproduce, "_run", ran.append)
    with pytest.raises(ValueError, match="test_scenes must be >= 0"):
        reproduce.reproduce(tmp_path / "out", tmp_path / "data", test_scenes=-1)
    assert ran == [] and not (tmp_path / "out").exists()
