"""The main job's ``results.json`` and the seed archives' ``rows.json`` as typed records.

:class:`Results` / :class:`ResultRow` are what the pipeline (:mod:`experiments.reproduce`,
:mod:`experiments.benchmark`) produces and what every report reads; :class:`ArchivedRow` is one
main-table row of a seed archive (:mod:`experiments.seeds`), :class:`ArchivedBenchmarkRow` one
benchmark row of it (per growing alliance). Each has ``to_dict`` / ``from_dict``
and :class:`Results` ``to_json`` / ``from_json``; reading a malformed file raises
:class:`ResultsError` with one line naming the file and the field (``rows[3].method``).

An evaluation (``ResultRow.eval``, ``ego_only``, each ``dynamic`` entry) stays the dict that
:func:`opencood_ext.eval.evaluate.evaluate` writes to ``eval_<label>.json``: ``ap`` (order ->
IoU threshold text -> AP), optionally ``ap_ci``, ``bytes_per_message``, ``frames_file``,
``bootstrap``, ``num_scenes``, ``pr_curves``, ``recall_by_visibility``, ``localisation``.
Optional fields that are None are left out of the JSON, so an older file round-trips unchanged.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

TABLES = ("main", "heterogeneous")
FAMILY_POOL = "pool"  # scene_families: every test frame, beside each family


class ResultsError(ValueError):
    """A results.json / rows.json that is not what it should be; the message names file and field."""


def _check(doc: dict, where: str, name: str, types: Tuple[type, ...], required: bool, source: str):
    """``doc[name]`` when it has one of ``types`` (ints pass as floats; bool is not an int here)."""
    if name not in doc or doc[name] is None:
        if required:
            raise ResultsError(f"{source}: missing field {where}{name}")
        return None
    value = doc[name]
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if not ok and float in types and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        names = " or ".join(t.__name__ for t in types)
        raise ResultsError(f"{source}: field {where}{name} must be {names}, got {type(value).__name__}")
    return value


def _unknown(doc: dict, known, where: str, source: str) -> None:
    extra = sorted(set(doc) - set(known))
    if extra:
        raise ResultsError(f"{source}: unknown field {where}{extra[0]}")


def check_scene_families(fig, source: str = "<dict>") -> Optional[dict]:
    """``Results.scene_families`` (the figures of :mod:`experiments.report_family`) when well formed,
    else :class:`ResultsError` naming the field (``scene_families.rows[2].families.road.scenes``)."""
    if fig is None:
        return None
    w = "scene_families."
    if not isinstance(fig, dict):
        raise ResultsError(f"{source}: field scene_families must be an object")
    _unknown(fig, ("test_data", "families", "rows"), w, source)
    _check(fig, w, "test_data", (str,), True, source)
    families = _check(fig, w, "families", (dict,), True, source)
    for name in families:
        _check(families, f"{w}families.", name, (int,), True, source)
    for k, row in enumerate(_check(fig, w, "rows", (list,), True, source)):
        where = f"{w}rows[{k}]."
        if not isinstance(row, dict):
            raise ResultsError(f"{source}: field {where.rstrip('.')} must be an object")
        _unknown(row, ("method", "table", "reference", "families"), where, source)
        _check(row, where, "method", (str,), True, source)
        _check(row, where, "reference", (str,), False, source)
        if _check(row, where, "table", (str,), True, source) not in TABLES:
            raise ResultsError(f"{source}: field {where}table must be one of {', '.join(TABLES)}, got {row['table']!r}")
        for fam, entry in _check(row, where, "families", (dict,), True, source).items():
            inner = f"{where}families.{fam}"
            if fam not in families and fam != FAMILY_POOL:
                raise ResultsError(f"{source}: field {inner} is not a family of {w}families ({', '.join(families)})")
            if not isinstance(entry, dict):
                raise ResultsError(f"{source}: field {inner} must be an object")
            _unknown(entry, ("scenes", "frames", "ap", "ap_ci", "vs_reference", "vs_reference_error"), inner + ".",
                     source)
            for name, types, required in (("scenes", (int,), True), ("frames", (int,), True), ("ap", (dict,), False),
                                          ("ap_ci", (dict,), False), ("vs_reference", (dict,), False),
                                          ("vs_reference_error", (str,), False)):
                _check(entry, inner + ".", name, types, required, source)
    return fig


def _plain(obj) -> dict:
    """A dataclass as a JSON dict, optional fields that are None left out."""
    out = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if v is None:
            continue
        if isinstance(v, list):
            v = [x.to_dict() if hasattr(x, "to_dict") else x for x in v]
        out[f.name] = v
    return out


@dataclass
class ResultRow:
    """One row of a results table.

    method: the row's name ("GenComm (m3 onboarded)"); table: "main" or "heterogeneous";
    eval: its evaluation (module docstring; for a benchmark row the full alliance's);
    train_wall_s: logged training (or onboarding) seconds; trainable_params: parameters it trained;
    run: its run folder; ego_only: the same weights evaluated with the collaborators off (main table);
    dynamic: the benchmark's evaluation per growing alliance, each with ``types`` and optionally
    ``onboard_params`` / ``onboard_gflops``; trainable_params_per_type: per new type (onboarding);
    onboard_method: the onboarding method; stage1: which stage-1 runs it started from
    ("gencomm" or "full_feature"); protocol: the run's ``protocol:`` (native, reference, equalized);
    training_seed: its ``train.seed``; optimizer_steps: the optimizer steps it trained (0: nothing
    trained, as late fusion of stage-1 runs)."""

    method: str
    eval: Dict[str, Any]
    train_wall_s: float
    trainable_params: int
    note: str = ""
    table: str = "main"
    run: Optional[str] = None
    ego_only: Optional[Dict[str, Any]] = None
    dynamic: Optional[List[Dict[str, Any]]] = None
    trainable_params_per_type: Optional[Dict[str, int]] = None
    onboard_method: Optional[str] = None
    stage1: Optional[str] = None
    protocol: Optional[str] = None
    training_seed: Optional[int] = None
    optimizer_steps: Optional[int] = None

    def __post_init__(self):
        if self.table not in TABLES:
            raise ValueError(f"ResultRow {self.method!r}: table must be one of {TABLES}, got {self.table!r}")

    def to_dict(self) -> dict:
        return _plain(self)

    @classmethod
    def from_dict(cls, doc, where: str = "", source: str = "<dict>") -> "ResultRow":
        """``where``: the row's place in the file (``rows[3].``), for the error message."""
        if not isinstance(doc, dict):
            raise ResultsError(f"{source}: field {where.rstrip('.')} must be an object")
        _unknown(doc, [f.name for f in dataclasses.fields(cls)], where, source)
        table = _check(doc, where, "table", (str,), False, source) or "main"
        if table not in TABLES:
            raise ResultsError(f"{source}: field {where}table must be one of {', '.join(TABLES)}, got {table!r}")
        ev = _check(doc, where, "eval", (dict,), True, source)
        if "ap" in ev and not isinstance(ev["ap"], dict):
            raise ResultsError(f"{source}: field {where}eval.ap must be an object")
        return cls(method=_check(doc, where, "method", (str,), True, source), eval=ev,
                   train_wall_s=float(_check(doc, where, "train_wall_s", (float,), True, source)),
                   trainable_params=_check(doc, where, "trainable_params", (int,), True, source),
                   note=_check(doc, where, "note", (str,), False, source) or "", table=table,
                   run=_check(doc, where, "run", (str,), False, source),
                   ego_only=_check(doc, where, "ego_only", (dict,), False, source),
                   dynamic=_check(doc, where, "dynamic", (list,), False, source),
                   trainable_params_per_type=_check(doc, where, "trainable_params_per_type", (dict,), False, source),
                   onboard_method=_check(doc, where, "onboard_method", (str,), False, source),
                   stage1=_check(doc, where, "stage1", (str,), False, source),
                   protocol=_check(doc, where, "protocol", (str,), False, source),
                   training_seed=_check(doc, where, "training_seed", (int,), False, source),
                   optimizer_steps=_check(doc, where, "optimizer_steps", (int,), False, source))


@dataclass
class StepTime:
    """Wall time of one step of an invocation (a step a rerun finds done takes seconds)."""

    step: str
    seconds: float

    def to_dict(self) -> dict:
        return {"step": self.step, "seconds": self.seconds}


@dataclass
class Results:
    """What one invocation of the main job found (``<out>/results.json``).

    profile / seed: the profile and the data (and channel) seed; data: the dataset root; rows: every
    row of the first training seed, main table first; onboarding: the main table's GenComm
    ``onboarding.json``; stage1_wall_s: GenComm stage-1 training seconds per type; total_wall_s: this
    invocation's wall time; training_seeds; test_data: the data every table is evaluated on (None in
    older files: the dataset's own test split); commit; command: the invocation's command line;
    configs: the configs root it read; steps; from_scratch / found_finished (:func:`found_finished`);
    seed_archives: the archive folders of the spread; seed_spread: their per-row AP per seed;
    feature_cache: the folder frozen encoders' features were kept in (None: every encoding computed);
    precision: the float precision chosen by detection, {choice, reason, cpu_bf16}
    (:mod:`opencood_ext.training.precision`); scene_families: AP per scene family of the test data
    (:mod:`experiments.report_family`; None: not computed, e.g. no row has per-frame records)."""

    profile: str
    seed: int
    data: str
    rows: List[ResultRow]
    onboarding: Dict[str, Any]
    stage1_wall_s: Dict[str, float]
    total_wall_s: float
    training_seeds: Optional[List[int]] = None
    test_data: Optional[str] = None
    commit: Optional[str] = None
    command: Optional[str] = None
    configs: Optional[str] = None
    steps: List[StepTime] = field(default_factory=list)
    from_scratch: Optional[bool] = None
    found_finished: Optional[List[str]] = None
    seed_archives: List[str] = field(default_factory=list)
    seed_spread: Optional[List[Dict[str, Any]]] = None
    feature_cache: Optional[str] = None
    precision: Optional[Dict[str, Any]] = None
    scene_families: Optional[Dict[str, Any]] = None

    def main_rows(self) -> List[ResultRow]:
        return [r for r in self.rows if r.table == "main"]

    def hetero_rows(self) -> List[ResultRow]:
        return [r for r in self.rows if r.table == "heterogeneous"]

    def to_dict(self) -> dict:
        out = _plain(self)
        if not self.steps:
            out.pop("steps")
        if not self.seed_archives:
            out.pop("seed_archives")
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def write(self, path: Path) -> Path:
        """Write atomically (a reader never sees half a file)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.to_json())
        tmp.replace(path)
        return path

    @classmethod
    def from_dict(cls, doc, source: str = "<dict>") -> "Results":
        if not isinstance(doc, dict):
            raise ResultsError(f"{source}: not a results.json (expected a JSON object)")
        _unknown(doc, [f.name for f in dataclasses.fields(cls)], "", source)
        rows = _check(doc, "", "rows", (list,), True, source)
        steps = _check(doc, "", "steps", (list,), False, source) or []
        for k, st in enumerate(steps):
            if not (isinstance(st, dict) and isinstance(st.get("step"), str)
                    and isinstance(st.get("seconds"), (int, float))):
                raise ResultsError(f"{source}: field steps[{k}] must be {{step: text, seconds: number}}")
        seeds = _check(doc, "", "training_seeds", (list,), False, source)
        if seeds is not None and not all(isinstance(s, int) for s in seeds):
            raise ResultsError(f"{source}: field training_seeds must be a list of integers")
        return cls(profile=_check(doc, "", "profile", (str,), True, source),
                   seed=_check(doc, "", "seed", (int,), True, source),
                   data=_check(doc, "", "data", (str,), True, source),
                   rows=[ResultRow.from_dict(r, f"rows[{k}].", source) for k, r in enumerate(rows)],
                   onboarding=_check(doc, "", "onboarding", (dict,), True, source),
                   stage1_wall_s=_check(doc, "", "stage1_wall_s", (dict,), True, source),
                   total_wall_s=float(_check(doc, "", "total_wall_s", (float,), True, source)),
                   training_seeds=seeds, test_data=_check(doc, "", "test_data", (str,), False, source),
                   commit=_check(doc, "", "commit", (str,), False, source),
                   command=_check(doc, "", "command", (str,), False, source),
                   configs=_check(doc, "", "configs", (str,), False, source),
                   steps=[StepTime(st["step"], float(st["seconds"])) for st in steps],
                   from_scratch=_check(doc, "", "from_scratch", (bool,), False, source),
                   found_finished=_check(doc, "", "found_finished", (list,), False, source),
                   seed_archives=_check(doc, "", "seed_archives", (list,), False, source) or [],
                   seed_spread=_check(doc, "", "seed_spread", (list,), False, source),
                   feature_cache=_check(doc, "", "feature_cache", (str,), False, source),
                   precision=_check(doc, "", "precision", (dict,), False, source),
                   scene_families=check_scene_families(doc.get("scene_families"), source))

    @classmethod
    def from_json(cls, text: str, source: str = "<text>") -> "Results":
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ResultsError(f"{source}: not a results.json ({exc})") from None
        return cls.from_dict(doc, source)

    @classmethod
    def load(cls, path) -> "Results":
        """Read ``path``; a missing file raises FileNotFoundError, anything malformed ResultsError."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such results file")
        try:
            text = path.read_text()
        except UnicodeDecodeError as exc:
            raise ResultsError(f"{path}: not a text file ({exc})") from None
        return cls.from_json(text, str(path))


@dataclass
class ArchivedEval:
    """One evaluation of an archived row: global / per-frame AP, its interval, the per-frame records'
    file name inside the archive folder (``frames``), bytes per message, recall by visibility."""

    ap: Dict[str, Dict[str, float]]
    frames: str
    ap_ci: Optional[Dict[str, Any]] = None
    bytes_per_message: Optional[float] = None
    recall_by_visibility: Optional[Dict[str, Any]] = None

    def to_dict(self) -> dict:  # ap_ci etc. are written as null when absent, as archives always were
        return dataclasses.asdict(self)


    @classmethod
    def from_dict(cls, doc, where: str, source: str) -> "ArchivedEval":
        """``doc``: an object (the caller checked it); ``where``: its place in the file (``rows[2].eval.``)."""
        _unknown(doc, [f.name for f in dataclasses.fields(cls)], where, source)
        return cls(ap=_check(doc, where, "ap", (dict,), True, source),
                   frames=_check(doc, where, "frames", (str,), True, source),
                   ap_ci=_check(doc, where, "ap_ci", (dict,), False, source),
                   bytes_per_message=_check(doc, where, "bytes_per_message", (float,), False, source),
                   recall_by_visibility=_check(doc, where, "recall_by_visibility", (dict,), False, source))


# what a version-2 archive row states about its run (issue 31); absent in version-1 archives
RUN_FACTS = ("protocol", "training_seed", "optimizer_steps")


def _run_facts(doc: dict, where: str, source: str) -> dict:
    return {"protocol": _check(doc, where, "protocol", (str,), False, source),
            "training_seed": _check(doc, where, "training_seed", (int,), False, source),
            "optimizer_steps": _check(doc, where, "optimizer_steps", (int,), False, source)}


def _facts_dict(row) -> dict:
    return {k: getattr(row, k) for k in RUN_FACTS if getattr(row, k) is not None}


@dataclass
class ArchivedRow:
    """One main-table row of a seed archive (``rows.json``); ``protocol``, ``training_seed`` and
    ``optimizer_steps`` as :class:`ResultRow` states them (version 2)."""

    method: str
    eval: ArchivedEval
    ego_only: ArchivedEval
    trainable_params: Optional[int] = None
    train_wall_s: Optional[float] = None
    protocol: Optional[str] = None
    training_seed: Optional[int] = None
    optimizer_steps: Optional[int] = None

    def to_dict(self) -> dict:
        return {"method": self.method, "trainable_params": self.trainable_params, "train_wall_s": self.train_wall_s,
                **_facts_dict(self), "eval": self.eval.to_dict(), "ego_only": self.ego_only.to_dict()}

    @classmethod
    def from_dict(cls, doc, where: str, source: str) -> "ArchivedRow":
        if not isinstance(doc, dict):
            raise ResultsError(f"{source}: field {where.rstrip('.')} must be an object")
        evals = {key: ArchivedEval.from_dict(_check(doc, where, key, (dict,), True, source), f"{where}{key}.", source)
                 for key in ("eval", "ego_only")}
        return cls(method=_check(doc, where, "method", (str,), True, source), eval=evals["eval"],
                   ego_only=evals["ego_only"],
                   trainable_params=_check(doc, where, "trainable_params", (int,), False, source),
                   train_wall_s=_check(doc, where, "train_wall_s", (float,), False, source),
                   **_run_facts(doc, where, source))


@dataclass
class ArchivedAlliance:
    """One alliance's evaluation of an archived benchmark row: ``types`` (ego first, joining order)."""

    types: List[str]
    eval: ArchivedEval


def _alliances(items, where: str, source: str) -> List[ArchivedAlliance]:
    """A list of ``{"types": [...], "eval": {...}}`` at ``where`` (``benchmark[0].alliances``), non-empty."""
    if not isinstance(items, list):
        raise ResultsError(f"{source}: field {where} must be a list")
    out = []
    for k, a in enumerate(items):
        inner = f"{where}[{k}]."
        if not isinstance(a, dict):
            raise ResultsError(f"{source}: field {inner.rstrip('.')} must be an object")
        types = _check(a, inner, "types", (list,), True, source)
        if not types or not all(isinstance(t, str) for t in types):
            raise ResultsError(f"{source}: field {inner}types must be a non-empty list of type names")
        out.append(ArchivedAlliance(types, ArchivedEval.from_dict(_check(a, inner, "eval", (dict,), True, source),
                                                                  f"{inner}eval.", source)))
    if not out:
        raise ResultsError(f"{source}: field {where} is empty")
    return out


@dataclass
class ArchivedBenchmarkRow:
    """One heterogeneous-benchmark row of a seed archive (version 2): its evaluation per growing
    alliance (``alliances``, the last the full one), with what it trained and how long. ``epochs``:
    when the job scored the onboarding's kept epochs (``--score_epochs``), each epoch's alliances
    ({epoch: alliances}); ``best_epoch``: the epoch the selected weights (``alliances``) are from."""

    method: str
    alliances: List[ArchivedAlliance]
    onboard_method: Optional[str] = None
    trainable_params: Optional[int] = None
    train_wall_s: Optional[float] = None
    protocol: Optional[str] = None
    training_seed: Optional[int] = None
    optimizer_steps: Optional[int] = None
    epochs: Dict[int, List[ArchivedAlliance]] = dataclasses.field(default_factory=dict)
    best_epoch: Optional[int] = None

    def alliance(self, types: Sequence[str], epoch: Optional[int] = None) -> Optional[ArchivedAlliance]:
        """The evaluation of alliance ``types`` with the selected weights, or epoch ``epoch``'s."""
        found = self.alliances if epoch is None else self.epochs.get(epoch, [])
        return next((a for a in found if a.types == list(types)), None)

    def to_dict(self) -> dict:
        doc = {"method": self.method, "onboard_method": self.onboard_method,
               "trainable_params": self.trainable_params, "train_wall_s": self.train_wall_s, **_facts_dict(self),
               "alliances": [{"types": a.types, "eval": a.eval.to_dict()} for a in self.alliances]}
        if self.epochs:
            doc["epochs"] = {str(n): [{"types": a.types, "eval": a.eval.to_dict()} for a in found]
                             for n, found in sorted(self.epochs.items())}
        if self.best_epoch is not None:
            doc["best_epoch"] = self.best_epoch
        return doc

    @classmethod
    def from_dict(cls, doc, where: str, source: str) -> "ArchivedBenchmarkRow":
        if not isinstance(doc, dict):
            raise ResultsError(f"{source}: field {where.rstrip('.')} must be an object")
        epochs = {}
        for n, found in (_check(doc, where, "epochs", (dict,), False, source) or {}).items():
            if not n.isdigit():
                raise ResultsError(f"{source}: field {where}epochs has key {n!r}, not an epoch number")
            epochs[int(n)] = _alliances(found, f"{where}epochs.{n}", source)
        return cls(method=_check(doc, where, "method", (str,), True, source),
                   alliances=_alliances(_check(doc, where, "alliances", (list,), True, source), f"{where}alliances",
                                        source),
                   onboard_method=_check(doc, where, "onboard_method", (str,), False, source),
                   trainable_params=_check(doc, where, "trainable_params", (int,), False, source),
                   train_wall_s=_check(doc, where, "train_wall_s", (float,), False, source),
                   epochs=epochs, best_epoch=_check(doc, where, "best_epoch", (int,), False, source),
                   **_run_facts(doc, where, source))
