"""The main job's ``results.json`` as typed records: :class:`Results` holds every :class:`ResultRow`
(one row type for the main table and the heterogeneous benchmark, and for the seed archives'
rows: :mod:`experiments.archives`), each evaluation an :class:`~experiments.evaluation.Evaluation`.

Reading a file validates it with the config loader (:func:`opencood_ext.config.config_from_dict`, the
one that checks experiment configs): a malformed file raises :class:`ResultsError` with one line
naming the file and the key (``results.json: key 'rows.3.trainable_params': expected an integer,
got 1.5``). Optional fields that are None are left out of the JSON, so an older file reads back as it
was; a row of a file that predates ``method_id`` gets it from
:func:`~experiments.method_ids.legacy_method_id` and is written back without it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Sequence

from opencood_ext.config import NONFINITE_OK, ConfigError, config_from_dict

from .evaluation import Alliance, Evaluation, Number, ResultsError, field_error
from .family_figures import FamilyFigures, mark_derived
from .method_ids import legacy_method_id

__all__ = ["ResultRow", "Results", "ResultsError", "StepTime", "TABLES"]

TABLES = ("main", "heterogeneous")
Table = Literal["main", "heterogeneous"]
RUN_FACTS = ("protocol", "training_seed", "optimizer_steps")  # what a row states about its run (issue 31)


@dataclass
class ResultRow:
    """One row of a results table.

    method_id: what the row is (:mod:`experiments.method_ids`), ``method`` its display name ("GenComm (m3
    onboarded)"); table: "main" or "heterogeneous"; eval: its evaluation (a benchmark row's: the full
    alliance's); train_wall_s: logged training (or onboarding) seconds; trainable_params: parameters it
    trained; run: its run folder; ego_only: the same weights evaluated with the collaborators off (main
    table); alliances: the benchmark's evaluation per growing alliance (results.json's ``dynamic``);
    trainable_params_per_type: per new type (onboarding); onboard_method: the onboarding method; stage1:
    which stage-1 runs it started from ("gencomm" or "full_feature"); protocol: the run's ``protocol:``;
    training_seed: its ``train.seed``; optimizer_steps: the optimizer steps it trained (0: nothing
    trained, as late fusion of stage-1 runs). A seed archive's benchmark row also has ``epochs`` (each
    scored onboarding epoch's alliances) and ``best_epoch`` (the epoch the selected weights are from)."""

    method_id: str
    method: str
    eval: Evaluation
    train_wall_s: Optional[Number] = None
    trainable_params: Optional[int] = None
    note: str = ""
    table: Table = "main"
    run: Optional[str] = None
    ego_only: Optional[Evaluation] = None
    alliances: Optional[List[Alliance]] = None
    trainable_params_per_type: Optional[Dict[str, int]] = None
    onboard_method: Optional[str] = None
    stage1: Optional[str] = None
    protocol: Optional[str] = None
    training_seed: Optional[int] = None
    optimizer_steps: Optional[int] = None
    epochs: Dict[int, List[Alliance]] = field(default_factory=dict)
    best_epoch: Optional[int] = None
    # the id came from legacy_method_id (the file did not state it), so it is not written back
    id_derived: bool = field(default=False, init=False, compare=False, repr=False)

    def __post_init__(self):
        if self.table not in TABLES:
            raise ValueError(f"ResultRow {self.method!r}: table must be one of {TABLES}, got {self.table!r}")
        if not self.method_id:
            raise ValueError(f"ResultRow {self.method!r}: method_id is empty")

    @property
    def facts(self) -> Dict[str, Any]:
        """The run facts the row states (protocol, training seed, optimizer steps), None ones left out."""
        return {k: getattr(self, k) for k in RUN_FACTS if getattr(self, k) is not None}

    def alliance(self, types: Sequence[str], epoch: Optional[int] = None) -> Optional[Alliance]:
        """The evaluation of alliance ``types`` with the selected weights, or epoch ``epoch``'s."""
        found = (self.alliances or []) if epoch is None else self.epochs.get(epoch, [])
        return next((a for a in found if a.types == list(types)), None)

    @classmethod
    def from_dict(cls, doc, source: str = "<dict>") -> "ResultRow":
        """One row as results.json keeps it, validated as :meth:`Results.from_dict` validates each."""
        row = validated(cls, row_fields(doc, "row", source), source)
        mark_derived_ids([row], [doc])
        return row

    def _id(self) -> Dict[str, str]:
        return {} if self.id_derived else {"method_id": self.method_id}

    def to_dict(self) -> dict:
        """The results.json form (None fields left out; the alliances as ``dynamic``)."""
        out: Dict[str, Any] = {**self._id(), "method": self.method, "eval": self.eval.to_run_json(self.run)}
        for name in ("train_wall_s", "trainable_params", "note", "table", "run"):
            out[name] = getattr(self, name)
        if self.ego_only is not None:
            out["ego_only"] = self.ego_only.to_run_json(self.run)
        if self.alliances is not None:
            out["dynamic"] = [a.to_run_json() for a in self.alliances]
        for name in ("trainable_params_per_type", "onboard_method", "stage1", *RUN_FACTS):
            out[name] = getattr(self, name)
        return {k: v for k, v in out.items() if v is not None}

    def to_archive(self) -> dict:
        """The seed archive's rows.json form (:mod:`experiments.archives`)."""
        head = {**self._id(), "method": self.method}
        if self.table == "main":
            return {**head, "trainable_params": self.trainable_params, "train_wall_s": self.train_wall_s,
                    **self.facts, "eval": self.eval.to_archive(), "ego_only": self.ego_only.to_archive()}
        doc = {**head, "onboard_method": self.onboard_method, "trainable_params": self.trainable_params,
               "train_wall_s": self.train_wall_s, **self.facts,
               "alliances": [{"types": a.types, "eval": a.eval.to_archive()} for a in self.alliances or []]}
        if self.epochs:
            doc["epochs"] = {str(n): [{"types": a.types, "eval": a.eval.to_archive()} for a in found]
                             for n, found in sorted(self.epochs.items())}
        if self.best_epoch is not None:
            doc["best_epoch"] = self.best_epoch
        return doc

    def to_combined(self) -> dict:
        """The fair benchmark's results.json form (:mod:`experiments.fair_results`; the records' paths are
        relative to the combined folder)."""
        head = {**self._id(), "method": self.method, "table": self.table, **{k: getattr(self, k) for k in RUN_FACTS},
                "trainable_params": self.trainable_params, "train_wall_s": self.train_wall_s}
        if self.table == "main":
            return {**head, "eval": self.eval.to_combined(), "ego_only": self.ego_only.to_combined()}
        return {**head, "onboard_method": self.onboard_method, "eval": self.alliances[-1].eval.to_combined(),
                "alliances": [{"types": a.types, **a.eval.to_combined()} for a in self.alliances]}


@dataclass
class StepTime:
    """Wall time of one step of an invocation (a step a rerun finds done takes seconds)."""

    step: str
    seconds: Number

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
    (:mod:`experiments.family_figures`; None: not computed, e.g. no row has per-frame records); lanes: how
    the trainings and onboardings shared the machine, {lanes, threads} (:mod:`experiments.lanes`; None in older files)."""

    profile: str
    seed: int
    data: str
    rows: List[ResultRow]
    onboarding: Dict[str, Any]
    stage1_wall_s: Dict[str, Number]
    total_wall_s: Number
    training_seeds: Optional[List[int]] = None
    test_data: Optional[str] = None
    commit: Optional[str] = None
    command: Optional[str] = None
    configs: Optional[str] = None
    steps: List[StepTime] = field(default_factory=list)
    from_scratch: Optional[bool] = None
    found_finished: Optional[List[str]] = None
    seed_archives: List[str] = field(default_factory=list)
    seed_spread: Optional[List[Dict[str, Any]]] = field(default=None, metadata={NONFINITE_OK: True})
    feature_cache: Optional[str] = None
    precision: Optional[Dict[str, Any]] = None
    scene_families: Optional[FamilyFigures] = None
    lanes: Optional[Dict[str, int]] = None

    def main_rows(self) -> List[ResultRow]:
        return [r for r in self.rows if r.table == "main"]

    def hetero_rows(self) -> List[ResultRow]:
        return [r for r in self.rows if r.table == "heterogeneous"]

    def to_dict(self) -> dict:
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None or (f.name in ("steps", "seed_archives") and not v):
                continue
            if f.name in ("rows", "steps"):
                v = [x.to_dict() for x in v]
            elif f.name == "scene_families":
                v = v.to_dict()
            out[f.name] = v
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
        shaped = dict(doc)
        if isinstance(doc.get("rows"), list):
            shaped["rows"] = [row_fields(r, f"rows.{k}", source) for k, r in enumerate(doc["rows"])]
        if isinstance(doc.get("scene_families"), dict):
            shaped["scene_families"] = FamilyFigures.fields_of(doc["scene_families"], source)
        results = validated(cls, shaped, source)
        mark_derived_ids(results.rows, doc["rows"])
        mark_derived(results.scene_families, doc.get("scene_families"))
        return results

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


def validated(schema, shaped: dict, source: str):
    """``shaped`` built into ``schema`` by the config loader; its errors become :class:`ResultsError`."""
    try:
        return config_from_dict(schema, shaped, {(): source})
    except ConfigError as exc:
        raise ResultsError(str(exc)) from None


def with_method_id(doc: dict, key: str, source: str, table: str) -> dict:
    """``doc`` with its ``method_id``, from :func:`legacy_method_id` when the file does not state it."""
    out = dict(doc)
    if "method_id" not in doc and isinstance(doc.get("method"), str):
        found = legacy_method_id(doc["method"], table, doc.get("onboard_method"))
        if found is None:
            raise field_error(source, f"{key}.method_id", f"missing, and the row's method {doc['method']!r} "
                              "is none this code ever named; state the row's method_id")
        out["method_id"] = found
    return out


def mark_derived_ids(rows: Sequence, docs: Optional[Sequence]) -> None:
    """Rows whose file did not state ``method_id`` are marked, so that writing them back leaves it out."""
    for row, doc in zip(rows, docs or []):
        row.id_derived = "method_id" not in doc


def row_fields(doc, key: str, source: str) -> dict:
    """A results.json row as :class:`ResultRow`'s fields (``dynamic`` -> alliances, each evaluation's
    ``frames_file`` relative to the row's run folder); left as it is when not an object (the loader says so)."""
    if not isinstance(doc, dict):
        return doc
    for name in ("epochs", "alliances", "best_epoch", "id_derived"):
        if name in doc:
            raise field_error(source, f"{key}.{name}", "unknown key for a results.json row")
    table = doc.get("table", "main")
    out = with_method_id(doc, key, source, table if isinstance(table, str) else "main")
    run = doc.get("run") if isinstance(doc.get("run"), str) else None
    for name in ("eval", "ego_only"):
        if isinstance(doc.get(name), dict):
            _check_path(doc[name], "frames_file", f"{key}.{name}", source)
            out[name] = Evaluation.run_json_fields(doc[name], run)
    if "dynamic" in doc:
        entries = out.pop("dynamic")
        out["alliances"] = [Alliance.run_json_fields(e) if isinstance(e, dict) else e for e in entries] \
            if isinstance(entries, list) else entries
    return out


def _check_path(doc: dict, name: str, key: str, source: str) -> None:
    if doc.get(name) is not None and not isinstance(doc[name], str):
        raise field_error(source, f"{key}.{name}", f"expected a string, got {doc[name]!r}")
