"""Console scripts of the ``gencomm`` distribution (``entry_points`` in setup.py).

Importing this package imports :mod:`gencomm`, which registers the GenComm
link, then each function below runs a substrate command of
:mod:`opencood_ext.cli` with ``argv`` (default: the process's arguments) and
returns its exit status; ``gencomm-onboard`` is GenComm's own stage 2,
:func:`gencomm.cli.onboard.main`:

==================  ==========================================  ====================
console script      module                                      checkout equivalent
==================  ==========================================  ====================
``gencomm-train``   :mod:`opencood_ext.cli.train`               ``tools/train.py``
``gencomm-infer``   :mod:`opencood_ext.cli.inference`           ``tools/inference.py``
``gencomm-onboard`` :mod:`gencomm.cli.onboard`                  ``tools/onboard.py``
``gencomm-sim``     :mod:`opencood_ext.cli.simulate`            ``tools/simulate.py``
``gencomm-demo``    :mod:`opencood_ext.cli.carla_demo`          ``tools/carla_demo.py``
==================  ==========================================  ====================
"""
from __future__ import annotations

from typing import Optional, Sequence

Argv = Optional[Sequence[str]]


def train(argv: Argv = None) -> int:
    from opencood_ext.cli.train import main
    return main(argv)


def infer(argv: Argv = None) -> int:
    from opencood_ext.cli.inference import main
    return main(argv)


def simulate(argv: Argv = None) -> int:
    from opencood_ext.cli.simulate import main
    return main(argv)


def demo(argv: Argv = None) -> int:
    from opencood_ext.cli.carla_demo import main
    return main(argv)
