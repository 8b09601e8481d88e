"""The reference LSS camera encoder (encoder type ``lss_reference``): its EfficientNet-B0 and ResNet-101
trunks, the import of the reference's CamEncode checkpoint layout, and its BEV feature against the
reference's computation written out in tests/helpers/reference_camera.py; GenComm's camera stage-1 yamls
(tests/assets/hypes, copied from the reference) convert and build it."""
import math
from pathlib import Path

import pytest
import torch
from torch import nn

import gencomm  # noqa: F401  (registers the GenComm link the stage-1 yamls use)
from opencood_ext.data.inputs import CameraInput
from opencood_ext.experiment import build_model
from opencood_ext.interop import HypesError, convert_hypes_file
from opencood_ext.interop.weights import WeightImportError, import_reference_state
from opencood_ext.models.encoder_stack import EncoderStack, center_crop
from opencood_ext.models.image_trunks import R101_BLOCKS, EfficientNetB0Trunk, ResNetTrunk, build_trunk
from opencood_ext.models.lss_reference import ReferenceLSSEncoder
from reference_camera import (UE4_FROM_OPENCV, depth_discretization, efficientnet_camencode, random_state,
                              reference_bev, resnet101_camencode)
from reference_keys import base_bev, diffusion_unet, downsample_conv, enhancer, enhancer_unread, gencomm_schedule
from reference_keys import heads as keys_heads
from reference_keys import message_extractor

torch.set_num_threads(1)
HYPES = Path(__file__).parents[2] / "assets" / "hypes"
RANGE = [-12.8, -12.8, -3.0, 12.8, 12.8, 1.0]
XY = (-12.8, 12.8, 0.4)


def _params(module):
    return sum(p.numel() for p in module.parameters())


def test_trunk_parameter_counts_are_the_known_ones():
    # EfficientNet-B0: 5,288,548 parameters; less its classifier (1280 x 1000 + 1000) and its 1280-wide
    # head conv + BN (320 x 1280 + 2 x 1280), which the reference's CamEncode never runs
    assert _params(EfficientNetB0Trunk()) == 5_288_548 - 1_281_000 - (320 * 1280 + 2 * 1280)
    # ResNet-101: 44,549,160; less its fc (2048 x 1000 + 1000)
    assert _params(ResNetTrunk(R101_BLOCKS, num_stages=4)) == 44_549_160 - 2_049_000
    # the part CamEncode_Resnet101 keeps: conv1 + bn1 (9,536), layer1 (215,808), layer2 (1,219,584)
    resnet = build_trunk("resnet101")
    assert _params(resnet) == 9_536 + 215_808 + 1_219_584
    # initialised as torchvision's resnet101(zero_init_residual=True): each block's last BN weight 0
    assert all(not b.bn3.weight.detach().any() for stage in resnet.stages for b in stage)
    with pytest.raises(ValueError, match="unknown image trunk 'resnet50'"):
        build_trunk("resnet50")


def _at(path, module):
    """A model holding ``module`` at ``path`` (the SLOTS path of an agent type's encoder)."""
    root = node = nn.Module()
    *parents, last = path.split(".")
    for name in parents:
        node.add_module(name, nn.Module())
        node = getattr(node, name)
    node.add_module(last, module)
    return root


def _cameras(a, n, H, W, seed):
    """Reference-style camera parameters (OpenCV axes -> LiDAR) and the CameraInput OPV2V's loader makes
    of them (its camera axes: x forward, y right, z up)."""
    g = torch.Generator().manual_seed(seed)
    yaw = torch.arange(a * n, dtype=torch.float64).view(a, n) * (2 * math.pi / n) + torch.rand(a, n, generator=g,
                                                                                                   dtype=torch.float64)
    pitch = (torch.rand(a, n, generator=g, dtype=torch.float64) - 0.5) * 0.2
    cy, sy, cp, sp = yaw.cos(), yaw.sin(), pitch.cos(), pitch.sin()
    z, o = torch.zeros_like(yaw), torch.ones_like(yaw)
    Rz = torch.stack([cy, -sy, z, sy, cy, z, z, z, o], -1).view(a, n, 3, 3)
    Ry = torch.stack([cp, z, sp, z, o, z, -sp, z, cp], -1).view(a, n, 3, 3)
    R_ue = Rz @ Ry
    trans = torch.rand(a, n, 3, generator=g, dtype=torch.float64) * torch.tensor([1.0, 1.0, 0.5]) + torch.tensor(
        [0.0, 0.0, 1.2])
    intrins = torch.tensor([[40.0, 0.0, W / 2 - 0.3], [0.0, 41.0, H / 2 + 0.2], [0.0, 0.0, 1.0]],
                           dtype=torch.float64).expand(a, n, 3, 3)
    T = torch.eye(4, dtype=torch.float64).repeat(a, n, 1, 1)
    T[..., :3, :3], T[..., :3, 3] = R_ue, trans
    images = torch.randn(a, n, 3, H, W, generator=g)
    cam = CameraInput(images, intrins.float(), T.float())
    return cam, R_ue @ UE4_FROM_OPENCV, trans, intrins.float().double(), T.float().double()


def _check(trunk, downsample, ddiscr, mode, zbound, hw, seed):
    D, C = int(ddiscr[2]), 8
    keys = (efficientnet_camencode("encoder_m2", D, C, downsample) if trunk == "efficientnet_b0"
            else resnet101_camencode("encoder_m2", D, C))
    ref = random_state(keys, seed)
    enc = ReferenceLSSEncoder(RANGE, trunk=trunk, img_downsample=downsample, depth_discretization=ddiscr,
                              depth_mode=mode, xbound=XY, ybound=XY, zbound=zbound, context_channels=C)
    mapping = import_reference_state(ref, _at("encoders.m2.encoder", enc))
    assert mapping.unused == [] and set(mapping.state) == {f"encoders.m2.encoder.{k}" for k in enc.state_dict()}
    enc.load_state_dict({k[len("encoders.m2.encoder."):]: v for k, v in mapping.state.items()})
    enc.eval()
    cam, rots, trans, intrins, T = _cameras(2, 2, *hw, seed)
    # the reference's extrinsics as float32 numbers, like ours (its loader casts them too)
    rots = T[..., :3, :3] @ UE4_FROM_OPENCV
    with torch.no_grad():
        out = enc(cam)
        want, logit = reference_bev(ref, "encoder_m2", trunk, downsample, ddiscr, mode, (XY, XY, zbound),
                                    cam.images, rots, T[..., :3, 3], intrins)
    h, w = hw[0] // downsample, hw[1] // downsample
    assert out.depth_logits.shape == (2, 2, D, h, w)
    torch.testing.assert_close(out.depth_logits, logit.view(2, 2, D, h, w), rtol=1e-5, atol=1e-5)
    assert out.bev.shape == want.shape and out.bev.shape[1] == enc.out_channels
    scale = float(want.abs().max())
    assert scale > 0 and int((want != 0).any(dim=1).sum()) >= 100  # the cameras see a part of the grid
    assert float((out.bev.double() - want).abs().max()) <= 1e-5 * scale
    return mapping


def test_efficientnet_camencode_imports_and_gives_the_reference_bev():
    mapping = _check("efficientnet_b0", 8, (1.0, 20.0, 12), "LID", (-10.0, 10.0, 20.0), (64, 96), seed=1)
    # the EfficientNet's head conv, its BN and the classifier: held by the checkpoint, never run
    assert sorted(k.split(".")[3] for k in mapping.dropped) == ["_bn1"] * 5 + ["_conv_head", "_fc", "_fc"]


def test_efficientnet_at_stride_16_with_uniform_bins_and_two_height_cells():
    _check("efficientnet_b0", 16, (1.0, 18.0, 10), "UD", (-2.0, 2.0, 2.0), (64, 128), seed=2)


def test_resnet101_camencode_imports_and_gives_the_reference_bev():
    _check("resnet101", 8, (2.0, 20.0, 9), "LID", (-10.0, 10.0, 20.0), (48, 72), seed=3)


def test_a_checkpoint_of_the_other_trunk_is_refused_naming_the_keys():
    enc = ReferenceLSSEncoder(RANGE, trunk="efficientnet_b0", xbound=XY, ybound=XY, context_channels=8,
                              depth_discretization=(2.0, 50.0, 6))
    ref = random_state(resnet101_camencode("encoder_m2", 6, 8), 0)
    with pytest.raises(WeightImportError, match=r"encoder_m2\.camencode\.trunk\._conv_stem\.weight"):
        import_reference_state(ref, _at("encoders.m2.encoder", enc))


def test_splat_truncates_toward_zero_like_the_reference():
    enc = ReferenceLSSEncoder(RANGE, trunk="resnet101", xbound=XY, ybound=XY, context_channels=1)
    pts = torch.tensor([[[-12.9, 0.1, 0.0], [-13.3, 0.1, 0.0], [0.1, 12.79, 0.0], [0.1, 0.1, -25.0]]],
                       dtype=torch.float64)
    bev = enc.splat(pts, torch.ones(1, 4, 1))
    # 0.1 m below the low x edge lands in column 0; 0.5 m below is dropped; z is binned over zbound the same way
    assert bev[0, 0, 32, 0] == 1 and bev[0, 0, 63, 32] == 1 and bev[0, 0, 32, 32] == 1 and bev.sum() == 3


def test_depth_loss_is_the_reference_focal_loss():
    enc = ReferenceLSSEncoder(RANGE, trunk="resnet101", xbound=XY, ybound=XY, depth_discretization=(2.0, 50.0, 48),
                              depth_mode="LID")
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 2, 48, 3, 4, generator=g)
    depth = torch.rand(1, 2, 24, 32, generator=g) * 70  # beyond dmax and below dmin too
    depth[0, 0, 4, 4] = 0.0  # no return: NaN in LID -> the last bin
    # bin_depths (target=True) of the depth at pixels 4 + 8 i, the focal loss (alpha 0.25, gamma 2), mean
    d = depth[..., 4::8, 4::8].clamp(max=50.0)
    size = 2 * 48.0 / (48 * 49)
    idx = -0.5 + 0.5 * torch.sqrt(1 + 8 * (d - 2.0) / size)
    idx[idx < 0] = 0
    idx[(idx >= 48) | ~torch.isfinite(idx)] = 47
    target = idx.long()
    assert int(target[0, 0, 0, 0]) == 47
    p = logits.softmax(2)
    onehot = torch.nn.functional.one_hot(target, 48).permute(0, 1, 4, 2, 3).float()
    want = (onehot * (-0.25 * (1 - p) ** 2 * logits.log_softmax(2))).sum(2).mean()
    torch.testing.assert_close(enc.depth_loss(logits, depth), want)
    total, count = enc.depth_loss_terms(logits, depth)
    torch.testing.assert_close(total.sum() / count.sum(), want)
    assert depth_discretization(2.0, 50.0, 48, "LID")[-1] < 50.0  # the bins' near edges


def test_constructor_refuses_what_the_reference_cannot_compute():
    with pytest.raises(ValueError, match="must reach past 0"):
        ReferenceLSSEncoder(RANGE, xbound=(-10.0, -2.0, 0.4), ybound=XY)
    with pytest.raises(ValueError, match="img_downsample: resnet101 gives features at stride \\[8\\]"):
        ReferenceLSSEncoder(RANGE, trunk="resnet101", img_downsample=16, xbound=XY, ybound=XY)
    with pytest.raises(ValueError, match="depth_mode"):
        ReferenceLSSEncoder(RANGE, depth_mode="SID", xbound=XY, ybound=XY)
    enc = ReferenceLSSEncoder(RANGE, xbound=XY, ybound=XY, context_channels=4, depth_discretization=(2.0, 50.0, 4))
    cam, *_ = _cameras(1, 1, 48, 64, 0)
    with pytest.raises(ValueError, match="image size 48x64 must be a multiple of 32"):
        enc(cam)


@pytest.mark.parametrize("m, trunk, image, keys", [
    ("m2", "efficientnet_b0", (384, 512), efficientnet_camencode("encoder_m2", 48, 128, 8)),
    ("m4", "resnet101", (336, 448), resnet101_camencode("encoder_m4", 48, 128)),
])
def test_gencomm_camera_stage1_yamls_convert_and_build(tmp_path, m, trunk, image, keys):
    conv = convert_hypes_file(HYPES / f"gencomm_stage1_{m}_att.yaml", remap_to=tmp_path / "modality.json")
    cfg = conv.experiment()
    assert cfg.model["agent_types"][m]["encoder"] == {
        "type": "lss_reference", "trunk": trunk, "img_downsample": 8, "depth_discretization": [2, 50, 48],
        "depth_mode": "LID", "xbound": [-51.2, 51.2, 0.4], "ybound": [-51.2, 51.2, 0.4], "zbound": [-10, 10, 20.0],
        "context_channels": 128}
    spec = cfg.data.agent_types[m]
    assert (spec.sensor, spec.image_size, spec.use_depth) == ("camera", image, True)
    approx = dict(conv.approximations)
    assert "label_type" in approx
    # the reference trains m2 from ImageNet weights, m4 from torchvision's initialisation (ours too)
    assert ("model.args.m2.encoder_args.camera_encoder" in approx) == (m == "m2")
    model = build_model(cfg)
    enc = model.encoders[m].encoder
    assert type(enc) is ReferenceLSSEncoder and enc.bev_shape == (256, 256) and enc.out_channels == 128
    assert model.grid.shape == (64, 64) and model.grid.cell == (1.6, 1.6)
    # as many parameters as the reference CamEncode holds, less what its forward never runs
    unread = ("trunk._conv_head", "trunk._bn1.", "trunk._fc", "running_", "num_batches")
    assert _params(enc) == sum(math.prod(s) for k, s in keys.items() if not any(u in k for u in unread))


def test_center_crop_is_torchvisions():
    x = torch.arange(1.0, 26.0).view(1, 1, 5, 5)
    # cut: from round((5 - 2) / 2) = 2 (round half to even), round((5 - 3) / 2) = 1
    assert center_crop(x, (2, 3)).flatten().tolist() == [12.0, 13.0, 14.0, 17.0, 18.0, 19.0]
    # pad: (8 - 5) // 2 = 1 zero row / column before, 2 after; 6 columns: none before, one after
    y = center_crop(x, (8, 6))
    assert y.shape == (1, 1, 8, 6) and y[0, 0, 1:6, 0:5].equal(x[0, 0]) and y.sum() == x.sum()


def test_a_camera_grid_inside_the_range_is_padded_to_it_after_the_shrink():
    enc = {"type": "lss_reference", "trunk": "resnet101", "xbound": [-6.4, 6.4, 0.4], "ybound": [-6.4, 6.4, 0.4],
           "depth_discretization": [1.0, 12.0, 6], "context_channels": 8}
    stack = EncoderStack(enc, {"type": "base_bev", "layer_nums": [1], "layer_strides": [2], "num_filters": [8],
                               "upsample_strides": [1], "num_upsample_filters": [8]}, RANGE,
                         shrink={"type": "downsample_conv", "kernel_size": [3], "stride": [1], "padding": [1],
                                 "dims": [8]}).eval()
    assert stack.encoder.bev_shape == (32, 32) and stack.crop == (32, 32)  # 16 cells of 0.8 m -> int(16 x 2)
    assert stack.grid.shape == (32, 32) and stack.grid.cell == (0.8, 0.8)
    cam, *_ = _cameras(1, 2, 48, 64, 4)
    with torch.no_grad():
        out = stack(cam).bev
        inner = stack.shrink(stack.backbone(stack.encoder(cam).bev))
    assert out.shape == (1, 8, 32, 32) and out[..., 8:24, 8:24].equal(inner)
    assert out[..., :8, :].abs().sum() == 0 and out[..., :, 24:].abs().sum() == 0


def test_a_camera_grid_past_the_detection_range_is_refused_for_gencomm(tmp_path):
    src = (HYPES / "gencomm_stage1_m2_att.yaml").read_text()
    edited = tmp_path / "m2_60.yaml"
    edited.write_text(src.replace("xbound: [-51.2, 51.2, 0.4]", "xbound: [-60, 60, 0.4]"))
    with pytest.raises(HypesError, match=r"heter\.modality_setting\.m2\.grid_conf\.xbound.*reaches past.*crop drops"):
        convert_hypes_file(edited, remap_to=tmp_path / "modality.json")


def test_a_gencomm_camera_grid_inside_the_range_converts_and_pads_after_the_message(tmp_path):
    """The reference's stage-2 shape (camera +-51.2 m, range +-102.4 x +-51.2 m): converted, it runs
    protocol reference, whose GenComm link extracts m4's message before the stack pads the feature."""
    src = (HYPES / "gencomm_stage1_m4_att.yaml").read_text()
    wide = src.replace("[-51.2, -51.2, -3, 51.2, 51.2, 1]", "[-102.4, -51.2, -3, 102.4, 51.2, 1]")
    assert wide != src
    edited = tmp_path / "m4_wide.yaml"
    edited.write_text(wide)
    cfg = convert_hypes_file(edited, remap_to=tmp_path / "modality.json").experiment()
    assert cfg.protocol == "reference" and cfg.model["agent_types"]["m4"]["encoder"]["xbound"] == [-51.2, 51.2, 0.4]
    model = build_model(cfg)
    stack = model.encoders["m4"]
    assert stack.uncropped == (64, 64) and stack.crop == (64, 128) and model.grid.shape == (64, 128)
    assert model.link.unpadded == {"m4": (64, 64)}


@pytest.mark.parametrize("m", ["m2", "m4"])
def test_a_whole_gencomm_camera_stage1_checkpoint_imports(tmp_path, m):
    """Every key of the reference's heter_model_baseline_w_gencomm_stage1 for m2 / m4 (camera encoder,
    BaseBEVBackbone, DownsampleConv, MessageExtractorv2, GenComm UNet + schedule, Enhancer, heads) lands
    in the model the config importer builds; only never-run keys are dropped."""
    conv = convert_hypes_file(HYPES / f"gencomm_stage1_{m}_att.yaml", remap_to=tmp_path / "modality.json")
    model = build_model(conv.experiment())
    camera = (efficientnet_camencode(f"encoder_{m}", 48, 128, 8) if m == "m2"
              else resnet101_camencode(f"encoder_{m}", 48, 128))
    levels = [(128, 64, 3, 1, 128), (64, 128, 5, 2, 128), (128, 256, 8, 4, 128)]  # inplanes 128, [3, 5, 8]
    shapes = {**camera, **base_bev(f"backbone_{m}", levels),
              **downsample_conv(f"shrinker_{m}", [(384, 128, 3)]), **message_extractor(f"message_extractor_{m}", 128),
              **diffusion_unet("gencomm.denoiser", 8, (1, 1), 2, 130, 128), **enhancer("enhancer", 128),
              **keys_heads(128)}
    schedule = gencomm_schedule("gencomm")
    mapping = import_reference_state({**random_state(shapes, 5), **schedule}, model)  # refuses any misfit
    unread = set(enhancer_unread(shapes)) | {k for k in camera if ".trunk._conv_head" in k or ".trunk._bn1." in k
                                             or ".trunk._fc" in k}
    assert mapping.unused == [] and set(mapping.dropped) == unread
    model.load_state_dict(mapping.state)
