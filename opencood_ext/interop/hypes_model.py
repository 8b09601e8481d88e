"""The ``model:`` section of a converted hypes yaml, and the checks against the built model.

Reference model ``heter_model_baseline*`` (per type: encoder -> BEV backbone ->
shrink header; fusion; shared 1x1 heads) maps onto our
:class:`~opencood_ext.models.detector.CooperativeDetector` with one
:class:`~opencood_ext.models.encoder_stack.EncoderStack` per type.
"""
from __future__ import annotations

import math
import re
from typing import List

from .hypes_detect import anchors, fusion_op, loss_weights
from .hypes_keys import ENCODERS, MODELS, REFUSED_MODELS, SENSORS
from .hypes_pyramid import PYRAMID_MODELS, check_pyramid, pyramid_fusion, pyramid_stack
from .hypes_reader import HypesReader, same_value
from .hypes_stamp import STAMP_COLLAB_MODELS, check_collab, stamp_collab, stamp_infer_link, stamp_link

# the reference LSS's camera_encoder -> our image trunk (opencood_ext/models/image_trunks.py)
CAMERA_TRUNKS = {"EfficientNet": "efficientnet_b0", "Resnet101": "resnet101"}
# the reference SECOND (VoxelBackBone8x): stage widths and SubM blocks after each stage's first conv
SECOND_CHANNELS, SECOND_BLOCKS = [16, 32, 64, 64], [1, 2, 2, 2]
_MODALITY = re.compile(r"m\d+\Z")
# model.args.missing_message: true -> the share of each collaborator's message elements the reference's
# evaluation zeroes (heter_model_baseline_w_gencomm_stage1/2 forward: torch.rand(C, H, W) > 0.4 / > 0.1)
MISSING_MESSAGE = {"heter_model_baseline_w_gencomm_stage1": 0.4, "heter_model_baseline_w_gencomm_stage2": 0.1}


def modality_names(r: HypesReader) -> List[str]:
    """The agent types: modality keys of ``model.args`` (which must match heter.modality_setting)."""
    model = [k for k in r.children("model.args") if _MODALITY.match(k)]
    heter = [k for k in r.children("heter.modality_setting") if _MODALITY.match(k)]
    if not model:
        r.refuse("model.args", "names no modality (m1, m2, ...)")
    elif sorted(model) != sorted(heter):
        r.refuse("heter.modality_setting", f"sets up {heter} but model.args builds {model}")
    return model


def _pillars(r: HypesReader, m: str, voxel) -> dict:
    args = f"model.args.{m}.encoder_args"
    widths = list(r.get(f"{args}.pillar_vfe.num_filters", [64]))
    # the reference's non-last PFN layers output width // 2 and concatenate the pillar max; ours take the width
    if any(int(w) % 2 for w in widths[:-1]):
        r.refuse(f"{args}.pillar_vfe.num_filters", f"non-last widths must be even, got {widths}")
    if r.has(f"{args}.point_pillar_scatter.num_features") and \
            not same_value(r.get(f"{args}.point_pillar_scatter.num_features"), widths[-1]):
        r.refuse(f"{args}.point_pillar_scatter.num_features", f"must equal the last pillar width {widths[-1]}")
    return {"type": "pointpillars", "voxel_size": voxel, "num_filters": [int(w) // 2 for w in widths[:-1]]
            + [int(widths[-1])]}


def _second(r: HypesReader, m: str, voxel) -> dict:
    out = r.get(f"model.args.{m}.encoder_args.spconv.num_features_out", 128)
    return {"type": "second", "voxel_size": voxel, "channels": SECOND_CHANNELS, "blocks": SECOND_BLOCKS,
            "out_z_channels": out}


def _lss(r: HypesReader, m: str) -> dict:
    """The reference LiftSplatShoot (lss_reference): its trunk by name, grid, depth bins and widths."""
    grid, args = f"heter.modality_setting.{m}.grid_conf", f"model.args.{m}.encoder_args"
    rng = r.get("cav_lidar_range")
    bounds = {}
    gencomm = MODELS.get(r.get("model.core_method")) == "gencomm"
    for axis, lo, hi in (("xbound", rng[0], rng[3]), ("ybound", rng[1], rng[4]), ("zbound", None, None)):
        b = r.get(f"{grid}.{axis}")
        # a grid inside the range is zero-padded to it; protocol reference extracts GenComm's message before
        # the pad, as the reference (gencomm.link.GenCommLink.extract_before_padding); a cut is not reproduced
        if gencomm and lo is not None and float(b[1]) > float(hi):
            r.refuse(f"{grid}.{axis}", f"{b} reaches past the detection range [{lo}, {hi}]: the reference GenComm "
                     f"extracts the message before it crops the camera feature, from cells the crop drops, "
                     f"which is not reproduced")
        bounds[axis] = list(b)
    trunk = r.get(f"{args}.camera_encoder", "EfficientNet")
    if trunk not in CAMERA_TRUNKS:
        r.refuse(f"{args}.camera_encoder", f"image trunk {trunk!r} not supported; one of {sorted(CAMERA_TRUNKS)}")
    elif trunk == "EfficientNet":
        r.approximations.append((f"{args}.camera_encoder", "training starts from a randomly initialised "
                                 "EfficientNet-B0; the reference's from ImageNet weights (from_pretrained), which "
                                 "are not downloaded here (an imported checkpoint is unaffected)"))
    mode = r.get(f"{grid}.mode", "UD")
    if mode not in ("LID", "UD"):
        r.refuse(f"{grid}.mode", f"depth bins {mode!r} not supported; LID or UD")
    down = r.get(f"{args}.img_downsample", 16)
    allowed = (8,) if CAMERA_TRUNKS.get(trunk) == "resnet101" else (8, 16)
    if down not in allowed:
        r.refuse(f"{args}.img_downsample", f"{trunk} gives features at stride {list(allowed)}, got {down}")
    return {"type": "lss_reference", "trunk": CAMERA_TRUNKS.get(trunk, "efficientnet_b0"), "img_downsample": down,
            "depth_discretization": list(r.get(f"{grid}.ddiscr")), "depth_mode": mode, **bounds,
            "context_channels": r.get(f"{args}.img_features", 64)}


def _pillar_height(r: HypesReader, m: str, voxel, core: str):
    """A pillar taller than the z range (DAIR-V2X files: 5 m pillars on a 4 m range): the reference's
    grid rounds to one layer; ours takes the range's height (one pillar over the same points)."""
    rng = r.get("cav_lidar_range", None)
    if core != "point_pillar" or not isinstance(voxel, list) or len(voxel) != 3 or not isinstance(rng, list):
        return voxel
    height = float(rng[5]) - float(rng[2])
    if float(voxel[2]) > height and round(height / float(voxel[2])) == 1:
        r.approximations.append((f"heter.modality_setting.{m}.preprocess.args.voxel_size", (
            f"pillar height {voxel[2]} m exceeds the {height} m z range: the reference's grid rounds to one layer; "
            f"ours is {height} m high, the same points, but the pillar-centre z feature is measured from "
            f"{float(rng[2]) + height / 2} m instead of the reference's {float(rng[2]) + float(voxel[2]) / 2} m")))
        return [voxel[0], voxel[1], height]
    return voxel


def _stack(r: HypesReader, m: str) -> dict:
    setting, args = f"heter.modality_setting.{m}", f"model.args.{m}"
    core = r.get(f"{setting}.core_method")
    if core not in ENCODERS:
        r.refuse(f"{setting}.core_method", f"encoder {core!r} not supported; one of {sorted(ENCODERS)}")
        return {}
    if r.get(f"{setting}.sensor_type") != SENSORS[core]:
        r.refuse(f"{setting}.sensor_type", f"{core} is a {SENSORS[core]} encoder")
    if ENCODERS[core] == "lss_reference":
        encoder = _lss(r, m)
    else:
        voxel = _pillar_height(r, m, r.get(f"{setting}.preprocess.args.voxel_size"), core)
        encoder = _pillars(r, m, voxel) if ENCODERS[core] == "pointpillars" else _second(r, m, voxel)
    bb = f"{args}.backbone_args"
    if r.get("model.core_method", None) in PYRAMID_MODELS + STAMP_COLLAB_MODELS:  # HEAL's ResNetBEVBackbone
        return {"encoder": encoder, **pyramid_stack(r, m)}
    if r.has(bb):  # the string 'identity' (its rule checks the value): no backbone
        backbone = {"type": "identity"}
    else:  # the reference's per-type BaseBEVBackbone and DownsampleConv shrink header: ours of the same structure
        backbone = {"type": "base_bev", "layer_nums": r.get(f"{bb}.layer_nums"),
                    "layer_strides": r.get(f"{bb}.layer_strides"), "num_filters": r.get(f"{bb}.num_filters"),
                    "upsample_strides": r.get(f"{bb}.upsample_strides"),
                    "num_upsample_filters": r.get(f"{bb}.num_upsample_filter")}
    sh = f"{args}.shrink_header"
    if not r.has(f"{sh}.dim"):
        r.approximations.append((sh, "absent in the reference; ours always ends on a ShrinkConv (3x3 conv, BN, "
                                 "ReLU), here of the backbone's width"))
        return {"encoder": encoder, "backbone": backbone,
                "shrink_channels": sum(backbone.get("num_upsample_filters") or [])}
    shrink = {"type": "downsample_conv", "kernel_size": r.get(f"{sh}.kernal_size"), "stride": r.get(f"{sh}.stride"),
              "padding": r.get(f"{sh}.padding"), "dims": r.get(f"{sh}.dim")}
    return {"encoder": encoder, "backbone": backbone, "shrink": shrink}


# the reference DiffusionUNet gives level i the nominal resolution 128 / 2**i (hard-coded 128) and
# puts attention blocks at the levels whose resolution attn_resolutions lists; ours has none
_UNET_RESOLUTION = 128


def _link(r: HypesReader, kind: str, types: List[str]) -> dict:
    if kind == "full_feature":
        return {"type": "full_feature", "wire_dtype": "float32"}
    if kind == "stamp":
        return stamp_link(r, types)
    if kind == "stamp_collab":  # heter_model_baseline_w_stamp_infer (collab_w_adapter's is stamp_collab())
        return stamp_infer_link(r, types)
    unet = "model.args.gencomm.model"
    mult = list(r.get(f"{unet}.ch_mult", [1, 1]))
    attn = r.get(f"{unet}.attn_resolutions", [])
    levels = [_UNET_RESOLUTION // 2 ** i for i in range(len(mult))]
    if any(res in levels for res in attn or []):
        r.refuse(f"{unet}.attn_resolutions", f"puts attention blocks at the UNet levels of resolution "
                 f"{sorted(set(attn) & set(levels))} (levels: {levels}); our reference UNet has no attention")
    generator = {"variant": "reference", "num_steps": r.get("model.args.gencomm.diffusion.num_diffusion_timesteps", 3),
                 "base_channels": r.get(f"{unet}.ch", 8), "channel_mult": mult,
                 "num_res_blocks": r.get(f"{unet}.num_res_blocks", 2)}
    link = {"type": "gencomm",
            "message": {"variant": "reference", "message_channels": r.get("model.args.message_extractor.out_ch", 2)},
            "generator": generator, "generation_weight": float(r.get("loss.args.generate_weight", 0.0)),
            # the reference generates on each feature in its sender's frame and warps in the fusion;
            # protocol: reference (the converted config's) also generates the ego's own feature
            "warp_before_generation": False, "wire_dtype": "float32"}
    missing = _missing_message(r)
    if missing:
        link["missing_message"] = missing
    if r.has("model.args.enhancer") or r.children("model.args.enhancer"):  # the reference: 'enhancer' in args
        link["enhancer"] = {"variant": "reference"}
    else:
        r.approximations.append(("model.args.enhancer", "absent: the reference applies no enhancer; our link "
                                 "always refines with a Channel Enhancer"))
    return link


def _missing_message(r: HypesReader) -> float:
    """``model.link.missing_message`` of a GenComm model (:data:`MISSING_MESSAGE`), 0 when off."""
    key = "model.args.missing_message"
    value = r.get(key, False)
    if not isinstance(value, bool):
        r.refuse(key, f"is {value!r}; the reference reads true or false")
        return 0.0
    return MISSING_MESSAGE.get(r.get("model.core_method"), 0.0) if value else 0.0


def model_section(r: HypesReader, types: List[str]) -> dict:
    """``model:`` of our config (CooperativeDetector arguments)."""
    core = r.get("model.core_method")
    if r.get("label_type", "lidar") == "camera":
        r.approximations.append(("label_type", "'camera': the reference's ground truth is only the objects inside "
                                 "the agents' camera-visibility masks (bev_visibility.png); ours is every labelled "
                                 "object in range, as with 'lidar'"))
    if core in REFUSED_MODELS:
        r.refuse("model.core_method", f"model {core!r}: {REFUSED_MODELS[core]}")
    elif core not in MODELS:
        r.refuse("model.core_method", f"model {core!r} not supported; one of {sorted(MODELS)}")
    if r.get("model.args.missing_message", False) is True and core not in MISSING_MESSAGE:
        r.refuse("model.args.missing_message", f"true: model {core!r} zeroes collaborators' features at random in "
                 f"evaluation, which this project's {MODELS.get(core, core)} link does not (GenComm's message loss "
                 f"converts: {sorted(MISSING_MESSAGE)})")
    collab = core in STAMP_COLLAB_MODELS  # fusion, fusion op and link: the ego type's (stamp_collab)
    model = {
        "fusion": "intermediate", "fusion_op": "pyramid" if collab else fusion_op(r, types),
        "agent_types": {m: _stack(r, m) for m in types},
        "link": {} if collab else _link(r, MODELS.get(core, "full_feature"), types),
        **anchors(r),
        "score_threshold": r.get("postprocess.target_args.score_threshold", 0.2),
        "nms_iou": r.get("postprocess.nms_thresh", 0.15),
        "loss": loss_weights(r),
    }
    if core in PYRAMID_MODELS:
        model.update(pyramid_fusion(r))
    if collab:
        model.update(stamp_collab(r, types))
    if r.has("loss.args.depth.weight"):
        model["depth_weight"] = r.get("loss.args.depth.weight")
    return model


def check_model(r: HypesReader, model) -> None:
    """Widths and the feature grid the file states, against the model built from the conversion."""
    c = getattr(model.fuse, "out_channels", model.channels)  # the width the head reads
    keys = ["model.args.att.feat_dim", "model.args.max.feat_dim", "model.args.in_head",
            "model.args.message_extractor.in_ch", "model.args.enhancer.in_ch",
            "model.args.gencomm.model.in_channels", "model.args.gencomm.model.out_ch"]
    protocol = r.get("heter.protocol_modality", None)
    collab = r.get("model.core_method", None) in STAMP_COLLAB_MODELS  # per-type widths: check_collab
    for m in model.encoders:  # STAMP's adapters state the width per type (the protocol's are not built)
        if m != protocol and not collab:
            keys += [f"model.args.{m}.{a}.args.{io}_channels" for a in ("adapter", "reverter") for io in ("in", "out")]
    for key in keys:
        if r.has(key) and not same_value(r.get(key), c):
            r.refuse(key, f"is {r.get(key)} but the fused feature is {c} wide (shrink_header.dim[-1])")

    for m, stack in model.encoders.items():
        args = f"model.args.{m}"
        for key, have in ((f"{args}.backbone_args.inplanes", stack.encoder.out_channels),
                          (f"{args}.encoder_args.map2bev.feature_num", stack.encoder.out_channels),
                          (f"{args}.shrink_header.input_dim", stack.backbone.out_channels)):
            if collab and key.endswith("shrink_header.input_dim"):  # STAMP: the type's post-fusion shrink
                continue
            if r.has(key) and not same_value(r.get(key), have):
                r.refuse(key, f"is {r.get(key)} but the converted {m} stack gives {have}")
    voxel = r.get("preprocess.args.voxel_size", None)
    stride = r.get("postprocess.anchor_args.feature_stride", None)
    if voxel is not None and stride is not None:
        want = (float(voxel[0]) * stride, float(voxel[1]) * stride)
        if not same_value(list(model.grid.cell), list(want)):
            r.refuse("postprocess.anchor_args.feature_stride",
                     f"anchors on {want} m cells (voxel x feature_stride) but the converted model's feature "
                     f"cell is {model.grid.cell} m")
    check_pyramid(r, model)
    if collab:
        check_collab(r, model)
