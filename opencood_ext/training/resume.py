"""The Trainer's resume side: what a checkpoint holds of a training run, and how a run takes
up again from its run folder's resume point (or starts from imported weights).

:class:`Resumable` is a base of :class:`~opencood_ext.training.trainer.Trainer`; it reads the
attributes the Trainer sets up (``model``, ``optimizer``, ``scheduler``, ``scaler``, ``config``,
``dist``, ``run_dir``, the counters ``epoch`` / ``step_in_epoch`` / ``global_step``, ``best_val`` /
``best_epoch`` / ``select_on`` (model selection, :mod:`.selection`), ``history`` and the running epoch
sums ``_acc``). What it does to the folder before loading (find
the resume point, clean up after a kill, the one-writer lock) is :mod:`.runfolder`'s; the checkpoint
format is :mod:`.checkpoint`'s. Saving stays with the training loop (``Trainer._save``), which
decides when.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Optional

from . import distributed as D
from .checkpoint import (FORMAT_VERSION, CheckpointError, check_optimizer_fits, check_weights_fit, restore_rng_state,
                         seed_everything)
from .runfolder import WriterLock, prepare_run_folder
from .selection import LEGACY_SELECT_ON, recorded_best_epoch

log = logging.getLogger("opencood_ext.training")


class Resumable:
    """Checkpoint state and resume of a :class:`~opencood_ext.training.trainer.Trainer` (module docstring)."""

    _lock: Optional[WriterLock] = None
    _restored: Optional[bool] = None

    def _state(self) -> dict:
        return {"format_version": FORMAT_VERSION, "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict() if self.scheduler else None,
                "grad_scaler": self.scaler.state_dict() if self.scaler.is_enabled() else None,
                "epoch": self.epoch, "step_in_epoch": self.step_in_epoch, "global_step": self.global_step,
                "best_val": self.best_val, "history": list(self.history),
                "world_size": self.dist.world_size, "batch_size": self.config.batch_size,
                "config": {**dataclasses.asdict(self.config), "select_on": self.select_on}}  # the run's own rule

    def restore(self) -> bool:
        """Load the run folder's resume point (if any) into model, optimizer, scheduler,
        counters and RNG; True when there was one. Without one, a folder holding imported
        weights (tools/import_weights.py) gives the model its starting weights (fine-tuning;
        still False: a fresh run). ``fit()`` calls it; call it earlier to find out whether the
        run folder fits this model before writing anything (tools/train.py does, before it
        saves config.yaml). A checkpoint that does not fit raises a one-line
        :class:`CheckpointError` naming the file and the keys, and leaves every file of the
        folder as it was: the clean-up after a kill (runfolder.py) runs only once the
        checkpoint has loaded. Idempotent."""
        if self.dist.is_main and self._lock is None:
            self._lock = WriterLock(self.run_dir)  # RunFolderBusy while another process trains here
        if self._restored is None:
            try:
                self._restored = self._resume()
            except BaseException:
                self._release(restore=True)
                raise
        return self._restored

    def _release(self, restore: bool = False) -> None:
        if self._lock is not None:
            self._lock.release(restore=restore)
            self._lock = None

    def _load_states(self, found, imported) -> None:
        """prepare_run_folder's check: load the resume point (or the imported weights) into the
        model, optimizer, scheduler and scaler, raising a one-line CheckpointError when any of
        it does not fit. Runs before any file of the folder changes."""
        if found is None:
            if imported is not None:
                state, path = imported
                check_weights_fit(self.model, state["model"], path)
                self.model.load_state_dict(state["model"])
                if self.dist.is_main:
                    log.info("starting from the imported weights in %s (%s)", path,
                             state.get("imported_from", "imported"))
            return
        state, path = found
        check_weights_fit(self.model, state["model"], path)
        check_optimizer_fits(self.optimizer, state["optimizer"], path)
        self.model.load_state_dict(state["model"])
        try:
            self.optimizer.load_state_dict(state["optimizer"])
            if self.scheduler is not None and state["scheduler"] is not None:
                self.scheduler.load_state_dict(state["scheduler"])
            if self.scaler.is_enabled() and state.get("grad_scaler"):
                self.scaler.load_state_dict(state["grad_scaler"])
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{path}: field 'optimizer'/'scheduler' does not fit this run "
                                  f"(different trainable parameters or scheduler?): {exc}") from None

    def _resume(self) -> bool:
        found, _ = prepare_run_folder(self.run_dir, map_location=self.device, main=self.dist.is_main,
                                      check=self._load_states)
        if found is None:
            return False
        state, path = found
        self.epoch, self.step_in_epoch = state["epoch"], state["step_in_epoch"]
        self.global_step, self.best_val = state["global_step"], state["best_val"]
        self.history = list(state["history"])
        self.best_epoch = recorded_best_epoch(self.history, self.best_val)
        now = dataclasses.asdict(self.config)
        changed = sorted(k for k in now if k not in ("epochs", "select_on") and state["config"].get(k) != now[k])
        if changed and self.dist.is_main:
            log.warning("resuming %s with changed train settings: %s", path, changed)
        self.select_on = state["config"].get("select_on", LEGACY_SELECT_ON)  # best_val's scale: the run's own rule
        if self.select_on != self.config.select_on and self.dist.is_main:
            log.warning("%s: this run selects best.pth on its %s, as it started (train.select_on %s applies to "
                        "new run folders)", path, self.select_on.replace("_", " "), self.config.select_on)
        same_layout = (state["world_size"] == self.dist.world_size and state["batch_size"] == self.config.batch_size
                       and state["config"].get("max_steps_per_epoch") == self.config.max_steps_per_epoch)
        if self.step_in_epoch and not same_layout:
            log.warning("%s: world size / batch size changed mid-epoch; epoch %d restarts from its beginning",
                        path, self.epoch + 1)
            self.step_in_epoch = 0
        partial = state.get("partial_epoch")
        if self.step_in_epoch and partial and len(partial) == self.dist.world_size:
            self._acc = dict(partial[self.dist.rank])
            self._acc["t0"] = time.time() - self._acc.pop("time_s")
        if len(state["rng"]) == self.dist.world_size:
            restore_rng_state(state["rng"][self.dist.rank])
        else:
            seed_everything(self.config.seed + self.dist.rank + self.global_step)
        return True
