#!/usr/bin/env python
"""Convert an OpenCOOD / HEAL / GenComm-reference hypes yaml into our experiment config.

    python tools/import_config.py opencood/hypes_yaml/opv2v/.../m1_att.yaml -o configs/mine/m1_att.yaml
    python tools/import_config.py IN.yaml                      # print the converted config only

Unsupported keys are refused, all listed with the file and key path. What is
carried over approximately, and what is not carried over, is written as
comments at the top of OUT.yaml. A heter.mapping_dict that remaps types
(e.g. m2 -> m1) needs the assignment file: run where its path resolves (or
above the hypes file); the remapped copy is written beside OUT as
OUT.modality.json. docs/interop.md lists every key.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gencomm  # noqa: E402,F401  (registers the GenComm link with opencood_ext)

from opencood_ext.config import ConfigError  # noqa: E402
from opencood_ext.interop import convert_hypes_file  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("hypes", type=Path, help="the hypes yaml to convert")
    p.add_argument("-o", "--output", type=Path, help="where to write the converted config (default: print)")
    args = p.parse_args(argv)
    remap = args.output.with_suffix(".modality.json") if args.output else None
    try:
        conv = convert_hypes_file(args.hypes, remap_to=remap)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = f"{conv.report()}\n{conv.yaml()}"
    if args.output is None:
        print(text)
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    conv.write_files()
    tmp = args.output.with_suffix(args.output.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(args.output)
    print(conv.report())
    print(f"wrote {args.output}" + "".join(f" and {f}" for f in conv.files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
