"""HEAL's ``heter_pyramid_collab`` hypes -> ``model.fusion: pyramid`` (the model-family part of the importer).

Per type HEAL runs encoder -> ResNetBEVBackbone (``backbone_args``; without ``upsample_strides`` its
levels are used as they are) -> aligner (identity, or ConvNeXt blocks for its stage-2 types); ours: the
same encoder, ``backbone: {type: resnet_bev, norm_eps: 1e-5}`` (HEAL's residual blocks keep torch's
default BatchNorm eps), ``shrink: {type: none}`` and ``aligner: {type: convnext}`` where HEAL has one.
The ``fusion_backbone`` (PyramidFusion), the ``shrink_header`` after it (``shrink_conv``) and the
pyramid loss (``loss.args.pyramid``; on when ``supervise_single`` is true, as HEAL's train.py adds the
foreground loss only then) become ``model.fusion_args`` of ``fusion_op: pyramid``
(:class:`~opencood_ext.models.pyramid_fusion.PyramidFusion`).
"""
from __future__ import annotations

import math
from .hypes_reader import HypesReader, same_value

PYRAMID_MODELS = ("heter_pyramid_collab",)
_FB = "model.args.fusion_backbone"


def pyramid_stack(r: HypesReader, m: str) -> dict:
    """Backbone and shrink of type ``m``'s stack (its encoder is converted as for every model)."""
    bb = f"model.args.{m}.backbone_args"
    backbone = {"type": "resnet_bev", "layer_nums": r.get(f"{bb}.layer_nums"),
                "layer_strides": r.get(f"{bb}.layer_strides"), "num_filters": r.get(f"{bb}.num_filters"),
                "upsample_strides": r.get(f"{bb}.upsample_strides", []),
                "num_upsample_filters": r.get(f"{bb}.num_upsample_filter", []), "norm_eps": 1e-5}
    r.approximations.append((bb, "HEAL's residual blocks update their BatchNorm statistics with momentum 0.1, "
                                 "ours 0.01 (the same computation in evaluation)"))
    stack = {"backbone": backbone, "shrink": {"type": "none"}}
    al = f"model.args.{m}.aligner_args"
    if r.get(f"{al}.core_method", "identity") == "convnext":
        stack["aligner"] = {"type": "convnext", "num_blocks": r.get(f"{al}.args.num_of_blocks"),
                            "kernel_size": r.get(f"{al}.args.kernel_size", 7)}
    return stack


def pyramid_fusion(r: HypesReader, base: str = "model.args") -> dict:
    """``fusion``, ``fusion_op``, ``fusion_args`` and ``link`` of a heter_pyramid_collab file; ``base``
    ``model.args.<m>``: STAMP's collab_w_adapter, whose type ``<m>`` has its own fusion_backbone and
    shrink_header (and its loss, ``loss.<m>.args``)."""
    fb = f"{base}.fusion_backbone"
    loss = "loss.args" if base == "model.args" else f"loss.{base.rsplit('.', 1)[1]}.args"
    strides = r.get(f"{fb}.layer_strides")
    args = {"layer_nums": r.get(f"{fb}.layer_nums"), "layer_strides": strides,
            "num_filters": r.get(f"{fb}.num_filters"), "upsample_strides": r.get(f"{fb}.upsample_strides"),
            "num_upsample_filters": r.get(f"{fb}.num_upsample_filter"), "resnext": bool(r.get(f"{fb}.resnext", False))}
    if r.has(f"{base}.shrink_header.dim"):
        sh = f"{base}.shrink_header"
        args["shrink"] = {"kernel_size": r.get(f"{sh}.kernal_size"), "stride": r.get(f"{sh}.stride"),
                          "padding": r.get(f"{sh}.padding"), "dims": r.get(f"{sh}.dim")}
    levels = len(args["layer_nums"] or [])
    if r.get("model.args.supervise_single", False):
        if r.has(f"{loss}.pyramid.weight"):  # else PyramidFusion's default, HEAL's 0.4 halved per level
            args["occupancy_weights"] = r.get(f"{loss}.pyramid.weight")
        args["occupancy_pos_weight"] = r.get(f"{loss}.pos_cls_weight", 1.0)
        down = r.get(f"{loss}.pyramid.relative_downsample", None)
        cum = [math.prod(strides[:i + 1]) for i in range(len(strides or []))]
        if down is not None and not same_value(list(down), cum):
            r.refuse(f"{loss}.pyramid.relative_downsample", f"is {down} but the fusion backbone's levels are "
                     f"{cum} times coarser than its input (our foreground targets follow the levels)")
    else:  # HEAL's train.py adds the foreground loss only with supervise_single
        args["occupancy_weights"] = [0.0] * levels
    return {"fusion": "pyramid", "fusion_op": "pyramid", "fusion_args": args,
            "link": {"type": "full_feature", "wire_dtype": "float32"}}


def check_pyramid(r: HypesReader, model) -> None:
    """Widths a heter_pyramid_collab file states, against the built model."""
    fuse = model.fuse
    if not hasattr(fuse, "occupancy"):
        if r.get("model.args.supervise_single", False):
            r.refuse("model.args.supervise_single", "true: the per-agent heads it adds exist only in "
                     "heter_pyramid_collab here (its foreground maps)")
        for m in model.encoders:
            if r.get(f"model.args.{m}.aligner_args.core_method", "identity") != "identity":
                r.refuse(f"model.args.{m}.aligner_args.core_method", "an aligner is converted for "
                         "heter_pyramid_collab only")
        return
    for m, stack in model.encoders.items():
        key = f"model.args.{m}.aligner_args.args.dim"
        if r.has(key) and not same_value(r.get(key), stack.out_channels):
            r.refuse(key, f"is {r.get(key)} but the converted {m} stack gives {stack.out_channels}")
    for key, have in ((f"{_FB}.inplanes", model.channels),
                      ("model.args.shrink_header.input_dim", fuse.backbone.out_channels)):
        if r.has(key) and not same_value(r.get(key), have):
            r.refuse(key, f"is {r.get(key)} but the converted model gives {have}")
