"""Onboard new agent types into an existing alliance (stage 2), by any registered method.

    gencomm-onboard --ego runs/STAGE1_M1 --new runs/STAGE1_M3 [--new ...] -o runs/ONBOARD
                    [--method gencomm|backalign|stamp|mpda|codefilling]
                    [-y configs/sim/stage2/gencomm_m1_m3.yaml] [--epochs N] [--set train.lr=0.0005]

Every method takes stage-1 runs (any homogeneous run for BackAlign, STAMP,
MPDA and CodeFilling; a GenComm stage-1 run for GenComm). Without -y the stage-2
experiment is composed from them: the ego's settings, each new type's stack,
the method's link and its reference schedule; with -y the yaml's
``stage.method`` names the method.

Like a stage-1 run, the onboarding folder keeps best.pth (the validated epoch with the lowest
detection loss, training/selection.py) and latest.pth (the last epoch); onboarding.json records
``best_epoch`` and ``select_on``, and ``gencomm-infer --checkpoint last|epoch_N`` scores the others.

Merges the stage-1 checkpoints, freezes everything except what the method
trains for the new types (GenComm: their message extractors; frozen BatchNorm
stays in eval mode every epoch), trains with the detection loss, and prints the
trainable parameters per new type and the wall time against stage 1.
Re-running on the same -o folder resumes. -y takes a path or a shipped config's name
(:func:`opencood_ext.config_files.resolve_config`).

This module is the substrate's command and imports no method: a method joins
``ONBOARDING`` when its package is imported. ``gencomm-onboard``
(:func:`gencomm.cli.onboard`; from a checkout ``python tools/onboard.py``) imports
GenComm first, so the default method ``gencomm`` is known.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ego", type=Path, required=True, help="the receiver's stage-1 run folder")
    p.add_argument("--new", type=Path, action="append", required=True, help="a new type's stage-1 run folder")
    p.add_argument("-o", "--out", type=Path, required=True, help="run folder for the onboarding")
    p.add_argument("-y", "--hypes_yaml", type=Path, default=None, help="a stage-2 experiment yaml (optional)")
    p.add_argument("--method", default=None, help="onboarding method (default: the -y config's stage.method, "
                   "else gencomm); see opencood_ext.training.onboarding.ONBOARDING")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--feature_cache", type=Path, default=None, metavar="DIR",
                   help="keep what the frozen encoder stacks compute in DIR and reuse it (every epoch after the "
                        "first, and across methods and evaluations on the same stage-1 runs); keyed by the "
                        "weights and the input, so it never serves another checkpoint's or frame's feature "
                        "(opencood_ext.models.feature_cache)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from opencood_ext.cli.errors import USER_ERRORS, data_hint, report
    skipping = False
    try:
        from opencood_ext.config_files import resolve_config
        from opencood_ext.training.onboarding import plan_onboarding
        if args.hypes_yaml is not None:
            args.hypes_yaml = resolve_config(args.hypes_yaml)
        try:
            plan = plan_onboarding(args.ego, args.new, args.overrides, args.epochs, args.hypes_yaml, args.method)
        except ValueError as exc:  # the runs do not compose (types, stacks, method)
            return report(exc)
        skipping = plan.config.data.skip_bad_frames
        return _onboard(args, plan)
    except USER_ERRORS as exc:
        return report(exc, data_hint(exc, skipping))


def _onboard(args, plan) -> int:
    from opencood_ext.config import ConfigError, dump_config
    from opencood_ext.experiment import build_dataset, collate
    from opencood_ext.training.onboarding import build_onboarding_model, trainable_per_type
    from opencood_ext.training.runlog import training_wall_time
    from opencood_ext.training import distributed as D
    from opencood_ext.training.checkpoint import seed_everything
    from opencood_ext.training.trainer import Trainer
    from opencood_ext.run_folder import RunFolder

    seed_everything(plan.config.train.seed)  # before the model is built (parameters not taken from stage 1)
    try:
        model, policy = build_onboarding_model(plan)
    except ValueError as exc:
        raise ConfigError(f"onboarding: {exc}") from None
    cfg = plan.config
    if args.feature_cache is not None:
        from opencood_ext.models.feature_cache import FeatureCache
        model.feature_cache = FeatureCache(args.feature_cache)
    train_set = build_dataset(cfg, cfg.data.train_split, train=True)
    val_set = build_dataset(cfg, cfg.data.val_split, train=False) if cfg.train.val_every else None
    try:
        trainer = Trainer(model, train_set, val_set, collate, cfg.train, args.out, param_filter=policy)
    except ValueError as exc:
        raise ConfigError(f"onboarding: {exc}") from None
    trainer.restore()  # a rerun whose run folder does not fit fails here, before config.yaml is written
    summary = policy.summary(model)
    if D.is_main_process():
        args.out.mkdir(parents=True, exist_ok=True)
        dump_config(cfg, RunFolder(args.out).config)
    result = trainer.fit()
    if D.is_main_process():
        per_type = trainable_per_type(plan, model)
        stage1 = {t: training_wall_time(r) for t, r in {plan.ego_type: plan.ego_run, **plan.new_runs}.items()}
        # measured the way stage 1 is (its epochs' logged times), so a rerun that finds the run
        # finished, or one that resumed it, still reports the whole onboarding time
        onboard_wall = training_wall_time(args.out)
        report = {"method": plan.method.name, "ego_type": plan.ego_type, "new_types": plan.new_types,
                  "trainable_params_per_new_type": per_type, "trainable_params_total": summary.trainable,
                  "frozen_params": summary.frozen, "frozen_batchnorm_layers": len(summary.frozen_batchnorms),
                  "onboarding_wall_time_s": onboard_wall, "stage1_wall_time_s": stage1,
                  "epochs": result.epochs_done, "best_epoch": result.best_epoch, "select_on": result.select_on}
        RunFolder(args.out).onboarding_report.write_text(json.dumps(report, indent=2))
        print(f"onboarded {', '.join(plan.new_types)} into {plan.ego_type}'s alliance with {plan.method.name} "
              f"-> {args.out}")
        for t, n in per_type.items():
            print(f"  trainable parameters for {t}: {n:,} ({', '.join(plan.method.trainable(t))})")
        print(f"  frozen parameters: {summary.frozen:,}; frozen BatchNorm layers: {len(summary.frozen_batchnorms)}")
        for t, s in stage1.items():
            print(f"  stage-1 training of {t}: {s:.0f} s; onboarding: {onboard_wall:.0f} s")
        if result.best_epoch is not None:
            print(f"  best.pth: epoch {result.best_epoch} of {result.epochs_done} (lowest validation "
                  f"{result.select_on.replace('_', ' ')}); latest.pth: epoch {result.epochs_done} "
                  f"(gencomm-infer --checkpoint last)")
        if model.feature_cache is not None:
            st = model.feature_cache.stats
            print(f"  feature cache {args.feature_cache}: {st.hits} agent encodings reused, {st.misses} computed "
                  f"and kept, {st.skipped} computed and not kept (augmented egos)")
    D.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
