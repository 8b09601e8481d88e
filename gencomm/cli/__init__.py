"""Console scripts of the ``gencomm`` distribution (``CONSOLE_SCRIPTS`` in setup.py).

Every command is a ``main(argv=None) -> int`` that parses ``argv`` (default: the process's
arguments) with underscore-style long options (OpenCOOD's: ``--model_dir``, ``--fusion_method``)
and returns its exit status: 0, or 2 with one line on stderr for bad input (a missing or malformed
config, run folder, data or checkpoint). ``-y`` / ``--config`` take a file or a shipped config's
name (``opv2v_h/gencomm_stage1_m1``: :func:`opencood_ext.config_files.resolve_config`), so every
command runs from any directory of an installed wheel; none needs spconv unless a SECOND model is
built. In a checkout ``python tools/<name>.py`` runs the same command.

The substrate's commands (:mod:`opencood_ext.cli`) import no method; the functions below import
:mod:`gencomm` first, which registers the GenComm link and onboarding, then run them. A missing
optional dependency (spconv for a SECOND model, open3d / scipy for the simulator) is one line saying
what to install, exit status 2.

=========================  ===========================================  ==========================
console script             runs                                         checkout equivalent
=========================  ===========================================  ==========================
``gencomm-train``          :mod:`opencood_ext.cli.train`                ``tools/train.py``
``gencomm-infer``          :mod:`opencood_ext.cli.inference`            ``tools/inference.py``
``gencomm-onboard``        :mod:`opencood_ext.cli.onboard`              ``tools/onboard.py``
``gencomm-sim``            :mod:`opencood_ext.cli.simulate`             ``tools/simulate.py``
``gencomm-demo``           :mod:`opencood_ext.cli.carla_demo`           ``tools/carla_demo.py``
``gencomm-compare``        :mod:`opencood_ext.cli.compare`              ``tools/compare.py``
``gencomm-robustness``     :mod:`opencood_ext.cli.robustness`           ``tools/robustness.py``
``gencomm-import-config``  :mod:`opencood_ext.cli.import_config`        ``tools/import_config.py``
``gencomm-import-weights`` :mod:`opencood_ext.cli.import_weights`       ``tools/import_weights.py``
``gencomm-inspect-data``   :mod:`opencood_ext.cli.inspect_data`         ``tools/inspect_data.py``
``gencomm-reproduce``      :func:`experiments.reproduce.main`           ``tools/reproduce.py``
``gencomm-seed-report``    :func:`experiments.seeds.main`               ``tools/seed_report.py``
``gencomm-bench``          :func:`experiments.bench.cli.main`           ``tools/bench.py``
=========================  ===========================================  ==========================

The last three are the experiment driver (:mod:`experiments`), which imports GenComm itself.
"""
from __future__ import annotations

import importlib
from typing import Optional, Sequence

Argv = Optional[Sequence[str]]


def _run(module: str, argv: Argv) -> int:
    """``module.main(argv)`` after importing :mod:`gencomm` (GenComm joins the registries)."""
    import gencomm  # noqa: F401
    from opencood_ext.cli.errors import report
    from opencood_ext.deps import MissingDependency
    try:
        return importlib.import_module(module).main(argv)
    except MissingDependency as exc:
        return report(exc)


def train(argv: Argv = None) -> int:
    return _run("opencood_ext.cli.train", argv)


def infer(argv: Argv = None) -> int:
    return _run("opencood_ext.cli.inference", argv)


def onboard(argv: Argv = None) -> int:
    return _run("opencood_ext.cli.onboard", argv)


def simulate(argv: Argv = None) -> int:
    return _run("opencood_ext.cli.simulate", argv)


def demo(argv: Argv = None) -> int:
    return _run("opencood_ext.cli.carla_demo", argv)


def compare(argv: Argv = None) -> int:
    return _run("opencood_ext.cli.compare", argv)


def robustness(argv: Argv = None) -> int:
    return _run("opencood_ext.cli.robustness", argv)


def import_config(argv: Argv = None) -> int:
    return _run("opencood_ext.cli.import_config", argv)


def import_weights(argv: Argv = None) -> int:
    return _run("opencood_ext.cli.import_weights", argv)


def inspect_data(argv: Argv = None) -> int:
    return _run("opencood_ext.cli.inspect_data", argv)
