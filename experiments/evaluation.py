"""One evaluation, typed: the main job's rows, the seed archives and the fair benchmark all hold
:class:`Evaluation` (one alliance's, with its types: :class:`Alliance`).

An evaluation is its AP (order -> IoU threshold text -> AP, as ``eval_<label>.json`` keys it), the 95 %
scene-bootstrap intervals of those APs, the bytes one collaborator sends per message, recall by who
sees each object, and where its per-frame records are (``records``), relative to the folder that holds
it: the run folder for a row of the main job, the archive folder for a seed archive's row. What else
the evaluation wrote (the bootstrap's settings, the PR curves, the channel's counts, box precision, ...)
is kept as written in ``details``.

Each file keeps it in its own shape, read and written here only:

* ``eval_<label>.json`` (:func:`opencood_ext.eval.evaluate.evaluate`; results.json's ``eval`` and
  ``ego_only``): every key the evaluation writes; the records are ``frames_file`` (a path as the
  evaluation was given it) and ``frames`` is the number of frames. :meth:`Evaluation.from_run_json`,
  :meth:`Evaluation.to_run_json`.
* a growing-alliance entry (``eval_dynamic.json``, results.json's ``dynamic``): ``types``, the AP and
  intervals, bytes, what onboarding each new type cost; its records are the alliance's evaluation in
  the run folder (:meth:`Alliance.from_run_json`).
* a seed archive's ``rows.json``: ``ap``, ``frames`` (the records' file name in the archive),
  ``ap_ci``, ``bytes_per_message``, ``recall_by_visibility``, null when absent
  (:meth:`Evaluation.from_archive`, :meth:`Evaluation.to_archive`).
* the fair benchmark's ``results.json``: ``ap``, ``ap_ci``, ``bytes_per_message`` and ``frames``, the
  records' path relative to the combined folder (:meth:`Evaluation.to_combined`).

Values are validated by the config loader (:func:`opencood_ext.config.config_from_dict`) when a
results file is read (:mod:`experiments.results`); numbers stay as written (an int stays an int), so a
file read and written back says the same.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from opencood_ext.config import NONFINITE_OK
from opencood_ext.eval.records import FrameRecords
from opencood_ext.run_folder import RunFolder, evaluation_label

from .tables import ap_cell

Number = Union[int, float]  # a number as the file wrote it
APTable = Dict[str, Dict[str, Optional[Number]]]  # order -> IoU threshold text -> AP (None: undefined)
CITable = Dict[str, Dict[str, Optional[List[Number]]]]  # order -> threshold text -> [lo, hi] (None: undefined)
GLOBAL = "global"  # the AP order every table reads (HEAL's); "per_frame" is OpenCOOD's
_TYPED = ("ap", "ap_ci", "bytes_per_message", "recall_by_visibility")  # the keys kept as typed fields


class ResultsError(ValueError):
    """A results file that is not what it should be; the message names the file and the field."""


def field_error(source: str, key: str, msg: str) -> ResultsError:
    """The one-line error of the config loader's form: ``<file>: key 'rows.3.eval.frames': <msg>``."""
    return ResultsError(f"{source}: key '{key}': {msg}")


@dataclass
class Evaluation:
    """See the module docstring. ``records``: the per-frame records' path relative to the folder that
    holds this evaluation (None: not kept); ``details``: the other keys of ``eval_<label>.json``."""

    ap: APTable = field(metadata={NONFINITE_OK: True})
    records: Optional[str] = None
    ap_ci: Optional[CITable] = field(default=None, metadata={NONFINITE_OK: True})
    bytes_per_message: Optional[Number] = None
    recall_by_visibility: Optional[Dict[str, Dict[str, Any]]] = None
    details: Dict[str, Any] = field(default_factory=dict, metadata={NONFINITE_OK: True})

    def ap_at(self, thr: str, order: str = GLOBAL) -> Optional[float]:
        """The AP at IoU threshold ``thr`` (text: "0.5") in ``order``."""
        return self.ap[order][thr]

    def ci_at(self, thr: str, order: str = GLOBAL) -> Optional[List[float]]:
        """Its 95 % interval ``[lo, hi]``, None when not computed."""
        return ((self.ap_ci or {}).get(order) or {}).get(thr)

    def cell(self, thr: str, order: str = GLOBAL) -> str:
        """``0.646 [0.60, 0.69]``: the AP at ``thr`` with its interval (:func:`experiments.tables.ap_cell`)."""
        return ap_cell(self.ap[order][thr], self.ci_at(thr, order))

    @property
    def bootstrap(self) -> Dict[str, Any]:
        """How the intervals were drawn (``interval``, ``resamples``, ``seed``); {} when not said."""
        return self.details.get("bootstrap") or {}

    @property
    def num_scenes(self) -> Optional[int]:
        """The test scenes the intervals resample (None when not said)."""
        return self.details.get("num_scenes")

    @property
    def pr_curves(self) -> Dict[str, Any]:
        """The global-order PR curves (``curves`` per threshold, ``image``); {} when not evaluated."""
        return self.details.get("pr_curves") or {}

    @property
    def localisation(self) -> Optional[Dict[str, Any]]:
        """Box precision of the objects found (:mod:`opencood_ext.eval.localisation`); None when not evaluated."""
        return self.details.get("localisation")

    @property
    def resamples(self) -> int:
        return self.bootstrap.get("resamples", 1000)

    @property
    def seed(self) -> int:
        return self.bootstrap.get("seed", 0)

    def records_path(self, base) -> Optional[Path]:
        """Where the records are, for the folder ``base`` that holds this evaluation (None: none kept)."""
        if self.records is None:
            return None
        return Path(self.records) if base is None else Path(base) / self.records

    def has_records(self, base) -> bool:
        path = self.records_path(base)
        return path is not None and path.is_file()

    def load_records(self, base) -> FrameRecords:
        """The per-frame records (FileNotFoundError naming the file when it is missing)."""
        path = self.records_path(base)
        if path is None:
            raise FileNotFoundError("the evaluation keeps no per-frame records")
        return FrameRecords.load(path)

    # eval_<label>.json, as results.json keeps it
    @classmethod
    def run_json_fields(cls, doc: dict, run: Optional[str]) -> dict:
        """``doc`` (an ``eval_<label>.json``) as this class's fields, for the loader to validate; ``run``:
        the run folder the evaluation belongs to (``frames_file`` becomes relative to it)."""
        out = {k: doc[k] for k in _TYPED if doc.get(k) is not None}
        path = doc.get("frames_file")
        if path is not None:
            out["records"] = path if run is None or not isinstance(path, str) else os.path.relpath(path, run)
        out["details"] = {k: v for k, v in doc.items() if k not in _TYPED and k != "frames_file"}
        return out

    @classmethod
    def from_run_json(cls, doc: dict, run: Optional[str] = None) -> "Evaluation":
        """From an evaluation as :func:`~opencood_ext.eval.evaluate.evaluate` wrote it (no validation:
        the pipeline reads what this code's evaluation just wrote; files go through the loader)."""
        return cls(**cls.run_json_fields(doc, run))

    def to_run_json(self, run: Optional[str] = None) -> dict:
        """The ``eval_<label>.json`` form: every key the evaluation writes (null where it wrote null);
        ``frames_file`` the records' path with the run folder ``run`` in front, as the evaluation wrote it."""
        out = {k: getattr(self, k) for k in _TYPED}
        out.update(self.details)
        if self.records is not None:
            out["frames_file"] = self.records if run is None else os.path.normpath(os.path.join(run, self.records))
        return out

    # a seed archive's rows.json
    @classmethod
    def archive_fields(cls, doc: dict) -> dict:
        """A rows.json evaluation as this class's fields (``frames``: the records' file name)."""
        out = {k: doc[k] for k in _TYPED if doc.get(k) is not None}
        out["records"] = doc.get("frames")
        return out

    def to_archive(self) -> dict:
        """The rows.json form: every key written, null where absent, as archives always were."""
        return {"ap": self.ap, "frames": self.records, "ap_ci": self.ap_ci,
                "bytes_per_message": self.bytes_per_message, "recall_by_visibility": self.recall_by_visibility}

    # the fair benchmark's results.json
    def to_combined(self) -> dict:
        """The fair benchmark's form: ``frames`` is the records' path under the combined folder
        (``equalized/seed0/row0.npz``), read back by :meth:`archive_fields`."""
        return {"ap": self.ap, "ap_ci": self.ap_ci, "bytes_per_message": self.bytes_per_message,
                "frames": self.records}


@dataclass
class Alliance:
    """One growing alliance's evaluation: ``types`` (ego first, joining order), and, in the main job's
    results, what onboarding the last type cost (``onboard_params``, ``onboard_gflops``)."""

    types: List[str]
    eval: Evaluation
    onboard_params: Optional[int] = None
    onboard_gflops: Optional[Number] = None

    @classmethod
    def run_json_fields(cls, doc: dict, checkpoint: Optional[str] = None) -> dict:
        """An ``eval_dynamic[_<checkpoint>].json`` entry as this class's fields; the records are the
        alliance's own evaluation's in the run folder (``eval_dyn_<types>[_<checkpoint>]_frames.npz``)."""
        out = {k: doc[k] for k in ("types", "onboard_params", "onboard_gflops") if doc.get(k) is not None}
        ev = {k: v for k, v in doc.items() if k not in ("types", "onboard_params", "onboard_gflops")}
        out["eval"] = {**{k: ev[k] for k in _TYPED if ev.get(k) is not None},
                       "details": {k: v for k, v in ev.items() if k not in _TYPED}}
        types = doc.get("types")
        if isinstance(types, list) and types and all(isinstance(t, str) for t in types):
            out["eval"]["records"] = RunFolder(".").frames(evaluation_label(alliance=types, checkpoint=checkpoint)).name
        return out

    @classmethod
    def from_run_json(cls, doc: dict, checkpoint: Optional[str] = None) -> "Alliance":
        """From an entry this code's evaluation just wrote (files go through the loader)."""
        fields = cls.run_json_fields(doc, checkpoint)
        return cls(**{**fields, "eval": Evaluation(**fields["eval"])})

    def to_run_json(self) -> dict:
        """The ``eval_dynamic.json`` entry: ``types``, AP, intervals, bytes, the onboarding cost (null for
        the ego's alliance alone), then what else the entry held (frames, scenes)."""
        ev = self.eval
        out: Dict[str, Any] = {"types": self.types, "ap": ev.ap, "ap_ci": ev.ap_ci,
                               "bytes_per_message": ev.bytes_per_message}
        if ev.recall_by_visibility is not None:
            out["recall_by_visibility"] = ev.recall_by_visibility
        out.update({"onboard_params": self.onboard_params, "onboard_gflops": self.onboard_gflops, **ev.details})
        return out
