"""Model selection: which validation score picks ``best.pth``, and validation noise fixed by seed.

Rules (the Trainer applies them, :meth:`~opencood_ext.training.trainer.Trainer.validate`):

- validation covers the whole validation split unless ``train.max_val_batches`` caps it;
- every random draw of a validation pass (GenComm's diffusion noise, any sampling a model does in
  eval mode) comes from generators seeded with ``train.seed + VAL_SEED_OFFSET + rank``, so two
  passes over the same weights give the same losses and two epochs' scores differ only by their
  weights; the generators' states from before the pass are restored after it, so validating (or
  not) leaves the training run's random stream exactly as it was;
- ``best.pth`` is the epoch with the lowest score: ``train.select_on: detection_loss`` (default)
  scores the detection terms alone (:attr:`LossOutput.detection`), ``total_loss`` the model's total
  loss in evaluation (auxiliary terms it computes there, such as camera depth, included).

Each validated epoch's record (``train_log.jsonl``, checkpoint history) holds ``val_loss`` (total),
``val_detection_loss`` (when the model returns it), the parts, and ``best_epoch``: the epoch
``best.pth`` holds after that epoch.
"""
from __future__ import annotations

import random
from contextlib import contextmanager
from typing import Iterator, List, Optional

import numpy as np
import torch

SELECT_ON = ("detection_loss", "total_loss")
SCORE_KEY = {"detection_loss": "val_detection_loss", "total_loss": "val_loss"}
VAL_SEED_OFFSET = 104729  # validation's generators: train.seed + this + rank, apart from training's seeds
LEGACY_SELECT_ON = "total_loss"  # what runs written before train.select_on selected on


@contextmanager
def fixed_noise(seed: int, device: torch.device) -> Iterator[None]:
    """Within the block python ``random``, numpy's global generator, torch's CPU generator and
    (on a CUDA ``device``) that device's generator are seeded with ``seed``; on exit all of them
    are back in the state they had on entry, whatever was drawn inside."""
    py_state, np_state = random.getstate(), np.random.get_state()
    cuda = device.type == "cuda"
    index = device.index if device.index is not None else (torch.cuda.current_device() if cuda else None)
    try:
        with torch.random.fork_rng(devices=[index] if cuda else [], device_type="cuda"):
            random.seed(seed)
            np.random.seed(seed % 2**32)
            torch.default_generator.manual_seed(seed)
            if cuda:
                with torch.cuda.device(index):
                    torch.cuda.manual_seed(seed)
            yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)


def score_key(select_on: str) -> str:
    """The epoch-record key ``select_on`` compares (``val_detection_loss`` or ``val_loss``)."""
    if select_on not in SCORE_KEY:
        raise ValueError(f"train.select_on must be one of {list(SELECT_ON)}, got {select_on!r}")
    return SCORE_KEY[select_on]


def recorded_best_epoch(history: List[dict], best_val: Optional[float]) -> Optional[int]:
    """The epoch ``best.pth`` holds according to a checkpoint's ``history``: the newest validated
    record's ``best_epoch``; for histories written before it existed, the newest epoch whose
    ``val_loss`` equals ``best_val`` (those runs selected on the total)."""
    for h in reversed(history):
        if h.get("best_epoch") is not None:
            return int(h["best_epoch"])
    if best_val is None:
        return None
    hits = [h["epoch"] for h in history if h.get("val_loss") == best_val]
    return hits[-1] if hits else None
