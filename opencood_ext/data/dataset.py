"""Frames -> per-agent model inputs for cooperative detection.

``CooperativeDataset`` wraps any reader (``opencood_ext.data.formats``) and
turns each Frame into a :class:`Sample`:

* the ego is the first agent after sorting (vehicles by id, then RSUs); with
  ``random_ego`` (training) any vehicle may be ego;
* collaborators are the agents within ``comm_range`` metres of the ego whose
  type is in ``agent_types`` (the alliance), at most ``max_agents`` in all;
* each agent is preprocessed by its TYPE: LiDAR types pick their beam variant
  (64 -> the main scan, 32/16 -> OPV2V-H's reduced scans) and voxelise with
  their own voxel size; camera types resize their four images;
* ground truth is the union over all agents, in the (augmented) ego frame,
  filtered to ``lidar_range``.

``cooperation`` chooses what a sample holds: ``"all"`` (late and intermediate
fusion), ``"ego_only"`` (no fusion) or ``"early"`` (every LiDAR agent's points
moved into the ego frame and merged into one cloud, voxelised as the ego's type).

Bad data raises :class:`~opencood_ext.data.errors.DataFormatError` naming the file
(the reader's, or the dataset's own: a missing reduced-beam scan, a frame without
an alliance agent). With ``skip_bad_frames`` the sample of such a frame is
``None`` (logged once): :func:`~opencood_ext.data.batch.collate_samples` leaves it
out of its batch, so an epoch sees every good frame exactly once and no frame
twice.

``protocol="reference"`` follows the GenComm reference / HEAL datasets instead
(:mod:`~opencood_ext.data.reference`): their agent order and selection (the first
``max_agents`` agents before the range check), ground truth from the selected agents'
labels only, each agent's own-vehicle points removed, each LiDAR scan shuffled before
voxelising (unless ``data.shuffle_points`` says false), and camera images resized keeping
their aspect then cropped (:mod:`~opencood_ext.data.camera_crop`).

Data faults (an agent missing inside its recording span, a stray timestamp,
NaN/inf points; :mod:`~opencood_ext.data.faults`) are warned about by file;
with ``data.strict`` they are DataFaultErrors (DataFormatErrors), which
``skip_bad_frames`` handles like any bad frame.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Dict, List, Literal, Optional, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset

from ..geometry import invert_transform, transform_points
from .augment import sample_augmentation
from .camera_crop import cropped_intrinsics, reference_image_crop, resize_crop
from .data_config import AgentTypeData, DataConfig  # noqa: F401  (re-exported: the data schema lives there)
from .data_config import type_override
from .ego_type_input import EgoTypeInputs
from .errors import DataFormatError, SkippedFrame
from .frame import AgentObs, Frame, timestamp_value
from .ground_truth import frame_ground_truth
from .reference import (reference_ego_first, reference_order, reference_selection, remove_own_points,
                        side_label_ground_truth)
from .sample import AgentInput, Sample  # noqa: F401  (re-exported: the sample records live there)
from .voxelize import Voxelizer

log = logging.getLogger(__name__)

IMAGE_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
IMAGE_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


class CooperativeDataset(Dataset):
    """See the module docstring. ``reader`` yields Frames (``len`` and indexing).

    voxel_sizes: ``{type: (vx, vy, vz)}`` for the LiDAR types, read from the model config
    (:func:`opencood_ext.models.voxel_sizes`), so no yaml repeats them.
    latency_frames: each collaborator's data (and pose) come from that many frames earlier in
    the same scenario, clamped at its first frame (OpenCOOD's time-delay protocol); evaluation
    only. A collaborator absent from the earlier frame sends nothing.
    protocol: "native" or "reference" (the experiment's ``protocol:``; module docstring).
    ego_type_inputs: training only: each collaborator of another type than the ego's also carries its
    scan as the ego type reads it (:mod:`~opencood_ext.data.ego_type_input`, GenComm's ego-encoder target).
    """

    def __init__(self, reader, cfg: DataConfig, voxel_sizes: Dict[str, Optional[tuple]], train: bool,
                 cooperation: Literal["all", "ego_only", "early"] = "all", seed: int = 0,
                 latency_frames: int = 0, protocol: Literal["native", "reference"] = "native",
                 ego_type_inputs: bool = False):
        if protocol not in ("native", "reference"):
            raise ValueError(f"protocol must be 'native' or 'reference', got {protocol!r}")
        self.protocol = protocol
        # data.shuffle_points None: the protocol's rule (the reference shuffles every scan)
        self.shuffle_points = (protocol == "reference") if cfg.shuffle_points is None else bool(cfg.shuffle_points)
        self.reader = reader
        self.cfg = cfg
        if cfg.strict:
            set_strict = getattr(reader, "set_strict", None)
            if set_strict is None:
                raise ValueError(f"data.strict is set but the reader {type(reader).__name__} has no strict setting")
            set_strict(True)  # raises the reader's index-time data faults (unless skip_bad leaves them to frames)
        self.train = train
        self.cooperation = cooperation
        self.seed = seed
        if latency_frames < 0:
            raise ValueError(f"latency_frames must be >= 0, got {latency_frames}")
        if latency_frames and train:
            raise ValueError("latency_frames is an evaluation setting; a training dataset has none")
        self.latency_frames = int(latency_frames)
        self._earlier: Optional[List[int]] = None
        self.forced_types = type_override(cfg.modality)
        self.class_table = cfg.class_table()
        self.voxelizers = {}
        for name, spec in cfg.agent_types.items():
            if spec.sensor != "lidar":
                continue
            if cooperation == "early":
                continue  # the receiver merges the raw points and voxelises them (models.fusion_methods)
            if not voxel_sizes.get(name):
                if cooperation == "ego_only":
                    # an ego-only run (e.g. an early-fusion model with its collaborators off) needs just the ego's
                    continue
                raise ValueError(f"data.agent_types.{name} is a LiDAR type but the model has no LiDAR "
                                 f"encoder (voxel size) for it; model types: {sorted(voxel_sizes)}")
            self.voxelizers[name] = Voxelizer(voxel_sizes[name], cfg.lidar_range,
                                              spec.max_points_per_voxel, spec.max_voxels)
        if cooperation == "early" and not any(t.sensor == "lidar" for t in cfg.agent_types.values()):
            raise ValueError("early fusion merges LiDAR points, but data.agent_types has no LiDAR type")
        if ego_type_inputs and not train:
            raise ValueError("ego_type_inputs are a training target (GenComm's ego-encoder target), not evaluated")
        self.ego_type_inputs = EgoTypeInputs(self) if ego_type_inputs else None
        self.skipped: set = set()  # indices of frames left out (skip_bad_frames), in this process

    @property
    def may_skip(self) -> bool:
        """True when a sample may be None (a bad frame left out, ``skip_bad_frames``)."""
        return bool(self.cfg.skip_bad_frames)

    def __len__(self) -> int:
        n = len(self.reader)
        return min(n, self.cfg.max_frames) if self.cfg.max_frames else n

    # ------------------------------------------------------------------ selection
    def read_frame(self, index: int) -> Frame:
        """The reader's frame with ``data.modality`` overrides and ``data.type_mapping`` applied to agent
        types (under the reference protocol, agents in its order first, so a ``cycle:`` follows that
        order, and its ego first where the mapping decides it: the first agent's type is tested as
        assigned, :func:`~opencood_ext.data.reference.reference_ego_first`)."""
        frame = self.reader[index]
        if self.protocol == "reference":  # a new Frame: a reader's cached one keeps its order
            frame = dataclasses.replace(frame, agents=reference_order(frame.agents))
        if self.forced_types:
            for k, a in enumerate(frame.agents):
                a.agent_type = self.forced_types[k % len(self.forced_types)]
        mapping = self.cfg.type_mapping
        if mapping:  # new agents: a reader's cached ones keep their assigned types
            agents = frame.agents
            if self.protocol == "reference" and not (self.train and self.cfg.random_ego):
                agents = reference_ego_first(agents, self.cfg.ego_types or self.cfg.agent_types, mapping)
            frame = dataclasses.replace(frame, agents=[dataclasses.replace(a, agent_type=mapping[a.agent_type])
                                                       for a in agents])
        return frame

    def select_agents(self, frame: Frame, rng: np.random.Generator,
                      with_collaborators: Optional[bool] = None) -> List[AgentObs]:
        """Ego first, then collaborators in range and in the alliance (sorted order).

        with_collaborators: None follows ``cooperation`` ('ego_only' -> just the ego);
        True lists the collaborators even for an ego-only dataset (evaluation uses it to
        tell which objects only a collaborator sees)."""
        members = [a for a in frame.agents if a.agent_type in self.cfg.agent_types]
        if not members:
            raise DataFormatError(frame.source or frame.scenario, f"frame {frame.timestamp}: no agent of the "
                                  f"alliance types {sorted(self.cfg.agent_types)}; agent types here are "
                                  f"{sorted({a.agent_type for a in frame.agents})}")
        if self.protocol == "reference" and not (self.train and self.cfg.random_ego):
            if with_collaborators is None:
                with_collaborators = self.cooperation != "ego_only"
            return reference_selection(frame.agents, self.cfg.agent_types, self.cfg.comm_range,
                                       self.cfg.max_agents, with_collaborators, self.cfg.ego_types)
        if self.train and self.cfg.random_ego:
            # any VEHICLE may be ego; a roadside unit's LiDAR sits metres higher, so the z range and
            # anchors of a vehicle ego do not fit it (the evaluation ego is always a vehicle)
            vehicles = [a for a in members if not a.is_rsu] or members
            ego = vehicles[int(rng.integers(len(vehicles)))]
        else:
            ego = members[0]
        if with_collaborators is None:
            with_collaborators = self.cooperation != "ego_only"
        if not with_collaborators:
            return [ego]
        ego_xy = ego.T_world_from_lidar[:2, 3]
        others = [a for a in members if a is not ego
                  and np.linalg.norm(a.T_world_from_lidar[:2, 3] - ego_xy) <= self.cfg.comm_range]
        return [ego] + others[: max(self.cfg.max_agents - 1, 0)]

    # ------------------------------------------------------------------ per type
    def lidar_points(self, agent: AgentObs, beams: int, frame: Optional[Frame] = None) -> np.ndarray:
        """The agent's scan with ``beams`` rings (N, 4) in its own LiDAR frame (under the reference
        protocol without the agent's own-vehicle returns); a missing reduced scan is a
        DataFormatError naming the agent and, given its ``frame``, the file."""
        if self.protocol == "reference":
            return remove_own_points(self._scan(agent, beams, frame))
        return self._scan(agent, beams, frame)

    def _scan(self, agent: AgentObs, beams: int, frame: Optional[Frame]) -> np.ndarray:
        if beams == 64:
            return agent.lidar
        if beams not in agent.lidar_beams:
            if frame is None:
                raise DataFormatError(f"agent {agent.agent_id} ({agent.agent_type})", f"needs its {beams}-beam "
                                      f"scan (OPV2V-H '_{beams}.pcd'), which is missing")
            raise DataFormatError(frame.source or frame.scenario, f"agent {agent.agent_id} ({agent.agent_type}) "
                                  f"needs its {beams}-beam scan '{agent.agent_id}/{frame.timestamp}_{beams}.pcd' "
                                  f"(OPV2V-H; looked in the agent's folder and hetero_root), which is missing",
                                  key=f"agent {agent.agent_id}")
        return agent.lidar_beams[beams]

    def _placed(self, pts: Optional[np.ndarray], a: AgentObs, ego: AgentObs, T_augego_from_world: np.ndarray):
        """Agent ``a``'s (N, 4) scan in the frame its input is expressed in, and that frame's pose in the
        world: the augmented ego frame for the ego (its feature needs no warp) and, with
        ``collaborator_frame: ego``, every LiDAR agent; a roadside unit's virtual LiDAR; else its own."""
        pose = a.T_world_from_lidar
        T = T_augego_from_world @ pose
        if pts is not None and (a is ego or self.cfg.collaborator_frame == "ego") and not np.allclose(T, np.eye(4)):
            return transform_points(T, pts), invert_transform(T_augego_from_world)
        if pts is not None and a.is_rsu and a is not ego:
            return self._virtual_lidar(pts, a, ego)
        return pts, pose

    @staticmethod
    def _virtual_lidar(pts: np.ndarray, rsu: AgentObs, ego: AgentObs):
        """A roadside LiDAR sits metres above a vehicle's, so the z range of ``lidar_range`` would
        cut its ground and cars away. Express its points in a virtual sensor frame moved down to the
        ego LiDAR's height (same x, y, axes); -> (points, T_world_from_virtual), geometry unchanged."""
        dz = float(rsu.T_world_from_lidar[2, 3] - ego.T_world_from_lidar[2, 3])
        if abs(dz) < 0.5:
            return pts, rsu.T_world_from_lidar
        up = rsu.T_world_from_lidar[:3, :3].T @ np.array([0.0, 0.0, dz])  # world offset in the lidar's axes
        S = np.eye(4)
        S[:3, 3] = up  # p_virtual = p_lidar + up: the virtual sensor sits dz lower
        return transform_points(S, pts), rsu.T_world_from_lidar @ invert_transform(S)

    def _camera_input(self, agent: AgentObs, spec: AgentTypeData, out: AgentInput) -> None:
        cams = [c for c in agent.cameras if c.image is not None]
        if not cams:
            raise ValueError(f"agent {agent.agent_id} ({agent.agent_type}) is a camera type "
                             f"but its frame has no camera images")
        H, W = spec.image_size
        images, Ks, exts, depths = [], [], [], []
        for cam in cams:
            if spec.use_depth and cam.depth is None:
                raise ValueError(f"agent {agent.agent_id}: use_depth is set but {cam.name} has no depth image")
            if self.protocol == "reference":  # resize keeping the aspect, then crop (camera_crop)
                crop = reference_image_crop(np.shape(cam.image)[:2], (H, W))
                img = resize_crop(cam.image, crop).astype(np.float32) / np.float32(255.0)
                K = cropped_intrinsics(cam.K, crop)
                if spec.use_depth:
                    depths.append(resize_crop(np.asarray(cam.depth, dtype=np.float32), crop))
            else:
                # a float32 copy: decoded or cached images may be read-only arrays, which torch warns about
                img = torch.from_numpy(np.asarray(cam.image, dtype=np.float32)).permute(2, 0, 1)[None] / 255.0
                h0, w0 = img.shape[-2:]
                img = torch.nn.functional.interpolate(img, size=(H, W), mode="bilinear", align_corners=False)[0]
                img = img.numpy().transpose(1, 2, 0)
                K = np.asarray(cam.K, dtype=np.float64).copy()
                K[0] *= W / w0
                K[1] *= H / h0
                if spec.use_depth:
                    d = torch.from_numpy(np.asarray(cam.depth, dtype=np.float32))[None, None]
                    depths.append(torch.nn.functional.interpolate(d, size=(H, W), mode="nearest")[0, 0].numpy())
            images.append(((img - IMAGE_MEAN) / IMAGE_STD).transpose(2, 0, 1))
            Ks.append(K)
            exts.append(cam.T_lidar_from_camera)
        out.images = np.stack(images).astype(np.float32)
        out.K = np.stack(Ks).astype(np.float32)
        out.T_lidar_from_camera = np.stack(exts).astype(np.float32)
        out.depth = np.stack(depths).astype(np.float32) if depths else None

    def _shuffle_rng(self, index: int, agent_id: int) -> np.random.Generator:
        """The generator of ``data.shuffle_points`` for one agent's scan of frame ``index``."""
        draw = int(torch.randint(0, 2**31 - 1, ())) if self.train else 0
        return np.random.default_rng((self.seed, index, 2 * abs(int(agent_id)) + (agent_id < 0), draw))

    # ------------------------------------------------------------------ latency
    def _earlier_index(self, index: int) -> int:
        """The index of the frame ``latency_frames`` earlier in the same scenario (clamped)."""
        if self._earlier is None:
            samples = getattr(self.reader, "samples", None)
            if samples is None:
                raise ValueError(f"latency_frames needs a reader that lists its (scenario, timestamp) "
                                 f"samples; {type(self.reader).__name__} does not")
            samples = list(samples)
            by_scenario: Dict[str, List[int]] = {}
            for k, (scen, _) in enumerate(samples):
                by_scenario.setdefault(scen, []).append(k)
            earlier = [0] * len(samples)
            for ks in by_scenario.values():
                ks = sorted(ks, key=lambda k: samples[k][1])
                for pos, k in enumerate(ks):
                    earlier[k] = ks[max(pos - self.latency_frames, 0)]
            self._earlier = earlier
        return self._earlier[index]

    def _stale(self, index: int, agents: List[AgentObs], now: float) -> Tuple[List[AgentObs], List[float]]:
        """The collaborators as they were ``latency_frames`` earlier (the ego stays current),
        with the timestamps their messages carry."""
        old = self.read_frame(self._earlier_index(index))
        by_id = {a.agent_id: a for a in old.agents}
        out, times = [agents[0]], [now]
        for a in agents[1:]:
            if a.agent_id in by_id:  # an agent not in the earlier frame had nothing to send then
                out.append(by_id[a.agent_id])
                times.append(timestamp_value(old.timestamp))
        return out, times

    # ------------------------------------------------------------------ item
    def __getitem__(self, index: int) -> Optional[Sample]:
        """The sample of frame ``index``; None for a bad frame when ``skip_bad_frames`` is set."""
        return self.sample_with_frame(index)[0]

    def sample_with_frame(self, index: int) -> Tuple[Optional[Sample], Optional[Frame]]:
        """``(self[index], the frame it was made from)``, so a caller that measures more on the frame
        (evaluation: who sees each object) does not read it again; ``(None, None)`` for a bad frame
        left out (``skip_bad_frames``). The frame is :meth:`read_frame`'s; making the sample does not
        change it."""
        try:
            frame = self.read_frame(index)
            return self._sample(index, frame), frame
        except DataFormatError as exc:
            if not self.cfg.skip_bad_frames:
                raise
            if index not in self.skipped and not isinstance(exc, SkippedFrame):  # the reader logged its own
                log.warning("skipping bad frame %d: %s", index, exc)
            self.skipped.add(index)
            return None, None

    def _sample(self, index: int, frame: Frame) -> Sample:
        # training draws follow torch's RNG (seeded per run and worker by the trainer), so each
        # epoch sees new augmentations; evaluation draws nothing random.
        rng = np.random.default_rng((self.seed, index, int(torch.randint(0, 2**31 - 1, ()))
                                     if self.train else 0))
        agents = self.select_agents(frame, rng)
        ego = agents[0]
        A = sample_augmentation(self.cfg.augment, rng) if self.train else np.eye(4)
        T_augego_from_world = A @ invert_transform(ego.T_world_from_lidar)
        T_world_from_augego = invert_transform(T_augego_from_world)
        reference = self.protocol == "reference" and not (self.train and self.cfg.random_ego)
        # reference: the labels of the agents it selects (with collaborators, whatever the fusion)
        labelled = [a.agent_id for a in self.select_agents(frame, rng, True)] if reference else None
        if frame.side_labels:  # each agent's own labels (DAIR-V2X): merged by overlap, the ego's first
            if labelled is None:  # native: every agent labels
                labelled = [ego.agent_id] + [a.agent_id for a in frame.agents if a is not ego]
            gt = side_label_ground_truth(frame, labelled, T_world_from_augego, self.cfg.lidar_range,
                                         classes=list(self.class_table))
        else:
            gt = frame_ground_truth(frame, T_world_from_augego, self.cfg.lidar_range,
                                    classes=list(self.class_table), visible_to=labelled)
        times = [timestamp_value(frame.timestamp)] * len(agents)
        if self.latency_frames:
            agents, times = self._stale(index, agents, times[0])
        inputs: List[AgentInput] = []
        if self.cooperation == "early":
            if self.cfg.agent_types[ego.agent_type].sensor != "lidar":
                raise ValueError(f"early fusion needs a LiDAR ego; ego type {ego.agent_type} is a camera")
            for a, ts in zip(agents, times):
                spec = self.cfg.agent_types[a.agent_type]
                if spec.sensor != "lidar":
                    continue  # a camera agent has no points to send
                pts = np.asarray(self.lidar_points(a, spec.lidar_beams, frame if ts == times[0] else None),
                                 dtype=np.float32)
                if self.shuffle_points:
                    pts = pts[self._shuffle_rng(index, a.agent_id).permutation(len(pts))]
                if a is ego and not np.allclose(A, np.eye(4)):
                    pts, pose = transform_points(A, pts).astype(np.float32), T_world_from_augego
                else:
                    pose = a.T_world_from_lidar
                inputs.append(AgentInput(a.agent_id, a.agent_type, np.asarray(pose, np.float64), ts,
                                         points=pts, num_points=len(pts)))
        else:
            for a, ts in zip(agents, times):
                t = a.agent_type
                spec = self.cfg.agent_types[t]
                pts = self.lidar_points(a, spec.lidar_beams, frame if ts == times[0] else None) \
                    if spec.sensor == "lidar" else None
                pts, pose = self._placed(pts, a, ego, T_augego_from_world)
                item = AgentInput(a.agent_id, t, np.asarray(pose, np.float64), ts)
                if self.ego_type_inputs is not None and t != ego.agent_type:  # GenComm's ego-encoder target
                    item.ego_type_voxels = self.ego_type_inputs(index, a, ego, frame if ts == times[0] else None,
                                                                T_augego_from_world)
                if pts is not None:
                    if t not in self.voxelizers:
                        raise ValueError(f"agent {a.agent_id} is of type {t}, for which the model has no "
                                         f"LiDAR encoder; model LiDAR types: {sorted(self.voxelizers)}")
                    if self.shuffle_points:
                        pts = pts[self._shuffle_rng(index, a.agent_id).permutation(len(pts))]
                    item.voxels = self.voxelizers[t](pts)
                    item.num_points = len(pts)
                else:
                    self._camera_input(a, spec, item)
                inputs.append(item)
        return Sample(frame.scenario, str(frame.timestamp), ego.agent_id, inputs, T_augego_from_world,
                      gt.boxes.astype(np.float32), gt.ids.astype(np.int64),
                      np.asarray([self.class_table[t] for t in gt.types], dtype=np.int64))
