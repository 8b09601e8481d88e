"""Does a model's cooperative path carry a collaborator's vehicles? One table row per evaluated run.

    python tools/formation.py RUN [RUN ...]                                  # print the table
    python tools/formation.py --update archive/stage1_formation/README.md    # rewrite its tables
    python tools/formation.py --check archive/stage1_formation/README.md     # exit 1 when one is stale

Issue 49 asks how often GenComm's stage 1 (and the onboarded alliance built on it) learns to carry
the vehicles only a collaborator sees, over training seeds and thread counts. Each row reads one run
folder (a ``gencomm-train`` or ``gencomm-onboard`` folder scored by ``gencomm-infer``, or its
archived copy):

* ``config.yaml``: ``train.seed``, ``data.modality`` (which agents) and
  ``model.link.generation_weight`` (``-`` for a link without one);
* ``train_log.jsonl``: the optimizer steps and the thread counts its epochs recorded;
* ``model.link.type``: a GenComm link's trained run is a ``stage 1`` row, a full-feature one a
  ``full feature`` row (intermediate fusion's model, for comparison);
* ``onboarding.json`` when present: the row is an onboarding of its ``new_types``;
* ``eval_intermediate.json``: AP@0.3/0.5/0.7 (global order) with their 95 % scene-bootstrap
  intervals, and ``recall_by_visibility.collaborators_only``: of the test objects that only a
  collaborator sees, how many the run found (recall x objects, rounded).

Below the table one line counts the runs whose path formed (at least one collaborator-only object
found). In a README, a table between ``<!-- formation: RUN RUN ... -->`` and ``<!-- /formation -->``
(run folders relative to the README's folder) is generated: ``--update`` rewrites every such block
from the folders, ``--check`` says which is stale. A missing file or field is an error naming it.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import yaml

from .curves import THRESHOLDS, _collab, epoch_records
from .tables import ap_cell, table

# model.link.type -> the row's kind for a trained (not onboarded) run; a config without one is GenComm's
LINK_KINDS = {"gencomm": "stage 1", "full_feature": "full feature"}
BLOCK = re.compile(r"(<!-- formation:(?P<runs>[^>]*?)-->\n)(?P<body>.*?)(<!-- /formation -->)", re.S)
HEADER = ("run", "kind", "agents", "seed", "threads", "steps", "generation weight",
          "collaborator-only found (recall)", "AP@0.3", "AP@0.5", "AP@0.7")


class FormationError(ValueError):
    """A run folder or README that cannot be read; the message names the file and the field."""


@dataclass(frozen=True)
class FormationRow:
    """One evaluated run. found / total: collaborator-only test objects found / present (total None:
    the evaluation does not define them); threads: the distinct counts its epochs recorded."""

    name: str
    kind: str
    agents: str
    seed: int
    threads: Tuple[int, ...]
    steps: int
    generation_weight: Optional[float]
    found: Optional[int]
    total: Optional[int]
    ap: Tuple[Optional[float], ...]
    ci: Tuple[Optional[List[float]], ...]

    @property
    def formed(self) -> bool:
        return bool(self.found)

    def cells(self) -> List[str]:
        collab = "-" if self.total is None else f"{self.found} of {self.total} ({self.found / self.total:.3f})"
        weight = "-" if self.generation_weight is None else f"{self.generation_weight:g}"
        threads = ", ".join(map(str, self.threads)) or "not recorded"
        return [self.name, self.kind, self.agents, str(self.seed), threads, str(self.steps), weight, collab,
                *(ap_cell(a, c) for a, c in zip(self.ap, self.ci))]


def _load_json(path: Path) -> dict:
    if not path.is_file():
        raise FormationError(f"{path}: no such file")
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise FormationError(f"{path}: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise FormationError(f"{path}: expected a JSON object")
    return doc


def _field(doc: dict, path: Sequence[str], source: Path, default=KeyError):
    """``doc[path[0]][path[1]]...``; a missing key raises (naming the file and the field) unless a
    ``default`` is given."""
    node = doc
    for part in path:
        if not isinstance(node, dict) or part not in node:
            if default is KeyError:
                raise FormationError(f"{source}: no field '{'.'.join(path)}'")
            return default
        node = node[part]
    return node


def read_row(run: Path, name: Optional[str] = None) -> FormationRow:
    """The row of run folder ``run`` (see the module docstring); ``name`` defaults to the folder's."""
    from opencood_ext.run_folder import RunFolder, evaluation_label
    run = Path(run)
    folder = RunFolder(run)
    cfg_path = folder.config
    if not cfg_path.is_file():
        raise FormationError(f"{cfg_path}: no such file")
    try:
        cfg = yaml.safe_load(cfg_path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise FormationError(f"{cfg_path}: not YAML ({str(exc).splitlines()[0]})") from None
    seed = int(_field(cfg, ("train", "seed"), cfg_path))
    agents = str(_field(cfg, ("data", "modality"), cfg_path))
    weight = _field(cfg, ("model", "link", "generation_weight"), cfg_path, default=None)
    try:
        records = epoch_records(run)
    except ValueError as exc:
        raise FormationError(str(exc)) from None
    if not records:
        raise FormationError(f"{folder.train_log}: no epoch record (the run trained nothing yet)")
    threads = tuple(sorted({int(r["threads"]) for r in records if r.get("threads") is not None}))
    steps = sum(int(r.get("steps", 0)) for r in records)
    link = str(_field(cfg, ("model", "link", "type"), cfg_path, default="gencomm"))
    kind = LINK_KINDS.get(link, link)
    if folder.onboarding_report.is_file():
        onboarding = _load_json(folder.onboarding_report)
        kind = "onboarded " + ", ".join(_field(onboarding, ("new_types",), folder.onboarding_report))
    eval_path = folder.evaluation(evaluation_label("intermediate"))
    ev = _load_json(eval_path)
    ap = tuple(_field(ev, ("ap", "global", t), eval_path) for t in THRESHOLDS)
    ci = tuple(_field(ev, ("ap_ci", "global", t), eval_path, default=None) for t in THRESHOLDS)
    found, total = _collab(ev.get("recall_by_visibility")) or (None, None)
    return FormationRow(name or run.name, kind, agents, seed, threads, steps,
                        None if weight is None else float(weight), found, total, ap, ci)


def summary(rows: Sequence[FormationRow]) -> str:
    """One line: in how many of the runs the path formed, and the range of objects found."""
    scored = [r for r in rows if r.total is not None]
    if not scored:
        return "No run here defines collaborator-only objects."
    formed = sum(r.formed for r in scored)
    found = sorted(r.found for r in scored)
    span = str(found[0]) if found[0] == found[-1] else f"{found[0]}-{found[-1]}"
    return (f"The cooperative path formed (at least one collaborator-only object found) in {formed} of "
            f"{len(scored)} runs; found {span}.")


def render(rows: Sequence[FormationRow], links: bool = False) -> List[str]:
    """The markdown table and its summary line; ``links``: each run's name links to its folder."""
    body = []
    for r in rows:
        cells = r.cells()
        if links:
            cells[0] = f"[{r.name}]({r.name})"
        body.append(cells)
    return [*table(HEADER, body), "", summary(rows)]


def _block_rows(readme: Path, spec: str) -> List[FormationRow]:
    names = spec.split()
    if not names:
        raise FormationError(f"{readme}: a '<!-- formation: -->' block names no run folder")
    return [read_row(readme.parent / n, n) for n in names]


def update(readme: Path, check: bool = False) -> List[str]:
    """Rewrite (or, ``check``, only compare) every generated block of ``readme``; returns the run lists
    of the blocks that were (or would be) changed."""
    readme = Path(readme)
    if not readme.is_file():
        raise FormationError(f"{readme}: no such file")
    text = readme.read_text()
    stale: List[str] = []

    def fill(m: re.Match) -> str:
        body = "\n".join(render(_block_rows(readme, m.group("runs")), links=True)) + "\n"
        if body != m.group("body"):
            stale.append(m.group("runs").strip())
        return m.group(1) + body + m.group(4)

    new = BLOCK.sub(fill, text)
    if not BLOCK.search(text):
        raise FormationError(f"{readme}: no '<!-- formation: RUN ... -->' block")
    if not check and new != text:
        readme.write_text(new)
    return stale


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="formation", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*", type=Path, help="evaluated run folders (one row each)")
    ap.add_argument("--update", type=Path, metavar="README", help="rewrite the README's generated tables")
    ap.add_argument("--check", type=Path, metavar="README", help="exit 1 when a generated table is stale")
    args = ap.parse_args(argv)
    try:
        if args.update or args.check:
            stale = update(args.update or args.check, check=args.check is not None)
            for runs in stale:
                print(f"{'stale' if args.check else 'updated'}: formation table of {runs}")
            return 1 if (args.check and stale) else 0
        if not args.runs:
            ap.error("name run folders, or --update / --check a README")
        print("\n".join(render([read_row(r) for r in args.runs])))
    except FormationError as exc:
        print(f"formation: {exc}", file=sys.stderr)
        return 2
    return 0
