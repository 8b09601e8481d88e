"""The run folder's training log: ``train_log.jsonl`` (one JSON object a line) and
tensorboard scalars under ``tb/``, written by rank 0; and readers for it."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional


class RunLog:
    """Rank-0 logging: tensorboard scalars and train_log.jsonl."""

    def __init__(self, run_dir: Path, purge_step: Optional[int]):
        from torch.utils.tensorboard import SummaryWriter
        self.tb = SummaryWriter(log_dir=str(run_dir / "tb"), purge_step=purge_step)
        self.jsonl = open(run_dir / "train_log.jsonl", "a")

    def record(self, kind: str, data: dict, step: Optional[int] = None, tb_prefix: Optional[str] = None):
        self.jsonl.write(json.dumps({"kind": kind, **data}) + "\n")
        self.jsonl.flush()
        if tb_prefix is not None:
            for k, v in data.items():
                if isinstance(v, float) and k not in ("epoch", "global_step", "step"):
                    self.tb.add_scalar(f"{tb_prefix}/{k}", v, step)
            self.tb.flush()

    def close(self):
        self.tb.close()
        self.jsonl.close()


def read_log(run_dir, kind: Optional[str] = None) -> List[dict]:
    """Records of ``run_dir/train_log.jsonl`` (only those of ``kind`` when given); [] if none."""
    path = Path(run_dir) / "train_log.jsonl"
    if not path.exists():
        return []
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in recs if kind is None or r.get("kind") == kind]


def training_wall_time(run_dir) -> float:
    """Seconds a run spent training: the sum of its epochs' ``time_s`` (nan without a log)."""
    epochs = read_log(run_dir, "epoch")
    if not epochs and not (Path(run_dir) / "train_log.jsonl").exists():
        return float("nan")
    return float(sum(float(r.get("time_s", 0.0)) for r in epochs))
