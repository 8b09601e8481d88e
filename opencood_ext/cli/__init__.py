"""Command-line programs of the substrate, importable so that they run from an
installed wheel: :mod:`.train`, :mod:`.inference`, :mod:`.simulate` and
:mod:`.carla_demo`, each with ``main(argv=None) -> int``.

They do not import any method package: a run whose config names a method's
link (``model.link.type: gencomm``) needs that package imported first, which
the console scripts of :mod:`gencomm.cli` do (``gencomm-train`` and friends).
``python tools/<name>.py`` in a checkout runs the same commands.
"""
