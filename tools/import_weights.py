#!/usr/bin/env python
"""Import a reference (HEAL / GenComm / OpenCOOD) checkpoint into a run folder our tools open.

    python tools/import_weights.py REF_RUN/net_epoch_bestval_at17.pth --config OUR.yaml -o runs/imported
    python tools/import_weights.py REF_RUN -o runs/imported     # a reference run folder: its config.yaml
                                                                # (converted) and its best/latest net_epoch
    python tools/inference.py --model_dir runs/imported

--config takes our experiment yaml or a hypes yaml (converted as by
tools/import_config.py). Every reference module must map onto ours: a module
whose structure differs (docs/interop.md) is refused, naming the reference
keys nobody took and our modules nobody filled. Writes config.yaml,
checkpoints/best.pth and import_report.json; refuses a folder where training
has started. A reference file that asks to call anything (not a plain
state_dict) is refused, naming the callable; nothing in it runs.

Training in the folder (python tools/train.py --model_dir runs/imported)
fine-tunes: it starts from the imported weights and keeps them, byte for byte,
as checkpoints/imported.pth.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gencomm  # noqa: E402,F401  (registers the GenComm link with opencood_ext)

from opencood_ext.config import ConfigError  # noqa: E402
from opencood_ext.interop.runs import (check_import_target, find_reference_checkpoint,  # noqa: E402
                                       import_weights, load_experiment_any, write_imported_run)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("reference", type=Path, help="a reference .pth state_dict, or a reference run folder")
    p.add_argument("--config", type=Path, help="our experiment yaml or a hypes yaml (default: the run "
                                               "folder's config.yaml)")
    p.add_argument("-o", "--output", type=Path, required=True, help="run folder to write")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a value of the (converted) config, e.g. --set data.root=/data/OPV2V")
    args = p.parse_args(argv)
    try:
        check_import_target(args.output)
        ckpt = find_reference_checkpoint(args.reference) if args.reference.is_dir() else args.reference
        config = args.config or (args.reference / "config.yaml" if args.reference.is_dir() else None)
        if config is None:
            raise ConfigError("give --config (our yaml or the hypes yaml the checkpoint was trained with)")
        cfg = load_experiment_any(config, args.overrides)
        model, mapping = import_weights(cfg, ckpt)
    except (ConfigError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    path = write_imported_run(cfg, model, mapping, ckpt, args.output)
    print(mapping.summary())
    print(f"wrote {path}; evaluate with: python tools/inference.py --model_dir {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
