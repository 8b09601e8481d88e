"""An on-disk cache of what FROZEN encoder stacks compute, so onboarding and evaluation encode each
agent's input once per set of weights.

During onboarding the alliance's encoder stacks (and a new type's, where the method freezes it)
never change, and every evaluation of runs built on the same stage-1 stacks encodes the same test
frames again. :class:`FeatureCache` keeps each agent's BEV feature (and, for camera types with
depth supervision, its depth-loss sum and pixel count) under two digests:

* the stack's: its constructor spec, the grid and every ``state_dict`` tensor (name, dtype, shape,
  bytes), plus the autocast dtype in force, so retraining, importing other weights or changing the
  config gives another key (nothing is ever read for other weights);
* the agent's input: the bytes of its slice of the :class:`~opencood_ext.data.inputs.LidarInput`
  (its voxels, point counts and voxel coordinates) or
  :class:`~opencood_ext.data.inputs.CameraInput` (images, intrinsics, extrinsics, depth), so a
  changed data file, another voxelisation or an augmented (rotated) ego input is another key.

A stack is only served from the cache when its output cannot depend on the batch it is in (frozen
BatchNorm, no dropout in training mode) and no gradient must reach its weights (:func:`frozen`). Entries are written atomically (temporary file, then
rename), one file per agent: ``<root>/<stack digest>/<input digest>.pt``.

The cached feature is the one a batch of this agent alone gives; the encoders compute each agent
independently (convolutions per sample, BatchNorm in eval mode), so a cached and an uncached step
agree to float rounding (``tests/opencood_ext/models/test_feature_cache.py`` checks loss and gradients).
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.dropout import _DropoutNd

from ..data.inputs import CameraInput, LidarInput
from ..torch_files import is_torchscript, without_unsafe_advice

Input = Union[LidarInput, CameraInput]


def _tensor_bytes(t: Tensor) -> bytes:
    t = t.detach().contiguous().cpu()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _update(h, *tensors: Optional[Tensor]) -> None:
    for t in tensors:
        if t is None:
            h.update(b"none;")
            continue
        h.update(f"{t.dtype}{tuple(t.shape)};".encode())
        h.update(_tensor_bytes(t))


def _mode_dependent(m: nn.Module) -> bool:
    """Whether ``m`` computes differently in training mode: BatchNorm (batch statistics), dropout, or
    a module that says so with a class attribute ``stochastic_in_training = True`` (e.g. drop-connect)."""
    return isinstance(m, (_BatchNorm, _DropoutNd)) or bool(getattr(m, "stochastic_in_training", False))


def frozen(stack: nn.Module) -> bool:
    """True when ``stack``'s output may come from the cache: it depends on its input and weights
    alone (no mode-dependent module, :func:`_mode_dependent`, is in training mode; onboarding keeps
    frozen BatchNorm in eval mode: FreezePolicy) and no gradient must reach its weights (none
    requires one, or gradients are off, as in evaluation). The weights themselves are part of the key."""
    if any(m.training and _mode_dependent(m) for m in stack.modules()):
        return False
    return not torch.is_grad_enabled() or not any(p.requires_grad for p in stack.parameters())


def agent_slice(inp: Input, rows: Sequence[int]) -> Input:
    """The input of agents ``rows`` (positions within ``inp``, in that order) as an input of
    ``len(rows)`` agents, renumbered 0.. (LiDAR voxels keep their order)."""
    if isinstance(inp, CameraInput):
        idx = torch.as_tensor(list(rows), dtype=torch.long, device=inp.images.device)
        return CameraInput(images=inp.images[idx], K=inp.K[idx], T_lidar_from_camera=inp.T_lidar_from_camera[idx],
                           depth=None if inp.depth is None else inp.depth[idx])
    agent = inp.coords[:, 0].long()
    new_index = torch.full((inp.num_agents,), -1, dtype=torch.long, device=agent.device)
    new_index[torch.as_tensor(list(rows), dtype=torch.long, device=agent.device)] = torch.arange(
        len(rows), device=agent.device)
    mapped = new_index[agent]
    keep = mapped >= 0
    coords = inp.coords[keep].clone()
    coords[:, 0] = mapped[keep].to(coords.dtype)
    # voxels of the kept agents in the order of ``rows`` (a stable sort keeps each agent's own order)
    order = torch.sort(coords[:, 0], stable=True).indices
    return LidarInput(voxels=inp.voxels[keep][order], num_points=inp.num_points[keep][order],
                      coords=coords[order], num_agents=len(rows))


def input_digests(inp: Input) -> List[str]:
    """One digest per agent of ``inp``: the bytes of its slice of every input tensor."""
    out = []
    if isinstance(inp, CameraInput):
        for a in range(inp.num_agents):
            h = hashlib.blake2b(b"camera;", digest_size=20)
            _update(h, inp.images[a], inp.K[a], inp.T_lidar_from_camera[a],
                    None if inp.depth is None else inp.depth[a])
            out.append(h.hexdigest())
        return out
    agent = inp.coords[:, 0].long()
    order = torch.sort(agent, stable=True).indices
    counts = torch.bincount(agent, minlength=inp.num_agents).tolist()
    start = 0
    for a in range(inp.num_agents):
        rows = order[start:start + counts[a]]
        start += counts[a]
        h = hashlib.blake2b(b"lidar;", digest_size=20)
        _update(h, inp.voxels[rows], inp.num_points[rows], inp.coords[rows][:, 1:])
        out.append(h.hexdigest())
    return out


@dataclass
class Encoded:
    """What a type's stack gave for ``A`` agents: bev (A, C, H, W); depth_logits (A, Ncam, D, h, w)
    when every agent was encoded now (no cache); depth_terms: (sum, count), two (A,) tensors, the
    depth loss per agent when the cache served any agent (None: no depth supervision)."""

    bev: Tensor
    depth_logits: Optional[Tensor] = None
    depth_terms: Optional[Tuple[Tensor, Tensor]] = None


@dataclass
class CacheStats:
    """Agents served from the cache (hits), encoded and stored (misses), encoded but not stored
    (skipped: an augmented ego in training, whose input changes every epoch)."""

    hits: int = 0
    misses: int = 0
    skipped: int = 0
    by_stack: Dict[str, int] = field(default_factory=dict)


# below this much free disk a failed write is reported as a full disk (the torn file is deleted first)
LOW_DISK_BYTES = 64 * 2**20


class FeatureCache:
    """See the module docstring. root: the cache folder (created when first written)."""

    def __init__(self, root: Union[str, Path]):
        self.root = Path(root)
        self.stats = CacheStats()
        self._digests: Dict[int, Tuple[tuple, str]] = {}

    def stack_digest(self, stack: nn.Module, spec: object) -> str:
        """Digest of ``stack``'s spec, weights and buffers, and the autocast dtype in force
        (recomputed only when a tensor was replaced or changed in place)."""
        state = stack.state_dict()
        version = tuple((k, v.data_ptr(), v._version) for k, v in state.items())
        memo = self._digests.get(id(stack))
        if memo is None or memo[0] != version:
            h = hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode())
            for k, v in state.items():
                h.update(k.encode())
                _update(h, v)
            memo = (version, h.hexdigest()[:32])
            self._digests[id(stack)] = memo
        amp = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
        return memo[1] if amp is None else f"{memo[1]}-{str(amp).replace('torch.', '')}"

    def _path(self, stack_key: str, input_key: str) -> Path:
        return self.root / stack_key / f"{input_key}.pt"

    def _read(self, path: Path) -> Optional[dict]:
        try:
            if is_torchscript(path):
                raise ValueError("a TorchScript archive (a saved program), not a cache entry; not loaded")
            return torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            return None
        except Exception as exc:  # noqa: BLE001  (a torn or foreign file: whatever the unpickler raises)
            raise RuntimeError(f"feature cache entry {path} is unreadable ({without_unsafe_advice(str(exc))}); "
                               f"delete it (or the folder {self.root}) and rerun") from None

    def _write(self, path: Path, entry: dict) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".pt", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(entry, f)
            os.replace(tmp, path)
        except BaseException as exc:
            Path(tmp).unlink(missing_ok=True)
            if isinstance(exc, (OSError, RuntimeError)):
                self._raise_if_disk_full(path, exc)
            raise

    def _raise_if_disk_full(self, path: Path, exc: BaseException) -> None:
        """A write that failed on a (nearly) full disk, as one clear OSError (ENOSPC): torch.save says
        only "unexpected pos 704 vs 598" there."""
        free = shutil.disk_usage(path.parent).free
        if free < LOW_DISK_BYTES or getattr(exc, "errno", None) == errno.ENOSPC:
            raise OSError(errno.ENOSPC, f"feature cache {self.root}: writing {path.name} failed ({exc}) with "
                          f"{free / 2**20:.0f} MiB free on its disk: the disk is full. The cache only saves time: "
                          "delete the cache folder of a finished job (a default main job's grows to about 20 GB) "
                          "or rerun with --no_feature_cache; the job resumes where it stopped") from None

    def encode(self, stack: nn.Module, spec: object, inp: Input, store: Sequence[bool]) -> Encoded:
        """``stack`` (frozen, :func:`frozen`) applied to ``inp`` through the cache. ``store[a]``:
        whether agent ``a``'s result may be kept (False for inputs that never repeat)."""
        key = self.stack_digest(stack, spec)
        digests = input_digests(inp)
        entries: List[Optional[dict]] = [self._read(self._path(key, d)) if s else None
                                         for d, s in zip(digests, store)]
        todo = [a for a, e in enumerate(entries) if e is None]
        has_depth = isinstance(inp, CameraInput) and inp.depth is not None and hasattr(stack.encoder, "depth_loss_terms")
        if not todo or len(todo) < inp.num_agents:  # else: nothing cached, plain encode below
            fresh = stack(agent_slice(inp, todo)) if todo else None
        else:
            fresh = stack(inp)
        terms = None
        if fresh is not None and has_depth and fresh.depth_logits is not None:
            sub = inp if len(todo) == inp.num_agents else agent_slice(inp, todo)
            terms = stack.encoder.depth_loss_terms(fresh.depth_logits, sub.depth)
        for j, a in enumerate(todo):
            if store[a]:
                entry = {"bev": fresh.bev[j].detach().clone()}
                if terms is not None:
                    entry["depth_sum"], entry["depth_count"] = terms[0][j].detach().clone(), terms[1][j].clone()
                self._write(self._path(key, digests[a]), entry)
                self.stats.misses += 1
            else:
                self.stats.skipped += 1
        self.stats.hits += inp.num_agents - len(todo)
        self.stats.by_stack[key] = self.stats.by_stack.get(key, 0) + inp.num_agents
        if len(todo) == inp.num_agents:  # nothing served from the cache: exactly the plain result
            return Encoded(bev=fresh.bev, depth_logits=fresh.depth_logits)
        device = inp.images.device if isinstance(inp, CameraInput) else inp.voxels.device
        rows = []
        pos = {a: j for j, a in enumerate(todo)}
        for a, e in enumerate(entries):
            rows.append(fresh.bev[pos[a]] if e is None else e["bev"].to(device))
        out = Encoded(bev=torch.stack(rows))
        if has_depth:
            sums, counts = [], []
            for a, e in enumerate(entries):
                if e is None:
                    sums.append(terms[0][pos[a]])
                    counts.append(terms[1][pos[a]])
                else:
                    sums.append(e["depth_sum"].to(device))
                    counts.append(e["depth_count"].to(device))
            out.depth_terms = (torch.stack(sums), torch.stack(counts))
        return out
