"""What a config or a command line names cannot leave its root: a run name (config ``name``)
stays inside ``--runs_root``, an evaluation ``--label`` inside its run folder; each refusal is
one line and exit status 2, before anything is written."""
import sys
from pathlib import Path

import pytest
import yaml

from tiny_runs import PP, tiny_config

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import inference  # noqa: E402
import train  # noqa: E402

BAD = ["x/../../..", "../escape", "..", "/tmp/abs", "a/b", "a\\b", ""]


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip() and " INFO " not in ln and " WARNING " not in ln]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _tree(root: Path) -> set:
    return {p.relative_to(root) for p in root.rglob("*")}


@pytest.mark.parametrize("label", BAD)
def test_inference_label_cannot_leave_the_run_folder(tmp_path, capsys, label):
    run = tmp_path / "sandbox" / "run"
    run.mkdir(parents=True)
    before = _tree(tmp_path)
    assert inference.main(["--model_dir", str(run), "--label", label]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "--label" in line and "plain name" in line
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("name", ["../escape", "/tmp/gencomm_abs_run", "a/../../b", ".."])
def test_a_run_name_cannot_leave_runs_root(tmp_path, capsys, name):
    cfg = tiny_config(tmp_path, tmp_path / "data", "ok", {"m1": PP},
                      {"fusion": "intermediate", "link": {"type": "full_feature"}})
    text = yaml.safe_load(cfg.read_text())
    text["name"] = name
    cfg.write_text(yaml.safe_dump(text))
    runs = tmp_path / "a" / "runs"
    runs.mkdir(parents=True)
    before = _tree(tmp_path)
    assert train.main(["-y", str(cfg), "--runs_root", str(runs)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"error: {cfg}: key 'name': ") and "plain name" in line
    assert _tree(tmp_path) == before
    assert not list(Path("/tmp").glob("gencomm_abs_run*"))


def test_compare_label_is_a_plain_name(tmp_path, capsys):
    from opencood_ext.cli import compare
    assert compare.main([f"{tmp_path}:../../etc/passwd"]) == 2
    assert "plain name" in _one_line(capsys.readouterr().err)


def test_plain_names_pass():
    from opencood_ext.cli.errors import check_label
    for ok in ("blank_m2", "late_noise0.2m0.2deg_seed3", "dyn_m1+m2", "sim m1 (v2)"):
        assert check_label(ok) == ok
    assert check_label(None) is None
