"""Interoperability with the field's code: HEAL / GenComm-reference (OpenCOOD-family) hypes
yamls and checkpoints (docs/interop.md).

* :mod:`.hypes` converts a hypes yaml into our experiment config (key table: :mod:`.hypes_keys`);
* :mod:`.weights` maps a reference state_dict onto our model and back (tables ``SLOTS``, ``LAYOUTS``);
* :mod:`.runs` the glue the tools use: load either kind of config, open either kind of run folder.
"""
from .hypes import Conversion, convert_hypes, convert_hypes_file
from .hypes_reader import HypesError, is_hypes

__all__ = ["Conversion", "convert_hypes", "convert_hypes_file", "HypesError", "is_hypes"]
