"""Heterogeneous-collaboration methods GenComm is compared with, each a module that
registers its link (:data:`opencood_ext.models.links.LINKS`) and its onboarding
method (:data:`.base.ONBOARDING`): BackAlign (HEAL), STAMP, MPDA, CodeFilling.
GenComm itself lives in the :mod:`gencomm` package and registers the same way.
"""
from .base import ONBOARDING, OnboardingMethod
from . import backalign  # noqa: F401  (registers the backalign onboarding method)
from . import stamp  # noqa: F401  (registers the stamp link and onboarding method)
from . import stamp_collab  # noqa: F401  (registers STAMP's own collaboration link, stamp_collab)
from . import mpda  # noqa: F401  (registers the mpda link and onboarding method)
from . import codefilling  # noqa: F401  (registers the codefilling link and onboarding method)

__all__ = ["ONBOARDING", "OnboardingMethod"]
