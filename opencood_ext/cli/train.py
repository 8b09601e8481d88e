"""Train a cooperative detector.

    gencomm-train -y configs/sim/m1_none.yaml
    gencomm-train -y opv2v_h/gencomm_stage1_m1 --dry_run               # a shipped config by name
    gencomm-train --model_dir runs/NAME                                # resume from latest.pth
    gencomm-train --model_dir runs/IMPORTED                            # fine-tune imported weights
    torchrun --nproc_per_node=2 --no-python gencomm-train -y CONFIG    # DDP (gloo on CPU, nccl on GPU)

From a checkout, ``python tools/train.py`` (also under torchrun) runs the same command.

The run folder holds the resolved ``config.yaml``, ``checkpoints/`` (every epoch,
``latest.pth``, ``best.pth``; written atomically), tensorboard scalars in ``tb/``
and ``train_log.jsonl``. A folder written by tools/import_weights.py trains from
its imported weights, kept as ``checkpoints/imported.pth``. A resume whose
checkpoint does not fit the model stops with one line (exit 2) and changes no file.

``-y`` takes a file or a shipped config's name (``opencood_ext.config_files``), from any directory.
``--dry_run`` builds the config and the model, prints the parameter counts (total and trainable)
and exits 0 without reading data or writing anything.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from opencood_ext.config import ConfigError, config_error, dump_config, locate_config
from opencood_ext.run_folder import RunFolder


def build_parser() -> argparse.ArgumentParser:
    """The command's parser (built without running anything: the flag-style test walks it)."""
    p = argparse.ArgumentParser(prog="gencomm-train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-y", "--hypes_yaml", help="experiment yaml, or a shipped config's name such as "
                                              "opv2v_h/gencomm_stage1_m1 (required unless --model_dir resumes)")
    p.add_argument("--model_dir", type=Path, help="run folder: resume it, or create it for a new run")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set train.epochs=2 (repeatable)")
    p.add_argument("--runs_root", type=Path, default=Path("runs"), help="where new run folders go")
    p.add_argument("--dry_run", action="store_true",
                   help="build the config and model, print parameter counts, exit (no data read, nothing written)")
    return p


def parse_args(argv=None):
    return build_parser().parse_args(argv)


def main(argv=None) -> int:
    """Exit status 0, or 2 with one line on stderr for a config, data or checkpoint error."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from opencood_ext.cli.errors import USER_ERRORS, data_hint, report
    cfg = None
    try:
        cfg = _load_config(args)
        return _dry_run(cfg) if args.dry_run else _train(args, cfg)
    except USER_ERRORS as exc:
        return report(exc, data_hint(exc, bool(cfg and cfg.data.skip_bad_frames)))


def _load_config(args):
    from opencood_ext.experiment import load_experiment
    from opencood_ext.interop.runs import load_experiment_any  # ours, or an OpenCOOD/HEAL hypes yaml
    resume_cfg = RunFolder(args.model_dir).config if args.model_dir else None
    if resume_cfg is not None and resume_cfg.exists():
        if args.hypes_yaml:
            logging.info("resuming %s: using its saved config.yaml, not %s", args.model_dir, args.hypes_yaml)
        return load_experiment(resume_cfg, args.overrides)
    if args.hypes_yaml:
        try:
            return load_experiment_any(locate_config(args.hypes_yaml), args.overrides)
        except ConfigError:
            raise
        except ValueError as exc:  # a hypes yaml the importer cannot convert
            raise ConfigError(f"{args.hypes_yaml}: {exc}") from None
    raise ConfigError("give -y CONFIG, or --model_dir of a run that has config.yaml")


def _dry_run(cfg) -> int:
    """Build the model of ``cfg`` and print its parameter counts (the trainer's trainable set)."""
    from opencood_ext.eval.flops import count_parameters
    from opencood_ext.experiment import build_model
    from opencood_ext.training.freeze import resolve_policy
    try:
        model = build_model(cfg)
    except (TypeError, ValueError) as exc:  # a spec the registry refuses
        raise config_error(cfg, ("model",), exc) from None
    resolve_policy(None).apply(model)  # what Trainer does with gencomm-train's (absent) param filter
    total, trainable = count_parameters(model), count_parameters(model, trainable_only=True)
    print(f"{cfg.name}: {total:,} parameters, {trainable:,} trainable (dry run: no data read, nothing written)")
    return 0


def _train(args, cfg) -> int:
    from opencood_ext.experiment import build_dataset, build_model, collate
    from opencood_ext.training import distributed as D
    from opencood_ext.training.checkpoint import seed_everything
    from opencood_ext.training.trainer import Trainer

    run_dir = args.model_dir or args.runs_root / f"{cfg.name}_{time.strftime('%Y_%m_%d_%H_%M_%S')}"
    seed_everything(cfg.train.seed)  # before anything draws: model init (the same on every rank), datasets
    model = build_model(cfg)
    train_set = build_dataset(cfg, cfg.data.train_split, train=True)
    val_set = build_dataset(cfg, cfg.data.val_split, train=False) if cfg.train.val_every else None
    try:
        trainer = Trainer(model, train_set, val_set, collate, cfg.train, run_dir)
    except ValueError as exc:  # e.g. no full batch in the train split
        raise config_error(cfg, ("train",), exc) from None
    trainer.restore()  # a resume that does not fit fails here, before config.yaml is written
    if D.is_main_process():
        run_dir.mkdir(parents=True, exist_ok=True)
        dump_config(cfg, RunFolder(run_dir).config)
        logging.info("run folder %s; %d train / %s val samples; %d trainable parameters",
                     run_dir, len(train_set), len(val_set) if val_set is not None else "no", trainer.trainable_params)
    result = trainer.fit()
    if D.is_main_process():
        logging.info("done: %d epochs, %.1f s; best.pth: epoch %s (validation %s %s); latest.pth: epoch %d",
                     result.epochs_done, result.wall_time_s, result.best_epoch, result.select_on.replace("_", " "),
                     result.best_val, result.epochs_done)
        print(run_dir)
    D.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
