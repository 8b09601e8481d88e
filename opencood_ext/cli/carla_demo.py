"""Co-simulation demo: connected vehicles drive, exchange GenComm messages every
tick, and the ego shows fused detections live. With a CARLA server it uses
CARLA; without one it runs the same loop on the built-in world.

    gencomm-demo live --model_dir RUN [--backend auto|carla|builtin] [--host H --port P]
                      [--ticks N] [--out DIR] [--latency K] [--drop P]
                      [--pose_noise_m M] [--pose_noise_deg D] [--wire_dtype float16] [--show]
                      [--set receiver.KEY=VALUE ...]
    gencomm-demo record -o DIR [--backend auto|carla|builtin] [--scenarios N] [--frames M]
                      [--split_ratio TRAIN VAL TEST] [--no_cameras] [--overwrite]

``live`` prints running AP and bytes per tick, writes a bird's-eye PNG per tick
and an animated GIF (``--out``, default RUN/live); ``--show`` also opens a
matplotlib window when a display is available. The receiver follows the run's
``receiver:`` config (bounds, budgets, ``max_age`` in seconds, the alliance key or per-sender
keys), changed with ``--set``; rejected messages are counted per rule in ``live_summary.json``.
Both worlds tick 0.05 s and show a frame every 2 ticks (0.1 s); the demo says so when it starts and
sets ``receiver.tick_s`` to the world's tick, so ``--latency 1`` makes every message 0.1 s old.
Messages travel the model's own transport, as in evaluation: the wire dtype is the run's
``model.link.wire_dtype`` (``--wire_dtype X`` is ``--set model.link.wire_dtype=X``), and the
channel adds ``--latency`` ticks, ``--drop`` loss and ``--pose_noise_m`` / ``--pose_noise_deg``.
``record`` writes OPV2V-H-format
data through the same recorder as ``gencomm-sim``. From a checkout,
``python tools/carla_demo.py`` runs the same command.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from opencood_ext.run_folder import RunFolder

log = logging.getLogger("carla_demo")


def _add_backend_args(p):
    p.add_argument("--backend", choices=["auto", "carla", "builtin"], default="auto",
                   help="auto: CARLA when a server answers, else the built-in world")
    p.add_argument("--host", default=os.environ.get("CARLA_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(os.environ.get("CARLA_PORT", "2000")))
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for a CARLA server")
    p.add_argument("--town", default="Town05")
    p.add_argument("--agents", type=int, default=3, help="connected agents")
    p.add_argument("--background", type=int, default=30, help="CARLA Traffic Manager vehicles")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no_cameras", action="store_true", help="record no camera images")


def open_world(args):
    """-> (world, backend name). ``auto`` falls back to the built-in world with a message."""
    from opencood_ext.sim.agent_types import load_agent_types
    types = load_agent_types()
    if args.backend in ("auto", "carla"):
        from opencood_ext.sim.carla_bridge import CarlaUnavailable, CarlaWorld
        try:
            world = CarlaWorld(host=args.host, port=args.port, timeout_s=args.timeout, town=args.town,
                               agent_types=types, num_agents=args.agents, seed=args.seed,
                               num_background=args.background,
                               record_cameras=not args.no_cameras)
            return world, "carla"
        except CarlaUnavailable as exc:
            if args.backend == "carla":
                raise
            print(f"[carla_demo] {exc}\n[carla_demo] no CARLA server: running the built-in world instead",
                  file=sys.stderr)
    from opencood_ext.sim.builtin import BuiltinWorld
    world = BuiltinWorld(agent_types=types, num_agents=args.agents, cameras=not args.no_cameras)
    world.reset(args.seed)
    return world, "builtin"


def _overrides(args) -> list:
    """The run's config overrides: ``--set`` items, and ``--wire_dtype`` as the key it writes."""
    if args.wire_dtype is None:
        return list(args.overrides)
    return list(args.overrides) + [f"model.link.wire_dtype={args.wire_dtype}"]


def cmd_live(args) -> int:
    config = RunFolder(args.model_dir).config
    if not config.is_file():
        print(f"error: {args.model_dir}: no {config.name}; is this a run folder written by gencomm-train?",
              file=sys.stderr)
        return 2
    # the world first: without a CARLA server (--backend carla) the user hears it within --timeout,
    # before the model loads
    world, backend = open_world(args)
    try:
        from opencood_ext.cli.errors import USER_ERRORS, report
        from opencood_ext.comm import ChannelEffects
        from opencood_ext.sim.live import LiveCooperation
        from opencood_ext.sim.live_view import LiveView
        from opencood_ext.runs import load_run
        try:
            cfg, model = load_run(args.model_dir, _overrides(args))
            if args.wire_dtype is not None and model.link is None:
                raise ValueError(f"--wire_dtype writes model.link.wire_dtype, and {args.model_dir} runs "
                                 f"{model.fusion} fusion, which sends no link payload")
            effects = ChannelEffects(pose_noise_std_m=args.pose_noise_m, pose_noise_std_deg=args.pose_noise_deg,
                                     drop_prob=args.drop, latency_ticks=args.latency, seed=args.seed)
            live = LiveCooperation(cfg, model, effects, tick_s=world.timestamp_s)
            print(f"[carla_demo] clock: timestamps count the world's {world.timestamp_s:g} s ticks; "
                  f"receiver.max_age and max_future are seconds; signing: {model.security.mode}", file=sys.stderr)
        except USER_ERRORS + (ValueError,) as exc:
            return report(exc)
        out = args.out or args.model_dir / "live"
        view = LiveView(out, cfg.data.lidar_range, show=args.show)
        return _live_loop(args, world, backend, live, view, out)
    finally:
        world.close()


def _live_loop(args, world, backend, live, view, out) -> int:
    try:
        for _ in range(args.ticks):
            frame = world.tick()
            r = live.step(frame)
            ap = live.running_ap()
            view.draw(frame, r, title=f"{backend} tick {r.tick}: AP@0.5 {ap[0.5]:.3f} AP@0.7 {ap[0.7]:.3f}")
            print(f"tick {r.tick:4d}  ego {r.ego_id}  agents {len(r.agent_ids)}  received {r.received}  "
                  f"dets {len(r.boxes):3d}  GT {len(r.gt_boxes):3d}  bytes/msg {live.bytes_per_message:9.0f}  "
                  f"running AP@0.5 {ap[0.5]:.3f} AP@0.7 {ap[0.7]:.3f}"
                  + (f"  rejected {len(r.rejected)} ("
                     + ", ".join(f"{k}: {v}" for k, v in sorted(r.rejected_counts.items())) + ")"
                     if r.rejected else ""), flush=True)
    except KeyboardInterrupt:
        print("interrupted; cleaning up", file=sys.stderr)
    animation = view.finish()
    summary = {"backend": backend, "ticks": live.ticks, "ap_global": live.running_ap(),
               "bytes_per_message": live.bytes_per_message, "frames": str(view.frames_dir),
               "animation": str(animation) if animation else None, "sent": live.effects.sent,
               "dropped": live.effects.dropped, "delivered": live.effects.delivered,
               "rejected": live.total_rejected, "rejected_reasons": dict(live.rejected_reasons),
               "authenticated": live.model.authenticated, "signing": live.model.security.mode,
               "tick_s": live.model.receiver.tick_s}
    (Path(out) / "live_summary.json").write_text(json.dumps({k: (str(v) if isinstance(v, Path) else v)
                                                             for k, v in summary.items()}, indent=2, default=str))
    print(f"frames in {view.frames_dir}; animation {animation}")
    return 0


def cmd_record(args) -> int:
    from opencood_ext.sim.recorder import record
    world, backend = open_world(args)
    try:
        res = record(world, args.out, args.scenarios, args.frames, args.seed, split_ratio=args.split_ratio,
                     write_cameras=not args.no_cameras, settings={"backend": backend},
                     overwrite=args.overwrite)
    finally:
        world.close()
    print(f"{args.out}: recorded {len(res.recorded)} scenario(s) from the {backend} backend, skipped "
          f"{len(res.skipped)} finished; splits {dict(sorted(res.splits.items()))}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    live = sub.add_parser("live", help="live cooperative detection")
    live.add_argument("--model_dir", type=Path, required=True)
    live.add_argument("--ticks", type=int, default=50)
    live.add_argument("--out", type=Path, default=None)
    live.add_argument("--latency", type=int, default=0, help="message latency in ticks")
    live.add_argument("--drop", type=float, default=0.0, help="message loss probability")
    live.add_argument("--pose_noise_m", type=float, default=0.0, help="std of x, y noise on sent poses (m)")
    live.add_argument("--pose_noise_deg", type=float, default=0.0, help="std of yaw noise on sent poses (deg)")
    live.add_argument("--wire_dtype", choices=["float32", "float16", "int8"], default=None,
                      help="the link's payload dtype: writes model.link.wire_dtype (default: the run's)")
    live.add_argument("--show", action="store_true", help="also open a live matplotlib window")
    live.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                      help="override the run's config, e.g. the receiver's bounds (max_age in seconds) and "
                           "keys: --set receiver.max_age=0.5 --set receiver.key_env=GENCOMM_ALLIANCE_KEY")
    _add_backend_args(live)
    rec = sub.add_parser("record", help="record OPV2V-H-format data")
    rec.add_argument("-o", "--out", type=Path, required=True)
    rec.add_argument("--split_ratio", type=float, nargs=3, default=(0.6, 0.2, 0.2),
                     metavar=("TRAIN", "VAL", "TEST"))
    rec.add_argument("--frames", type=int, default=20)
    rec.add_argument("--scenarios", type=int, default=1)
    rec.add_argument("--overwrite", action="store_true",
                     help="record again the finished scenarios of OUT recorded with other settings (another "
                          "backend, seed, ...); default: refuse")
    _add_backend_args(rec)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from opencood_ext.sim.carla_bridge import CarlaUnavailable
    try:
        return cmd_live(args) if args.cmd == "live" else cmd_record(args)
    except CarlaUnavailable as exc:  # --backend carla and no server: the message alone, no traceback
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
