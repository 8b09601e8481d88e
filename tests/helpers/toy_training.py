"""Toy model / dataset / batch for the training-engine tests, plus a CLI entry point
that subprocess tests (SIGKILL resume, torchrun DDP) launch:

    python tests/helpers/toy_training.py --run-dir DIR --out OUT [--kill-after-steps N] [--kill-writing NAME:K] ...

``--kill-writing best.pth:2`` SIGKILLs the process in the middle of the 2nd atomic write of
best.pth: its temporary file is written, the replace has not happened.

Writes ``OUT.rank{r}.json`` (history, seen indices, save-call count) and
``OUT.rank{r}.pt`` (the final state dict) for each rank.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import List

import torch
from torch import nn
from torch.utils.data import Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from opencood_ext.training import LossOutput, TrainConfig, Trainer  # noqa: E402


@dataclass
class ToyBatch:
    """x: (B, 4) inputs, y: (B,) targets, idx: dataset indices of the samples."""
    x: torch.Tensor
    y: torch.Tensor
    idx: List[int] = field(default_factory=list)

    def to(self, device) -> "ToyBatch":
        return ToyBatch(self.x.to(device), self.y.to(device), list(self.idx))


class ToyDataset(Dataset):
    """n samples of y = w.x + 0.5 + noise, each a pure function of its index."""

    def __init__(self, n: int, offset: int = 0):
        self.n, self.offset = n, offset
        self.seen: List[int] = []

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        self.seen.append(i)
        g = torch.Generator().manual_seed(1000 + i + self.offset)
        x = torch.randn(4, generator=g)
        y = (x * torch.tensor([1.0, -2.0, 0.5, 3.0])).sum() + 0.5 + 0.05 * torch.randn((), generator=g)
        return i, x, y


def collate(items) -> ToyBatch:
    idx, xs, ys = zip(*items)
    return ToyBatch(torch.stack(xs), torch.stack(ys), list(idx))


class ToyModel(nn.Module):
    """encoder (Linear + BatchNorm1d + ReLU + Dropout) -> head (Linear). kill_after_steps:
    SIGKILL this process at the start of training forward number kill_after_steps + 1."""

    def __init__(self, kill_after_steps: int = 0, dropout: float = 0.1):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(dropout))
        self.head = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))
        self.kill_after_steps = kill_after_steps
        self.train_calls = 0

    def forward(self, batch: ToyBatch) -> torch.Tensor:
        if self.training:
            self.train_calls += 1
            if self.kill_after_steps and self.train_calls > self.kill_after_steps:
                os.kill(os.getpid(), signal.SIGKILL)
        return self.head(self.encoder(batch.x)).squeeze(-1)

    def loss(self, output: torch.Tensor, batch: ToyBatch) -> LossOutput:
        mse = ((output - batch.y) ** 2).mean()
        return LossOutput(total=mse, parts={"mse": mse, "abs": (output - batch.y).abs().mean()}, detection=mse)


def kill_while_writing(name: str, k) -> None:
    """SIGKILL this process once the k-th atomic write of a file called ``name`` has
    written its temporary file, before the rename."""
    import opencood_ext.training.checkpoint as C
    real_replace, count = C.os.replace, [0]

    def replace(src, dst):
        if Path(dst).name == name:
            count[0] += 1
            if count[0] == int(k):
                os.kill(os.getpid(), signal.SIGKILL)
        return real_replace(src, dst)

    C.os.replace = replace  # this process only (a subprocess of the tests)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--n-train", type=int, default=12)
    ap.add_argument("--n-val", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--ckpt-every", type=int, default=0)
    ap.add_argument("--kill-after-steps", type=int, default=0)
    ap.add_argument("--kill-writing", default=None, metavar="NAME:K")
    args = ap.parse_args(argv)
    if args.kill_writing:
        kill_while_writing(*args.kill_writing.split(":"))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    import opencood_ext.training.trainer as trainer_mod
    saves = []
    real_save = trainer_mod.save_checkpoint

    def counting_save(state, paths):
        paths = list(paths)
        saves.append([Path(p).name for p in paths])
        real_save(state, paths)

    trainer_mod.save_checkpoint = counting_save
    try:
        model = ToyModel(kill_after_steps=args.kill_after_steps)
        train_set = ToyDataset(args.n_train)
        cfg = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=0.01, log_every=2, seed=3,
                          checkpoint_every_steps=args.ckpt_every or None, progress_bar=False)
        trainer = Trainer(model, train_set, ToyDataset(args.n_val, offset=500), collate, cfg, args.run_dir,
                          device="cpu")
        result = trainer.fit()
    finally:
        trainer_mod.save_checkpoint = real_save
    rank = trainer.dist.rank
    out = {"rank": rank, "world_size": trainer.dist.world_size, "history": result.history,
           "epochs_done": result.epochs_done, "global_step": result.global_step, "best_val": result.best_val,
           "seen": train_set.seen, "saves": saves, "backend": trainer.dist.backend}
    torch.save(model.state_dict(), f"{args.out}.rank{rank}.pt")
    Path(f"{args.out}.rank{rank}.json").write_text(json.dumps(out))
    from opencood_ext.training import cleanup
    cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
