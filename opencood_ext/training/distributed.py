"""torch.distributed plumbing for torchrun launches (gloo on CPU, nccl on CUDA).

Launch N processes with::

    python -m torch.distributed.run --nproc_per_node=N tools/train.py -y CONFIG

torchrun sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT``; :func:`init_distributed` reads them. Without them (a plain
``python`` launch) everything here degrades to a single process: rank 0, world
size 1, and every collective is a no-op.

Also here: the data sharding the trainer uses (:func:`train_sampler`, a
``DistributedSampler`` whose order is reproducible for resume, and
:func:`val_batches`, disjoint unpadded validation shards) and the small
collectives it needs (:func:`all_reduce_means`, :func:`broadcast_buffers`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
from torch.utils.data import Dataset, DistributedSampler, Sampler


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job.

    rank / world_size: global; local_rank: index on this host (selects the GPU);
    device: the device this process trains on; backend: "gloo", "nccl" or None
    for a single-process run.
    """
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: Optional[str]

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _env_int(name: str) -> Optional[int]:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r}: expected an integer (set by torchrun)") from None


def init_distributed(device: Optional[str | torch.device] = None, timeout_s: float = 600.0) -> DistInfo:
    """Join the torchrun process group (idempotent) and pick this process's device.

    timeout_s: how long a collective waits for a stalled rank before failing on the others
    (the trainer passes ``TrainConfig.dist_timeout_s``; see there for what a user sees).

    device: None picks ``cuda:LOCAL_RANK`` when CUDA is available, else CPU.
    An explicit CUDA device without an index gets ``LOCAL_RANK`` as index.
    The backend is nccl for CUDA devices and gloo for CPU. A process group that
    is already initialised (e.g. by the caller) is reused as is.
    """
    world_size = _env_int("WORLD_SIZE") or 1
    rank = _env_int("RANK") or 0
    local_rank = _env_int("LOCAL_RANK") or 0
    if dist.is_available() and dist.is_initialized():
        world_size, rank = dist.get_world_size(), dist.get_rank()
    if not 0 <= rank < world_size:
        raise ValueError(f"RANK={rank} is outside WORLD_SIZE={world_size} (torchrun environment)")

    if device is None:
        dev = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
        if dev.type == "cuda" and local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"LOCAL_RANK={local_rank} but this machine has {torch.cuda.device_count()} CUDA "
                               f"device(s): start one process per GPU (torchrun --nproc_per_node="
                               f"{torch.cuda.device_count()}), or run CPU ranks with CUDA_VISIBLE_DEVICES=''")
    else:
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)

    if world_size == 1:
        return DistInfo(rank=0, world_size=1, local_rank=local_rank, device=dev, backend=None)
    if not dist.is_available():
        raise RuntimeError("WORLD_SIZE > 1 but this torch build has no torch.distributed support")
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if not dist.is_initialized():
        from datetime import timedelta
        kwargs = {"device_id": dev} if dev.type == "cuda" else {}
        dist.init_process_group(backend=backend, init_method="env://", world_size=world_size,
                                rank=rank, timeout=timedelta(seconds=timeout_s), **kwargs)
    else:
        backend = dist.get_backend()
    return DistInfo(rank=rank, world_size=world_size, local_rank=local_rank, device=dev, backend=backend)


def is_dist() -> bool:
    """True inside an initialised process group of more than one process."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def get_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def get_world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def is_main_process() -> bool:
    """Rank 0 (or a single-process run): the only process that writes files."""
    return get_rank() == 0


def barrier() -> None:
    """Wait for every rank; no-op without a process group."""
    if is_dist():
        if dist.get_backend() == "nccl":
            dist.barrier(device_ids=[torch.cuda.current_device()])
        else:
            dist.barrier()


def cleanup() -> None:
    """Leave the process group (call once at the end of a torchrun script)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_gather_object(obj: Any) -> List[Any]:
    """Every rank's ``obj`` (picklable), in rank order; ``[obj]`` without a group."""
    if not is_dist():
        return [obj]
    out: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def all_true(flag: bool) -> bool:
    """True when ``flag`` is True on every rank (one small all-reduce); ``flag`` without a group."""
    if not is_dist():
        return bool(flag)
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def broadcast_buffers(module: torch.nn.Module, src: int = 0) -> None:
    """Copy rank ``src``'s buffers (BatchNorm running stats) into every rank's ``module``.

    DDP only syncs buffers at the start of a training forward, so after the last
    step each rank holds stats from its own last batch; call this before
    validating or saving so that every rank evaluates the checkpointed model.
    """
    if not is_dist():
        return
    with torch.no_grad():
        for buf in module.buffers():
            dist.broadcast(buf, src=src)


def all_reduce_means(sums: Dict[str, float], count: float) -> Dict[str, float]:
    """``{k: sum over ranks of sums[k] / sum over ranks of count}``; ranks may lack keys."""
    total_n, total = 0.0, {}
    for r_sums, r_n in all_gather_object((sums, count)):
        total_n += r_n
        for k, v in r_sums.items():
            total[k] = total.get(k, 0.0) + v
    return {k: v / total_n for k, v in total.items()} if total_n else {}


# ---------------------------------------------------------------- data sharding
class SkipSampler(Sampler):
    """The indices of ``inner`` after its first ``skip`` (resume inside an epoch)."""

    def __init__(self, inner: Sampler, skip: int):
        self.inner, self.skip = inner, skip

    def __iter__(self):
        for i, idx in enumerate(self.inner):
            if i >= self.skip:
                yield idx

    def __len__(self):
        return max(0, len(self.inner) - self.skip)


def train_sampler(dataset: Dataset, epoch: int, seed: int, shuffle: bool = True, skip: int = 0) -> Sampler:
    """This rank's share of ``dataset`` for ``epoch``, minus its first ``skip`` indices.

    A ``DistributedSampler`` (also for a single process): the order is a pure
    function of (seed, epoch, rank, world size), which is what makes a resumed
    epoch continue with exactly the batches it had not seen. Shards are padded
    to equal length by repeating samples, so every rank takes the same number
    of steps.
    """
    s = DistributedSampler(dataset, num_replicas=get_world_size(), rank=get_rank(), shuffle=shuffle, seed=seed)
    s.set_epoch(epoch)
    return SkipSampler(s, skip) if skip else s


def val_batches(n: int, batch_size: int, max_batches: Optional[int] = None) -> List[List[int]]:
    """This rank's validation batches: indices ``rank, rank + world, ...`` of ``range(n)``.

    Disjoint shards without padding duplicates, so sums over ranks cover each
    sample exactly once (ranks may get different batch counts; validation runs
    the bare module, so no collective sits inside the loop).
    """
    idx = list(range(get_rank(), n, get_world_size()))
    return [idx[i:i + batch_size] for i in range(0, len(idx), batch_size)][:max_batches]
