"""Import a reference (HEAL / GenComm / OpenCOOD) checkpoint into a run folder our tools open.

    gencomm-import-weights REF_RUN/net_epoch_bestval_at17.pth --config OUR.yaml -o runs/imported
    gencomm-import-weights REF_RUN -o runs/imported     # a reference run folder: its config.yaml
                                                        # (converted) and its best/latest net_epoch
    gencomm-infer --model_dir runs/imported

--config takes our experiment yaml or a hypes yaml (converted as by
gencomm-import-config). Every reference module must map onto ours: a module
whose structure differs (docs/interop.md) is refused, naming the reference
keys nobody took and our modules nobody filled. Writes config.yaml,
checkpoints/best.pth and import_report.json; refuses a folder where training
has started. A reference file that asks to call anything (not a plain
state_dict) is refused, naming the callable; nothing in it runs.

Training in the folder (gencomm-train --model_dir runs/imported)
fine-tunes: it starts from the imported weights and keeps them, byte for byte,
as checkpoints/imported.pth. ``python tools/import_weights.py`` in a checkout runs the same
command; bad input is one line on stderr, exit status 2.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from opencood_ext.cli.errors import USER_ERRORS, report
from opencood_ext.config import ConfigError, locate_config
from opencood_ext.run_folder import RunFolder


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gencomm-import-weights", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("reference", type=Path, help="a reference .pth state_dict, or a reference run folder")
    p.add_argument("--config", help="our experiment yaml (a file or a shipped config's name) or a hypes yaml "
                                    "(default: the reference run folder's config)")
    p.add_argument("-o", "--output", type=Path, required=True, help="run folder to write")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a value of the (converted) config, e.g. --set data.root=/data/OPV2V")
    return p


def main(argv=None) -> int:
    """Exit status 0, or 2 with one line on stderr for a bad reference file, config or target folder."""
    args = build_parser().parse_args(argv)
    from opencood_ext.interop.runs import (check_import_target, find_reference_checkpoint, import_weights,
                                           load_experiment_any, write_imported_run)
    try:
        check_import_target(args.output)
        ckpt = find_reference_checkpoint(args.reference) if args.reference.is_dir() else args.reference
        config = args.config or (RunFolder(args.reference).config if args.reference.is_dir() else None)
        if config is None:
            raise ConfigError("give --config (our yaml or the hypes yaml the checkpoint was trained with)")
        cfg = load_experiment_any(locate_config(config), args.overrides)
        model, mapping = import_weights(cfg, ckpt)
    except (*USER_ERRORS, ValueError) as exc:
        return report(exc)
    path = write_imported_run(cfg, model, mapping, ckpt, args.output)
    print(mapping.summary())
    print(f"wrote {path}; evaluate with: gencomm-infer --model_dir {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
