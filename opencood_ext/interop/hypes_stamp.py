"""STAMP's adapter stage (``heter_model_baseline_w_stamp``, the GenComm reference's
``baselines/stage2/STAMP/m0<m>_*.yaml``) -> our STAMP link and stage 2.

The reference trains, for the new type ``<m>`` (``heter.ego_modality``), an adapter
(``<m>`` -> protocol) and a reverter (protocol -> ``<m>``) against the protocol type
``m0`` (``heter.protocol_modality``), whose whole stack the file also builds. That is
our :class:`~opencood_ext.methods.stamp.StampLink` with ``protocol: m0`` and
``stage.new_types: [<m>]``: the protocol owner's space is the protocol (the identity
for it), and the new type's AdapterConvNeXt is our DomainAdapter of the same structure
(1x1 conv to ``dim``, ``num_of_blocks`` ConvNeXt blocks, 1x1 conv back; no resize, so
``in_feature_shape`` must equal ``out_feature_shape`` and the grid). The three
alignment weights are ``loss_adapter``'s alphas. What differs is printed with the
conversion: the agents' types and the detection loss (opencood_ext/methods/stamp.py).

STAMP's own repository (``collab_w_adapter``, :func:`stamp_collab`) and the GenComm reference's
STAMP inference (``heter_model_baseline_w_stamp_infer``, :func:`stamp_infer_link`) become the
``stamp_collab`` link (opencood_ext/methods/stamp_collab.py): the model of one type E, whose
agents' features are fused as they are and every other type's through its adapter and E's reverter.
"""
from __future__ import annotations

from typing import List

from ..methods.stamp_adapters import ATT_DEFAULTS, CONVNEXT_DEFAULTS, ROW_COUPLED, AttentionAdapter
from .hypes_reader import HypesReader, same_value


def _convnext_only(r: HypesReader, m: str, part: str, model: str) -> None:
    """The GenComm reference's STAMP files are converted with the ConvNeXt adapter only."""
    key = f"model.args.{m}.{part}.core_method"
    if r.get(key, "adapterconvnext") != "adapterconvnext":
        r.refuse(key, f"{r.get(key)!r}: {model} is converted with STAMP's AdapterConvNext only (the other "
                      f"variants: STAMP's collab_w_adapter, opencood_ext/methods/stamp_adapters.py)")


def _size(r: HypesReader, m: str) -> dict:
    """The adapter and reverter size of type ``m`` (the two must match: ours share one size)."""
    sizes = {}
    for part in ("adapter", "reverter"):
        _convnext_only(r, m, part, str(r.get("model.core_method", "this model")))
        sub = f"model.args.{m}.{part}.args.submodule_args"
        sizes[part] = (r.get(f"{sub}.dim", 64), r.get(f"{sub}.num_of_blocks", 3))
        shapes = [r.get(f"model.args.{m}.{part}.args.{io}_feature_shape", None) for io in ("in", "out")]
        if None not in shapes and not same_value(list(shapes[0]), list(shapes[1])):
            r.refuse(f"model.args.{m}.{part}.args.out_feature_shape",
                     f"{shapes[1]} differs from in_feature_shape {shapes[0]}: a resizing adapter, ours do not resize")
    if sizes["adapter"] != sizes["reverter"]:
        r.refuse(f"model.args.{m}.reverter.args.submodule_args",
                 f"(dim, num_of_blocks) {sizes['reverter']} differs from the adapter's {sizes['adapter']}; ours "
                 f"share one size")
    dim, blocks = sizes["adapter"]
    return {"hidden_channels": dim, "blocks": blocks}


def stamp_link(r: HypesReader, types: List[str]) -> dict:
    """``model.link`` (type stamp) of a STAMP adapter-stage file."""
    protocol = r.get("heter.protocol_modality")
    for key, want in (("model.args.stage", "train_adapter"), ("model.args.crop_to_visible", False)):
        if r.has(key) and r.get(key) != want:
            r.refuse(key, f"{r.get(key)!r}: heter_model_baseline_w_stamp is converted for {want!r} only")
    if protocol not in types:
        r.refuse("heter.protocol_modality", f"{protocol!r} must be one of the model's types {types}: the "
                                            f"protocol type's stack is built from the file")
        return {"type": "stamp", "protocol": types[0] if types else "m0"}
    new = [t for t in types if t != protocol]
    for t in types:
        if t == protocol:  # built by the reference, frozen, and read by neither the forward nor the loss
            for part in ("adapter", "reverter"):
                if r.children(f"model.args.{t}.{part}"):
                    r.dropped.append((f"model.args.{t}.{part}", "the protocol type's own adapter / reverter: the "
                                      "reference builds it frozen and its adapter stage never applies it (ours: "
                                      "the identity)"))
        elif not r.children(f"model.args.{t}.adapter") or not r.children(f"model.args.{t}.reverter"):
            r.refuse(f"model.args.{t}.adapter", f"type {t} needs an adapter and a reverter to the protocol {protocol}")
    size = _size(r, new[0]) if new else {}
    for t in new[1:]:
        other = _size(r, t)
        if other != size:
            r.refuse(f"model.args.{t}.adapter.args.submodule_args", f"size {other} differs from {new[0]}'s {size}; "
                                                                    f"ours share one size")
    link = {"type": "stamp", "protocol": protocol, **size, "kernel_size": 7}
    for key, ours in (("alpha_M2P", "m2p_weight"), ("alpha_P2M", "p2m_weight"), ("alpha_M2P2M", "cycle_weight")):
        if r.has(f"loss_adapter.args.{key}"):
            link[ours] = float(r.get(f"loss_adapter.args.{key}"))
    r.approximations.append((
        "fusion.dataset", "the reference feeds each agent's sensors to both the protocol stack and the new type's "
        "(opv2v4stamp); ours gives each agent one type: data.modality alternates the two types so protocol / new "
        "pairs meet, and the alignment is measured between two agents' views (opencood_ext/methods/stamp.py)"))
    r.approximations.append((
        "loss_adapter", "the reference's adapter stage trains with the alignment loss alone; ours adds the detection "
        "loss through the protocol owner's frozen fusion and head"))
    return link


def stamp_stage(r: HypesReader, types: List[str]) -> dict:
    """``stage`` and ``data.modality`` of a STAMP adapter-stage file."""
    protocol = r.get("heter.protocol_modality", None)
    new = [t for t in types if t != protocol]
    return {"stage": {"new_types": new, "method": "stamp"}, "modality": "cycle:" + ",".join([str(protocol), *new])}


# ---------------------------------------------------------------- STAMP's own repository (collab_w_adapter)
STAMP_COLLAB_MODELS = ("collab_w_adapter",)
#: STAMP's model.args.stage -> whether the ego type's own rows go through its adapter and reverter
#: (the adapter-training stages' output of the ego type fuses every agent's M -> P -> M round trip)
COLLAB_STAGES = {"infer": False, "train_adapter_w_output": True, "train_adapter_output_only": True}


def collab_ego(r: HypesReader, types: List[str]) -> str:
    """The agent type whose fusion and heads the converted model holds: STAMP's ``ego_modality``."""
    key = "model.args.ego_modality" if r.has("model.args.ego_modality") else "heter.ego_modality"
    ego = str(r.get(key, types[0] if types else "m1"))
    if ego not in types:
        r.refuse(key, f"{ego!r} must be one of the model's types {types} (one type: the converted model is that "
                      f"ego type's collaboration model)")
        return types[0] if types else ego
    return ego


#: per variant, the submodule_args keys only the other variants read (dropped, listed, when a file states them);
#: AdapterConv reads none of submodule_args
OTHER_VARIANTS_SIZES = {"adapterconvnext": ("depth", "num_heads", "patch_size"),
                        "adapteratt": ("num_of_blocks", "kernel_size", "deform"),
                        "adapterconv": ("dim", "num_of_blocks", "kernel_size", "deform", "depth", "num_heads",
                                        "patch_size", "early_scale", "late_upsample")}


def collab_part(r: HypesReader, t: str, part: str) -> dict:
    """The ``model.link`` arguments of type ``t``'s ``part`` (adapter / reverter) in a collab_w_adapter
    file: its variant (core_method; the ConvNeXt one unnamed) and the sizes that variant reads, with
    STAMP's defaults (opencood_ext/methods/stamp_adapters.py)."""
    base = f"model.args.{t}.{part}"
    kind = r.get(f"{base}.core_method", "adapterconvnext")
    shapes = [r.get(f"{base}.args.{io}_feature_shape", None) for io in ("in", "out")]
    if None not in shapes and not same_value(list(shapes[0]), list(shapes[1])):
        r.refuse(f"{base}.args.out_feature_shape",
                 f"{shapes[1]} differs from in_feature_shape {shapes[0]}: a resizing adapter, ours do not resize")
    sub = f"{base}.args.submodule_args"
    for key in r.children(sub):  # the sizes another variant reads (STAMP's modules read only their own)
        if key in OTHER_VARIANTS_SIZES.get(kind, ()):
            r.dropped.append((f"{sub}.{key}", f"{kind} does not read it"))
    if kind == "adapterconvnext":
        return {"hidden_channels": r.get(f"{sub}.dim", CONVNEXT_DEFAULTS["hidden_channels"]),
                "blocks": r.get(f"{sub}.num_of_blocks", CONVNEXT_DEFAULTS["blocks"]),
                "kernel_size": r.get(f"{sub}.kernel_size", CONVNEXT_DEFAULTS["kernel_size"])}
    if kind == "adapterconv":
        return {"adapter": kind}
    if kind != "adapteratt":
        r.refuse(f"{base}.core_method", f"{kind!r}: STAMP's adapters here are adapterconvnext, adapterconv and "
                                        f"adapteratt")
        return {"adapter": kind}
    if shapes[0] is None:
        r.refuse(f"{base}.args.in_feature_shape", "missing: AdapterAtt's position table is laid on that grid")
    return {"adapter": kind, "hidden_channels": r.get(f"{sub}.dim", ATT_DEFAULTS["hidden_channels"]),
            "blocks": r.get(f"{sub}.depth", ATT_DEFAULTS["blocks"]),
            "num_heads": r.get(f"{sub}.num_heads", ATT_DEFAULTS["num_heads"]),
            "patch_size": r.get(f"{sub}.patch_size", ATT_DEFAULTS["patch_size"]),
            "feature_shape": [int(v) for v in shapes[0] or []]}


def stamp_collab(r: HypesReader, types: List[str]) -> dict:
    """``fusion``, ``fusion_op``, ``fusion_args`` and ``link`` of a collab_w_adapter file: the ego type's
    Pyramid Fusion, shrink_conv and heads, the ``stamp_collab`` link (opencood_ext/methods/stamp_collab.py)."""
    from .hypes_pyramid import pyramid_fusion  # noqa: PLC0415 (here: hypes_model imports both modules)

    stage = r.get("model.args.stage", "infer")
    ego = collab_ego(r, types)
    if stage not in COLLAB_STAGES:
        r.refuse("model.args.stage", f"{stage!r}: STAMP's adapter stage without outputs (train_adapter) detects "
                 f"nothing; one of {sorted(COLLAB_STAGES)}")
        return {"fusion": "pyramid", "fusion_op": "pyramid", "link": {"type": "stamp_collab", "ego": ego}}
    base = f"model.args.{ego}"
    if r.get(f"{base}.fusion_method", "pyramid") != "pyramid":
        r.refuse(f"{base}.fusion_method", f"{r.get(f'{base}.fusion_method')!r}: the ego type's fusion must be "
                                          f"pyramid here (PyramidFusion)")
    parts = pyramid_fusion(r, base)
    cycle = COLLAB_STAGES.get(stage, False)
    senders = [ego] if cycle else [t for t in types if t != ego]  # the adapter stages' agents are all ego
    needed = [(t, "adapter") for t in senders] + ([(ego, "reverter")] if senders else [])
    used = []
    for t, part in needed:
        if not r.children(f"model.args.{t}.{part}"):
            r.refuse(f"model.args.{t}.{part}", f"type {t} needs its {part} in the collaboration of a {ego} ego")
            continue
        used.append(collab_part(r, t, part))
    if any(s != used[0] for s in used[1:]):
        r.refuse(f"model.args.{ego}.reverter", f"adapter / reverter variants or sizes differ ({used}); ours share "
                                               f"one")
    if cycle and used and used[0].get("adapter") in ROW_COUPLED:
        r.refuse("model.args.stage", f"{stage!r} with {used[0]['adapter']}: the reference adapts the ego's row "
                 f"with its collaborators' in one attention call; ours adapts the ego's own row apart "
                 f"(opencood_ext/methods/stamp_collab.py): only stage 'infer' converts with this adapter")
    link = {"type": "stamp_collab", "ego": ego, **(used[0] if used else {}), "cycle_own": cycle}
    r.approximations.append(("model.args.ego_modality", (
        f"STAMP runs, per sample, the ego's type's own fusion and heads; the converted model is type {ego}'s: "
        f"the other types' fusion and heads are not built (their checkpoint keys are dropped, listed), and a "
        f"sample whose ego is of another type is refused" + ("" if cycle else f"; data.modality puts {ego} on "
                                                             f"every sample's ego"))))
    if cycle:
        r.approximations.append(("model.args.stage", (
            f"{stage}: the reference's {ego} output fuses every agent's {ego} -> protocol -> {ego} round trip "
            f"(its alignment loss and protocol output are training-time parts, not converted)")))
    return {**parts, "link": link}


def check_collab(r: HypesReader, model) -> None:
    """Widths a collab_w_adapter file states for the ego type, against the built model."""
    ego = model.link.ego
    for key, have in ((f"model.args.{ego}.in_head", model.fuse.out_channels),
                      (f"model.args.{ego}.fusion_backbone.inplanes", model.channels),
                      (f"model.args.{ego}.shrink_header.input_dim", model.fuse.backbone.out_channels),
                      (f"model.args.{ego}.anchor_number", model.anchor_gen.num_per_loc)):
        if r.has(key) and not same_value(r.get(key), have):
            r.refuse(key, f"is {r.get(key)} but the converted model gives {have}")
    rev = model.link.reverter[ego] if ego in model.link.reverter else None
    if isinstance(rev, AttentionAdapter) and list(rev.feature_shape) != list(model.grid.shape):
        r.refuse(f"model.args.{ego}.reverter.args.in_feature_shape", f"is {list(rev.feature_shape)} but the "
                 f"converted model's feature grid is {list(model.grid.shape)} (AdapterAtt's position table)")
    for t in model.encoders:
        for part in ("adapter", "reverter"):
            for io in ("in_channels", "out_channels"):
                key = f"model.args.{t}.{part}.args.{io}"
                if r.has(key) and not same_value(r.get(key), model.channels):
                    r.refuse(key, f"is {r.get(key)} but the agents' features are {model.channels} wide")


def stamp_infer_link(r: HypesReader, types: List[str]) -> dict:
    """``model.link`` of the GenComm reference's ``heter_model_baseline_w_stamp_infer``: one fusion and head
    (type E's, ``ego_modality``) for every sample; every agent of another type t, the ego included, is
    fused as ``reverter_E(adapter_t(f))``, an E agent's feature as it is (``stamp_collab``,
    ``ego_of_any_type``)."""
    ego = collab_ego(r, types)
    needed = [(t, "adapter") for t in types if t != ego] + ([(ego, "reverter")] if len(types) > 1 else [])
    sizes = []
    for t, part in needed:
        if not r.children(f"model.args.{t}.{part}"):
            r.refuse(f"model.args.{t}.{part}", f"type {t} needs its {part} (the model's type is {ego})")
            continue
        sizes.append(_size(r, t))
    if any(s != sizes[0] for s in sizes[1:]):
        r.refuse(f"model.args.{ego}.reverter.args.submodule_args", f"adapter / reverter sizes differ ({sizes}); "
                 f"ours share one size")
    return {"type": "stamp_collab", "ego": ego, **(sizes[0] if sizes else {}), "kernel_size": 7,
            "ego_of_any_type": True}
