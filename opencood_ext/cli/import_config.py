"""Convert an OpenCOOD / HEAL / GenComm-reference hypes yaml into our experiment config.

    gencomm-import-config opencood/hypes_yaml/opv2v/.../m1_att.yaml -o configs/mine/m1_att.yaml
    gencomm-import-config IN.yaml                      # print the converted config only

Keys that change the reference's computation in a way this project cannot
reproduce are refused, all listed with the file and key path (exit status 2).
Keys this project does not read are accepted: one WARNING line each on stderr
(file, key path, why). What is carried over approximately, and what is not
read, is written as comments at the top of OUT.yaml. The converted config runs
with protocol: reference. A heter.mapping_dict that remaps types
(e.g. m2 -> m1) needs the assignment file: run where its path resolves (or
above the hypes file); it is copied unchanged beside OUT as OUT.modality.json
and the mapping becomes data.type_mapping. docs/interop.md lists every key. ``python tools/import_config.py`` in a
checkout runs the same command. A hypes file that cannot be read or converted is one line on stderr,
exit status 2.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from opencood_ext.cli.errors import USER_ERRORS, report


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gencomm-import-config", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("hypes", type=Path, help="the hypes yaml to convert")
    p.add_argument("-o", "--output", type=Path, help="where to write the converted config (default: print)")
    return p


def main(argv=None) -> int:
    """Exit status 0, or 2 with one line on stderr for a hypes file that cannot be read or converted.
    A config naming a method's link (GenComm) needs that method imported first (gencomm-import-config does)."""
    args = build_parser().parse_args(argv)
    from opencood_ext.interop import convert_hypes_file
    remap = args.output.with_suffix(".modality.json") if args.output else None
    try:
        conv = convert_hypes_file(args.hypes, remap_to=remap)
    except (*USER_ERRORS, ValueError) as exc:
        return report(exc)
    for line in conv.warnings():
        print(line, file=sys.stderr)
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
