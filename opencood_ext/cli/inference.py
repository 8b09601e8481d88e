"""Evaluate a trained run: AP@0.3/0.5/0.7 in both accumulation orders, bytes each
collaborator sends per frame, BEV images of detections vs ground truth.

    gencomm-infer --model_dir runs/NAME [--fusion_method no|late|early|intermediate]
                  [--split test] [--plot_every 20] [--max_frames N]
    gencomm-infer --model_dir runs/ONBOARD --dynamic m1,m3     # ego m1, then +m3
    gencomm-infer --model_dir runs/NAME --pose_noise 0.2,0.2 --drop 0.25 --latency_frames 1
    gencomm-infer --model_dir runs/NAME --checkpoint last        # or epoch_3: -> eval_intermediate_last.json
    gencomm-infer --late_of m1=runs/S1_M1 --late_of m3=runs/S1_M3 -o runs/LATE --dynamic m1,m3
                  # late fusion of single-type runs, each agent detecting with its own run

An imperfect channel: --pose_noise STD_M,STD_DEG (Gaussian on each collaborator's transmitted x, y
and yaw, the CoAlign / HEAL protocol), --drop P (each message lost with probability P),
--latency_frames K (each collaborator's data and pose come from K frames earlier, clamped at the
scenario's first frame), all seeded by --channel_seed and the frame index, so every run meets the
same channel; --wire_dtype float32|float16|int8 overrides the payload dtype.

What a type's messages carry: --blank_messages m2 --label blank_m2 evaluates with the m2
collaborators sending all-zero feature maps (they still take part), into eval_blank_m2.json;
``tools/compare.py RUN:dyn_m1+m2 RUN:blank_m2`` then gives the paired difference.

The detection area: --range X,Y evaluates x in [-X, X], y in [-Y, Y] (z bounds kept), as the
reference's inference script: the LiDAR crop, voxel grid, anchors, ground truth and the prediction
range mask all follow it (data.lidar_range). Under ``protocol: reference`` the default is the
reference's (102.4,51.2; opencood_ext/eval/detection_range.py), under native the config's range.

Which weights: best.pth (the epoch validation selected, training/selection.py; latest.pth when
validation never ran) unless --checkpoint names others: ``last`` (latest.pth, the last epoch),
``best``, ``epoch_N``; the label then ends in the name (eval_intermediate_epoch_3.json; with --dynamic
eval_dyn_m1+m2_epoch_3.json and eval_dynamic_epoch_3.json), so scoring every epoch of a run keeps each
result and never overwrites the default (best) files. Works the same on stage-1 and gencomm-onboard run folders.

Writes eval_<method>.yaml / .json (eval_dynamic.json) and bev/*.png into the run folder, and
the evaluation's stamp eval_<label>.inputs.json (its command, code and input files). --reuse skips
an evaluation whose stamp is current: the same settings, code, run weights and config, test data.
From a checkout, ``python tools/inference.py`` runs the same command.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_dir", type=Path, default=None, help="the run to evaluate (results are written there)")
    p.add_argument("--late_of", action="append", default=[], metavar="TYPE=RUN",
                   help="instead of --model_dir: late fusion of separately trained single-type runs (repeat per "
                        "type; the first is the ego's), each agent detecting with its own run; needs -o")
    p.add_argument("-o", "--out", type=Path, default=None, help="where --late_of writes its results")
    p.add_argument("--checkpoint", default=None, metavar="best|last|epoch_N",
                   help="evaluate these weights of the run: best.pth, latest.pth (the last epoch) or epoch_N.pth "
                        "(default: best.pth, else latest.pth); the label gets the name appended")
    p.add_argument("--fusion_method", default=None, help="default: the method the model was trained for")
    p.add_argument("--split", default=None, help="default: eval.split of the run's config")
    p.add_argument("--plot_every", type=int, default=None, help="BEV image every N frames (0 = none)")
    p.add_argument("--max_frames", type=int, default=None)
    p.add_argument("--dynamic", default=None, metavar="T1,T2,...",
                   help="evaluate the alliance growing in this order of agent types (paper-style table)")
    p.add_argument("--pose_noise", default=None, metavar="STD_M,STD_DEG",
                   help="Gaussian pose noise on collaborators' transmitted poses (x, y in m; yaw in deg)")
    p.add_argument("--drop", type=float, default=0.0, metavar="P", help="message loss probability")
    p.add_argument("--latency_frames", type=int, default=0, metavar="K",
                   help="collaborators' messages come from K frames earlier")
    p.add_argument("--wire_dtype", choices=["float32", "float16", "int8"], default=None)
    p.add_argument("--channel_seed", type=int, default=0)
    p.add_argument("--blank_messages", default=None, metavar="m2[,m4]",
                   help="diagnostic: collaborators of these types send all-zero feature maps (GenComm, "
                        "full-feature, STAMP, MPDA links); compare with the normal evaluation (tools/compare.py) "
                        "to see what their messages carry. Needs --label")
    p.add_argument("--label", default=None, help="name of the eval_<label>.json written (default: the fusion "
                   "method, plus the channel settings when the channel is not perfect); a plain name: no path "
                   "separator, not '..'")
    p.add_argument("--reuse", action="store_true",
                   help="do nothing when the run folder already holds this evaluation and its stamp records the "
                        "same settings, code and input files (the main job's resume rule)")
    p.add_argument("--range", default=None, metavar="X,Y",
                   help="evaluate x in [-X, X], y in [-Y, Y] metres (the reference's --range: LiDAR crop, grid, "
                        "anchors, ground truth and predictions); default: the config's range, or under protocol "
                        "reference the reference's default 102.4,51.2")
    p.add_argument("--feature_cache", type=Path, default=None, metavar="DIR",
                   help="keep what the encoder stacks compute in DIR and reuse it: the alliances of --dynamic, and "
                        "every evaluation of runs on the same stage-1 encoders, encode each test frame once; keyed by "
                        "weights and input, never another checkpoint's or frame's (opencood_ext.models.feature_cache)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from opencood_ext.cli.errors import USER_ERRORS, data_hint, report
    try:
        return _run(args)
    except USER_ERRORS as exc:
        return report(exc, data_hint(exc, skipping=False))
    except ValueError as exc:  # an unknown --fusion_method or --dynamic type, bad channel settings
        return report(exc)


def _run(args) -> int:
    from opencood_ext.eval.evaluate import evaluate
    from opencood_ext.eval.reuse import EvaluationSettings, evaluation_stamp, parse_types
    from opencood_ext.run_folder import RunFolder, check_checkpoint_name, evaluation_label
    from opencood_ext.experiment import build_dataset
    from opencood_ext.interop.runs import load_any_run  # ours, or a reference (OpenCOOD/HEAL) run folder
    from opencood_ext.runs import set_fusion
    from opencood_ext.comm.channel import ChannelConfig, parse_pose_noise
    from opencood_ext.training.checkpoint import seed_everything
    from opencood_ext.cli.errors import check_label
    from opencood_ext.eval.detection_range import evaluation_range, parse_range, range_override

    check_label(args.label)  # eval_<label>.json is written into the run folder: a plain name, never a path
    if args.checkpoint is not None:
        check_checkpoint_name(args.checkpoint)
        if args.late_of:
            raise ValueError("--checkpoint evaluates one run's named weights: not with --late_of (each run is "
                             "evaluated with its own evaluation weights)")
    given_range = parse_range(args.range)
    if args.late_of:
        from opencood_ext.runs import late_fusion_of
        if args.out is None or args.model_dir is not None:
            raise ValueError("--late_of needs -o OUT and no --model_dir")
        pairs = [item.split("=", 1) for item in args.late_of]
        if any(len(pair) != 2 for pair in pairs):
            raise ValueError(f"--late_of takes TYPE=RUN, got {args.late_of}")

        def load(overrides):
            return late_fusion_of({t: Path(r) for t, r in pairs}, pairs[0][0], overrides)
        args.model_dir = args.out
        args.model_dir.mkdir(parents=True, exist_ok=True)
    elif args.model_dir is None:
        raise ValueError("give --model_dir RUN (or --late_of TYPE=RUN ... -o OUT)")
    else:
        def load(overrides):
            return load_any_run(args.model_dir, overrides, checkpoint=args.checkpoint)
    cfg, model = load(args.overrides)
    area = evaluation_range(cfg.protocol, cfg.data.format, cfg.data.lidar_range, given_range or cfg.eval.range)
    if area is not None:  # the model is rebuilt on the new grid (its weights do not depend on the grid size)
        args.overrides = [*args.overrides, range_override(area)]
        print(f"detection range {list(area)} (" + ("--range" if given_range else "eval.range" if cfg.eval.range else
              f"protocol {cfg.protocol}: the reference's default") + f"; the config has {list(cfg.data.lidar_range)})")
        cfg, model = load(args.overrides)
    if args.fusion_method:
        set_fusion(model, args.fusion_method)
    noise_m, noise_deg = parse_pose_noise(args.pose_noise)
    channel = ChannelConfig(pose_noise_m=noise_m, pose_noise_deg=noise_deg, drop=args.drop,
                            seed=args.channel_seed)
    if args.latency_frames < 0:
        raise ValueError(f"--latency_frames must be >= 0, got {args.latency_frames}")
    model.wire_dtype = args.wire_dtype
    blank = set(parse_types(args.blank_messages))
    if blank:
        if not args.label or args.dynamic:
            raise ValueError("--blank_messages needs --label NAME (so the run's own evaluation is not overwritten) "
                             "and no --dynamic")
        unknown = sorted(blank - set(model.encoders))
        if unknown:
            raise ValueError(f"--blank_messages: types {unknown} are not in this model ({sorted(model.encoders)})")
        model.blank_message_types = blank
    split = args.split or cfg.eval.split
    max_frames = args.max_frames if args.max_frames is not None else cfg.eval.max_frames
    order = parse_types(args.dynamic)
    label = args.label or evaluation_label(model.fusion, channel, args.latency_frames, args.wire_dtype,
                                           checkpoint=args.checkpoint)
    settings = EvaluationSettings(args.model_dir, model.fusion, split, max_frames, label, channel=channel,
                                  latency_frames=args.latency_frames, wire_dtype=args.wire_dtype,
                                  blank_messages=tuple(sorted(blank)),
                                  overrides=tuple(args.overrides), dynamic=order,
                                  late_of=tuple(args.late_of), checkpoint=args.checkpoint)
    folder, stamp = RunFolder(args.model_dir), evaluation_stamp(settings, cfg)
    if args.reuse and folder.evaluation_current(settings.stamp_label, stamp):
        print(f"== {args.model_dir}: {folder.evaluation(settings.stamp_label).name} is current (same settings, "
              f"code and input files as its stamp records); not evaluated again ==")
        return 0
    folder.clear_stamp(settings.stamp_label)  # an interrupted evaluation leaves no stamp on new outputs
    if args.feature_cache is not None:  # results equal an uncached evaluation's, so the stamp leaves it out
        from opencood_ext.models.feature_cache import FeatureCache
        model.feature_cache = FeatureCache(args.feature_cache)
    seed_everything(cfg.train.seed)  # GenComm's receiver samples diffusion noise: same seed, same AP
    print(f"== {args.model_dir} on {split} ==")
    if order:
        from opencood_ext.eval.dynamic import format_dynamic, run_dynamic
        print(format_dynamic(run_dynamic(cfg, model, order, split, out_dir=args.model_dir, max_frames=max_frames,
                                         checkpoint=args.checkpoint)))
    else:
        dataset = build_dataset(cfg, split, train=False, fusion=model.fusion, latency_frames=args.latency_frames)
        result = evaluate(model, dataset, out_dir=args.model_dir,
                          plot_every=cfg.eval.plot_every if args.plot_every is None else args.plot_every,
                          max_frames=max_frames, label=label, channel=channel)
        print(result.table())
    folder.write_stamp(settings.stamp_label, stamp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
