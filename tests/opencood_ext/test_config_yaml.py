"""A config file that is no YAML text (a control character) or no file on disk (a kernel pseudo-file
such as /proc/self/environ, regular by its mode) is refused by what it is, on one line naming the file
(the including file and its key 'base' for an include) and where in it: exit status 2, no traceback
(issue 52 item 4a)."""
import subprocess
import sys
from pathlib import Path

import pytest

from opencood_ext.config import ConfigError
from opencood_ext.experiment import load_experiment

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import train  # noqa: E402

PSEUDO = Path("/proc/self/environ")  # stat: a regular file of 0 bytes; reads the environment


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _refused(argv, capsys) -> str:
    capsys.readouterr()
    assert train.main(argv) == 2
    return _one_line(capsys.readouterr().err)


@pytest.mark.parametrize("raw,char,where", [(b"name: x\x00\n", "0x00", "line 1, column 8"),
                                            (b"name: x\ntrain:\n  epochs: 3\x07\n", "0x07", "line 3, column 12"),
                                            (b"name: x\x1b[0m\n", "0x1b", "line 1, column 8")])
def test_a_control_character_names_the_file_and_its_position(tmp_path, capsys, raw, char, where):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(raw)
    with pytest.raises(ConfigError) as err:
        load_experiment(bad)
    assert str(err.value).startswith(f"{bad}: invalid YAML: character {char} at {where}")
    line = _refused(["-y", str(bad), "--model_dir", str(tmp_path / "run")], capsys)
    assert str(bad) in line and char in line and where in line
    assert not (tmp_path / "run").exists()


def test_a_control_character_in_an_included_file_names_that_file(tmp_path, capsys):
    base = tmp_path / "base.yaml"
    base.write_bytes(b"train:\n  epochs: 2\x00\n")
    exp = tmp_path / "exp.yaml"
    exp.write_text("base: base.yaml\nname: x\n")
    line = _refused(["-y", str(exp), "--model_dir", str(tmp_path / "run")], capsys)
    assert f"{base}: invalid YAML: character 0x00 at line 2, column 12" in line


def test_a_control_character_in_a_set_value_names_the_option(tmp_path, capsys):
    exp = tmp_path / "exp.yaml"
    exp.write_text("name: x\n")
    line = _refused(["-y", str(exp), "--set", "name=a\x01b", "--model_dir", str(tmp_path / "run")], capsys)
    assert "--set 'name=a\\x01b'" in line and "character 0x01 at line 1, column 2" in line


@pytest.mark.skipif(not PSEUDO.is_file(), reason="needs Linux procfs")
def test_a_kernel_pseudo_file_is_refused_as_a_config_or_an_include(tmp_path, capsys):
    exp = tmp_path / "exp.yaml"
    exp.write_text(f"base: [{PSEUDO}]\nname: x\n")
    line = _refused(["-y", str(exp), "--model_dir", str(tmp_path / "run")], capsys)
    assert line.startswith(f"error: {exp}: key 'base': cannot include '{PSEUDO}': {PSEUDO}: not a file on disk")
    line = _refused(["-y", str(PSEUDO), "--model_dir", str(tmp_path / "run")], capsys)
    assert line.startswith(f"error: {PSEUDO}: not a file on disk: its size says 0 bytes")
    for special in ("/dev/null", str(tmp_path)):  # a device, a directory: refused before reading
        exp.write_text(f"base: [{special}]\nname: x\n")
        assert f"{exp}: key 'base': cannot include '{special}'" in _refused(
            ["-y", str(exp), "--model_dir", str(tmp_path / "run")], capsys)
    assert not (tmp_path / "run").exists()


def test_the_console_script_exits_2_with_one_line(tmp_path):
    """The issue's command as a user types it: printf 'name: x\\x00\\n' > bad.yaml; gencomm-train -y bad.yaml."""
    script = Path(sys.executable).parent / "gencomm-train"
    cmd = [str(script)] if script.is_file() else [sys.executable, str(ROOT / "tools" / "train.py")]
    (tmp_path / "bad.yaml").write_bytes(b"name: x\x00\n")
    proc = subprocess.run(cmd + ["-y", "bad.yaml"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2
    assert _one_line(proc.stderr) == ("error: bad.yaml: invalid YAML: character 0x00 at line 1, column 8 is not "
                                      "allowed in YAML (no control characters but tab and line breaks)")
