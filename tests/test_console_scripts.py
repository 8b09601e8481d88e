"""Every command is a console script of setup.py, with one flag style and one way to fail.

* each ``CONSOLE_SCRIPTS`` entry point imports and is callable (no wheel needed: read from setup.py);
* every long option of every command's argparse parser (sub-commands and benchmarks included) uses
  underscores, OpenCOOD's style (``--model_dir``): the parsers are captured, nothing runs;
* each command's ``main`` given a config / run folder / file that does not exist returns 2 and
  prints exactly one line on stderr.
"""
import argparse
import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def console_scripts():
    """{script: "module:function"} from setup.py's CONSOLE_SCRIPTS."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    entries = next(ast.literal_eval(node.value) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                   and any(getattr(t, "id", None) == "CONSOLE_SCRIPTS" for t in node.targets))
    return dict(tuple(part.strip() for part in e.split("=", 1)) for e in entries)


def entry_point(target: str):
    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)


SCRIPTS = console_scripts()
COMMANDS = {"train", "infer", "onboard", "sim", "demo", "compare", "robustness", "import-config",
            "import-weights", "inspect-data", "reproduce", "seed-report", "fair-benchmark", "curves", "bench"}


def test_every_command_is_a_console_script_that_imports():
    assert set(SCRIPTS) == {f"gencomm-{c}" for c in COMMANDS}, sorted(SCRIPTS)
    for script, target in SCRIPTS.items():
        assert callable(entry_point(target)), script


class _Captured(Exception):
    pass


def captured_parsers(func, argv, monkeypatch):
    """The argparse parsers ``func(argv)`` builds, captured at its first parse (nothing runs after)."""
    seen = []

    def capture(self, args=None, namespace=None):
        seen.append(self)
        raise _Captured

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", capture)
    with pytest.raises(_Captured):
        func(argv)
    monkeypatch.undo()
    return seen


def long_options(parser: argparse.ArgumentParser):
    """(parser prog, option) for every long option of ``parser`` and its sub-command parsers."""
    for action in parser._actions:
        for opt in action.option_strings:
            if opt.startswith("--"):
                yield parser.prog, opt
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from long_options(sub)


def test_long_options_use_underscores_not_hyphens(monkeypatch):
    from experiments.bench.cli import BENCHMARKS
    parsers = []
    for script, target in SCRIPTS.items():
        parsers += captured_parsers(entry_point(target), ["--help"], monkeypatch)
    for module, _ in BENCHMARKS.values():  # each benchmark parses the rest of gencomm-bench's argv
        parsers += captured_parsers(importlib.import_module(module).main, ["--help"], monkeypatch)
    options = [o for p in parsers for o in long_options(p)]
    assert len(parsers) >= len(SCRIPTS) + len(BENCHMARKS) and len(options) > 100
    hyphenated = sorted({(prog, opt) for prog, opt in options if "-" in opt[2:]})
    assert not hyphenated, hyphenated


def _missing_input_argv(tmp_path: Path):
    """Per command: arguments naming a config, run folder or file that does not exist."""
    gone = tmp_path / "does_not_exist"
    return {
        "train": ["-y", str(gone / "exp.yaml")],
        "infer": ["--model_dir", str(gone)],
        "onboard": ["--ego", str(gone / "m1"), "--new", str(gone / "m3"), "-o", str(tmp_path / "out")],
        "sim": ["-o", str(tmp_path / "sim"), "--agent_types", str(gone / "rig.yaml")],
        "demo": ["live", "--backend", "builtin", "--model_dir", str(gone)],
        "compare": [str(gone / "a"), str(gone / "b")],
        "robustness": ["--runs", f"a={gone}", "-o", str(tmp_path / "rob")],
        "import-config": [str(gone / "hypes.yaml")],
        "import-weights": [str(gone / "net_epoch1.pth"), "--config", str(gone / "exp.yaml"),
                           "-o", str(tmp_path / "imported")],
        "inspect-data": [str(gone), "--format", "opv2v", "--split", "train"],
        "reproduce": ["--quick", "--configs", str(gone), "--out", str(tmp_path / "res"),
                      "--data", str(tmp_path / "data")],
        "seed-report": ["report", str(gone)],
        "fair-benchmark": [str(gone / "seed0"), "-o", str(tmp_path / "fair")],
        "curves": ["report", str(gone)],
        "bench": ["warp", "--model_dir", str(gone)],
    }


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_missing_input_is_exit_2_and_one_line(command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    status = entry_point(SCRIPTS[f"gencomm-{command}"])(_missing_input_argv(tmp_path)[command])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip() and " INFO " not in ln and " WARNING " not in ln]
    assert status == 2, (status, err)
    assert len(lines) == 1 and "Traceback" not in err and "does_not_exist" in lines[0], err
