"""GenComm stage 2 with a camera type whose grid is smaller than the detection range, under
``protocol: reference``: the reference (``heter_model_baseline_w_gencomm_stage2.forward``) runs each
type's message extractor on the shrunk feature, then centre-crops / zero-pads the feature AND the
message to the range (torchvision ``CenterCrop``); natively the message is extracted from the padded
feature. A checkpoint in the reference's layout (random weights), imported, gives the messages and the
head maps of an independent restatement of the reference's order, and the native order's are not
those (so the test fails if the protocol's gate breaks).

The frame: the real V2XSet scan (LiDAR type m1, as tests/opencood_ext/models/test_reference_e2e.py) and a camera agent m2
(the reference LSS with its ResNet-101 trunk, two random 48 x 64 images) 8 m away, either the ego;
the camera grid +-12.8 m, the range +-25.6 x +-12.8 m: the camera feature is padded in x only, as the
reference's OPV2V stage-2 configs (camera +-51.2 m, range +-102.4 x +-51.2 m).
"""
import math

import pytest
import torch
import torch.nn.functional as F

import reference_forward as ref
from opencood_ext.data.augment import AugmentConfig
from opencood_ext.data.batch import Batch, collate_samples
from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.data.inputs import CameraInput
from opencood_ext.geometry import pose_to_matrix
from opencood_ext.models.detector import CooperativeDetector
from reference_camera import UE4_FROM_OPENCV, reference_bev, resnet101_camencode
from reference_keys import base_bev, downsample_conv, message_extractor
from test_reference_e2e import (BACKBONES, GENCOMM_LINK, UNET, VOXEL, C, _checkpoint, _frame, _load, _Reader,
                                _shapes, _stack)
from test_reference_e2e import no_noise  # noqa: F401  (the fixture: diffusion noise zero on both sides)

torch.set_num_threads(1)
RANGE = [-25.6, -12.8, -3.0, 25.6, 12.8, 1.0]  # centred; 16 x 32 cells of 1.6 m after the shrink
CAM_XY = (-12.8, 12.8, 0.4)  # 64 cells; /4 after the backbone and the shrink: 16, padded to 32 columns
ZB = (-10.0, 10.0, 20.0)
DEPTH = (1.0, 12.0, 6)
CTX = 8
HW = (48, 64)
OFFSET = [8.0, 3.0, 0.0, 0.0, 20.0, 0.0]  # the camera agent in the ego's frame (x, y, z, roll, yaw, pitch)


def _camera_stack():
    nums, strides, filters, ups, up_filters = BACKBONES["m1"]
    return {"encoder": {"type": "lss_reference", "trunk": "resnet101", "img_downsample": 8,
                        "depth_discretization": list(DEPTH), "depth_mode": "LID", "xbound": list(CAM_XY),
                        "ybound": list(CAM_XY), "zbound": list(ZB), "context_channels": CTX},
            "backbone": {"type": "base_bev", "layer_nums": nums, "layer_strides": strides, "num_filters": filters,
                         "upsample_strides": ups, "num_upsample_filters": up_filters},
            "shrink": {"type": "downsample_conv", "kernel_size": [3], "stride": [2], "padding": [1], "dims": [C]}}


def _model(protocol):
    link = GENCOMM_LINK if protocol == "reference" else {**GENCOMM_LINK, "warp_before_generation": False}
    return CooperativeDetector({"m1": _stack("m1"), "m2": _camera_stack()}, RANGE, fusion="intermediate",
                               fusion_op="att", link=link, protocol=protocol).eval()


def _state():
    nums, _, filters, ups, up_filters = BACKBONES["m1"]
    camera = {**resnet101_camencode("encoder_m2", DEPTH[2], CTX),
              **base_bev("backbone_m2", list(zip([CTX] + filters[:-1], filters, nums, ups, up_filters))),
              **downsample_conv("shrinker_m2", [(sum(up_filters), C, 3)]),
              **message_extractor("message_extractor_m2", C)}
    return _checkpoint({**_shapes(["m1"], True), **camera}, seed=7)


def _cameras():
    """Two cameras of the m2 agent looking forward and backward (yawed by 0.3 rad), 1.5 m up; random images."""
    g = torch.Generator().manual_seed(11)
    T = torch.eye(4, dtype=torch.float64).repeat(1, 2, 1, 1)
    for k in range(2):
        yaw = k * math.pi + 0.3
        T[0, k, :2, :2] = torch.tensor([[math.cos(yaw), -math.sin(yaw)], [math.sin(yaw), math.cos(yaw)]])
        T[0, k, :3, 3] = torch.tensor([0.5, 0.0, 1.5])
    K = torch.tensor([[40.0, 0.0, HW[1] / 2 - 0.3], [0.0, 41.0, HW[0] / 2 + 0.2], [0.0, 0.0, 1.0]]).expand(1, 2, 3, 3)
    return CameraInput(torch.randn(1, 2, 3, *HW, generator=g), K.clone(), T.float())


def _batch(camera_ego=False):
    """One sample: the real scan's agent (m1) and the camera agent (m2), the ego first (m1 unless camera_ego)."""
    cfg = DataConfig(lidar_range=tuple(RANGE), augment=AugmentConfig(enabled=False), modality="all:m1",
                     agent_types={"m1": AgentTypeData(lidar_beams=64)}, max_agents=1)
    ds = CooperativeDataset(_Reader([_frame()]), cfg, {"m1": VOXEL}, train=False, cooperation="all")
    lb = collate_samples([ds[0]])
    T_lidar = lb.T_world_from_agent[0]
    T_cam = torch.from_numpy(T_lidar.numpy() @ pose_to_matrix(OFFSET))
    order = [1, 0] if camera_ego else [0, 1]  # positions of m1, m2
    poses = [None, None]
    poses[order[0]], poses[order[1]] = T_lidar, T_cam
    ids = [None, None]
    ids[order[0]], ids[order[1]] = lb.agent_ids[0], 9000
    points = [0, 0]
    points[order[0]] = int(lb.num_points[0])
    return Batch(agent_types=["m2", "m1"] if camera_ego else ["m1", "m2"], agent_ids=ids, agents_per_sample=[2],
                 T_world_from_agent=torch.stack(poses), T_ego_from_world=torch.linalg.inv(poses[0])[None],
                 inputs={"m1": lb.inputs["m1"], "m2": _cameras()},
                 type_index={"m1": torch.tensor([order[0]]), "m2": torch.tensor([order[1]])},
                 gt_boxes=lb.gt_boxes, num_points=torch.tensor(points), gt_classes=lb.gt_classes,
                 agent_times=[0.0, 0.0])


def _torchvision_center_crop(x, hw):
    """torchvision.transforms.functional.center_crop restated (torchvision is not installed here): zero
    padding ``[(w' - w) // 2, (h' - h) // 2, (w' - w + 1) // 2, (h' - h + 1) // 2]`` (left, top, right,
    bottom) where the crop is larger, then the cut from ``int(round((H - h') / 2))``."""
    (th, tw), (h, w) = hw, x.shape[-2:]
    if th > h or tw > w:
        x = F.pad(x, [(tw - w) // 2 if tw > w else 0, (tw - w + 1) // 2 if tw > w else 0,
                      (th - h) // 2 if th > h else 0, (th - h + 1) // 2 if th > h else 0], value=0.0)
        h, w = x.shape[-2:]
    top, left = int(round((h - th) / 2.0)), int(round((w - tw) / 2.0))
    return x[..., top:top + th, left:left + tw]


def _reference_features(sd, batch):
    """The reference's shrunk feature per agent, (1, C, h, w) each, before any crop / pad."""
    nums, strides, _, ups, _ = BACKBONES["m1"]
    inp = batch.inputs["m1"]
    pf = ref.pillar_vfe(sd, "encoder_m1", inp.voxels, inp.num_points, inp.coords, VOXEL, RANGE)
    x = ref.scatter(pf, inp.coords, 1, round((RANGE[3] - RANGE[0]) / VOXEL[0]), round((RANGE[4] - RANGE[1]) / VOXEL[1]))
    lidar = ref.downsample_conv(sd, "shrinker_m1", ref.base_bev(sd, "backbone_m1", x, nums, strides, ups), [2], [1])
    cam = batch.inputs["m2"]
    T = cam.T_lidar_from_camera.double()
    bev, _ = reference_bev(sd, "encoder_m2", "resnet101", 8, DEPTH, "LID", (CAM_XY, CAM_XY, ZB), cam.images,
                           T[..., :3, :3] @ UE4_FROM_OPENCV, T[..., :3, 3], cam.K.double())
    camera = ref.downsample_conv(sd, "shrinker_m2", ref.base_bev(sd, "backbone_m2", bev.float(), nums, strides, ups),
                                 [2], [1])
    return lidar, camera


def _reference(sd, batch, message_before_pad=True):
    """The reference's forward (message_before_pad True; False: the native order restated) -> messages
    (2, 2, H, W) in agent order and the head maps."""
    lidar, camera = _reference_features(sd, batch)
    hw = lidar.shape[-2:]
    # crop_ratio_H / _W: ymax / ybound[1], xmax / xbound[1]; target int(h ratio) x int(w ratio)
    ratio_h, ratio_w = RANGE[4] / CAM_XY[1], RANGE[3] / CAM_XY[1]
    target = (int(camera.shape[-2] * ratio_h), int(camera.shape[-1] * ratio_w))
    assert target == tuple(hw)
    padded = _torchvision_center_crop(camera, target)
    if message_before_pad:
        cam_msg = _torchvision_center_crop(ref.message_extractor(sd, "message_extractor_m2", camera), target)
    else:
        cam_msg = ref.message_extractor(sd, "message_extractor_m2", padded)
    feats = {"m1": lidar, "m2": padded}
    messages = {"m1": ref.message_extractor(sd, "message_extractor_m1", lidar), "m2": cam_msg}
    x = torch.cat([feats[t] for t in batch.agent_types])  # agent order: the ego first
    msgs = torch.cat([messages[t] for t in batch.agent_types])
    x = ref.enhance(sd, ref.generate(sd, x[:1].expand_as(x), msgs, **UNET))
    x = ref.warp_to_ego(x, batch.T_world_from_agent, RANGE)
    return msgs, ref.heads(sd, ref.att_fusion(x)[None])


def _ours(model, batch):
    with torch.no_grad():
        feats = model.encode(batch).feats
        msgs = model.link.send(feats, batch.agent_types)
        head = model(batch).head
    return msgs, head


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


def _map_errors(head, want):
    hwl = torch.tensor([a * 7 + j for a in range(head.reg.shape[1] // 7) for j in (0, 1, 2, 5, 4, 3, 6)])
    return [_rel(head.cls, want[0]), _rel(head.reg, want[1][:, hwl]), _rel(head.dir, want[2])]


@pytest.fixture(scope="module", params=[False, True], ids=["lidar_ego", "camera_ego"])
def setup(request):
    sd, batch = _state(), _batch(camera_ego=request.param)
    with torch.no_grad():
        want = _reference(sd, batch)
        native_order = _reference(sd, batch, message_before_pad=False)
    return sd, batch, want, native_order


def test_the_camera_message_is_extracted_before_the_pad_as_the_reference(no_noise, setup):
    """As a collaborator's message and as the ego's own (generated into the feature the ego fuses)."""
    sd, batch, (want_msgs, want_maps), (native_msgs, native_maps) = setup
    cam = batch.agent_types.index("m2")
    model = _model("reference")
    _load(model, sd)
    stack = model.encoders["m2"]
    assert stack.uncropped == (16, 16) and stack.crop == (16, 32) and model.link.unpadded == {"m2": (16, 16)}
    msgs, head = _ours(model, batch)
    assert msgs.shape == want_msgs.shape == (2, 2, 16, 32)
    assert not want_msgs[cam, :, :, :8].any() and not want_msgs[cam, :, :, 24:].any()  # zero where padded
    assert _rel(msgs, want_msgs) < 1e-4
    assert max(_map_errors(head, want_maps)) < 1e-4
    # the native order (the message of the padded feature) is another message and other maps, so the
    # checks above would catch a reference model extracting after the pad
    assert _rel(native_msgs[cam], want_msgs[cam]) > 1e-2 and max(_map_errors(head, native_maps)) > 1e-3


def test_native_extracts_the_message_from_the_padded_feature(no_noise, setup):
    sd, batch, (want_msgs, _), (native_msgs, _) = setup
    cam = batch.agent_types.index("m2")
    model = _model("native")
    _load(model, sd)
    assert model.link.unpadded == {}
    msgs, _ = _ours(model, batch)
    assert _rel(msgs[cam], native_msgs[cam]) < 1e-4 and _rel(msgs[cam], want_msgs[cam]) > 1e-2


def test_a_camera_grid_past_the_range_is_refused_under_reference():
    wide = _camera_stack()
    wide["encoder"] = {**wide["encoder"], "ybound": [-25.6, 25.6, 0.4]}  # y: 32 rows cut to 16
    with pytest.raises(ValueError, match=r"model\.agent_types\.m2\.encoder: its feature \(32, 16\) is cut"):
        CooperativeDetector({"m1": _stack("m1"), "m2": wide}, RANGE, fusion="intermediate", link=GENCOMM_LINK,
                            protocol="reference")
    # natively it is cut, as the reference cuts a HEAL feature
    model = CooperativeDetector({"m1": _stack("m1"), "m2": wide}, RANGE, fusion="intermediate",
                                link={**GENCOMM_LINK, "warp_before_generation": True}, protocol="native")
    assert model.encoders["m2"].crop == (16, 32) and model.link.unpadded == {}

