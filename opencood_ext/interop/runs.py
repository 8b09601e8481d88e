"""What the tools call: load either kind of config, open either kind of run folder, write an imported run.

A reference run folder (OpenCOOD / HEAL / GenComm training output) holds the
hypes ``config.yaml`` it was trained with and ``net_epoch*.pth`` state_dicts;
:func:`load_any_run` opens it like one of ours, converting the config and
mapping the weights (strictly: a module whose structure differs is refused).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence, Tuple

from ..config import dump_config
from ..experiment import ExperimentConfig, build_model, load_experiment
from ..models.detector import CooperativeDetector
from ..run_folder import RunFolder
from ..runs import load_run
from ..training.checkpoint import FORMAT_VERSION, save_checkpoint
from .hypes import Conversion, convert_hypes
from .hypes_reader import is_hypes, read_yaml
from .weights import WeightImportError, WeightMapping, import_reference_state, read_reference_checkpoint

def convert_if_hypes(path, echo: bool = True, remap_to: Optional[Path] = None) -> Optional[Conversion]:
    """The conversion of ``path`` when it is a hypes yaml (printed when ``echo``), else None."""
    data, dups = read_yaml(Path(path))
    if not is_hypes(data):
        return None
    conv = convert_hypes(data, Path(path), remap_to=remap_to, duplicates=dups)
    if echo:
        print(f"{path} is an OpenCOOD/HEAL hypes yaml; converted config:\n{conv.yaml()}{conv.report()}")
    return conv


def load_experiment_any(path, overrides: Sequence[str] = (), echo: bool = True) -> ExperimentConfig:
    """Our experiment yaml, or a hypes yaml converted on the fly (printed when ``echo``)."""
    conv = convert_if_hypes(path, echo)
    return load_experiment(path, overrides) if conv is None else conv.experiment(overrides)


def find_reference_checkpoint(run_dir) -> Path:
    """``net_epoch_bestval_at<N>.pth`` of the highest N, else ``net_epoch<N>.pth`` of the highest N."""
    found = RunFolder(run_dir).reference_weights()
    if not found:
        raise FileNotFoundError(f"{run_dir}: no net_epoch*.pth (a reference run folder holds its weights there)")
    return found[0]


def import_weights(cfg: ExperimentConfig, checkpoint, partial: bool = False) -> Tuple[CooperativeDetector,
                                                                                      WeightMapping]:
    """Build our model for ``cfg`` and load the reference ``checkpoint`` into it."""
    model = build_model(cfg)
    mapping = import_reference_state(read_reference_checkpoint(checkpoint), model, partial=partial)
    model.load_state_dict(mapping.state, strict=not partial)
    return model, mapping


def load_any_run(run_dir, overrides: Sequence[str] = (), echo: bool = True,
                 checkpoint: Optional[str] = None) -> Tuple[ExperimentConfig, CooperativeDetector]:
    """One of our run folders, or a reference one (config converted, weights mapped), in eval mode.
    checkpoint: best, last or epoch_N of one of our runs (:meth:`CheckpointPaths.named`)."""
    cfg_path = RunFolder(run_dir).config
    conv = convert_if_hypes(cfg_path, echo) if cfg_path.exists() else None
    if conv is None:
        return load_run(run_dir, overrides, checkpoint)
    if checkpoint is not None:
        raise ValueError(f"{run_dir}: --checkpoint {checkpoint} names this project's checkpoint files; a reference "
                         f"run folder is evaluated with the net_epoch*.pth find_reference_checkpoint picks")
    cfg = conv.experiment(overrides)
    ckpt = find_reference_checkpoint(run_dir)
    try:
        model, mapping = import_weights(cfg, ckpt)
    except WeightImportError as exc:
        raise WeightImportError(f"{ckpt}: {exc}") from None
    if echo:
        print(f"weights from {ckpt}:\n{mapping.summary()}")
    model.eval()
    return cfg, model


def check_import_target(run_dir) -> None:
    """Refuse (:class:`WeightImportError`, one line) an output folder where training has
    started: importing would overwrite its config.yaml and best.pth. A folder holding only an
    earlier import (its best.pth) may be imported into again."""
    paths = RunFolder(run_dir).checkpoints
    started = [p for p in [paths.latest, paths.imported, *paths.epoch_files().values()] if p.is_file()]
    if started:
        raise WeightImportError(f"{run_dir}: training has started in this run folder ({started[0].name}); "
                                "importing would overwrite its config.yaml and best.pth. Give another -o")


def write_imported_run(cfg: ExperimentConfig, model: CooperativeDetector, mapping: WeightMapping, source,
                       run_dir) -> Path:
    """A run folder our tools open: config.yaml, checkpoints/best.pth (atomic), import_report.json.

    Training in the folder (tools/train.py --model_dir) starts from these weights and keeps
    the file, byte for byte, as checkpoints/imported.pth (see training/runfolder.py)."""
    folder = RunFolder(run_dir)
    folder.root.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, folder.config)
    path = folder.checkpoints.best
    save_checkpoint({"format_version": FORMAT_VERSION, "model": model.state_dict(),
                     "imported_from": str(source)}, [path])
    report = {"source": str(source), "mapped": mapping.matched, "not_mapped": mapping.unmatched,
              "unused_reference_keys": mapping.unused, "dropped_unread_reference_keys": mapping.dropped}
    folder.import_report.write_text(json.dumps(report, indent=1))
    return path
