"""OPV2V / OPV2V-H / V2XSet reader (docs/formats.md section 1).

Layout: ``<root>/<split>/<scenario>/<agent_id>/<timestamp>.{pcd,yaml}`` plus
``<timestamp>_camera{i}.png``; OPV2V-H adds ``<timestamp>_32.pcd``,
``<timestamp>_16.pcd`` and ``<timestamp>_depth{i}.png``, looked up in the same
agent directory first, then in the parallel ``hetero_root`` tree.

Frames are indexed at construction from file names only (no yaml or pcd is
parsed); one frame is one timestamp of one scenario with every agent that has
``<timestamp>.yaml``, agents ordered vehicles by id then RSUs (``agents[0]`` is
the default ego). The same scan checks the agents x timestamps of each scenario
for data faults (:mod:`opencood_ext.data.faults`: an agent missing inside its
recording span, a stray timestamp, a yaml without its point cloud or the
reverse), warned about by file or, with ``strict``, raised. Coordinates stay in CARLA's left-handed frame. See
:mod:`.opv2v_io` for the camera and depth conventions and :mod:`.layout` for
``skip_bad``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Tuple, Union

import numpy as np

from ...geometry import pose_to_matrix
from ..errors import DataFormatError, not_utf8
from ..frame import AgentObs, CameraObs, Frame, ObjectLabel, sort_agent_ids
from .decode_cache import DecodeCache
from ..faults import disputed_frames, drop_nonfinite, layout_faults
from .layout import IndexedReader, frame_keys, hetero_tree, scan_layout, split_dir, yaml_tree
from .opv2v_io import (CAMERA_KEY, as_array, camera_indices, existing, load_agent_yaml, parse_camera,
                       parse_objects, read_depth_png, read_rgb_png, require)
from .pcd import decode_pcd

LAYOUT = "<root>/<split>/<scenario>/<agent_id>/<timestamp>.pcd + .yaml"
IN_ORDER_TYPES = ("m1", "m2", "m3", "m4")
BEAM_COUNTS = (32, 16)
_CORE_KEYS = ("lidar_pose", "vehicles")

Modality = Union[None, str, Path, Mapping[str, Mapping[str, str]]]


def in_order_assignment(agent_ids: Iterable[int], types=IN_ORDER_TYPES) -> Dict[str, str]:
    """``{agent_id_str: type}`` cycling ``types`` over agents sorted by :func:`sort_agent_ids`."""
    return {str(a): types[k % len(types)] for k, a in enumerate(sort_agent_ids(agent_ids))}


def resolve_assignment(modality: Modality, tree: Mapping[str, Mapping[int, object]],
                       allowed_types: Optional[Iterable[str]] = None) -> Dict[Tuple[str, int], str]:
    """``{(scenario, agent_id): type}`` for every indexed agent.

    ``modality``: None (every type ""), ``"in_order"``, a path to the JSON
    ``{scenario: {agent_id_str: type}}`` or that mapping itself. A missing
    scenario or agent, or a type outside ``allowed_types``, raises a
    :class:`DataFormatError` naming the JSON, the scenario and the agent.
    """
    allowed = None if allowed_types is None else [str(t) for t in allowed_types]
    if modality is None:
        return {(s, a): "" for s, agents in tree.items() for a in agents}
    if isinstance(modality, str) and modality == "in_order":
        source = "modality 'in_order'"
        table = {s: in_order_assignment(agents) for s, agents in tree.items()}
    elif isinstance(modality, (str, Path)):
        source = str(modality)
        try:
            table = json.loads(Path(modality).read_text(encoding="utf-8"))
        except OSError as exc:
            raise DataFormatError(source, f"cannot read modality assignment: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise not_utf8(source, exc) from None
        except json.JSONDecodeError as exc:
            raise DataFormatError(source, f"modality assignment is not valid JSON: {exc}") from None
    elif isinstance(modality, Mapping):
        source, table = "<modality mapping>", modality
    else:
        raise TypeError(f"modality must be None, 'in_order', a JSON path or a mapping, got {type(modality)}")
    if not isinstance(table, Mapping):
        raise DataFormatError(source, "modality assignment must map scenario -> {agent_id: type}")
    out = {}
    for scen, agents in tree.items():
        per = table.get(scen)
        if not isinstance(per, Mapping):
            raise DataFormatError(source, f"no modality assignment for scenario {scen!r} "
                                  f"(agents {sort_agent_ids(agents)})", key=scen)
        for aid in agents:
            t = per.get(str(aid), per.get(aid)) if isinstance(per, Mapping) else None
            if t is None:
                raise DataFormatError(source, f"scenario {scen!r} has no modality for agent {aid}; "
                                      f"assigned agents: {sorted(per, key=str)}", key=f"{scen}.{aid}")
            if not isinstance(t, str) or not t or (allowed is not None and t not in allowed):
                raise DataFormatError(source, f"scenario {scen!r} agent {aid}: unknown modality {t!r}; "
                                      f"allowed types: {allowed if allowed is not None else 'non-empty strings'}",
                                      key=f"{scen}.{aid}")
            out[(scen, aid)] = t
    return out


def default_hetero_root(root: Path) -> Optional[Path]:
    """:func:`~.layout.hetero_tree` of ``root`` (``OPV2V`` -> ``OPV2V_Hetero``) when that directory exists."""
    cand = hetero_tree(root)
    return cand if cand is not None and cand.is_dir() else None


class OPV2VReader(IndexedReader):
    """Frames of one split of an OPV2V-format dataset.

    Args:
        root: dataset root holding ``<split>/`` directories.
        split: ``train`` / ``validate`` / ``test`` / ...; a missing split raises
            a :class:`DataFormatError` listing the existing ones.
        modality: agent-type assignment (see :func:`resolve_assignment`).
        hetero_root: OPV2V-H tree for ``_32.pcd`` / ``_16.pcd`` / ``_depth{i}.png``
            (default: :func:`default_hetero_root`).
        load_cameras: read camera PNGs and calibration; False gives ``cameras=[]``.
        load_depth: read ``_depth{i}.png`` into ``CameraObs.depth`` when present.
        load_beams: read ``_32.pcd`` / ``_16.pcd`` into ``AgentObs.lidar_beams``.
        skip_bad: see :mod:`.layout`.
        strict: data faults (an agent file missing inside the agent's recording span, a
            timestamp only some agents have, NaN/inf points) raise a DataFaultError naming
            the file instead of a DataFaultWarning (see :mod:`opencood_ext.data.faults`);
            ``.faults`` lists the index-time ones either way.
        allowed_types: modality names accepted in the assignment.
        max_agents: keep at most this many agents per frame (the first after sorting).
        cache_dir: keep decoded point clouds and yaml labels there as arrays
            (:mod:`.decode_cache`); None reads the sources every time.
    """

    left_handed = True  # CARLA frame: plots flip y
    lidar_ext = "pcd"  # <timestamp>.<lidar_ext> is an agent's main point cloud
    lidar_columns = 4  # leading columns of a scan that must be finite (x, y, z, intensity)

    def __init__(self, root, split: str, modality: Modality = None, hetero_root=None,
                 load_cameras: bool = True, load_depth: bool = True, load_beams: bool = True,
                 skip_bad: bool = False, allowed_types: Optional[Iterable[str]] = None,
                 max_agents: Optional[int] = None, cache_dir=None, strict: bool = False):
        super().__init__(skip_bad, strict)
        self.cache = None if cache_dir is None else DecodeCache(cache_dir)
        self.root = self._root = Path(root)
        self.split = str(split)
        self.load_cameras, self.load_depth, self.load_beams = load_cameras, load_depth, load_beams
        if max_agents is not None and int(max_agents) < 1:
            raise ValueError(f"max_agents must be >= 1, got {max_agents}")
        self.max_agents = None if max_agents is None else int(max_agents)
        self._split_dir = split_dir(self.root, self.split, LAYOUT)
        layout = scan_layout(self._split_dir, self.lidar_ext)
        self._tree = yaml_tree(layout)
        keys = frame_keys(self._tree)
        if not keys:
            raise DataFormatError(self._split_dir, f"no frames found (expected {LAYOUT})")
        if self.max_agents is not None:
            keys = [(s, t, a[:self.max_agents]) for s, t, a in keys]
        faults = layout_faults(self._split_dir, layout, self.lidar_ext)
        disputed = disputed_frames(faults)  # a renamed or stray file's timestamp is no frame
        self._keys = keys = [k for k in keys if k[:2] not in disputed]
        self._set_faults(faults, self._split_dir, {(s, t) for s, t, _ in keys})
        if hetero_root is not None and not Path(hetero_root).is_dir():
            raise DataFormatError(hetero_root, "hetero_root does not exist or is not a directory")
        self.hetero_root = Path(hetero_root) if hetero_root is not None else default_hetero_root(self.root)
        self._types = resolve_assignment(modality, self._tree, allowed_types)

    # ------------------------------------------------------------------ index
    def __len__(self) -> int:
        return len(self._keys)

    @property
    def scenarios(self) -> List[str]:
        return list(self._tree)

    @property
    def samples(self) -> List[Tuple[str, str]]:
        return [(s, t) for s, t, _ in self._keys]

    def agent_ids(self, i: int) -> Tuple[int, ...]:
        """Agent ids of frame ``i`` as they will be ordered in the Frame."""
        return self._keys[self._index(i)][2]

    def frame_path(self, i: int) -> Path:
        """The first (ego) agent's ``<timestamp>.yaml`` of frame ``i``."""
        s, t, agents = self._keys[self._index(i)]
        return self._split_dir / s / str(agents[0]) / f"{t}.yaml"

    def agent_type(self, scenario: str, agent_id: int) -> str:
        return self._types[(scenario, int(agent_id))]

    # ------------------------------------------------------------------ loading
    def _agent_dirs(self, scenario: str, agent_id: int) -> Tuple[Path, Optional[Path]]:
        main = self._split_dir / scenario / str(agent_id)
        het = None if self.hetero_root is None else self.hetero_root / self.split / scenario / str(agent_id)
        return main, het

    def _read_points(self, path: Path, read=decode_pcd, **kw) -> np.ndarray:
        """Decoded points of ``path`` as stored (cached when ``cache_dir`` is set), rows with
        NaN/inf values included: :meth:`_finite` drops (or refuses) them after the cache, so
        every read reports them."""
        return read(path, **kw) if self.cache is None else self.cache.points(path, read, **kw)

    def _finite(self, points: np.ndarray, path: Path) -> np.ndarray:
        return drop_nonfinite(points, path, self.lidar_columns, strict=self.strict)

    def _load_lidar(self, agent_dir: Path, ts: str) -> np.ndarray:
        path = agent_dir / f"{ts}.{self.lidar_ext}"
        return self._finite(self._read_points(path), path)

    def _cameras(self, d: dict, yaml_path: Path, main: Path, het: Optional[Path], ts: str) -> List[CameraObs]:
        if not self.load_cameras:
            return []
        pngs = {i: main / f"{ts}_camera{i}.png" for i in range(4)}
        indices = sorted(set(camera_indices(d)) | {i for i, p in pngs.items() if p.exists()})
        cams = []
        for i in indices:
            cords, T_lidar_from_camera, K = parse_camera(d, i, yaml_path)
            png = existing(main / f"{ts}_camera{i}.png")
            depth_png = existing(main / f"{ts}_depth{i}.png",
                                 None if het is None else het / f"{ts}_depth{i}.png") if self.load_depth else None
            cams.append(CameraObs(name=f"camera{i}", image=None if png is None else read_rgb_png(png),
                                  K=K, T_lidar_from_camera=T_lidar_from_camera,
                                  depth=None if depth_png is None else read_depth_png(depth_png),
                                  T_world_from_camera=pose_to_matrix(cords), cords=cords))
        return cams

    def _beams(self, main: Path, het: Optional[Path], ts: str) -> Dict[int, np.ndarray]:
        if not self.load_beams:
            return {}
        out = {}
        for n in BEAM_COUNTS:
            p = existing(main / f"{ts}_{n}.pcd", None if het is None else het / f"{ts}_{n}.pcd")
            if p is not None:
                out[n] = self._finite(self._read_points(p), p)
        return out

    def _load_agent(self, scenario: str, agent_id: int, ts: str) -> Tuple[AgentObs, Dict[int, ObjectLabel]]:
        main, het = self._agent_dirs(scenario, agent_id)
        yaml_path = main / f"{ts}.yaml"
        d = load_agent_yaml(yaml_path, self.cache)
        lidar_pose = as_array(require(d, "lidar_pose", yaml_path), (6,), yaml_path, "lidar_pose")
        objects = parse_objects(d, yaml_path)
        agent = AgentObs(
            agent_id=agent_id, agent_type=self._types[(scenario, agent_id)],
            T_world_from_lidar=pose_to_matrix(lidar_pose), lidar=self._load_lidar(main, ts),
            cameras=self._cameras(d, yaml_path, main, het, ts), lidar_beams=self._beams(main, het, ts),
            visible_ids=sorted(objects), lidar_pose=lidar_pose,
            meta={k: v for k, v in d.items() if k not in _CORE_KEYS and not CAMERA_KEY.match(str(k))})
        return agent, objects

    def _load(self, i: int) -> Frame:
        scenario, ts, agent_ids = self._keys[i]
        self._check_frame_faults(scenario, ts)
        agents, objects = [], {}
        for aid in agent_ids:
            agent, objs = self._load_agent(scenario, aid, ts)
            agents.append(agent)
            for oid, obj in objs.items():
                objects.setdefault(oid, obj)
        return Frame(scenario=scenario, timestamp=ts, agents=agents, objects=objects, split=self.split,
                     source=str(self._split_dir / scenario))
