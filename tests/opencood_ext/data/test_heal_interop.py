"""``tools/simulate.py --tree heal`` output read the way HEAL reads OPV2V-H.

``heal_paths`` / ``heal_depth`` / ``heal_visibility`` below are a small loader
written from HEAL's public conventions (yifanlu0227/HEAL):

* ``opencood/data_utils/datasets/basedataset/opv2v_basedataset.py``: scenario
  folders under ``root_dir`` (= ``<root>/<split>``), one folder per CAV, one
  ``<timestamp>.yaml`` per frame; depth ``<cav>/<ts>_depth{i}.png`` with every
  ``OPV2V`` in the path replaced by ``OPV2V_Hetero``; extra files
  (``bev_visibility.png``) at ``<cav>/<ts>_<name>``;
* ``opencood/utils/heter_utils.py`` ``switch_lidar_channels``: a 32 / 16-beam
  modality reads ``<ts>.pcd`` with ``OPV2V`` -> ``OPV2V_Hetero`` and
  ``.pcd`` -> ``_32.pcd`` / ``_16.pcd``;
* ``intermediate_heter_fusion_dataset.py``: depth = ``ToTensor(PIL image) * 255``
  (``ToTensor`` divides 8-bit images by 255 and leaves wider integers alone);
* ``box_utils.box_is_visible``: the mask is 256 x 256, 0.39 m a cell, row
  ``127 - int(x / 0.39)``, column ``127 + int(y / 0.39)``, non-zero = visible;
  the PNG is read with ``cv2.imread`` (BGR) and converted to gray;
* ``pcd_utils.pcd_to_np``: open3d's reader, intensity = the red colour channel.
"""
import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from opencood_ext.data.formats import OPV2VReader, read_pcd
from opencood_ext.geometry import invert_transform, pose_to_matrix

REPO = Path(__file__).resolve().parents[3]
ARGS = ["--scenarios", "1", "--frames", "2", "--seed", "0", "--camera_size", "160x120", "--vehicles", "40", "41",
        "--points_per_second", "400000", "--raster_res", "0.5", "--split_ratio", "1", "0", "0", "--quiet"]
UE4_TO_OPENCV = np.array([[0, 0, 1, 0], [1, 0, 0, 0], [0, -1, 0, 0], [0, 0, 0, 1]], np.float64)


def _tool():
    spec = importlib.util.spec_from_file_location("simulate_tool", REPO / "tools" / "simulate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ------------------------------------------------------------------ the HEAL-convention loader

def heal_frames(root_dir: Path):
    """(scenario, cav_id, timestamp, cav_path) for every frame, HEAL's folder walk."""
    for scen in sorted(p for p in root_dir.iterdir() if p.is_dir()):
        for cav in sorted(p for p in scen.iterdir() if p.is_dir()):
            for y in sorted(x for x in cav.iterdir() if x.name.endswith(".yaml") and "additional" not in x.name):
                yield scen.name, cav.name, y.name[:-len(".yaml")], cav


def heal_paths(cav_path: Path, ts: str) -> dict:
    s = str(cav_path)
    return {"yaml": Path(s) / f"{ts}.yaml", "lidar": Path(s) / f"{ts}.pcd",
            "lidar_32": Path(str(Path(s) / f"{ts}.pcd").replace("OPV2V", "OPV2V_Hetero").replace(".pcd", "_32.pcd")),
            "lidar_16": Path(str(Path(s) / f"{ts}.pcd").replace("OPV2V", "OPV2V_Hetero").replace(".pcd", "_16.pcd")),
            "cameras": [Path(s) / f"{ts}_camera{i}.png" for i in range(4)],
            "depths": [Path(str(Path(s) / f"{ts}_depth{i}.png").replace("OPV2V", "OPV2V_Hetero")) for i in range(4)],
            "bev_visibility.png": Path(s) / f"{ts}_bev_visibility.png"}


def heal_depth(path: Path) -> np.ndarray:
    """``img_to_tensor(depth_img) * 255`` on a PIL image."""
    arr = np.asarray(Image.open(path))
    as_tensor = arr.astype(np.float32) / 255.0 if arr.dtype == np.uint8 else arr.astype(np.float32)
    return as_tensor * 255.0


def heal_visibility(path: Path) -> np.ndarray:
    """cv2.imread (3 channels, BGR) then BGR2GRAY."""
    bgr = np.asarray(Image.open(path).convert("RGB"), np.float64)[..., ::-1]
    return np.rint(0.114 * bgr[..., 0] + 0.587 * bgr[..., 1] + 0.299 * bgr[..., 2]).astype(np.uint8)


def heal_box_is_visible(x: float, y: float, visibility: np.ndarray) -> bool:
    py, px = 127 - int(x / 0.39), 127 + int(y / 0.39)
    if py < 0 or py >= 256 or px < 0 or px >= 256:
        return False
    return bool(visibility[py, px] > 0)


def heal_camera(params: dict, i: int):
    """(T_lidar_from_camera in OpenCV axes, K), HEAL's ``get_ext_int``."""
    T_world_cam = pose_to_matrix(params[f"camera{i}"]["cords"])
    T_world_lidar = pose_to_matrix(params["lidar_pose"])
    return invert_transform(T_world_lidar) @ T_world_cam @ UE4_TO_OPENCV, np.asarray(params[f"camera{i}"]["intrinsic"])


# ------------------------------------------------------------------ the test

@pytest.fixture(scope="module")
def heal_tree(tmp_path_factory):
    out = tmp_path_factory.mktemp("heal") / "dataset" / "OPV2V"
    assert _tool().main(["-o", str(out), "--tree", "heal"] + ARGS) == 0
    return out


def test_tree_heal_needs_opv2v_in_the_path(tmp_path, capsys):
    assert _tool().main(["-o", str(tmp_path / "sim"), "--tree", "heal"] + ARGS) == 2
    assert "must contain 'OPV2V'" in capsys.readouterr().err and not (tmp_path / "sim").exists()


def test_heal_finds_and_decodes_every_file(heal_tree):
    import open3d as o3d
    import yaml

    het = heal_tree.parent / "OPV2V_Hetero"
    assert het.is_dir() and not list(heal_tree.rglob("*_depth*")) and not list(heal_tree.rglob("*_32.pcd"))
    assignment = json.loads((heal_tree / "modality_assignment.json").read_text())
    frames = list(heal_frames(heal_tree / "train"))
    assert len(frames) >= 2 * 2
    depth_errors, seen_visible, unseen_visible = [], [], []
    for scen, cav, ts, cav_path in frames:
        assert assignment[scen][cav] in ("m1", "m2", "m3", "m4")
        paths = heal_paths(cav_path, ts)
        params = yaml.safe_load(paths["yaml"].read_text())
        pcd = o3d.io.read_point_cloud(str(paths["lidar"]))
        xyz = np.asarray(pcd.points)
        np.testing.assert_allclose(xyz, read_pcd(paths["lidar"])[:, :3], atol=1e-5)
        np.testing.assert_allclose(np.asarray(pcd.colors)[:, 0], read_pcd(paths["lidar"])[:, 3], atol=0.5 / 255)
        n32 = len(o3d.io.read_point_cloud(str(paths["lidar_32"])).points)
        n16 = len(o3d.io.read_point_cloud(str(paths["lidar_16"])).points)
        assert 0 < n16 < n32 < len(xyz)
        assert all(p.is_file() for p in paths["cameras"])
        for i, dpath in enumerate(paths["depths"]):
            depth = heal_depth(dpath)
            assert depth.shape == (120, 160) and depth.min() >= 0 and depth.max() <= 255
            # metres: LiDAR points projected into the camera land on pixels of about their depth
            T, K = heal_camera(params, i)
            p = (invert_transform(T) @ np.c_[xyz, np.ones(len(xyz))].T)[:3].T
            p = p[(p[:, 2] > 2) & (p[:, 2] < 60)]
            uv = (K @ (p / p[:, 2:3]).T).T[:, :2]
            inside = (uv[:, 0] >= 0) & (uv[:, 0] < 160) & (uv[:, 1] >= 0) & (uv[:, 1] < 120)
            col, row = uv[inside, 0].astype(int), uv[inside, 1].astype(int)
            depth_errors.append(np.abs(depth[row, col] - p[inside, 2]))
        vis = heal_visibility(paths["bev_visibility.png"])
        assert vis.shape == (256, 256) and set(np.unique(vis)) <= {0, 255} and 0.05 < (vis > 0).mean() < 0.95
        T_lidar_world = invert_transform(pose_to_matrix(params["lidar_pose"]))
        labelled = set(params["vehicles"])   # the vehicles this agent's LiDAR hits
        everyone = {}
        for _, other, ts2, other_path in frames:
            if ts2 == ts and other_path.parent == cav_path.parent:
                everyone.update(yaml.safe_load((other_path / f"{ts}.yaml").read_text())["vehicles"])
        for oid, v in everyone.items():
            c = T_lidar_world @ np.r_[np.add(v["location"], v["center"]), 1.0]
            if max(abs(c[0]), abs(c[1])) > 45 or oid == int(cav):
                continue
            (seen_visible if oid in labelled else unseen_visible).append(heal_box_is_visible(c[0], c[1], vis))
    err = np.concatenate(depth_errors)
    assert len(err) > 1000 and np.median(err) < 0.5 and np.mean(err < 1.0) > 0.8, (np.median(err), len(err))
    # the mask agrees with what the agent's own sensors hit: most vehicles its LiDAR labels are in
    # visible cells, most vehicles only other agents label are not
    assert len(seen_visible) >= 5 and len(unseen_visible) >= 5
    assert np.mean(seen_visible) >= 0.6 and np.mean(unseen_visible) <= 0.3, (seen_visible, unseen_visible)


def test_our_reader_reads_the_heal_tree_back(heal_tree):
    reader = OPV2VReader(heal_tree, "train", modality=heal_tree / "modality_assignment.json")
    assert reader.hetero_root == heal_tree.parent / "OPV2V_Hetero"
    frame = reader[0]
    for agent in frame.agents:
        assert sorted(agent.lidar_beams) == [16, 32] and len(agent.cameras) == 4
        cav = heal_tree / "train" / frame.scenario / str(agent.agent_id)
        for i, cam in enumerate(agent.cameras):
            np.testing.assert_array_equal(cam.depth, heal_depth(heal_paths(cav, frame.timestamp)["depths"][i]))
    explicit = OPV2VReader(heal_tree, "train", hetero_root=heal_tree.parent / "OPV2V_Hetero")[0]
    assert sorted(explicit.agents[0].lidar_beams) == [16, 32]


def test_rerun_checks_both_trees(heal_tree, capsys):
    """A finished scenario is skipped; one whose side-tree folder is gone is recorded again."""
    tool = _tool()
    capsys.readouterr()
    assert tool.main(["-o", str(heal_tree), "--tree", "heal"] + ARGS) == 0
    assert "recorded 0 scenario(s), skipped 1" in capsys.readouterr().out
    het = heal_tree.parent / "OPV2V_Hetero"
    before = sorted(p.relative_to(het) for p in het.rglob("*") if p.is_file())
    shutil.rmtree(next((het / "train").iterdir()))
    assert tool.main(["-o", str(heal_tree), "--tree", "heal"] + ARGS) == 0
    assert "recorded 1 scenario(s), skipped 0" in capsys.readouterr().out
    assert sorted(p.relative_to(het) for p in het.rglob("*") if p.is_file()) == before
