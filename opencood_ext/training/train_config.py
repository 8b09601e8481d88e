"""The ``train:`` section of an experiment: :class:`TrainConfig`."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Literal, Optional


@dataclass
class TrainConfig:
    """Training schedule and engine settings (the ``train:`` section of an experiment yaml).

    epochs: total epochs (a resumed run stops there too).
    batch_size: samples per optimizer step PER PROCESS; val_batch_size defaults to it.
    num_workers: DataLoader worker processes (0 loads in the training process).
    optimizer / lr / weight_decay / momentum (sgd only).
    lr_scheduler: None (constant), "multistep" (x gamma at each epoch in
    milestones) or "cosine" (to min_lr at the last epoch); stepped per epoch.
    grad_clip: max global L2 norm of the trainable gradients, None = off.
    log_every: steps between log lines / tensorboard points.
    val_every: validate every N epochs and after the last one; 0 = never.
    max_val_batches: per-process cap on validation batches (quick runs), None = all (the whole
    validation split: what best.pth should be selected on).
    select_on: what picks best.pth among the validated epochs (lowest wins; noise fixed by seed,
    training/selection.py): "detection_loss" = the detection terms alone (classification, box,
    direction; no camera depth or other auxiliary term), "total_loss" = the model's total loss in
    evaluation (camera depth included; GenComm's generation MSE and HEAL's occupancy term are
    training-only). latest.pth (the last epoch) is kept beside it either way.
    seed: seeds python/numpy/torch (+ rank) and the per-epoch sample order.
    shuffle / drop_last: train sample order and incomplete last batch.
    max_steps_per_epoch: cap on optimizer steps per epoch (quick runs), None = full epoch.
    checkpoint_every_steps: also write latest.pth every N global steps (mid-epoch resume).
    keep_epoch_checkpoints: keep only the newest N epoch_*.pth, None = all.
    find_unused_parameters: DDP flag for models whose trainable parameters do
    not all take part in every forward (heterogeneous agent mixes).
    progress_bar: tqdm bar on rank 0 when stderr is a terminal.
    amp: mixed precision, None = float32. "bf16": the forward pass and the loss run under
    ``torch.autocast`` in bfloat16 (GPUs since Ampere; CPUs with bf16 instructions, e.g.
    avx512_bf16 or AMX: elsewhere a CPU emulates it, slower than float32). "fp16": float16
    autocast with a gradient scaler (GPUs). Weights, optimizer state and checkpoints stay
    float32; it changes numerics, so compare AP with a float32 run before relying on it.
    dist_timeout_s: DDP only: how long a rank waits in a collective (gradient all-reduce,
    checkpoint RNG gather, validation sums) for the others. When a rank stalls (paused,
    swapping, stuck on I/O), every other rank fails after this many seconds with a
    torch.distributed error naming the timed-out operation (gloo: "Timed out waiting
    ...ms for recv operation to complete"); torchrun then stops the job with a
    ChildFailedError. Nothing is lost beyond the last checkpoint: rerun the same command
    to resume. Keep it above the longest gap between collectives (one training step, or
    rank 0 writing a checkpoint).
    """
    epochs: int = 10
    batch_size: int = 2
    val_batch_size: Optional[int] = None
    num_workers: int = 0
    optimizer: Literal["adam", "adamw", "sgd"] = "adam"
    lr: float = 1e-3
    weight_decay: float = 0.0
    momentum: float = 0.9
    lr_scheduler: Optional[Literal["multistep", "cosine"]] = None
    milestones: List[int] = field(default_factory=list)
    gamma: float = 0.1
    min_lr: float = 0.0
    grad_clip: Optional[float] = None
    log_every: int = 10
    val_every: int = 1
    max_val_batches: Optional[int] = None
    select_on: Literal["detection_loss", "total_loss"] = "detection_loss"
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = False
    max_steps_per_epoch: Optional[int] = None
    checkpoint_every_steps: Optional[int] = None
    keep_epoch_checkpoints: Optional[int] = None
    find_unused_parameters: bool = False
    progress_bar: bool = True
    dist_timeout_s: float = 600.0
    amp: Optional[Literal["bf16", "fp16"]] = None

    def __post_init__(self):
        def bad(name, rule):
            return ValueError(f"TrainConfig.{name} must be {rule}, got {getattr(self, name)!r}")
        for name in ("lr", "weight_decay", "momentum", "gamma", "min_lr", "grad_clip", "dist_timeout_s"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise bad(name, "a finite number")
        for name in ("epochs", "batch_size", "log_every"):
            if getattr(self, name) <= 0:
                raise bad(name, "> 0")
        if self.dist_timeout_s <= 0:
            raise bad("dist_timeout_s", "> 0 seconds")
        for name in ("val_batch_size", "max_val_batches", "max_steps_per_epoch", "checkpoint_every_steps",
                     "keep_epoch_checkpoints", "grad_clip"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise bad(name, "> 0 or None")
        for name in ("num_workers", "val_every", "lr", "weight_decay", "min_lr", "momentum"):
            if getattr(self, name) < 0:
                raise bad(name, ">= 0")
        if self.amp not in (None, "bf16", "fp16"):
            raise bad("amp", "None, bf16 or fp16")
        if self.select_on not in ("detection_loss", "total_loss"):
            raise bad("select_on", "detection_loss or total_loss")
        if self.optimizer not in ("adam", "adamw", "sgd"):
            raise bad("optimizer", "adam, adamw or sgd")
        if self.lr_scheduler not in (None, "multistep", "cosine"):
            raise bad("lr_scheduler", "None, multistep or cosine")
        if self.lr_scheduler == "multistep" and (not self.milestones or self.milestones != sorted(self.milestones)):
            raise bad("milestones", "a non-empty increasing list of epochs for lr_scheduler=multistep")
