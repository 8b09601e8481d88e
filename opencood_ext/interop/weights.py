"""Reference (HEAL / GenComm, OpenCOOD family) state_dict <-> our model's state_dict.

Two tables drive the mapping:

* :data:`SLOTS`: where each of our per-model modules sits in the reference model
  (``encoders.m1.encoder`` is ``encoder_m1``, ``head`` holds ``cls_head`` ...);
* :data:`LAYOUTS`: for each of OUR module classes whose structure matches a
  reference module, how its parameter names (and, where needed, tensor layouts)
  translate. Templates name one dotted segment as ``{x}`` or a choice as
  ``{x:a|b}``; the same pair of templates maps both ways.

A module of ours with no entry in LAYOUTS (its structure differs from the
reference's: see :data:`DIFFERENCES`) is not mapped; the import refuses and
names the reference keys nobody took and our keys nobody filled. Adding a
``variant: reference`` module (say a generator shaped like the reference UNet)
takes one LAYOUTS entry for its class; a package outside opencood_ext may add it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Tuple

import torch
from torch import Tensor, nn

from ..models.backbone import ResNetBEVBackbone
from ..models.head import BOX_DIM, AnchorHead
from ..models.pointpillars import PointPillarEncoder
from ..models.second import SecondEncoder


class WeightImportError(ValueError):
    """Reference weights that do not fit; the message names the keys and why."""


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


def _unit_deconv(t: Tensor, module: nn.Module, direction: str) -> Tensor:
    """The reference upsamples a stride-1 level with ConvTranspose2d(k=1) (weight (in, out, 1, 1));
    ours is Conv2d(k=1) (weight (out, in, 1, 1)). Other levels have the same module on both sides."""
    if isinstance(module, nn.Conv2d) and module.kernel_size == (1, 1) and module.stride == (1, 1):
        return t.transpose(0, 1).contiguous()
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
    """keys: (reference template, our template) below the module; transforms: (our template, Transform)."""

    keys: Tuple[Tuple[str, str], ...]
    transforms: Tuple[Tuple[str, Transform], ...] = ()


_BN = "{p:weight|bias|running_mean|running_var|num_batches_tracked}"
_SP = "{a:0|1}.{p:weight|bias|running_mean|running_var|num_batches_tracked}"  # (sparse conv, BN1d) pairs

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
        transforms=(("ups.{i}.0.weight", _unit_deconv),)),
    # heter_model_baseline*.py: cls_head, reg_head, dir_head (1x1 convs on the fused feature)
    AnchorHead: Layout(
        keys=(("cls_head.{p}", "cls.{p}"), ("reg_head.{p}", "reg.{p}"), ("dir_head.{p}", "dir.{p}")),
        transforms=(("reg.{p}", _box_order),)),
}

# our module path (template, {t} = agent type) -> the reference's attribute prefix
SLOTS: Tuple[Tuple[str, str], ...] = (
    ("encoders.{t}.encoder", "encoder_{t}"),
    ("encoders.{t}.backbone", "backbone_{t}"),
    ("encoders.{t}.shrink", "shrinker_{t}"),
    ("link.dme.{t}", "message_extractor_{t}"),
    ("link.safg.{t}", "gencomm"),
    ("link.enhancer.{t}", "enhancer"),
    ("post_fusion", "shrink_conv"),
    ("head", ""),
)

# why a module of ours has no layout (by class name), and what unmatched reference keys are
DIFFERENCES: Dict[str, str] = {
    "ShrinkConv": "ours: 3x3 conv (no bias), BN, ReLU; the reference DownsampleConv (shrinker_<m>): per "
                  "layer conv (bias), ReLU, 3x3 conv (bias), ReLU, no BN",
    "LSSEncoder": "ours: a small conv image net + 1x1 depth/context conv; the reference LiftSplatShoot "
                  "(encoder_<m>.camencode): EfficientNet-B0 or ResNet-101 trunk, Up block, depth head",
    "DeformableMessageExtractor": "ours: DCN (no bias), BN, ReLU, SE gate (Linear), 1x1 conv, BN, ReLU, 1x1 "
                                  "conv; the reference MessageExtractorv2 (message_extractor_<m>.bev_extractor): "
                                  "DCN with bias, no BN/ReLU, SE gate of 1x1 convs, 1x1 conv+bias, ReLU, 1x1 conv",
    "SpatialAwareFeatureGenerator": "ours: two-level ConditionalUNet (GroupNorm residual blocks); the reference "
                                    "(gencomm.*): DDPM UNet with ch_mult levels, res blocks and attention",
    "ChannelEnhancer": "ours: partial conv + gated feed-forward + channel attention; the reference Enhancer "
                       "(enhancer.*) is a different network",
    "Sequential": "ours (post_fusion): 3x3 conv, BN, ReLU layers; the reference shrink_conv is a DownsampleConv",
}
REFERENCE_MODULES: Tuple[Tuple[str, str], ...] = (
    (r"backbone_m\d+\.(blocks|deblocks)\.", "BaseBEVBackbone (plain conv stacks; ours is the residual "
                                            "ResNetBEVBackbone, whose reference keys are backbone_<m>.resnet.*)"),
    (r"shrinker_m\d+\.", "DownsampleConv shrink header"),
    (r"message_extractor_m\d+\.", "MessageExtractorv2 (DME)"),
    (r"gencomm\.", "conditional diffusion generator"),
    (r"enhancer\.", "Enhancer"),
    (r"encoder_m\d+\.camencode\.", "LSS image encoder (EfficientNet / ResNet trunk)"),
    (r"shrink_conv\.", "shared DownsampleConv after fusion"),
    (r"(aligner_m\d+|pyramid_backbone|compressor|fusion_net)\.", "a module this framework does not have"),
    (r"(cls|reg|dir)_head_single\.", "per-agent auxiliary heads (supervise_single)"),
)


class _Template:
    """``a.{i}.{m:x|y}.{p}`` <-> regex with named groups; ``{name}`` is one dotted segment."""

    _TOKEN = re.compile(r"\{(\w+)(?::([\w|]+))?\}")

    def __init__(self, text: str):
        self.text = text
        parts, last = [], 0
        for m in self._TOKEN.finditer(text):
            parts.append(re.escape(text[last:m.start()]))
            parts.append(f"(?P<{m.group(1)}>{m.group(2) or '[^.]+'})")
            last = m.end()
        parts.append(re.escape(text[last:]))
        self.regex = re.compile("".join(parts) + r"\Z")

    def match(self, key: str) -> Optional[Dict[str, str]]:
        m = self.regex.match(key)
        return m.groupdict() if m else None

    def format(self, values: Mapping[str, str]) -> str:
        return self._TOKEN.sub(lambda m: values[m.group(1)], self.text)


def _translate(layout: Layout, suffix: str, to: str) -> Optional[str]:
    """A key suffix in ``to`` = "reference" (from ours) or "ours" (from the reference); None if no rule."""
    for ref_t, our_t in layout.keys:
        src, dst = (_Template(our_t), _Template(ref_t)) if to == "reference" else (_Template(ref_t), _Template(our_t))
        values = src.match(suffix)
        if values is not None:
            return dst.format(values)
    return None


def _transform(layout: Layout, our_suffix: str) -> Optional[Transform]:
    for tmpl, fn in layout.transforms:
        if _Template(tmpl).match(our_suffix) is not None:
            return fn
    return None


@dataclass
class Slot:
    """One of our modules: its path, the reference prefix, its layout (None: structure differs)."""

    ours: str
    reference: str
    module: nn.Module
    layout: Optional[Layout]

    def reference_key(self, our_key: str) -> Optional[str]:
        suffix = _translate(self.layout, our_key[len(self.ours) + 1:], "reference") if self.layout else None
        if suffix is None:
            return None
        return f"{self.reference}.{suffix}" if self.reference else suffix

    def convert(self, our_key: str, tensor: Tensor, direction: str) -> Tensor:
        suffix = our_key[len(self.ours) + 1:]
        fn = _transform(self.layout, suffix)
        if fn is None:
            return tensor
        owner = self.module.get_submodule(suffix.rsplit(".", 1)[0]) if "." in suffix else self.module
        return fn(tensor, owner, direction)


def slots(model: nn.Module) -> List[Slot]:
    """Our model's modules that hold parameters, with their reference prefix and layout."""
    names = dict(model.named_modules())
    found = []
    for ours_t, ref_t in SLOTS:
        rx = _Template(ours_t)
        for name, module in names.items():
            values = rx.match(name)
            if values is None or not any(True for _ in module.state_dict()):
                continue
            found.append(Slot(name, ref_t.format(**values), module, LAYOUTS.get(type(module))))
    return found


# ---------------------------------------------------------------- import / export
@dataclass
class WeightMapping:
    """state: our key -> tensor for the slots that mapped; matched: their paths;
    unmatched: slot path -> why not; unused: reference keys no slot took."""

    state: Dict[str, Tensor]
    matched: List[str]
    unmatched: Dict[str, str]
    unused: List[str]

    def summary(self) -> str:
        lines = [f"mapped: {', '.join(self.matched) or 'nothing'}"]
        lines += [f"not mapped: {k}: {why}" for k, why in self.unmatched.items()]
        if self.unused:
            lines.append(f"reference keys not used ({len(self.unused)}):")
            lines += [f"  {g}" for g in group_reference_keys(self.unused)]
        return "\n".join(lines)


def group_reference_keys(keys: List[str]) -> List[str]:
    """One line per reference module: its key prefix, count, an example and what it is."""
    groups: Dict[str, List[str]] = {}
    for k in keys:
        groups.setdefault(k.split(".")[0], []).append(k)
    lines = []
    for prefix, ks in groups.items():
        what = next((d for rx, d in REFERENCE_MODULES if re.match(rx, ks[0])), "")
        lines.append(f"{prefix}.* ({len(ks)} keys, e.g. {ks[0]})" + (f": {what}" if what else ""))
    return lines


def _slot_state(slot: Slot, ours: Mapping[str, Tensor], ref: Mapping[str, Tensor]):
    """-> ({our key: tensor}, None) when every key of the slot maps, else (None, why)."""
    if slot.layout is None:
        name = type(slot.module).__name__
        return None, f"{name} has no reference layout ({DIFFERENCES.get(name, 'structure differs')})"
    out = {}
    for k in [k for k in ours if k.startswith(slot.ours + ".")]:
        rk = slot.reference_key(k)
        if rk is None:
            return None, f"{k} has no counterpart in the {type(slot.module).__name__} layout"
        if rk not in ref:
            return None, f"reference key {rk} (for {k}) is missing"
        t = slot.convert(k, ref[rk], "ours")
        if tuple(t.shape) != tuple(ours[k].shape):
            return None, f"reference {rk} has shape {tuple(ref[rk].shape)}, our {k} needs {tuple(ours[k].shape)}"
        out[k] = t.to(ours[k].dtype)
    return out, None


def import_reference_state(ref: Mapping[str, Tensor], model: nn.Module, partial: bool = False) -> WeightMapping:
    """Map a reference state_dict onto ``model``'s keys, module by module (all keys of a module or none).

    partial=False raises :class:`WeightImportError` unless every key on both sides is accounted for.
    """
    ours = model.state_dict()
    state, matched, unmatched, used = {}, [], {}, set()
    covered = set()
    for slot in slots(model):
        keys = [k for k in ours if k.startswith(slot.ours + ".")]
        covered.update(keys)
        got, why = _slot_state(slot, ours, ref)
        if got is None:
            unmatched[slot.ours] = why
            continue
        state.update(got)
        matched.append(slot.ours)
        used.update(slot.reference_key(k) for k in keys)
    for k in ours:
        if k not in covered:
            unmatched[k] = "no reference counterpart (not in SLOTS)"
    result = WeightMapping(state, matched, unmatched, [k for k in ref if k not in used])
    if not partial and (result.unmatched or result.unused):
        raise WeightImportError("the reference weights do not fit this model:\n" + result.summary())
    return result


def export_reference_state(model: nn.Module, partial: bool = False) -> Tuple[Dict[str, Tensor], List[str]]:
    """Our weights in the reference's key layout -> (state_dict, our module paths left out).

    partial=False raises :class:`WeightImportError` when a module has no reference layout.
    """
    ours = model.state_dict()
    out: Dict[str, Tensor] = {}
    skipped = []
    for slot in slots(model):
        if slot.layout is None:
            skipped.append(slot.ours)
            continue
        for k in [k for k in ours if k.startswith(slot.ours + ".")]:
            rk = slot.reference_key(k)
            if rk is None:
                raise WeightImportError(f"{k} has no counterpart in the {type(slot.module).__name__} layout")
            out[rk] = slot.convert(k, ours[k], "reference")
    if skipped and not partial:
        raise WeightImportError("no reference layout for: " + "; ".join(
            f"{p} ({DIFFERENCES.get(type(model.get_submodule(p)).__name__, 'structure differs')})" for p in skipped))
    return out, skipped


def read_reference_checkpoint(path) -> Dict[str, Tensor]:
    """A reference ``net_epoch*.pth``: a state_dict (possibly under 'state_dict' / 'model', possibly with
    DataParallel's 'module.' prefix). Loaded with ``weights_only=True``: tensors only, nothing executed."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise WeightImportError(f"reference checkpoint not found: {path}") from None
    except Exception as exc:  # torch raises many types for foreign or corrupt archives
        raise WeightImportError(f"{path}: not a loadable tensor checkpoint ({type(exc).__name__}: {exc})") from None
    for key in ("state_dict", "model_state_dict", "model"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict) or not obj or not all(isinstance(v, Tensor) for v in obj.values()):
        raise WeightImportError(f"{path}: expected a state_dict (key -> tensor)")
    return {k[len("module."):] if k.startswith("module.") else k: v for k, v in obj.items()}
