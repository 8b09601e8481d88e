"""Dependencies imported where they are used, with an error that says what to install.

* ``spconv`` (sparse convolutions) is needed only by the SECOND encoder; voxelisation
  uses it when installed and a pure-PyTorch voxeliser with the same output otherwise
  (:mod:`opencood_ext.data.voxelize`). It is not in ``install_requires``: its CUDA builds
  are distributions with other names (``spconv-cu126``, ...) that provide the same
  ``spconv`` module, so declaring ``spconv`` would pull the CPU build onto a GPU machine.
* ``open3d`` and ``scipy`` are needed only by the built-in simulator
  (:mod:`opencood_ext.sim`), the ``sim`` extra: ``pip install 'gencomm[sim]'``.
  Readers, models, training and evaluation import without them.
"""
from __future__ import annotations

import importlib
from types import ModuleType

SPCONV_HINT = ("install the spconv build for this machine: 'pip install spconv-cu126' (or the spconv-cuXXX "
               "matching your CUDA) with a GPU, 'pip install spconv' on a CPU-only machine; it is not a declared "
               "dependency of gencomm because the CUDA builds have other distribution names")
SIM_HINT = ("the built-in simulator needs open3d and scipy: pip install 'gencomm[sim]' "
            "(a CPU-only machine may install open3d-cpu instead of open3d)")


class MissingDependency(ImportError):
    """An optional dependency is not installed; the message says what to install. The console
    scripts (:mod:`gencomm.cli`) report it as one line with exit status 2, like any bad input."""


def require(module: str, hint: str) -> ModuleType:
    """``importlib.import_module(module)``, or a :class:`MissingDependency` naming ``module``,
    the reason and ``hint`` (what to install)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependency(f"cannot import {module} ({exc}); {hint}") from exc


def require_spconv(submodule: str = "spconv.pytorch") -> ModuleType:
    return require(submodule, SPCONV_HINT)


def require_sim(module: str) -> ModuleType:
    return require(module, SIM_HINT)
