#!/usr/bin/env python
"""Evaluate a trained run: AP@0.3/0.5/0.7 in both accumulation orders, bytes each
collaborator sends per frame, BEV images of detections vs ground truth.

    python tools/inference.py --model_dir runs/NAME [--fusion_method no|late|early|intermediate]
                              [--split test] [--plot_every 20] [--max_frames N]
    python tools/inference.py --model_dir runs/ONBOARD --dynamic m1,m3     # ego m1, then +m3

Writes eval_<method>.yaml / .json (eval_dynamic.json) and bev/*.png into the run folder.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gencomm  # noqa: E402,F401  (registers the GenComm link with opencood_ext)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_dir", type=Path, required=True)
    p.add_argument("--fusion_method", default=None, help="default: the method the model was trained for")
    p.add_argument("--split", default=None, help="default: eval.split of the run's config")
    p.add_argument("--plot_every", type=int, default=None, help="BEV image every N frames (0 = none)")
    p.add_argument("--max_frames", type=int, default=None)
    p.add_argument("--dynamic", default=None, metavar="T1,T2,...",
                   help="evaluate the alliance growing in this order of agent types (paper-style table)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from opencood_ext.eval.evaluate import evaluate
    from opencood_ext.experiment import build_dataset
    from opencood_ext.interop.runs import load_any_run  # ours, or a reference (OpenCOOD/HEAL) run folder
    from opencood_ext.runs import set_fusion

    try:
        cfg, model = load_any_run(args.model_dir, args.overrides)
        if args.fusion_method:
            set_fusion(model, args.fusion_method)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    split = args.split or cfg.eval.split
    max_frames = args.max_frames if args.max_frames is not None else cfg.eval.max_frames
    if args.dynamic:
        from opencood_ext.eval.dynamic import format_dynamic, run_dynamic
        order = [t.strip() for t in args.dynamic.split(",") if t.strip()]
        try:
            rows = run_dynamic(cfg, model, order, split, out_dir=args.model_dir, max_frames=max_frames)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"== {args.model_dir} on {split} ==")
        print(format_dynamic(rows))
        return 0
    dataset = build_dataset(cfg, model, split, train=False)
    result = evaluate(model, dataset, out_dir=args.model_dir,
                      plot_every=cfg.eval.plot_every if args.plot_every is None else args.plot_every,
                      max_frames=max_frames,
                      label=model.fusion)
    print(f"== {args.model_dir} on {split} ==")
    print(result.table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
