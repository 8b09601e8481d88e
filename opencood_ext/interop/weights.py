"""Reference (HEAL / GenComm, OpenCOOD family) state_dict <-> our model's state_dict.

The tables live in :mod:`.layouts`: :data:`SLOTS` (where each of our modules
sits in the reference model) and :data:`LAYOUTS` (per module class, how
parameter names and layouts translate). A module of ours with no layout (its
structure differs from the reference's: see :data:`DIFFERENCES`) is not
mapped; the import refuses and names the reference keys nobody took and our
keys nobody filled. Adding a module shaped like a reference one (say a
``variant: reference`` generator) takes one LAYOUTS entry for its class; a
package outside opencood_ext adds it (GenComm's: :mod:`gencomm.interop`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

import torch
from torch import Tensor, nn

from ..training.checkpoint import CheckpointError, UnsafeCheckpointError, safe_torch_load
from .layouts import DIFFERENCES, LAYOUTS, REFERENCE_MODULES, SLOTS, Layout, Transform, layout_for

__all__ = ["WeightImportError", "Layout", "LAYOUTS", "SLOTS", "DIFFERENCES", "Slot", "slots", "WeightMapping",
           "import_reference_state", "export_reference_state", "read_reference_checkpoint",
           "group_reference_keys"]


class WeightImportError(ValueError):
    """Reference weights that do not fit; the message names the keys and why."""


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


def _translate(layout: Layout, suffix: str, to: str, module: nn.Module) -> Optional[str]:
    """A key suffix in ``to`` = "reference" (from ours) or "ours" (from the reference); None if no rule."""
    for ref_t, our_t in layout.keys:
        src, dst = (_Template(our_t), _Template(ref_t)) if to == "reference" else (_Template(ref_t), _Template(our_t))
        values = src.match(suffix)
        if values is not None:
            for name, fn in layout.renumber:
                if name in values:
                    values[name] = str(fn(module, int(values[name])))
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

    def _full(self, suffix: str) -> str:
        return f"{self.reference}.{suffix}" if self.reference else suffix

    def reference_key(self, our_key: str) -> Optional[str]:
        suffix = _translate(self.layout, our_key[len(self.ours) + 1:], "reference", self.module) \
            if self.layout else None
        return None if suffix is None else self._full(suffix)

    def convert(self, our_key: str, tensor: Tensor, direction: str) -> Tensor:
        suffix = our_key[len(self.ours) + 1:]
        fn = _transform(self.layout, suffix)
        if fn is None:
            return tensor
        owner = self.module.get_submodule(suffix.rsplit(".", 1)[0]) if "." in suffix else self.module
        return fn(tensor, owner, direction)

    def derived(self) -> Dict[str, Tensor]:
        """Reference key -> the tensor our module implies (e.g. its diffusion schedule buffers)."""
        return {self._full(k): fn(self.module) for k, fn in self.layout.derived} if self.layout else {}

    def ignored(self, ref: Mapping[str, Tensor]) -> List[str]:
        """Keys of ``ref`` under this slot that the reference's forward never reads."""
        if not self.layout or not self.layout.ignored:
            return []
        prefixes = tuple(self._full(p) for p in self.layout.ignored)
        return [k for k in ref if k.startswith(prefixes)]


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
            found.append(Slot(name, ref_t.format(**values), module, layout_for(module)))
    return found


# ---------------------------------------------------------------- import / export
@dataclass
class WeightMapping:
    """state: our key -> tensor for the slots that mapped; matched: their paths;
    unmatched: slot path -> why not; unused: reference keys no slot took;
    dropped: reference keys a matched slot declared unread by the reference's forward."""

    state: Dict[str, Tensor]
    matched: List[str]
    unmatched: Dict[str, str]
    unused: List[str]
    dropped: List[str] = field(default_factory=list)
    why_dropped: Dict[str, str] = field(default_factory=dict)  # a dropped key -> why (when a link said)

    def summary(self) -> str:
        lines = [f"mapped: {', '.join(self.matched) or 'nothing'}"]
        lines += [f"not mapped: {k}: {why}" for k, why in self.unmatched.items()]
        if self.dropped:
            lines.append(f"reference keys its forward never reads, dropped ({len(self.dropped)}):")
            lines += [f"  {g}" for g in group_reference_keys(self.dropped, depth=2, why=self.why_dropped)]
        if self.unused:
            lines.append(f"reference keys not used ({len(self.unused)}):")
            lines += [f"  {g}" for g in group_reference_keys(self.unused)]
        return "\n".join(lines)


def group_reference_keys(keys: List[str], depth: int = 1, why: Optional[Mapping[str, str]] = None) -> List[str]:
    """One line per reference module (the first ``depth`` key segments): its key prefix, count, an
    example and what it is (``why[key]`` of its first key when given)."""
    groups: Dict[str, List[str]] = {}
    for k in keys:
        groups.setdefault(".".join(k.split(".")[:depth]), []).append(k)
    lines = []
    for prefix, ks in groups.items():
        what = (why or {}).get(ks[0]) or next((d for rx, d in REFERENCE_MODULES if re.match(rx, ks[0])), "")
        lines.append(f"{prefix}.* ({len(ks)} keys, e.g. {ks[0]})" + (f": {what}" if what else ""))
    return lines


def _slot_state(slot: Slot, ours: Mapping[str, Tensor], ref: Mapping[str, Tensor]):
    """-> ({our key: tensor}, reference keys used, None) when every key of the slot maps, else
    (None, None, why)."""
    if slot.layout is None:
        name = type(slot.module).__name__
        return None, None, f"{name} has no reference layout ({DIFFERENCES.get(name, 'structure differs')})"
    out, used = {}, set()
    for k in [k for k in ours if k.startswith(slot.ours + ".")]:
        rk = slot.reference_key(k)
        if rk is None:
            return None, None, f"{k} has no counterpart in the {type(slot.module).__name__} layout"
        if rk not in ref:
            return None, None, f"reference key {rk} (for {k}) is missing"
        t = slot.convert(k, ref[rk], "ours")
        if tuple(t.shape) != tuple(ours[k].shape):
            return None, None, f"reference {rk} has shape {tuple(ref[rk].shape)}, our {k} needs {tuple(ours[k].shape)}"
        out[k] = t.to(ours[k].dtype)
        used.add(rk)
    for rk, want in slot.derived().items():
        if rk not in ref:
            continue
        have = ref[rk]
        if tuple(have.shape) != tuple(want.shape) or not torch.allclose(have.double(), want.double(),
                                                                         rtol=1e-5, atol=1e-7):
            show = (lambda t: "[" + ", ".join(f"{v:.4g}" for v in t.flatten()[:4].tolist()) + "]")
            return None, None, (f"reference {rk} = {show(have)} differs from this "
                                f"{type(slot.module).__name__}'s {show(want)}")
        used.add(rk)
    return out, used, None


def import_reference_state(ref: Mapping[str, Tensor], model: nn.Module, partial: bool = False,
                           viewed: bool = False) -> WeightMapping:
    """Map a reference state_dict onto ``model``'s keys, module by module (all keys of a module or none).

    partial=False raises :class:`WeightImportError` unless every key on both sides is accounted for.
    A link with ``reference_view`` (STAMP's collaboration, whose checkpoint holds a fusion and heads
    per agent type) first names which keys play the single model's parts; the keys it says this model
    never reads are dropped and listed with the others (viewed=True: ``ref`` is that view already).
    """
    view = None if viewed else getattr(getattr(model, "link", None), "reference_view", None)
    if view is not None:
        ref, names, unread = view(ref, list(getattr(model, "encoders", {})))
        result = import_reference_state(ref, model, partial=True, viewed=True)
        result.unused = [names[k] for k in result.unused]
        result.dropped = [names[k] for k in result.dropped] + list(unread)
        result.why_dropped = dict(unread)
        if not partial and (result.unmatched or result.unused):
            raise WeightImportError("the reference weights do not fit this model:\n" + result.summary())
        return result
    ours = model.state_dict()
    state, matched, unmatched, used, dropped = {}, [], {}, set(), set()
    covered = set()
    for slot in slots(model):
        covered.update(k for k in ours if k.startswith(slot.ours + "."))
        got, keys, why = _slot_state(slot, ours, ref)
        if got is None:
            unmatched[slot.ours] = why
            continue
        state.update(got)
        matched.append(slot.ours)
        used.update(keys)
        dropped.update(slot.ignored(ref))
    for k in ours:
        if k not in covered:
            unmatched[k] = "no reference counterpart (not in SLOTS)"
    result = WeightMapping(state, matched, unmatched, [k for k in ref if k not in used and k not in dropped],
                           [k for k in ref if k in dropped and k not in used])
    if not partial and (result.unmatched or result.unused):
        raise WeightImportError("the reference weights do not fit this model:\n" + result.summary())
    return result


def export_reference_state(model: nn.Module, partial: bool = False) -> Tuple[Dict[str, Tensor], List[str]]:
    """Our weights in the reference's key layout -> (state_dict, our module paths left out).

    partial=False raises :class:`WeightImportError` when a module has no reference layout. Modules
    that share one reference module (one per receiver type here) must hold equal weights.
    """
    ours = model.state_dict()
    out: Dict[str, Tensor] = {}
    source: Dict[str, str] = {}
    skipped = []
    for slot in slots(model):
        if slot.layout is None:
            skipped.append(slot.ours)
            continue
        items = []
        for k in [k for k in ours if k.startswith(slot.ours + ".")]:
            rk = slot.reference_key(k)
            if rk is None:
                raise WeightImportError(f"{k} has no counterpart in the {type(slot.module).__name__} layout")
            items.append((rk, k, slot.convert(k, ours[k], "reference")))
        items += [(rk, f"{slot.ours} (derived)", t) for rk, t in slot.derived().items()]
        for rk, k, t in items:
            if rk in out and not torch.equal(out[rk], t):
                raise WeightImportError(f"{source[rk]} and {k} both map to the reference's single {rk} but "
                                        f"differ; the reference holds one such module")
            out[rk], source[rk] = t, k
    if skipped and not partial:
        raise WeightImportError("no reference layout for: " + "; ".join(
            f"{p} ({DIFFERENCES.get(type(model.get_submodule(p)).__name__, 'structure differs')})" for p in skipped))
    return out, skipped


def read_reference_checkpoint(path) -> Dict[str, Tensor]:
    """A reference ``net_epoch*.pth``: a state_dict (possibly under 'state_dict' / 'model', possibly with
    DataParallel's 'module.' prefix). Loaded with ``weights_only=True``: tensors only, nothing executed."""
    if not Path(path).is_file():
        raise WeightImportError(f"reference checkpoint not found: {path}")
    try:
        obj = safe_torch_load(Path(path), "cpu")
    except UnsafeCheckpointError as exc:  # names the refused callable; never advises an unsafe load
        raise WeightImportError(str(exc)) from None
    except CheckpointError as exc:
        raise WeightImportError(f"{exc}; not a loadable tensor checkpoint") from None
    for key in ("state_dict", "model_state_dict", "model"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict) or not obj or not all(isinstance(v, Tensor) for v in obj.values()):
        raise WeightImportError(f"{path}: expected a state_dict (key -> tensor)")
    return {k[len("module."):] if k.startswith("module.") else k: v for k, v in obj.items()}
