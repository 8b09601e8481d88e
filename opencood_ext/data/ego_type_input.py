"""Each collaborator's own scan preprocessed as its sample's EGO type reads scans: a training-time
target input for GenComm's ego-encoder generation target (``model.link.generation_target:
ego_encoder``, :mod:`gencomm.link`; beyond the paper).

OPV2V-H and the built-in simulator give every agent every sensor: a 32-beam SECOND collaborator
(m3) also has the 64-beam scan a PointPillars ego (m1) reads. The ego type's frozen encoder can then
encode the SENDER's scene in the ego's own semantic space, and that feature is what the ego's
generator, conditioned on the new type's message, is trained to regenerate. Nothing is sent: at
evaluation the dataset makes none of these.

:class:`EgoTypeInputs` is the dataset's hook (``CooperativeDataset(ego_type_inputs=True)``):
called for each collaborator whose type differs from the ego's, it gives that agent's scan with
the EGO type's beam count (:meth:`CooperativeDataset.lidar_points`), placed in the same frame as
the agent's own input (its own LiDAR frame, a roadside unit's virtual LiDAR, or the ego frame
under ``collaborator_frame: ego``), voxelised with the ego type's voxel size and caps, into
:attr:`~.sample.AgentInput.ego_type_voxels`.

Refused, with one line naming ``model.link.generation_target``: protocol ``reference`` (the
reference GenComm has no such target), a camera ego type, and data formats other than OPV2V's
(OPV2V-H and the simulator: DAIR-V2X's and V2X-Real's agents carry different LiDARs, so a
collaborator lacks the ego's sensor). A frame whose collaborator lacks the ego type's reduced scan
is a DataFormatError naming the file, as any missing scan.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from .frame import AgentObs, Frame
from .voxelize import VoxelData

KEY = "model.link.generation_target"
# data formats whose every agent carries every sensor (the simulator writes OPV2V-H's format)
EVERY_SENSOR_FORMATS = ("opv2v",)


def check_ego_type_inputs(data_format: str, protocol: str) -> None:
    """ValueError (one line, naming the config key) when ``data.format`` / the protocol cannot give
    each collaborator's scan as the ego type reads it."""
    if protocol == "reference":
        raise ValueError(f"{KEY}: ego_encoder is beyond the paper and refused under protocol reference "
                         f"(the reference GenComm trains stage 2 with the detection loss only); set it to none")
    if data_format not in EVERY_SENSOR_FORMATS:
        raise ValueError(f"{KEY}: ego_encoder needs every agent to carry the ego type's sensor (OPV2V-H and the "
                         f"simulator, data.format opv2v); data.format {data_format} gives agents different "
                         f"sensors; set it to none")


class EgoTypeInputs:
    """The dataset hook of the module docstring. ``dataset``: the :class:`~.dataset.CooperativeDataset`
    it serves (its data config, protocol, voxelisers, scan reader and shuffle rule)."""

    def __init__(self, dataset):
        check_ego_type_inputs(dataset.cfg.format, dataset.protocol)
        self.dataset = dataset

    def __call__(self, index: int, agent: AgentObs, ego: AgentObs, frame: Optional[Frame],
                 T_augego_from_world: np.ndarray) -> VoxelData:
        """Agent ``agent``'s scan as ``ego``'s type reads it: (V, P, 4) voxels of the ego type's beams, in
        the frame of the agent's own input (``CooperativeDataset._placed`` with the sample's (4, 4)
        ``T_augego_from_world``). ``index``: the sample's frame index (the shuffle's draw); ``frame``: the
        agent's frame, for a missing scan's file name (None: named by agent alone)."""
        ds = self.dataset
        spec = ds.cfg.agent_types[ego.agent_type]
        if spec.sensor != "lidar" or ego.agent_type not in ds.voxelizers:
            raise ValueError(f"{KEY}: ego_encoder needs a LiDAR ego type; ego type {ego.agent_type} is a "
                             f"{spec.sensor} type; set it to none")
        pts, _ = ds._placed(ds.lidar_points(agent, spec.lidar_beams, frame), agent, ego, T_augego_from_world)
        if ds.shuffle_points:  # read as the ego type reads its own scans
            pts = pts[ds._shuffle_rng(index, agent.agent_id).permutation(len(pts))]
        return ds.voxelizers[ego.agent_type](pts)
