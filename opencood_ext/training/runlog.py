"""The run folder's training log: ``train_log.jsonl`` (one JSON object a line) and
tensorboard scalars under ``tb/``, written by rank 0; and readers for it."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import List, Optional

from ..run_folder import RunFolder
from .checkpoint import atomic_write_bytes

log = logging.getLogger("opencood_ext.training")


class RunLog:
    """Rank-0 logging: tensorboard scalars and train_log.jsonl."""

    def __init__(self, run_dir: Path, purge_step: Optional[int]):
        from torch.utils.tensorboard import SummaryWriter
        folder = RunFolder(run_dir)
        self.tb = SummaryWriter(log_dir=str(folder.tensorboard), purge_step=purge_step)
        self.jsonl = open(folder.train_log, "a")

    def record(self, kind: str, data: dict, step: Optional[int] = None, tb_prefix: Optional[str] = None,
               durable: bool = False):
        """Append one record; ``durable`` also fsyncs it (epoch records, written before the checkpoint)."""
        self.jsonl.write(json.dumps({"kind": kind, **data}) + "\n")
        self.jsonl.flush()
        if durable:
            os.fsync(self.jsonl.fileno())
        if tb_prefix is not None:
            for k, v in data.items():
                if isinstance(v, float) and k not in ("epoch", "global_step", "step"):
                    self.tb.add_scalar(f"{tb_prefix}/{k}", v, step)
            self.tb.flush()

    def close(self):
        self.tb.close()
        self.jsonl.close()


def _parse(lines: List[str], path: Path) -> List[dict]:
    recs = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            recs.append(json.loads(line))
        except json.JSONDecodeError:
            log.warning("%s: ignoring line %d, not JSON (a run killed while logging tears its last line): %r",
                        path, n, line[:80])
    return recs


def read_log(run_dir, kind: Optional[str] = None) -> List[dict]:
    """Records of ``run_dir/train_log.jsonl`` (only those of ``kind`` when given); [] if none.
    A line that is not JSON (torn by a kill mid-write) is skipped with a warning."""
    path = RunFolder(run_dir).train_log
    if not path.exists():
        return []
    recs = _parse(path.read_text().splitlines(), path)
    return [r for r in recs if kind is None or r.get("kind") == kind]


def truncate_log(run_dir, global_step: int, epoch: int) -> int:
    """Keep only the records a checkpoint at (``global_step``, ``epoch`` completed epochs)
    accounts for: step and resume records up to ``global_step``, epoch records up to
    ``epoch``; a torn last line goes too. Rewrites the file atomically when anything is
    dropped; returns the number of records dropped."""
    path = RunFolder(run_dir).train_log
    if not path.exists():
        return 0
    lines = path.read_text().splitlines()
    recs = _parse(lines, path)
    keep = [r for r in recs if (r.get("epoch", 0) <= epoch if r.get("kind") == "epoch"
                                else r.get("global_step", 0) <= global_step)]
    dropped = len([ln for ln in lines if ln.strip()]) - len(keep)
    if dropped:
        atomic_write_bytes(path, "".join(json.dumps(r) + "\n" for r in keep).encode())
        log.warning("%s: dropped %d record(s) past the resume point (epoch %d, step %d)", path, dropped,
                    epoch, global_step)
    return dropped


def training_wall_time(run_dir) -> float:
    """Seconds a run spent training: the sum of its epochs' ``time_s`` (nan without a log)."""
    epochs = read_log(run_dir, "epoch")
    if not epochs and not RunFolder(run_dir).train_log.exists():
        return float("nan")
    return float(sum(float(r.get("time_s", 0.0)) for r in epochs))


def optimizer_steps(run_dir) -> Optional[int]:
    """Optimizer steps a run took: its last epoch record's ``global_step``; None when its log has no
    epoch record that holds one (no log, or written before the count was logged)."""
    epochs = [r for r in read_log(run_dir, "epoch") if "global_step" in r]
    return int(epochs[-1]["global_step"]) if epochs else None
