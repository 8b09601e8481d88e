"""A run folder's file names, its evaluation labels, and the one rule that says whether an
evaluation already in it still counts.

Layout of a run folder (every name is built here and nowhere else)::

    config.yaml                       the resolved experiment config (tools/train.py, onboarding)
    checkpoints/epoch_<n>.pth         after epoch n          (CheckpointPaths; training/runfolder.py
    checkpoints/latest.pth            newest state            says in which order they are written)
    checkpoints/best.pth              best validation score (training/selection.py)
    checkpoints/imported.pth          weights imported from another code base
    train_log.jsonl  tb/  .writer.lock  training's log, tensorboard scalars, the one-writer lock
    onboarding.json                   what a stage-2 onboarding trained and what it cost
    import_report.json                which reference weights tools/import_weights.py mapped
    eval_<label>.json / .yaml         one evaluation (eval/evaluate.py)
    eval_<label>_frames.npz           its per-frame records (eval/bootstrap.py)
    eval_<label>.inputs.json          its stamp (:class:`EvaluationStamp`)
    pr_<label>.png  bev/<label>_<i>.png  its precision-recall curves and BEV images
    eval_dynamic.json                 the growing-alliance table (eval/dynamic.py)
    eval_dynamic_<ckpt>.json          the same of named weights (--checkpoint epoch_2: eval_dynamic_epoch_2.json,
                                      its alliances eval_dyn_m1+m2_epoch_2.json)

A reference (OpenCOOD / HEAL) run folder holds ``config.yaml`` and ``net_epoch*.pth`` instead.

The reuse rule: an evaluation counts when ``eval_<label>.json`` exists and its stamp records the
same command, the same code (sha256 over the Python sources of the installed packages) and the same
inputs (path, size and modification time of every file of the run's config and weights and of the
test data). Anything else -- an edited source file, another command, a retrained checkpoint, another
``data.root`` -- evaluates again. The main job, the benchmark and the robustness sweep use it alike.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

if TYPE_CHECKING:  # annotations only: the run folder stays importable without torch
    from .comm.channel import ChannelConfig

FUSION_ALIASES = {"no": "none"}  # OpenCOOD's spelling of the none method (``--fusion_method no``)
CODE_PACKAGES = ("opencood_ext", "gencomm", "experiments")  # whose sources the code digest covers
DYNAMIC = "dynamic"  # the label of the growing-alliance table, eval_dynamic.json
_REFERENCE_WEIGHTS = re.compile(r"net_epoch(_bestval_at)?(\d+)\.pth\Z")
CHECKPOINT_NAMES = "best, last or epoch_N"  # what CheckpointPaths.named takes (gencomm-infer --checkpoint)
_CHECKPOINT_NAME = re.compile(r"(best|last|epoch_([1-9]\d*))\Z")
_DYNAMIC_OF = re.compile(r"eval_" + DYNAMIC + r"_(best|last|epoch_[1-9]\d*)\.json\Z")


def check_checkpoint_name(which: str) -> str:
    """``which`` if it names a checkpoint of a run (:meth:`CheckpointPaths.named`), else ValueError."""
    if not isinstance(which, str) or not _CHECKPOINT_NAME.match(which):
        raise ValueError(f"--checkpoint must be {CHECKPOINT_NAMES} (N >= 1), got {which!r}")
    return which


def epoch_checkpoint(n: int) -> str:
    """The ``--checkpoint`` name of epoch ``n``'s weights ("epoch_3")."""
    return check_checkpoint_name(f"epoch_{int(n)}")


def epoch_of_checkpoint(which: str) -> Optional[int]:
    """The epoch a checkpoint name holds ("epoch_3" -> 3); None for "best" and "last"."""
    m = _CHECKPOINT_NAME.match(check_checkpoint_name(which))
    return int(m.group(2)) if m.group(2) else None


class CheckpointPaths:
    """The checkpoint file names of one run folder (``<run>/checkpoints/``)."""

    def __init__(self, run_dir: str | os.PathLike):
        self.dir = Path(run_dir) / "checkpoints"

    def epoch(self, n: int) -> Path:
        return self.dir / f"epoch_{n}.pth"

    @property
    def latest(self) -> Path:
        return self.dir / "latest.pth"

    @property
    def best(self) -> Path:
        return self.dir / "best.pth"

    @property
    def imported(self) -> Path:
        """Weights imported from another code base (tools/import_weights.py): where a fresh run in
        this folder starts from; training never writes or removes it (see training/runfolder.py)."""
        return self.dir / "imported.pth"

    def for_evaluation(self) -> Path:
        """The weights a run is evaluated with: ``best.pth`` when validation ran, else ``latest.pth``, else
        ``imported.pth`` (an imported folder whose fine-tuning has not written a checkpoint yet)."""
        for path in (self.best, self.latest, self.imported):
            if path.exists():
                return path
        raise FileNotFoundError(f"{self.dir.parent}: no checkpoints/best.pth or checkpoints/latest.pth "
                                f"(was it trained?)")

    def named(self, which: str) -> Path:
        """The weights ``which`` names (:data:`CHECKPOINT_NAMES`): ``best`` = best.pth (the epoch
        validation selected), ``last`` = latest.pth (the last epoch of a finished run; the newest state
        of an interrupted one), ``epoch_N`` = epoch_N.pth. FileNotFoundError naming the run when absent."""
        path = {"best": self.best, "last": self.latest}.get(check_checkpoint_name(which))
        if path is None:
            path = self.epoch(int(which[len("epoch_"):]))
        if not path.is_file():
            kept = ", ".join(f"epoch_{n}" for n in self.epoch_files()) or "none"
            why = {"best": " (no validation ran)", "last": " (not trained)"}.get(
                which, f" (epoch files kept: {kept}; train.keep_epoch_checkpoints prunes older ones)")
            raise FileNotFoundError(f"{self.dir.parent}: --checkpoint {which}: no checkpoints/{path.name}{why}")
        return path

    def epoch_files(self) -> Dict[int, Path]:
        """Existing ``epoch_{n}.pth`` files by n."""
        out = {}
        for p in self.dir.glob("epoch_*.pth"):
            stem = p.stem[len("epoch_"):]
            if stem.isdigit():
                out[int(stem)] = p
        return dict(sorted(out.items()))

    def prune_epochs(self, keep: int) -> None:
        """Delete all but the newest ``keep`` epoch files."""
        files = self.epoch_files()
        for n in list(files)[:-keep] if keep > 0 else list(files):
            files[n].unlink(missing_ok=True)


def evaluation_label(fusion: Optional[str] = None, channel: Optional["ChannelConfig"] = None,
                     latency_frames: int = 0, wire_dtype: Optional[str] = None, *,
                     alliance: Optional[Sequence[str]] = None, split_suffix: str = "",
                     checkpoint: Optional[str] = None) -> str:
    """The ``<label>`` of ``eval_<label>.json``, the one place labels are built.

    A plain evaluation: the fusion method ("no" read as "none"), plus what differs from the plain
    evaluation (pose noise, loss, latency, wire dtype, and the channel seed when any of them is set),
    e.g. ``late_noise0.2m0.2deg_seed1``. ``alliance`` (ego type first): the growing-alliance step
    ``dyn_m1+m2`` instead (fusion and channel do not enter it; a checkpoint does: ``dyn_m1+m2_epoch_2``).
    ``split_suffix``: another split than the run's own evaluation split (``_validate``), which the JSON
    does not record. ``checkpoint``: a named checkpoint (:meth:`CheckpointPaths.named`) instead of the run's
    evaluation weights, appended (``intermediate_epoch_3``, ``intermediate_last``)."""
    if alliance is not None:
        if not alliance:
            raise ValueError("an alliance has at least the ego's type")
        named = "_" + check_checkpoint_name(checkpoint) if checkpoint is not None else ""
        return "dyn_" + "+".join(alliance) + named + split_suffix
    if not fusion:
        raise ValueError("evaluation_label needs the fusion method or an alliance")
    parts = [FUSION_ALIASES.get(fusion, fusion)]
    if channel is not None and (channel.pose_noise_m or channel.pose_noise_deg):
        parts.append(f"noise{channel.pose_noise_m:g}m{channel.pose_noise_deg:g}deg")
    if channel is not None and channel.drop:
        parts.append(f"drop{channel.drop:g}")
    if latency_frames:
        parts.append(f"latency{latency_frames}")
    if wire_dtype:
        parts.append(wire_dtype)
    if len(parts) > 1 and channel is not None and channel.seed:
        parts.append(f"seed{channel.seed}")
    if checkpoint is not None:
        parts.append(check_checkpoint_name(checkpoint))
    return "_".join(parts) + split_suffix


def dynamic_label(checkpoint: Optional[str] = None) -> str:
    """The label of a growing-alliance table: ``dynamic`` (the run's evaluation weights), or with a named
    checkpoint ``dynamic_epoch_2`` / ``dynamic_last`` / ``dynamic_best``, so scoring other weights never
    overwrites the default table."""
    return DYNAMIC if checkpoint is None else f"{DYNAMIC}_{check_checkpoint_name(checkpoint)}"


# ---------------------------------------------------------------------------------------- the reuse rule
def package_sources(packages: Sequence[str] = CODE_PACKAGES) -> List[Tuple[str, Path]]:
    """``(name relative to the package's parent, path)`` of every ``.py`` of the importable ``packages``,
    located through the import system (an installed wheel or a checkout alike); a package that is not
    importable is left out. Nothing is imported (:func:`importlib.util.find_spec` of a top-level name
    does not run it)."""
    out = []
    for name in packages:
        spec = importlib.util.find_spec(name)
        for top in (spec.submodule_search_locations or []) if spec is not None else []:
            top = Path(top)
            out += [(str(f.relative_to(top.parent)), f) for f in top.rglob("*.py")]
    return sorted(out)


@functools.lru_cache(maxsize=None)
def code_digest(packages: Tuple[str, ...] = CODE_PACKAGES) -> str:
    """sha256 over the names and bytes of :func:`package_sources`: any edit of the code an evaluation
    runs makes its stamp stale; docs, tests and configs (the run's own config is an input) do not.
    Computed once per process, when first asked: the code this process runs (an edit while it runs
    is the next process's code)."""
    h = hashlib.sha256()
    for rel, f in package_sources(packages):
        h.update(f"{rel}\0".encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def files_digest(paths: Iterable[Path]) -> Tuple[str, int]:
    """(sha256 over path, size and mtime of every file under ``paths``, number of files); a missing
    path counts as an entry of its own, so its later appearance changes the digest."""
    h, n = hashlib.sha256(), 0
    for top in paths:
        top = Path(top)
        files = sorted(f for f in top.rglob("*") if f.is_file()) if top.is_dir() else \
            ([top] if top.is_file() else [])
        if not files:
            h.update(f"missing {top}\n".encode())
        for f in files:
            st = f.stat()
            h.update(f"{f}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
            n += 1
    return h.hexdigest(), n


@dataclass(frozen=True)
class EvaluationStamp:
    """What an evaluation's result depends on, written beside it as ``eval_<label>.inputs.json``.

    command: the command that produced it (argv; for an evaluation run in-process, the inference
    command with every setting spelt out, :func:`opencood_ext.eval.evaluate.evaluation_stamp`);
    code: :func:`code_digest`; files / num_files: :func:`files_digest` of what it reads (the run's
    :meth:`RunFolder.inputs` and the test data)."""

    command: Tuple[str, ...]
    code: str
    files: str
    num_files: int

    @classmethod
    def of(cls, command: Sequence[str], reads: Iterable[Path], code: Optional[str] = None) -> "EvaluationStamp":
        """The stamp of running ``command`` now on the files under ``reads`` (``code``: a digest already
        computed, e.g. once per sweep; default :func:`code_digest`)."""
        digest, n = files_digest(reads)
        return cls(tuple(str(a) for a in command), code if code is not None else code_digest(), digest, n)

    def to_json(self) -> dict:
        return {"command": list(self.command), "code": self.code, "files": self.files, "num_files": self.num_files}

    @classmethod
    def from_json(cls, d: object) -> Optional["EvaluationStamp"]:
        """The stamp ``d`` holds, or None when it is not one (an older or cut file: never current)."""
        if not isinstance(d, dict) or set(d) != {"command", "code", "files", "num_files"} \
                or not isinstance(d["command"], list) or not isinstance(d["num_files"], int):
            return None
        return cls(tuple(str(a) for a in d["command"]), str(d["code"]), str(d["files"]), d["num_files"])


# ---------------------------------------------------------------------------------------- the run folder
@dataclass(frozen=True)
class RunFolder:
    """One run folder (module docstring): every file name in it, and the reuse rule of its evaluations."""

    root: Path

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root))

    # training and onboarding
    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def checkpoints(self) -> CheckpointPaths:
        return CheckpointPaths(self.root)

    @property
    def train_log(self) -> Path:
        return self.root / "train_log.jsonl"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tb"

    @property
    def writer_lock(self) -> Path:
        return self.root / ".writer.lock"

    @property
    def onboarding_report(self) -> Path:
        return self.root / "onboarding.json"

    @property
    def import_report(self) -> Path:
        return self.root / "import_report.json"

    def reference_weights(self) -> List[Path]:
        """A reference (OpenCOOD / HEAL) run's ``net_epoch[_bestval_at]<N>.pth`` files, best to worst:
        bestval before plain, then the highest N."""
        found = [(m.group(1) is not None, int(m.group(2)), p) for p in self.root.glob("net_epoch*.pth")
                 if (m := _REFERENCE_WEIGHTS.match(p.name))]
        return [p for *_, p in sorted(found, reverse=True)]

    def inputs(self) -> Tuple[Path, ...]:
        """What loading the run reads: its config and weights (ours or a reference run's), not the
        evaluations written beside them; an evaluation is stale when one of these changes."""
        return (self.config, self.checkpoints.dir, *self.reference_weights())

    # evaluations
    def evaluation(self, label: str) -> Path:
        return self.root / f"eval_{label}.json"

    def evaluation_yaml(self, label: str) -> Path:
        return self.root / f"eval_{label}.yaml"

    def frames(self, label: str) -> Path:
        """The per-frame records the bootstrap of ``eval_<label>.json`` resampled."""
        return self.root / f"eval_{label}_frames.npz"

    def stamp(self, label: str) -> Path:
        return self.root / f"eval_{label}.inputs.json"

    def pr_plot(self, label: str) -> Path:
        return self.root / f"pr_{label}.png"

    def bev_image(self, label: str, index: int) -> Path:
        return self.root / "bev" / f"{label}_{index:05d}.png"

    def evaluation_labels(self) -> List[str]:
        """Labels of the evaluations here that have per-frame records."""
        head, tail = "eval_", "_frames.npz"
        return sorted(p.name[len(head):-len(tail)] for p in self.root.glob(f"{head}*{tail}"))

    def dynamic_checkpoints(self) -> List[str]:
        """The named checkpoints (``epoch_2``, ``last``, ...) with a growing-alliance table here
        (``eval_dynamic_<ckpt>.json``), epochs in epoch order, then ``best`` and ``last``."""
        found = [m.group(1) for p in self.root.glob(f"eval_{DYNAMIC}_*.json") if (m := _DYNAMIC_OF.match(p.name))]
        return sorted(found, key=lambda c: (0, int(c[len("epoch_"):])) if c.startswith("epoch_") else (1, c))

    def read_evaluation(self, label: str) -> dict:
        """``eval_<label>.json``; FileNotFoundError / ValueError (naming the file) when missing or not JSON."""
        path = self.evaluation(label)
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None

    def read_stamp(self, label: str) -> Optional[EvaluationStamp]:
        try:
            return EvaluationStamp.from_json(json.loads(self.stamp(label).read_text()))
        except (OSError, ValueError):
            return None

    def evaluation_current(self, label: str, stamp: EvaluationStamp) -> bool:
        """The reuse rule: ``eval_<label>.json`` exists and its stamp equals ``stamp``."""
        return self.evaluation(label).is_file() and self.read_stamp(label) == stamp

    def clear_stamp(self, label: str) -> None:
        """Before (re)evaluating: an interrupted evaluation must not leave the old stamp on new outputs."""
        self.stamp(label).unlink(missing_ok=True)

    def write_stamp(self, label: str, stamp: EvaluationStamp) -> Path:
        """Record ``stamp`` for the evaluation just written (atomically: temporary file, then rename)."""
        path = self.stamp(label)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(stamp.to_json(), indent=1))
        os.replace(tmp, path)
        return path

    def evaluate_once(self, label: str, stamp: EvaluationStamp, run: Callable[[], object]) -> bool:
        """Call ``run`` (which writes ``eval_<label>.json``) unless the evaluation is current, then stamp
        it; True when it ran. A ``run`` that raises leaves no stamp, so the next call evaluates again."""
        if self.evaluation_current(label, stamp):
            return False
        self.clear_stamp(label)
        run()
        if not self.evaluation(label).is_file():
            raise FileNotFoundError(f"{self.evaluation(label)}: the evaluation did not write it")
        self.write_stamp(label, stamp)
        return True
