"""Every file name of a run folder is built by opencood_ext/run_folder.py alone (issue 33): an AST scan
of the project's Python sources for string literals that are such a name (docstrings are prose and
are not scanned; a message that mentions a name in a sentence is not a name)."""
import ast
import re
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("opencood_ext", "gencomm", "experiments", "tools")
OWNER = "opencood_ext/run_folder.py"
NAMES = {"config.yaml", "checkpoints", "best.pth", "latest.pth", "last.pth", "imported.pth", "onboarding.json",
         "import_report.json", "train_log.jsonl", ".writer.lock", "tb", "eval_dynamic.json"}
REPORT_FILES = {"pr_curves.png"}  # results/pr_curves.png: the main job's report figure, in no run folder
PATTERN = re.compile(r"^/?(eval_\S*|pr_(\S*\.png)?|epoch_(\S*\.pth)?|net_epoch\S*)$|\S*(\.inputs\.json|_frames\.npz)$")
# Files allowed, for now, to build run-folder names themselves (each with the reason); empty: every
# module goes through opencood_ext.run_folder.RunFolder.
PENDING: set = set()


def _docstrings(tree: ast.AST) -> set:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def is_name(text: str) -> bool:
    """Whether a literal (or a literal piece of an f-string) is a run-folder file name."""
    text = text.strip()
    return text not in REPORT_FILES and (text.lstrip("/") in NAMES or bool(PATTERN.match(text)))


def literal_sites(source: str) -> List[str]:
    """``line: text`` of every run-folder file-name literal in ``source``."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip \
                and is_name(node.value):
            hits.append(f"{node.lineno}: {node.value!r}")
    return sorted(set(hits), key=lambda h: int(h.split(":")[0]))


def scan() -> Dict[str, List[str]]:
    out = {}
    for top in SCANNED:
        for f in sorted((ROOT / top).rglob("*.py")):
            rel = f.relative_to(ROOT).as_posix()
            if rel == OWNER:
                continue
            sites = literal_sites(f.read_text())
            if sites:
                out[rel] = sites
    return out


def test_the_scanner_finds_names_and_skips_prose():
    src = '''"""Writes config.yaml and eval_<label>.json."""
def f(run, label):
    """checkpoints/best.pth"""
    a = run / "config.yaml"
    b = run / f"eval_{label}.json"
    c = run / "checkpoints" / "best.pth"
    d = f"{run}/eval_dynamic.json"
    e = run / f"{label}.inputs.json"
    g = {"pr_curves": 1, "x": pr_envelope, "eval.max_frames=3": 2}
    raise ValueError(f"{run}: no config.yaml; is this a run folder?")
'''
    sites = literal_sites(src)
    assert [s.split(":")[0] for s in sites] == ["4", "5", "6", "6", "7", "8"]
    assert not any("no config.yaml" in s for s in sites)


def test_no_run_folder_name_outside_the_run_folder_module():
    found = {f: sites for f, sites in scan().items() if f not in PENDING}
    assert not found, "build these names with opencood_ext.run_folder.RunFolder: " + "; ".join(
        f"{f} {', '.join(s)}" for f, s in found.items())


def test_pending_files_still_need_it():
    """A file that no longer builds a name leaves PENDING (files moved away are ignored here)."""
    sites = scan()
    done = sorted(f for f in PENDING if (ROOT / f).is_file() and f not in sites)
    assert not done, f"remove from PENDING: {done}"
