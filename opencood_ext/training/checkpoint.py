"""Training checkpoints: atomic files, RNG state capture, model-weight loading.

Checkpoint files (written by rank 0 only; their names: :class:`~opencood_ext.run_folder.CheckpointPaths`)::

    checkpoints/epoch_{n}.pth   after epoch n (1-based) finished
    checkpoints/latest.pth      newest state, end of an epoch or mid-epoch
    checkpoints/best.pth        state with the best validation score so far (selection.py)

Every file is written to a temporary file in the same folder, fsynced and
then ``os.replace``d over the target, so a reader (or a resume after SIGKILL)
sees either the old or the new checkpoint, never a torn one. The order of the
writes (latest.pth last, the commit point) and the clean-up after a kill are in
:mod:`.runfolder`.

Checkpoint dict (``CHECKPOINT_KEYS``, ``format_version`` 2):

- ``model``: state dict of the bare module (never the DDP wrapper's ``module.`` keys)
- ``optimizer``, ``scheduler`` (None without a scheduler): their state dicts
- ``epoch``: number of COMPLETED epochs
- ``step_in_epoch``: optimizer steps already done in epoch ``epoch + 1``
  (0 at an epoch boundary)
- ``global_step``: optimizer steps since the start of training
- ``best_val``: lowest validation selection score so far (``config['select_on']``, selection.py), or None
- ``history``: list of per-epoch dicts (see ``trainer.TrainResult``)
- ``rng``: list of per-rank RNG states (:func:`capture_rng_state`), tensors and plain types only
- ``world_size``, ``batch_size``: the layout the step counter refers to
- ``config``: the TrainConfig as a plain dict
- ``partial_epoch`` (optional): mid-epoch only, per rank, the running loss sums of the
  epoch (tensors), its step count and training seconds so far; None at an epoch end

Safe loading: every file is read with ``torch.load(weights_only=True)``, which
rebuilds tensors and plain containers only and never calls a function named in
the file; a file that asks for anything else (e.g. a ``__reduce__`` payload) is
refused with :class:`UnsafeCheckpointError` before any of it runs. Format 2
stores everything as tensors and plain types. Format 1 files (written before
format 2) hold numpy's RNG state as a numpy array; they are read with exactly
the three numpy globals that array needs allowed, and their RNG state is
converted on load.
"""
from __future__ import annotations

import io
import os
import pickle
import random
import re
from pathlib import Path
from typing import Iterable, Mapping, Optional

import numpy as np
import torch
from torch import nn

from ..atomic_files import _fsync_dir, atomic_write_bytes  # noqa: F401  (re-exported: runlog, runfolder)
from ..run_folder import CheckpointPaths  # noqa: F401  (the file names live with the run folder's)
from ..torch_files import is_torchscript, without_unsafe_advice

FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
CHECKPOINT_KEYS = ("format_version", "model", "optimizer", "scheduler", "epoch", "step_in_epoch",
                   "global_step", "best_val", "history", "rng", "world_size", "batch_size", "config")


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, unreadable or lacks a field; the message names the file."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint asks to run code or build objects outside the allow-list; nothing of it ran."""


# numpy's legacy RNG state array in format-1 files: these three rebuild a plain ndarray and nothing else
_LEGACY_NUMPY_GLOBALS = [np._core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32)),
                         (np._core.multiarray._reconstruct, "numpy.core.multiarray._reconstruct")]
_GLOBAL_NAME = re.compile(r"GLOBAL ([\w.]+)")


def save_checkpoint(state: Mapping, paths: Iterable[str | os.PathLike]) -> None:
    """Serialise ``state`` once and write it atomically to every path in ``paths``."""
    buf = io.BytesIO()
    torch.save(dict(state), buf)
    data = buf.getvalue()
    for p in paths:
        atomic_write_bytes(p, data)


def _safe_torch_load(path: Path, map_location):
    """``torch.load(weights_only=True)``; a refused global raises :class:`UnsafeCheckpointError`.

    The messages never pass on torch's advice to retry with ``weights_only=False`` (that is
    the unsafe load the refusal protects against); a refusal names the callable the file
    asks for instead."""
    if is_torchscript(path):  # torch.load would dispatch to torch.jit.load, or advise the unsafe load
        raise UnsafeCheckpointError(
            f"{path}: refused to open: a TorchScript archive (a saved program, whose code runs when it is "
            f"loaded), not a checkpoint; nothing in it was executed. Checkpoints hold tensors and plain types "
            f"only (torch.save of a state dict)")
    try:
        with torch.serialization.safe_globals(_LEGACY_NUMPY_GLOBALS):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        found = _GLOBAL_NAME.search(str(exc))
        if found is None:
            raise CheckpointError(f"{path}: unreadable checkpoint (UnpicklingError: "
                                  f"{_unpickler_detail(str(exc))})") from None
        raise UnsafeCheckpointError(
            f"{path}: refused to open: the file asks to call or build {found.group(1)!r}, which a checkpoint "
            f"never needs (it could run arbitrary code); nothing in it was executed. Checkpoints written "
            f"by this project (formats {READABLE_VERSIONS}) hold tensors and plain types only") from None
    except Exception as exc:  # torch raises many types for a corrupt archive
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise CheckpointError(f"{path}: unreadable checkpoint ({type(exc).__name__}: "
                              f"{without_unsafe_advice(first)})") from None


safe_torch_load = _safe_torch_load  # for readers of other checkpoint layouts (interop's reference files)


def _unpickler_detail(text: str) -> str:
    """What torch's weights-only unpickler objected to, without its advice on loading unsafely."""
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1]
    lines = [ln.strip() for ln in text.replace("\033[1m", "").replace("\033[0m", "").splitlines() if ln.strip()]
    keep = [ln for ln in lines if "weights_only" not in ln and not ln.startswith("Weights only load failed")
            and "arbitrary code" not in ln]
    return (keep[0] if keep else "the safe loader refused it")[:300]


def load_checkpoint(path: str | os.PathLike, map_location="cpu", required=CHECKPOINT_KEYS) -> dict:
    """Read a checkpoint safely; raises :class:`CheckpointError` naming the file and missing fields.

    A format-1 file comes back in format 2 (its RNG states converted to plain types).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    state = _safe_torch_load(path, map_location)
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: expected a dict, got {type(state).__name__}")
    missing = [k for k in required if k not in state]
    if missing:
        raise CheckpointError(f"{path}: missing field(s) {missing}")
    version = state.get("format_version", FORMAT_VERSION)
    if version not in READABLE_VERSIONS:
        raise CheckpointError(f"{path}: field 'format_version' is {version}, this code reads {READABLE_VERSIONS}")
    if isinstance(state.get("rng"), list):
        state["rng"] = [plain_rng_state(r) for r in state["rng"]]
    return state


# ---------------------------------------------------------------- RNG + seeding
def seed_everything(seed: int) -> None:
    """Seed python ``random``, numpy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def capture_rng_state() -> dict:
    """This process's python / numpy / torch CPU (and CUDA, if used) RNG states, as tensors and
    plain types (what ``weights_only`` loading accepts)::

        python: random.getstate() as nested tuples of ints
        numpy:  {"bit_generator": "MT19937", "key": (624,) int64 tensor, "pos", "has_gauss": int,
                 "cached_gaussian": float}
        torch:  ByteTensor;  cuda: list of ByteTensors (only when CUDA is initialised)
    """
    state = {"python": random.getstate(), "numpy": _plain_numpy_state(np.random.get_state()),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _plain_numpy_state(st) -> dict:
    name, key, pos, has_gauss, cached = st
    return {"bit_generator": str(name), "key": torch.as_tensor(np.asarray(key, dtype=np.int64)),
            "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def plain_rng_state(state: Mapping) -> dict:
    """A captured RNG state with numpy's legacy tuple (format 1) converted to the plain dict."""
    state = dict(state)
    if isinstance(state.get("numpy"), tuple):
        state["numpy"] = _plain_numpy_state(state["numpy"])
    return state


def restore_rng_state(state: Mapping) -> None:
    """Inverse of :func:`capture_rng_state` (also takes format 1's numpy tuple)."""
    random.setstate(_as_tuples(state["python"]))
    st = plain_rng_state(state)["numpy"]
    np.random.set_state((st["bit_generator"], np.asarray(st["key"], dtype=np.int64).astype(np.uint32),
                         st["pos"], st["has_gauss"], st["cached_gaussian"]))
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all([s.cpu() for s in cuda_states])


def _as_tuples(value):
    """``random.setstate`` wants tuples; lists (e.g. after a JSON round trip) are converted."""
    return tuple(_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


# ---------------------------------------------------------------- model weights
def _few(keys: list, n: int = 3) -> str:
    return ", ".join(keys[:n]) + (f" (+{len(keys) - n} more)" if len(keys) > n else "")


def check_weights_fit(model: nn.Module, weights: Mapping[str, torch.Tensor], path, strict: bool = True) -> None:
    """Raise a one-line :class:`CheckpointError` naming ``path`` and the keys when ``weights``
    (a state dict) cannot load into ``model``: shapes that differ, and with ``strict`` keys
    missing on either side."""
    own = model.state_dict()
    shape = [f"{k} {tuple(weights[k].shape)} vs {tuple(own[k].shape)}" for k in weights
             if k in own and tuple(weights[k].shape) != tuple(own[k].shape)]
    missing = [k for k in own if k not in weights] if strict else []
    unexpected = [k for k in weights if k not in own] if strict else []
    if not (shape or missing or unexpected):
        return
    parts = ([f"{len(shape)} key(s) differ in shape (checkpoint vs model): {_few(shape)}"] if shape else []) + \
        ([f"{len(missing)} model key(s) missing from the checkpoint: {_few(missing)}"] if missing else []) + \
        ([f"{len(unexpected)} checkpoint key(s) not in the model: {_few(unexpected)}"] if unexpected else [])
    raise CheckpointError(f"{path}: field 'model' does not fit the {type(model).__name__} built from this "
                          f"config (was it trained with other model settings?): " + "; ".join(parts))


def check_optimizer_fits(optimizer: torch.optim.Optimizer, saved, path) -> None:
    """Raise a one-line :class:`CheckpointError` naming ``path`` when ``saved`` (an optimizer
    state dict) cannot be loaded into ``optimizer``: other parameter groups, other parameter
    counts, or per-parameter state (e.g. Adam's ``exp_avg``) of another shape than the
    parameter it belongs to. Changes nothing; ``load_state_dict`` alone checks only the counts,
    and a wrong shape would fail (or broadcast) at the first step."""
    where = f"{path}: field 'optimizer' does not fit this run (different trainable parameters?)"
    if not isinstance(saved, Mapping) or not isinstance(saved.get("param_groups"), list) \
            or not isinstance(saved.get("state"), Mapping):
        raise CheckpointError(f"{where}: expected a dict with 'state' and 'param_groups'")
    groups = optimizer.param_groups
    if len(saved["param_groups"]) != len(groups):
        raise CheckpointError(f"{where}: {len(saved['param_groups'])} parameter group(s), "
                              f"this run has {len(groups)}")
    params = {}
    for i, (theirs, ours) in enumerate(zip(saved["param_groups"], groups)):
        ids = theirs.get("params") if isinstance(theirs, Mapping) else None
        if not isinstance(ids, list) or len(ids) != len(ours["params"]):
            have = len(ids) if isinstance(ids, list) else "no"
            raise CheckpointError(f"{where}: group {i} holds {have} parameter(s), this run trains "
                                  f"{len(ours['params'])}")
        params.update(zip(ids, ours["params"]))
    for pid, entry in saved["state"].items():
        if pid not in params:
            raise CheckpointError(f"{where}: state for parameter id {pid}, which no group lists")
        if not isinstance(entry, Mapping):
            raise CheckpointError(f"{where}: state of parameter {pid} is a {type(entry).__name__}, not a dict")
        want = tuple(params[pid].shape)
        for name, value in entry.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and tuple(value.shape) != want:
                raise CheckpointError(f"{where}: state {name!r} of parameter {pid} has shape "
                                      f"{tuple(value.shape)}, the parameter {want}")


def load_model_state(model: nn.Module, path: str | os.PathLike,
                     prefix_map: Optional[Mapping[str, str]] = None, strict: bool = True) -> list:
    """Load weights from a checkpoint (or a bare state dict file) into ``model``.

    prefix_map: ``{source_prefix: target_prefix}``; when given, only the
    checkpoint keys under a source prefix are loaded, renamed to the target
    prefix (``{"": ""}`` loads everything). This composes models, e.g. stage 2
    takes the receiver's stage-1 model and the new agent type's encoder stack
    from another run: ``{"encoders.lidar.": "encoders.lidar."}``.
    strict: with a prefix_map, every model key under a target prefix must be
    filled; without, the full ``load_state_dict`` strictness applies.
    Returns the list of model keys that were loaded.
    """
    path = Path(path)
    state = load_checkpoint(path, required=())
    weights = state["model"] if "model" in state and isinstance(state["model"], dict) else state
    weights = {k[len("module."):] if k.startswith("module.") else k: v for k, v in weights.items()}
    if prefix_map is None:
        check_weights_fit(model, weights, path, strict)
        result = model.load_state_dict(weights, strict=strict)
        missing = set(result.missing_keys)
        return [k for k in model.state_dict() if k not in missing]
    picked = {}
    for src, dst in prefix_map.items():
        found = {dst + k[len(src):]: v for k, v in weights.items() if k.startswith(src)}
        if not found:
            raise CheckpointError(f"{path}: field 'model' has no key starting with {src!r}")
        picked.update(found)
    own = model.state_dict()
    unknown = sorted(k for k in picked if k not in own)
    if unknown:
        raise CheckpointError(f"{path}: mapped keys not in {type(model).__name__}: {unknown[:5]}")
    bad = [k for k, v in picked.items() if tuple(v.shape) != tuple(own[k].shape)]
    if bad:
        k = bad[0]
        raise CheckpointError(f"{path}: key {k!r} has shape {tuple(picked[k].shape)}, "
                              f"model expects {tuple(own[k].shape)}")
    if strict:
        unfilled = sorted(k for k in own if any(k.startswith(d) for d in prefix_map.values()) and k not in picked)
        if unfilled:
            raise CheckpointError(f"{path}: model keys left unfilled by prefix_map: {unfilled[:5]}")
    model.load_state_dict(picked, strict=False)
    return sorted(picked)
