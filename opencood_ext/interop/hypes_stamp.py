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
"""
from __future__ import annotations

from typing import List

from .hypes_reader import HypesReader, same_value


def _size(r: HypesReader, m: str) -> dict:
    """The adapter and reverter size of type ``m`` (the two must match: ours share one size)."""
    sizes = {}
    for part in ("adapter", "reverter"):
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
