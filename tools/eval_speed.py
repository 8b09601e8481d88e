#!/usr/bin/env python
"""Evaluation time per test frame, this checkout against an earlier commit, side by side in one
process (docs/performance.md, "Evaluation cost").

    python tools/eval_speed.py --before COMMIT [--fusion none] [--frames N] [--repeat R]
        [--set data.root=...] RUN [RUN ...]

``COMMIT``'s ``opencood_ext/eval/evaluate.py`` and ``visibility.py``, the OPV2V reader's agent-yaml
loader and point-cloud NaN check, and the voxeliser's call, are loaded next to the current ones. Each run is
evaluated with the current code and with those, alternately, ``R`` times each, after one warm-up
evaluation that fills a feature cache both use (as the main job's evaluations find it). Each
evaluation writes its results (and a BEV image every ``eval.plot_every`` frames, as the run's
config says) to a temporary folder. Wall and CPU time (the process's, all threads) are summed over
the repeats, for the whole evaluation and for what it spends outside ``model.predict`` (reading,
the visibility split, metrics, plots: what changed; the model is the same code in both). The tool
prints both per frame and their ratios, and stops with an error if the two evaluations' JSON
differ in anything but times and paths. On a shared machine only the ratios mean something.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _old_module(commit: str, path: str, name: str, folder: Path):
    """``path`` at ``commit`` imported as module ``name`` (a sibling of the current one, so its
    relative imports resolve to the current package)."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:{path}"], check=True,
                            capture_output=True, text=True).stdout
    file = folder / f"{name.rsplit('.', 1)[1]}.py"
    file.write_text(source)
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _comparable(result: dict, out_dir: Path) -> str:
    """The eval JSON without its times, paths made relative to the folder it was written to."""
    d = dict(result)
    d.pop("seconds_per_frame")
    return json.dumps(d, sort_keys=True).replace(str(out_dir), "OUT")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--before", required=True, help="the commit to compare with")
    p.add_argument("--frames", type=int, default=None, help="test frames per evaluation (default: all)")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--fusion", default=None, help="evaluate with this fusion method (default: the run's own)")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    args = p.parse_args(argv)

    import torch
    import gencomm  # noqa: F401  (registers GenComm's link)
    import opencood_ext.data.formats.opv2v as opv2v
    from opencood_ext.eval import evaluate as new_eval
    from opencood_ext.experiment import build_dataset
    from opencood_ext.interop.runs import load_any_run
    from opencood_ext.models.feature_cache import FeatureCache
    from opencood_ext.runs import set_fusion

    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="speed-"))
    (tmp / "old").mkdir()
    old_io = _old_module(args.before, "opencood_ext/data/formats/opv2v_io.py",
                         "opencood_ext.data.formats._before_opv2v_io", tmp / "old")
    old_vis = _old_module(args.before, "opencood_ext/eval/visibility.py", "opencood_ext.eval._before_visibility",
                          tmp / "old")
    old_eval = _old_module(args.before, "opencood_ext/eval/evaluate.py", "opencood_ext.eval._before_evaluate",
                           tmp / "old")
    old_faults = _old_module(args.before, "opencood_ext/data/faults.py", "opencood_ext.data._before_faults",
                             tmp / "old")
    old_vox = _old_module(args.before, "opencood_ext/data/voxelize.py", "opencood_ext.data._before_voxelize",
                          tmp / "old")
    old_eval.visibility_groups = old_vis.visibility_groups
    from opencood_ext.data.voxelize import Voxelizer
    new_voxelize = Voxelizer.__call__
    new_yaml, new_finite = opv2v.load_agent_yaml, opv2v.drop_nonfinite
    for run in args.runs:
        cfg, model = load_any_run(run, args.overrides, echo=False)
        if args.fusion:
            set_fusion(model, args.fusion)
        model.feature_cache = FeatureCache(tmp / "features")
        dataset = build_dataset(cfg, cfg.eval.split, train=False, fusion=model.fusion)
        in_predict = [0.0, 0.0]  # wall, CPU seconds inside model.predict (the same code in both)
        predict = model.predict

        def timed_predict(*a, **k):
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                return predict(*a, **k)
            finally:
                in_predict[0] += time.perf_counter() - t0
                in_predict[1] += time.process_time() - c0

        model.predict = timed_predict
        n = len(dataset) if args.frames is None else min(args.frames, len(dataset))

        def one(which: str, k: int):
            old = which == "before"
            opv2v.load_agent_yaml = old_io.load_agent_yaml if old else new_yaml
            opv2v.drop_nonfinite = old_faults.drop_nonfinite if old else new_finite
            Voxelizer.__call__ = old_vox.Voxelizer.__call__ if old else new_voxelize
            out = tmp / run.name / f"{which}{k}"
            torch.manual_seed(cfg.train.seed)
            in_predict[:] = [0.0, 0.0]
            t0, c0 = time.perf_counter(), time.process_time()
            res = (old_eval if old else new_eval).evaluate(model, dataset, out_dir=out, plot_every=cfg.eval.plot_every,
                                                          max_frames=n, label="speed", progress=False)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            return (wall, cpu, wall - in_predict[0], cpu - in_predict[1]), _comparable(res.to_json(), out)

        _, reference = one("after", 0)  # warm-up: the feature cache, the yaml memo
        spent = {"before": [0.0] * 4, "after": [0.0] * 4}
        for k in range(1, args.repeat + 1):
            for which in ("before", "after") if k % 2 else ("after", "before"):
                seconds, got = one(which, k)
                if got != reference:
                    raise SystemExit(f"{run}: the {which} evaluation's results differ from the warm-up's")
                spent[which] = [a + b for a, b in zip(spent[which], seconds)]
        per = [{w: v[i] / (args.repeat * n) for w, v in spent.items()} for i in range(4)]
        print(f"{run.name} ({model.fusion}), {n} frames x {args.repeat}, seconds per frame before -> after (ratio); "
              f"same results")
        for name, (wall, cpu) in (("whole evaluation", per[:2]), ("outside model.predict", per[2:])):
            print(f"  {name:<22} wall {wall['before']:.3f} -> {wall['after']:.3f} "
                  f"({wall['after'] / wall['before']:.2f}x), CPU {cpu['before']:.3f} -> {cpu['after']:.3f} ({cpu['after'] / cpu['before']:.2f}x)")
        model.predict = predict
    opv2v.load_agent_yaml, opv2v.drop_nonfinite, Voxelizer.__call__ = new_yaml, new_finite, new_voxelize
    return 0


if __name__ == "__main__":
    sys.exit(main())
