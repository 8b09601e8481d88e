"""Command-line programs of the substrate, importable so that they run from an installed wheel,
each with ``main(argv=None) -> int`` (0, or 2 with one line on stderr for bad input) and
underscore-style long options: :mod:`.train`, :mod:`.inference`, :mod:`.onboard`,
:mod:`.simulate`, :mod:`.carla_demo`, :mod:`.compare`, :mod:`.robustness`,
:mod:`.import_config`, :mod:`.import_weights` and :mod:`.inspect_data` (:mod:`.errors` holds
the one-line reporting they share).

They do not import any method package: a run whose config names a method's
link (``model.link.type: gencomm``) needs that package imported first, which
the console scripts of :mod:`gencomm.cli` do (``gencomm-train`` and friends; the table of
scripts is there). ``python tools/<name>.py`` in a checkout runs the same commands.
"""
