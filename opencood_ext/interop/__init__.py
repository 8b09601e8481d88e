"""Interoperability with the field's code: HEAL / GenComm-reference (OpenCOOD-family) hypes
yamls and checkpoints.

* :mod:`.hypes` converts a hypes yaml into our experiment config (table: :mod:`.hypes_keys`);
* :mod:`.weights` maps a reference state_dict onto our model and back (table: ``LAYOUTS``);
* :mod:`.runs` the glue the tools use: load either kind of config, open either kind of run folder.
"""
from .hypes import Conversion, convert_hypes, convert_hypes_file  # noqa: F401
from .hypes_reader import HypesError, is_hypes  # noqa: F401
