"""Dataset formats: readers yielding :class:`~opencood_ext.data.frame.Frame` and writers.

``get_reader("opv2v" | "dairv2x" | "v2xreal", root, split, **kw)`` builds a reader;
``READERS`` maps the names to the classes.
"""
from __future__ import annotations

from ..errors import DataFormatError
from .dairv2x import DairV2XReader
from .opv2v import OPV2VReader, in_order_assignment, resolve_assignment
from .opv2v_writer import write_data_protocol, write_modality_json, write_opv2v_frame
from .pcd import read_pcd, write_pcd
from .v2xreal import V2XREAL_SUPERCLASS, V2XRealReader, superclass

READERS = {"opv2v": OPV2VReader, "dairv2x": DairV2XReader, "v2xreal": V2XRealReader}


def get_reader(fmt: str, root, split=None, **kw):
    """Reader for dataset format ``fmt`` over ``root``.

    ``split``: the split directory for ``opv2v`` / ``v2xreal`` (required);
    for ``dairv2x`` it is passed as ``split_ids`` (None, a JSON list path or a list).
    """
    cls = READERS.get(str(fmt).lower())
    if cls is None:
        raise ValueError(f"unknown dataset format {fmt!r}; known formats: {sorted(READERS)}")
    if cls is DairV2XReader:
        return cls(root, split_ids=split, **kw)
    if split is None:
        raise ValueError(f"format {fmt!r} needs a split (a directory under {root})")
    return cls(root, split, **kw)


__all__ = ["READERS", "get_reader", "DataFormatError", "OPV2VReader", "DairV2XReader", "V2XRealReader",
           "V2XREAL_SUPERCLASS", "superclass", "read_pcd", "write_pcd", "write_opv2v_frame",
           "write_data_protocol", "write_modality_json", "in_order_assignment", "resolve_assignment"]
