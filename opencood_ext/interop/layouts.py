"""The tables of the reference (HEAL / GenComm) <-> ours weight mapping (:mod:`.weights`).

* :data:`SLOTS`: where each of our per-model modules sits in the reference model
  (``encoders.m1.encoder`` is ``encoder_m1``, ``head`` holds ``cls_head`` ...);
* :data:`LAYOUTS`: for each of OUR module classes whose structure matches a
  reference module, how its parameter names (and, where needed, tensor layouts)
  translate. Templates name one dotted segment as ``{x}`` or a choice as
  ``{x:a|b}``; the same pair of templates maps both ways.

A :class:`Layout` with ``variant`` applies only to modules built with that
``variant`` argument (``variant: reference``); a package outside opencood_ext
adds the layouts of its own modules (GenComm's: :mod:`gencomm.interop`).
Modules of ours without a layout are described in :data:`DIFFERENCES`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import torch
from torch import Tensor, nn

from ..models.aligner import ConvNeXtAligner
from ..models.backbone import BaseBEVBackbone, DownsampleConv, ResNetBEVBackbone
from ..models.head import BOX_DIM, AnchorHead
from ..models.lss_reference import ReferenceLSSEncoder
from ..models.pointpillars import PointPillarEncoder
from ..models.pyramid_fusion import PyramidFusion
from ..models.second import SecondEncoder
from ..methods.stamp import DomainAdapter
from ..methods.stamp_adapters import AttentionAdapter, ConvAdapter

# ---------------------------------------------------------------- tensor transforms
# Each takes (tensor, our module that owns the parameter, direction "ours" | "reference").
Transform = Callable[[Tensor, nn.Module, str], Tensor]

# reference box regression per anchor: x y z h w l yaw ("hwl"); ours: x y z l w h yaw
_HWL_TO_LWH = [0, 1, 2, 5, 4, 3, 6]


def _box_order(t: Tensor, module: nn.Module, direction: str) -> Tensor:
    """Permute the 7 regression channels of every anchor (the permutation is its own inverse)."""
    k = t.shape[0] // BOX_DIM
    idx = torch.tensor([a * BOX_DIM + j for a in range(k) for j in _HWL_TO_LWH])
    return t[idx].clone()


def unit_deconv(t: Tensor, module: nn.Module, direction: str) -> Tensor:
    """The reference upsamples a stride-1 level with ConvTranspose2d(k=1) (weight (in, out, 1, 1));
    ours is Conv2d(k=1) (weight (out, in, 1, 1)). Other levels have the same module on both sides."""
    if isinstance(module, nn.Conv2d) and module.kernel_size == (1, 1) and module.stride == (1, 1):
        return t.transpose(0, 1).contiguous()
    return t


def linear_as_conv1x1(t: Tensor, module: nn.Module, direction: str) -> Tensor:
    """Our Linear weight (out, in) <-> the reference's 1x1 Conv2d weight (out, in, 1, 1)."""
    if direction == "ours" and t.dim() == 4 and tuple(t.shape[2:]) == (1, 1):
        return t.flatten(1).clone()
    if direction == "reference" and t.dim() == 2:
        return t[:, :, None, None].clone()
    return t


def _spconv_weight(t: Tensor, module: nn.Module, direction: str) -> Tensor:
    """spconv 2.x weights are (out, kD, kH, kW, in), as here; a checkpoint of spconv 1.x holds
    (kD, kH, kW, in, out) and is permuted. Exports use the 2.x layout."""
    want = tuple(module.weight.shape)
    if direction == "ours" and tuple(t.shape) != want and tuple(t.permute(4, 0, 1, 2, 3).shape) == want:
        return t.permute(4, 0, 1, 2, 3).contiguous()
    return t


@dataclass(frozen=True)
class Layout:
    """How one of our module classes maps onto a reference module.

    keys: (reference template, our template) below the module; transforms: (our template, Transform).
    variant: the layout applies only to modules whose ``variant`` attribute is this (None: any).
    derived: (reference key, function of our module) for reference buffers our module computes
        instead of storing (a diffusion schedule): checked on import, written on export.
    ignored: reference key prefixes the reference module holds but its forward never reads;
        dropped on import (and listed), absent from exports.
    renumber: (placeholder, function of (our module, index)) for an index the two sides count
        differently (a UNet's up levels, say); the function must be its own inverse.
    """

    keys: Tuple[Tuple[str, str], ...]
    transforms: Tuple[Tuple[str, Transform], ...] = ()
    variant: Optional[str] = None
    derived: Tuple[Tuple[str, Callable[[nn.Module], Tensor]], ...] = ()
    ignored: Tuple[str, ...] = ()
    renumber: Tuple[Tuple[str, Callable[[nn.Module, int], int]], ...] = ()


_BN = "{p:weight|bias|running_mean|running_var|num_batches_tracked}"
_SP = "{a:0|1}.{p:weight|bias|running_mean|running_var|num_batches_tracked}"  # (sparse conv, BN1d) pairs


def _lss_layout() -> Layout:
    """The reference CamEncode's names -> ours (:mod:`..models.image_trunks`, :mod:`..models.lss_reference`)."""
    eff = "camencode.trunk._blocks.{i}."
    block = [(eff + ref + "." + _BN if bn else eff + ref + ".{p}", "trunk.blocks.{i}." + ours + ".{p}")
             for ref, ours, bn in (("_expand_conv", "expand", False), ("_bn0", "expand_bn", True),
                                   ("_depthwise_conv", "depthwise", False), ("_bn1", "depthwise_bn", True),
                                   ("_se_reduce", "se_reduce", False), ("_se_expand", "se_expand", False),
                                   ("_project_conv", "project", False), ("_bn2", "project_bn", True))]
    resnet = []
    for k in range(1, 5):
        ref, ours = f"camencode.layer{k}.{{j}}.", f"trunk.stages.{k - 1}.{{j}}."
        resnet += [(ref + "{m:conv1|bn1|conv2|bn2|conv3|bn3}.{p}", ours + "{m}.{p}"),
                   (ref + "downsample.{a:0|1}.{p}", ours + "shortcut.{a}.{p}")]
    return Layout(
        keys=(("camencode.trunk._conv_stem.weight", "trunk.stem.weight"),
              ("camencode.trunk._bn0." + _BN, "trunk.stem_bn.{p}"), *block,
              ("camencode.up{n:1|2}.conv.{a:0|1|3|4}.{p}", "up{n}.layers.{a}.{p}"),
              ("camencode.{m:conv1|bn1}.{p}", "trunk.{m}.{p}"), *resnet,
              ("camencode.{h:depth_head|image_head}.{p}", "{h}.{p}")),
        # the EfficientNet's 1280-wide head conv, its BN and the ImageNet classifier: CamEncode stops before them
        ignored=("camencode.trunk._conv_head.", "camencode.trunk._bn1.", "camencode.trunk._fc."))

LAYOUTS: Dict[type, Layout] = {
    # opencood/models/sub_modules/pillar_vfe.py PillarVFE (PFNLayer: linear without bias, BatchNorm1d)
    PointPillarEncoder: Layout(keys=(("pillar_vfe.pfn_layers.{i}.{m:linear|norm}.{p}", "pfn.layers.{i}.{m}.{p}"),)),
    # opencood/models/sub_modules/sparse_backbone_3d.py VoxelBackBone8x (conv_input, conv1..4, conv_out)
    SecondEncoder: Layout(
        keys=(("spconv_block.conv_input." + _SP, "stages.0.0.{a}.{p}"),
              ("spconv_block.conv1.0." + _SP, "stages.0.1.{a}.{p}"),
              ("spconv_block.conv2.{j}." + _SP, "stages.1.{j}.{a}.{p}"),
              ("spconv_block.conv3.{j}." + _SP, "stages.2.{j}.{a}.{p}"),
              ("spconv_block.conv4.{j}." + _SP, "stages.3.{j}.{a}.{p}"),
              ("spconv_block.conv_out." + _SP, "z_conv.{a}.{p}")),
        transforms=(("stages.{i}.{j}.0.weight", _spconv_weight), ("z_conv.0.weight", _spconv_weight))),
    # opencood/models/sub_modules/base_bev_backbone_resnet.py ResNetBEVBackbone (+ resblock.BasicBlock)
    ResNetBEVBackbone: Layout(
        keys=(("resnet.layer{i}.{j}.{m:conv1|bn1|conv2|bn2}.{p}", "levels.{i}.{j}.{m}.{p}"),
              ("resnet.layer{i}.{j}.downsample.{a}.{p}", "levels.{i}.{j}.shortcut.{a}.{p}"),
              ("deblocks.{i}.{a}.{p}", "ups.{i}.{a}.{p}")),
        transforms=(("ups.{i}.0.weight", unit_deconv),)),
    # opencood/models/sub_modules/base_bev_backbone.py BaseBEVBackbone: blocks.<i> = ZeroPad2d, then
    # (conv, BN, ReLU) triples at 1.., deblocks.<i> = (ConvTranspose2d | strided conv, BN, ReLU)
    BaseBEVBackbone: Layout(
        keys=(("blocks.{i}.{j}.{p}", "levels.{i}.{j}.{p}"), ("deblocks.{i}.{a}.{p}", "ups.{i}.{a}.{p}")),
        transforms=(("ups.{i}.0.weight", unit_deconv),)),
    # opencood/models/sub_modules/downsample_conv.py DownsampleConv: layers.<i>.double_conv = conv, ReLU, conv, ReLU
    DownsampleConv: Layout(keys=(("layers.{i}.double_conv.{a:0|2}.{p}", "layers.{i}.{a:0|2}.{p}"),)),
    # heter_encoders.py LiftSplatShoot: camencode = lss_submodule.py CamEncode (EfficientNet-B0 trunk of the
    # efficientnet_pytorch package, Up blocks up1 / up2: conv.0, .1, .3, .4 = conv, BN, conv, BN) or
    # CamEncode_Resnet101 (torchvision ResNet-101's conv1, bn1, layer1, layer2), then depth_head, image_head
    ReferenceLSSEncoder: _lss_layout(),
    # fuse_modules/pyramid_fuse.py PyramidFusion (pyramid_backbone: ResNetModified levels resnet.layer<i>,
    # deblocks, single_head_<i>) and heter_pyramid_collab.py's shrink_conv (DownsampleConv after the fusion)
    PyramidFusion: Layout(
        keys=(("pyramid_backbone.resnet.layer{i}.{j}.{m:conv1|bn1|conv2|bn2|conv3|bn3}.{p}",
               "backbone.levels.{i}.{j}.{m}.{p}"),
              ("pyramid_backbone.resnet.layer{i}.{j}.downsample.{a}.{p}", "backbone.levels.{i}.{j}.shortcut.{a}.{p}"),
              ("pyramid_backbone.deblocks.{i}.{a}.{p}", "backbone.ups.{i}.{a}.{p}"),
              ("pyramid_backbone.single_head_{i}.{p}", "occupancy.{i}.{p}"),
              ("shrink_conv.layers.{i}.double_conv.{a:0|2}.{p}", "shrink.layers.{i}.{a}.{p}")),
        transforms=(("backbone.ups.{i}.0.weight", unit_deconv),)),
    # sub_modules/feature_alignnet.py AlignNet(convnext): channel_align = ConvNeXt, its blocks in .model
    ConvNeXtAligner: Layout(
        keys=(("channel_align.model.{k}.{m:dwconv|norm|pwconv1|pwconv2}.{p}", "blocks.{k}.{m}.{p}"),
              ("channel_align.model.{k}.gamma", "blocks.{k}.gamma"))),
    # STAMP's fuse_modules/adapter.py AdapterConvNext (adapter_<m>.adapter, reverter_<m>.reverter): channel_convert1,
    # ConvNeXt blocks conv.model.<k> (sub_modules/feature_alignnet_modules.py ConvNeXtBlock), channel_convert2;
    # its 3x3 'smoothing' conv is built and never applied
    DomainAdapter: Layout(
        keys=(("channel_convert1.{p}", "reduce.{p}"), ("channel_convert2.{p}", "restore.{p}"),
              ("conv.model.{k}.dwconv.{p}", "blocks.{k}.depthwise.{p}"),
              ("conv.model.{k}.norm.{p}", "blocks.{k}.norm.{p}"), ("conv.model.{k}.pwconv1.{p}", "blocks.{k}.expand.{p}"),
              ("conv.model.{k}.pwconv2.{p}", "blocks.{k}.project.{p}"), ("conv.model.{k}.gamma", "blocks.{k}.gamma")),
        ignored=("smoothing.",)),
    # STAMP's AdapterConv: one 1x1 conv
    ConvAdapter: Layout(keys=(("conv.{p}", "conv.{p}"),)),
    # STAMP's AdapterAtt: channel_convert1, patch_embed, pos_embed, blocks.<k> (feature_alignnet_modules.py AttBlock:
    # norm1, attn = nn.MultiheadAttention without biases (in_proj_weight, out_proj.weight), norm2, mlp.0 / mlp.3
    # Linear layers), norm, channel_convert2; the never-applied 3x3 smoothing conv as in AdapterConvNext
    AttentionAdapter: Layout(
        keys=(("channel_convert1.{p}", "reduce.{p}"), ("channel_convert2.{p}", "restore.{p}"),
              ("patch_embed.{p}", "embed.{p}"), ("pos_embed", "position"), ("norm.{p}", "norm.{p}"),
              ("blocks.{k}.{m:norm1|norm2}.{p}", "blocks.{k}.{m:norm1|norm2}.{p}"),
              ("blocks.{k}.attn.in_proj_weight", "blocks.{k}.attn.qkv.weight"),
              ("blocks.{k}.attn.out_proj.weight", "blocks.{k}.attn.out.weight"),
              ("blocks.{k}.mlp.0.{p}", "blocks.{k}.expand.{p}"), ("blocks.{k}.mlp.3.{p}", "blocks.{k}.project.{p}")),
        ignored=("smoothing.",)),
    # heter_model_baseline*.py: cls_head, reg_head, dir_head (1x1 convs on the fused feature)
    AnchorHead: Layout(
        keys=(("cls_head.{p}", "cls.{p}"), ("reg_head.{p}", "reg.{p}"), ("dir_head.{p}", "dir.{p}")),
        transforms=(("reg.{p}", _box_order),)),
}

# our module path (template, {t} = agent type) -> the reference's attribute prefix. Several of our
# modules may share one reference module (the reference GenComm has ONE generator and ONE enhancer,
# ours one per receiver type): each gets its weights on import; an export needs them equal.
SLOTS: Tuple[Tuple[str, str], ...] = (
    ("encoders.{t}.encoder", "encoder_{t}"),
    ("encoders.{t}.backbone", "backbone_{t}"),
    ("encoders.{t}.shrink", "shrinker_{t}"),
    ("encoders.{t}.aligner", "aligner_{t}"),
    ("link.dme.{t}", "message_extractor_{t}"),
    ("link.safg.{t}", "gencomm"),
    ("link.enhancer.{t}", "enhancer"),
    ("link.adapter.{t}", "adapter_{t}.adapter"),  # STAMP (stamp, stamp_collab links)
    ("link.reverter.{t}", "reverter_{t}.reverter"),
    ("post_fusion", "shrink_conv"),
    ("fuse", ""),  # the pyramid fusion: pyramid_backbone.* and shrink_conv.* (its layout names both)
    ("head", ""),
)

# why a module of ours has no layout (by class name), and what unmatched reference keys are
DIFFERENCES: Dict[str, str] = {
    "ShrinkConv": "ours: 3x3 conv (no bias), BN, ReLU; the reference DownsampleConv (shrinker_<m>): per "
                  "layer conv (bias), ReLU, 3x3 conv (bias), ReLU, no BN; build shrink: {type: downsample_conv}",
    "LSSEncoder": "ours: a small conv image net + 1x1 depth/context conv; the reference LiftSplatShoot "
                  "(encoder_<m>.camencode: EfficientNet-B0 or ResNet-101 trunk, Up blocks, depth head) is "
                  "encoder type lss_reference",
    "DeformableMessageExtractor": "variant 'default': DCN (no bias), BN, ReLU, SE gate, 1x1 conv, BN, ReLU, "
                                  "1x1 conv; the reference MessageExtractorv2 has no BN (DCN and 1x1 conv with "
                                  "bias): build it with variant: reference",
    "SpatialAwareFeatureGenerator": "variant 'compact': two-level ConditionalUNet with a learned step "
                                    "embedding; the reference (gencomm.denoiser) is a DDPM UNet: build it "
                                    "with variant: reference",
    "ChannelEnhancer": "variant 'default': partial conv + gated feed-forward + channel attention; the "
                       "reference Enhancer (enhancer.*): build it with variant: reference",
    "Sequential": "ours (post_fusion): 3x3 conv, BN, ReLU layers; the reference shrink_conv is a DownsampleConv",
}
REFERENCE_MODULES: Tuple[Tuple[str, str], ...] = (
    (r"backbone_m\d+\.(blocks|deblocks)\.", "BaseBEVBackbone (plain conv stacks: backbone type base_bev)"),
    (r"backbone_m\d+\.resnet\.", "ResNetBEVBackbone (backbone type resnet_bev)"),
    (r"shrinker_m\d+\.", "DownsampleConv shrink header (shrink type downsample_conv)"),
    (r"message_extractor_m\d+\.", "MessageExtractorv2 (DME, variant: reference)"),
    (r"gencomm\.", "conditional diffusion generator (generator variant: reference)"),
    (r"enhancer\.", "Enhancer (enhancer variant: reference)"),
    (r"encoder_m\d+\.camencode\.", "LSS image encoder (EfficientNet / ResNet trunk: encoder type lss_reference)"),
    (r"shrink_conv\.", "shared DownsampleConv after fusion"),
    (r"pyramid_backbone\.", "PyramidFusion (model.fusion: pyramid, fusion_op: pyramid)"),
    (r"aligner_m\d+\.", "HEAL's AlignNet (aligner type convnext)"),
    (r"(adapter|reverter)_m\d+\.", "STAMP's AdapterConvNext (model.link type stamp or stamp_collab), AdapterConv "
                                     "or AdapterAtt (stamp_collab, adapter: adapterconv / adapteratt)"),
    (r"(pyramid_backbone|shrink_conv|cls_head|reg_head|dir_head)_m\d+\.",
     "a STAMP type's own fusion and heads (collab_w_adapter: model.link type stamp_collab)"),
    (r"(compressor|fusion_net)\.", "a module this framework does not have"),
    (r"(cls|reg|dir)_head_single\.", "per-agent auxiliary heads (supervise_single)"),
)


def layout_for(module: nn.Module) -> Optional[Layout]:
    """The layout of ``module``'s class, if it applies to this module's variant; else None."""
    layout = LAYOUTS.get(type(module))
    if layout is None or (layout.variant is not None and getattr(module, "variant", None) != layout.variant):
        return None
    return layout
