"""Training engine: :class:`Trainer` (epochs, validation, atomic checkpoints, resume,
DDP via torchrun, tensorboard + jsonl logs) and stage policies (:class:`FreezePolicy`)."""
from .checkpoint import CheckpointError, CheckpointPaths, load_checkpoint, load_model_state, seed_everything
from .distributed import DistInfo, barrier, cleanup, init_distributed, is_main_process
from .freeze import FreezePolicy, FreezeSummary
from ..models.losses import LossOutput
from .trainer import TrainConfig, Trainer, TrainResult

__all__ = ["Trainer", "TrainConfig", "TrainResult", "LossOutput", "FreezePolicy", "FreezeSummary",
           "CheckpointError", "CheckpointPaths", "load_checkpoint", "load_model_state", "seed_everything",
           "DistInfo", "init_distributed", "is_main_process", "barrier", "cleanup"]
