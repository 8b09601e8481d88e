"""GenComm: generative communication for heterogeneous cooperative perception
(NeurIPS 2025): the method. The experiment driver that runs it against the
competitors (main job, benchmark, reports) is :mod:`experiments`.

* :mod:`.message` the Deformable Message Extractor (sender, one per agent type);
* :mod:`.generator` the Spatial-Aware Feature Generator (receiver, conditional diffusion);
* :mod:`.enhancer` the Channel Enhancer (receiver);
* :mod:`.link` the GenComm link, registered as ``model.link.type: gencomm``
  in :data:`opencood_ext.models.links.LINKS` when this package is imported;
* :mod:`.interop` the reference GenComm checkpoint layout of the ``variant: reference``
  modules (registered with :mod:`opencood_ext.interop` when this package is imported);
* :mod:`.onboarding` stage 2, a new agent type joining an alliance;
* :mod:`.cli` the console scripts (they run :mod:`opencood_ext.cli` programs with the link registered).

Everything a cooperative-perception method needs besides (data, simulator,
encoders, detector, wire format, training engine, evaluation) is in
:mod:`opencood_ext`.
"""
from . import interop, link, onboarding  # noqa: F401  (register the link, onboarding method, weight layouts)

__version__ = "0.1.0"
