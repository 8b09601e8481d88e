"""The generic training engine: epochs, validation, checkpoints, resume, DDP, logs.

Contract with the rest of the project
-------------------------------------
- ``model``: an ``nn.Module`` with ``forward(batch) -> output`` and
  ``loss(output, batch) -> LossOutput`` (``total``: scalar tensor to minimise,
  ``parts``: named scalar tensors for logging, ``detection``: the detection terms
  alone, what ``best.pth`` is selected on by default). The loss of a batch is taken to be a per-sample
  mean (validation weights batches by their sample count); a batch whose loss reaches no trainable
  parameter (an onboarding batch without a new-type agent) takes no optimizer step.
- ``batch``: whatever ``collate_fn`` returns; it must have ``.to(device)``
  returning the same type on ``device`` (and ``.batch_size``, its sample count,
  when it may hold fewer samples than asked for). ``None`` is a batch of bad
  frames only: with a dataset whose ``may_skip`` is True the step is left out (on
  every rank alike under DDP).
- ``train_set`` / ``val_set``: map-style ``torch.utils.data.Dataset``s
  (``val_set`` may be None: no validation, no ``best.pth``). Validation covers the
  whole split (unless ``max_val_batches``), with its random draws fixed by seed, and
  ``best.pth`` is the epoch with the lowest ``select_on`` score: :mod:`.selection`.
- ``param_filter``: None (train every parameter that requires grad), a
  :class:`~opencood_ext.training.freeze.FreezePolicy`, or ``callable(model) ->
  iterable of trainable parameters``.

Run folder (rank 0 writes; ``config.yaml`` is the CLI's; names: :class:`~opencood_ext.run_folder.RunFolder`)::

    checkpoints/{epoch_N,latest,best}.pth   see checkpoint.py; saving and resuming: resume.py
                                            (latest.pth of a finished run: its last epoch)
    tb/                                     tensorboard scalars
    train_log.jsonl                         one JSON object a line:
        {"kind": "step", "epoch", "step", "global_step", "lr", "loss", <parts>}
        {"kind": "epoch", <TrainResult.history entry>}   (val_loss, val_detection_loss, best_epoch)
        {"kind": "resume", "epoch", "step_in_epoch", "global_step"}

Epochs are numbered from 1. Resume: ``fit()`` on a run folder holding ``latest.pth`` continues from it
(after a kill at any instant the folder is made consistent first, see :mod:`.runfolder`: stale temporary
files go, a corrupt latest.pth falls back to the newest intact epoch file, log records and best.pth
follow the resume point). Each epoch's sample order is a pure function of (seed, epoch, rank, world
size), so an epoch interrupted after a mid-epoch checkpoint (``checkpoint_every_steps``) continues at the
next unseen batch; without one it restarts from its beginning; it is never skipped. With
``num_workers=0`` a resumed run reproduces the uninterrupted one bit for bit on CPU (RNG states are
restored); with workers the data order is the same but worker-side augmentation draws are not.

DDP: launch with torchrun; every rank builds the same model, the Trainer joins the process group
(:func:`~opencood_ext.training.distributed.init_distributed`), shards the data with
``DistributedSampler`` and wraps the model in ``DistributedDataParallel``. ``batch_size`` is per process. Call
``distributed.cleanup()`` at the end of the script. A non-finite loss raises
FloatingPointError on the rank that sees it (the others then stop at the
process group's timeout, ``TrainConfig.dist_timeout_s``); non-finite weights raise it before any checkpoint or
epoch record is written, so a run folder never holds NaN/Inf weights.
"""
from __future__ import annotations

import logging
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from ..models.losses import LossOutput
from . import distributed as D
from ..run_folder import RunFolder
from .checkpoint import capture_rng_state, save_checkpoint, seed_everything
from .freeze import PolicyLike, resolve_policy
from .resume import Resumable
from .runfolder import WriterLock
from .runlog import RunLog
from .selection import VAL_SEED_OFFSET, fixed_noise, score_key
from .train_config import TrainConfig

log = logging.getLogger("opencood_ext.training")


@dataclass
class TrainResult:
    """Outcome of :meth:`Trainer.fit`.

    history: one dict per completed epoch: ``epoch``, ``lr`` (during the epoch),
    ``train_loss`` + ``train_<part>`` (mean over the epoch's steps in this
    process group; a mid-epoch checkpoint carries the partial sums, so a resumed
    epoch reports the same means), ``steps``, ``threads`` (torch's intra-op threads: results depend on
    them, see :meth:`Trainer._warn_if_threads_changed`), ``time_s`` (training time of the
    epoch, the part before a mid-epoch checkpoint included), and when validated
    ``val_loss`` (total) + ``val_detection_loss`` (when the model returns it) + ``val_<part>``
    and ``best_epoch`` (the epoch ``best.pth`` holds after this one).
    best_val / best_epoch: the lowest selection score (``select_on``) and its epoch (None: never
    validated). select_on: what selected ``best.pth`` (a resumed run keeps the rule it started with).
    """
    epochs_done: int
    best_val: Optional[float]
    best_epoch: Optional[int]
    select_on: str
    history: List[dict]
    wall_time_s: float
    trainable_params: int
    global_step: int


def build_optimizer(params, cfg: TrainConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def build_scheduler(optimizer, cfg: TrainConfig):
    if cfg.lr_scheduler == "multistep":
        return torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=list(cfg.milestones), gamma=cfg.gamma)
    if cfg.lr_scheduler == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=cfg.epochs, eta_min=cfg.min_lr)
    return None


def _seed_worker(worker_id: int) -> None:
    seed = torch.initial_seed() % 2**32  # torch gives each worker base_seed + worker_id
    np.random.seed(seed)
    random.seed(seed)


class Trainer(Resumable):
    """Trains ``model`` on ``train_set``; see the module docstring for the contract.

    device: None = ``cuda:LOCAL_RANK`` when available, else CPU.
    """

    def __init__(self, model: nn.Module, train_set: Dataset, val_set: Optional[Dataset],
                 collate_fn: Callable, config: TrainConfig, run_dir, param_filter: PolicyLike = None,
                 device=None):
        if not callable(getattr(model, "loss", None)):
            raise TypeError(f"{type(model).__name__} has no loss(output, batch) method (Trainer contract)")
        if len(train_set) == 0:
            raise ValueError("Trainer: train_set is empty")
        self.config, self.run_dir = config, Path(run_dir)
        self.train_set, self.val_set, self.collate_fn = train_set, val_set, collate_fn
        self.dist = D.init_distributed(device, timeout_s=config.dist_timeout_s)
        self.device = self.dist.device
        self.model = model.to(self.device)
        self.policy = resolve_policy(param_filter)
        self.params = self.policy.apply(self.model)
        self.trainable_params = sum(p.numel() for p in self.params)
        self.forward_module: nn.Module = self.model
        if self.dist.distributed:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.forward_module = DistributedDataParallel(
                self.model, device_ids=ids, find_unused_parameters=config.find_unused_parameters)
        self.optimizer = build_optimizer(self.params, config)
        self.scheduler = build_scheduler(self.optimizer, config)
        # float16 gradients underflow without loss scaling; bf16 has float32's range (no scaler)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=config.amp == "fp16")
        self.paths = RunFolder(self.run_dir).checkpoints
        self.epoch, self.step_in_epoch, self.global_step = 0, 0, 0
        self.best_val: Optional[float] = None  # lowest selection score so far (select_on), its epoch:
        self.best_epoch: Optional[int] = None
        self.select_on: str = config.select_on  # a resumed run keeps its own (resume.py)
        self.history: List[dict] = []
        self._log: Optional[RunLog] = None
        self._lock: Optional[WriterLock] = None  # rank 0's hold on the run folder, restore() to fit()'s end
        self._acc: Optional[dict] = None  # the running epoch's sums (see _train_epoch)
        self._restored: Optional[bool] = None  # restore() ran: whether it found a resume point
        self._may_skip = bool(getattr(train_set, "may_skip", False))  # samples may be None (bad frames)
        if self.steps_per_epoch() == 0:
            raise ValueError(f"Trainer: {len(train_set)} train samples over {self.dist.world_size} process(es) "
                             f"make no full batch of {config.batch_size} (drop_last=True)")

    # ------------------------------------------------------------ checkpoints
    def _check_finite(self) -> None:
        """Refuse to go on (and to checkpoint) with NaN/Inf weights; every rank holds the same
        weights, so every rank raises alike (no rank is left waiting in a collective)."""
        bad = [k for k, v in self.model.state_dict().items() if v.is_floating_point() and not torch.isfinite(v).all()]
        if bad:
            raise FloatingPointError(
                f"{self.run_dir}: {len(bad)} model tensor(s) hold NaN/Inf after epoch {self.epoch} step "
                f"{self.step_in_epoch} (global step {self.global_step}), e.g. {', '.join(bad[:3])}; nothing saved, "
                f"{self.paths.latest.name} keeps the last finite state (lower train.lr or set train.grad_clip)")

    def _save(self, epoch_file: bool, best: bool) -> None:
        self._check_finite()
        partial = None
        if self._acc is not None:  # mid-epoch: the running sums, so the resumed epoch's means are whole
            partial = {k: dict(v) if isinstance(v, dict) else v for k, v in self._acc.items()}
            partial["time_s"] = time.time() - partial.pop("t0")
        gathered = D.all_gather_object((capture_rng_state(), partial))  # collective: every rank calls _save
        if not self.dist.is_main:
            return
        state = self._state()
        state["rng"] = [g[0] for g in gathered]
        state["partial_epoch"] = [g[1] for g in gathered] if partial is not None else None
        # latest.pth last: it is the commit point (runfolder.py)
        paths = ([self.paths.epoch(self.epoch)] if epoch_file else []) + ([self.paths.best] if best else [])
        save_checkpoint(state, paths + [self.paths.latest])
        if epoch_file and self.config.keep_epoch_checkpoints:
            self.paths.prune_epochs(self.config.keep_epoch_checkpoints)

    # ------------------------------------------------------------ data
    def _loader(self, dataset, sampler=None, batch_sampler=None, gen_seed: int = 0, drop_last=False):
        g = torch.Generator()
        g.manual_seed(gen_seed)
        kw = dict(batch_size=self.config.batch_size, sampler=sampler, drop_last=drop_last) \
            if batch_sampler is None else dict(batch_sampler=batch_sampler)
        return DataLoader(dataset, collate_fn=self.collate_fn, num_workers=self.config.num_workers,
                          worker_init_fn=_seed_worker, generator=g, pin_memory=self.device.type == "cuda", **kw)

    def steps_per_epoch(self) -> int:
        n = math.ceil(len(self.train_set) / self.dist.world_size)
        bs = self.config.batch_size
        steps = n // bs if self.config.drop_last else math.ceil(n / bs)
        cap = self.config.max_steps_per_epoch
        return min(steps, cap) if cap else steps

    # ------------------------------------------------------------ loops
    def _autocast(self):
        """``torch.autocast`` in ``config.amp``'s dtype (a no-op context in float32)."""
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.config.amp)
        return torch.autocast(self.device.type, dtype=dtype, enabled=dtype is not None)

    def _loss(self, batch) -> LossOutput:
        with self._autocast():
            out = self.forward_module(batch)
            loss = self.model.loss(out, batch)
        if not isinstance(loss, LossOutput):
            raise TypeError(f"{type(self.model).__name__}.loss must return LossOutput, got {type(loss).__name__}")
        return loss

    def _train_epoch(self, epoch: int) -> dict:
        cfg, start, total_steps = self.config, self.step_in_epoch, self.steps_per_epoch()
        sampler = D.train_sampler(self.train_set, epoch, cfg.seed, cfg.shuffle, skip=start * cfg.batch_size)
        loader = self._loader(self.train_set, sampler=sampler, drop_last=cfg.drop_last,
                              gen_seed=cfg.seed * 100003 + epoch * 1009 + self.dist.rank)
        self.policy.train_mode(self.model)
        show = cfg.progress_bar and self.dist.is_main and sys.stderr.isatty()
        bar = tqdm(total=total_steps, initial=start, desc=f"epoch {epoch}/{cfg.epochs}", disable=not show,
                   dynamic_ncols=True, leave=False)
        if self._acc is None or not start:
            self._acc = {"sums": {}, "steps": 0, "window": {}, "window_steps": 0, "t0": time.time()}
        acc = self._acc  # running sums of the epoch (and of the log window); in mid-epoch checkpoints
        sums, window = acc["sums"], acc["window"]
        for step, batch in enumerate(loader, start=start):
            if step >= total_steps:
                break
            if self._may_skip and not D.all_true(batch is not None):
                self.step_in_epoch = step + 1  # every sample of the batch (on some rank) was a bad frame
                continue
            batch = batch.to(self.device)
            loss = self._loss(batch)
            if not torch.isfinite(loss.total):
                parts = {k: v.item() for k, v in loss.parts.items()}
                raise FloatingPointError(f"non-finite loss {loss.total.item()} at epoch {epoch} step {step}: {parts}")
            self.optimizer.zero_grad(set_to_none=True)
            if loss.total.requires_grad:  # else no trainable parameter took part (onboarding: no new-type agent)
                self.scaler.scale(loss.total).backward()  # scale and unscale_ are identities without fp16
                if cfg.grad_clip:
                    self.scaler.unscale_(self.optimizer)
                    torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip)
                self.scaler.step(self.optimizer)  # skips the step when fp16 gradients overflowed
                self.scaler.update()
            self.global_step += 1
            self.step_in_epoch = step + 1
            acc["steps"] += 1
            acc["window_steps"] += 1
            for k, v in [("loss", loss.total)] + list(loss.parts.items()):
                v = v.detach().float()
                sums[k] = sums.get(k, 0.0) + v
                window[k] = window.get(k, 0.0) + v
            bar.update(1)
            if self.global_step % cfg.log_every == 0:
                means = {k: float(v) / acc["window_steps"] for k, v in window.items()}
                bar.set_postfix(loss=f"{means['loss']:.4g}")
                if self._log:
                    rec = {"epoch": epoch, "step": step + 1, "global_step": self.global_step,
                           "lr": float(self.optimizer.param_groups[0]["lr"]), **means}
                    self._log.record("step", rec, self.global_step, tb_prefix="train")
                window.clear()
                acc["window_steps"] = 0
            if cfg.checkpoint_every_steps and self.global_step % cfg.checkpoint_every_steps == 0 \
                    and step + 1 < total_steps:
                self._save(epoch_file=False, best=False)
        bar.close()
        if self.step_in_epoch < total_steps:
            raise RuntimeError(f"epoch {epoch}: the data loader ended after {self.step_in_epoch} of "
                               f"{total_steps} steps (did the dataset length change?)")
        if not acc["steps"]:
            raise RuntimeError(f"epoch {epoch}: every batch was left out (all its frames were bad and "
                               f"skip_bad_frames is set); check the dataset")
        self._acc = None
        means = D.all_reduce_means({k: float(v) for k, v in sums.items()}, float(acc["steps"]))
        return {"train_" + k if k != "loss" else "train_loss": v for k, v in means.items()} | {
            "steps": total_steps, "time_s": time.time() - acc["t0"], "threads": torch.get_num_threads()}

    @torch.no_grad()
    def validate(self) -> Dict[str, float]:
        """Sample-weighted mean validation losses over all ranks' shards: ``val_loss`` (total),
        ``val_detection_loss`` (when the model returns ``LossOutput.detection``), ``val_<part>``.

        Every batch of the split unless ``max_val_batches``; every random draw inside comes from
        generators seeded with ``seed + VAL_SEED_OFFSET + rank`` and the training run's generators
        are left as they were (:func:`~.selection.fixed_noise`): the same weights give the same
        losses in every pass, and validating does not change what training draws next."""
        if self.val_set is None:
            raise ValueError("Trainer.validate: no val_set")
        cfg = self.config
        batches = D.val_batches(len(self.val_set), cfg.val_batch_size or cfg.batch_size, cfg.max_val_batches)
        loader = self._loader(self.val_set, batch_sampler=batches, gen_seed=cfg.seed + self.dist.rank)
        was_training = self.model.training
        self.model.eval()
        sums: Dict[str, torch.Tensor] = {}
        count = 0
        with fixed_noise(cfg.seed + VAL_SEED_OFFSET + self.dist.rank, self.device):
            for ids, batch in zip(batches, loader):
                if batch is None:  # bad frames only (skip_bad_frames)
                    continue
                n = getattr(batch, "batch_size", len(ids))  # fewer than len(ids) when bad frames were left out
                batch = batch.to(self.device)
                with self._autocast():
                    loss = self.model.loss(self.model(batch), batch)
                if loss.detection is None and self.select_on == "detection_loss":
                    raise TypeError(f"{type(self.model).__name__}.loss returns no LossOutput.detection, which "
                                    f"train.select_on: detection_loss selects best.pth on; return the detection "
                                    f"terms there, or set train.select_on: total_loss")
                terms = [("loss", loss.total)] + ([("detection_loss", loss.detection)] if loss.detection is not None
                                                  else []) + list(loss.parts.items())
                for k, v in terms:
                    sums[k] = sums.get(k, 0.0) + v.detach().double() * n
                count += n
        if was_training:
            self.policy.train_mode(self.model)
        means = D.all_reduce_means({k: float(v) for k, v in sums.items()}, float(count))
        return {"val_" + k: v for k, v in means.items()}

    def _warn_if_threads_changed(self) -> None:
        """A resume under another intra-op thread count goes on, but no longer bit-exactly: CPU kernels
        reduce in another order (a 3x3 convolution's weight gradient already differs between 1 and 2
        threads), so the run ends with other weights than an uninterrupted one."""
        last = self.history[-1] if self.history else {}  # runs from before epochs recorded it: no threads
        if last.get("threads", torch.get_num_threads()) != torch.get_num_threads():
            log.warning("%s: epoch %d trained with %d intra-op thread(s), this resume has %d; the run goes on, "
                        "but its weights will differ from an uninterrupted run's in float rounding (set "
                        "OMP_NUM_THREADS=%d to resume it exactly)", self.run_dir, last["epoch"], last["threads"],
                        torch.get_num_threads(), last["threads"])

    def fit(self) -> TrainResult:
        """Train to ``config.epochs`` (resuming from ``run_dir`` when it holds latest.pth)."""
        t0, cfg = time.time(), self.config
        resumed = self.restore()
        if not resumed:
            seed_everything(cfg.seed + self.dist.rank)
        try:
            if self.dist.is_main:
                self.paths.dir.mkdir(parents=True, exist_ok=True)
                self._log = RunLog(self.run_dir, purge_step=self.global_step + 1 if resumed else None)
                if resumed:
                    self._log.record("resume", {"epoch": self.epoch, "step_in_epoch": self.step_in_epoch,
                                                "global_step": self.global_step})
                    if self.epoch < cfg.epochs:  # a finished run trains nothing more: nothing to warn of
                        self._warn_if_threads_changed()
            for epoch in range(self.epoch + 1, cfg.epochs + 1):
                lr = float(self.optimizer.param_groups[0]["lr"])
                record = {"epoch": epoch, "lr": lr, **self._train_epoch(epoch)}
                D.broadcast_buffers(self.model)  # every rank validates / saves rank 0's model
                improved = False
                if self.val_set is not None and cfg.val_every and (epoch % cfg.val_every == 0 or epoch == cfg.epochs):
                    record.update(self.validate())
                    score = record[score_key(self.select_on)]
                    improved = self.best_val is None or score < self.best_val
                    if improved:
                        self.best_val, self.best_epoch = score, epoch
                    record["best_epoch"] = self.best_epoch
                if self.scheduler is not None:
                    self.scheduler.step()
                self.epoch, self.step_in_epoch = epoch, 0
                record["global_step"] = self.global_step  # optimizer steps so far (the budget a results row states)
                self.history.append(record)
                self._check_finite()  # before the epoch record: an epoch with NaN weights is not logged as done
                if self._log:  # before the checkpoint: a resume drops it if latest.pth never got written
                    self._log.record("epoch", record, self.global_step, tb_prefix="epoch", durable=True)
                self._save(epoch_file=True, best=improved)
                if self._log:
                    log.info("epoch %d/%d  %s", epoch, cfg.epochs, "  ".join(
                        f"{k} {v:.4g}" for k, v in record.items() if k.endswith("loss") or k == "time_s"))
        finally:
            if self._log:
                self._log.close()
                self._log = None
            self._release()
        D.barrier()
        if self.dist.is_main and self.best_epoch is not None:
            log.info("best.pth: epoch %d of %d (lowest validation %s, %.4g); latest.pth: epoch %d", self.best_epoch,
                     self.epoch, self.select_on.replace("_", " "), self.best_val, self.epoch)
        return TrainResult(epochs_done=self.epoch, best_val=self.best_val, best_epoch=self.best_epoch,
                           select_on=self.select_on, history=list(self.history),
                           wall_time_s=time.time() - t0, trainable_params=self.trainable_params,
                           global_step=self.global_step)
