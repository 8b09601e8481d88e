"""Robustness sweep: AP of several trained runs under pose noise, latency and
message loss, every run on the same seeded channel (issue 15).

For each run and each level of each effect the run is evaluated with
:func:`opencood_ext.eval.evaluate.evaluate` through the imperfect channel
(:mod:`opencood_ext.comm.channel`; latency from the dataset reader,
``latency_frames``), and the result lands in the run folder as
``eval_<label>.json``, ``<label>`` being the inference CLI's
(:func:`opencood_ext.run_folder.evaluation_label`). One already there is reused
by the run folder's one rule (:meth:`~opencood_ext.run_folder.RunFolder.evaluation_current`):
its stamp records the same settings (the inference command of
:class:`~opencood_ext.eval.reuse.EvaluationSettings`), the same code and the same
files (the run's config and weights, the test data under ``data.root``). So the
sweep resumes where it stopped and reuses the inference CLI's (and the main
job's) evaluations, and evaluates again after any code change, retraining or
other test data.

Levels (defaults, the field's protocol): pose noise std 0, 0.2, 0.4, 0.6 (m on
x and y, deg on yaw, both at once); latency 0-3 frames; drop probability 0,
0.25, 0.5, 1.0. The drop effect also evaluates each run with its collaborators
off (fusion "none", ``eval_none.json``): with every message lost a cooperative
method should score what that scores.

:func:`sweep` returns (and the CLI writes) ``robustness.json``;
:func:`format_markdown` and :func:`plot_robustness` render it.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from tqdm import tqdm

from ..comm.channel import ChannelConfig
from ..run_folder import RunFolder, code_digest, evaluation_label
from .reuse import EvaluationSettings, evaluation_stamp

Level = Union[int, float]
THRESHOLDS = ("0.5", "0.7")


@dataclass(frozen=True)
class Effect:
    """One channel effect swept over levels. ``kind`` is how a level is read (float or int)."""

    name: str
    title: str
    axis: str
    defaults: Tuple[Level, ...]
    kind: type

    def setting(self, level: Level, seed: int) -> Tuple[ChannelConfig, int]:
        """(channel, latency_frames) of ``level``."""
        if self.name == "noise":
            return ChannelConfig(pose_noise_m=float(level), pose_noise_deg=float(level), seed=seed), 0
        if self.name == "drop":
            return ChannelConfig(drop=float(level), seed=seed), 0
        return ChannelConfig(seed=seed), int(level)

    def parse(self, text: str, option: str) -> List[Level]:
        """"0,0.2,0.4" -> levels (each >= 0; drop <= 1; latency whole frames), in the given order."""
        out: List[Level] = []
        for part in (p.strip() for p in str(text).split(",")):
            try:
                value = self.kind(part)
            except ValueError:
                raise ValueError(f"{option}: {part!r} is not a{'n integer' if self.kind is int else ' number'} "
                                 f"(expected levels like {','.join(f'{v:g}' for v in self.defaults)})") from None
            if not (math.isfinite(value) and value >= 0) or (self.name == "drop" and value > 1):
                raise ValueError(f"{option}: level {part} must be >= 0{' and <= 1' if self.name == 'drop' else ''}")
            out.append(value)
        if not out or len(set(out)) != len(out):
            raise ValueError(f"{option}: give distinct levels separated by commas, got {text!r}")
        return out


EFFECTS: Dict[str, Effect] = {
    "noise": Effect("noise", "Pose noise", "std of x, y in m and of yaw in deg", (0.0, 0.2, 0.4, 0.6), float),
    "latency": Effect("latency", "Latency", "frames the collaborators' data are late", (0, 1, 2, 3), int),
    "drop": Effect("drop", "Message loss", "probability that a message is lost", (0.0, 0.25, 0.5, 1.0), float),
}


@dataclass(frozen=True)
class RunSpec:
    """A run of the sweep: table label, run folder, fusion method (None: the one it was trained for)."""

    label: str
    run_dir: Path
    fusion: Optional[str] = None


def parse_run(text: str, methods: Sequence[str]) -> RunSpec:
    """"LABEL=RUN_DIR[:FUSION]" -> RunSpec; FUSION must be one of ``methods`` (else the colon is the path's)."""
    label, sep, rest = str(text).partition("=")
    if not sep or not label.strip() or not rest.strip():
        raise ValueError(f"--runs {text!r}: expected LABEL=RUN_DIR[:FUSION], e.g. 'GenComm=runs/onboard:intermediate'")
    path, colon, fusion = rest.rpartition(":")
    if colon and fusion in methods:
        return RunSpec(label.strip(), Path(path), fusion)
    return RunSpec(label.strip(), Path(rest))


def interval(point: dict, thr: str) -> Optional[Tuple[float, float]]:
    """The 95% interval of AP@``thr`` in an evaluation's ``ap_ci`` (global order), when it has one.

    Accepted shapes: ``{"0.5": [lo, hi]}``, ``{"global": {"0.5": [lo, hi]}}``, and ``{"lo": .., "hi": ..}``
    or ``{"low": .., "high": ..}`` in place of the pair."""
    ci = point.get("ap_ci")
    if not isinstance(ci, dict):
        return None
    ci = ci.get("global", ci)
    v = ci.get(thr) if isinstance(ci, dict) else None
    if isinstance(v, dict):
        v = (v.get("lo", v.get("low")), v.get("hi", v.get("high")))
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, (int, float)) for x in v):
        return float(v[0]), float(v[1])
    return None


def _point(level: Level, name: str, res: dict, reused: bool) -> dict:
    ch = res.get("channel") or {}
    return {"level": level, "eval": name, "reused": reused, "ap": res["ap"]["global"], "ap_ci": res.get("ap_ci"),
            "frames": res["frames"], "sent": ch.get("sent", 0), "lost": ch.get("lost", 0),
            "rejected": ch.get("rejected", 0), "bytes_per_message": res.get("bytes_per_message", 0.0)}


class _RunEvaluator:
    """Evaluates one run at any channel setting, reusing stored results (module docstring)."""

    def __init__(self, spec: RunSpec, seed: int, split: Optional[str], max_frames: Optional[int],
                 overrides: Sequence[str], progress: bool, code: str, feature_cache=None):
        from ..interop.runs import load_any_run
        from ..runs import set_fusion
        self.spec, self.seed, self.progress, self.code = spec, seed, progress, code
        self.folder, self.overrides = RunFolder(spec.run_dir), tuple(overrides)
        self.cfg, self.model = load_any_run(spec.run_dir, overrides, echo=False)
        from .detection_range import evaluation_range, range_override
        area = evaluation_range(self.cfg.protocol, self.cfg.data.format, self.cfg.data.lidar_range, self.cfg.eval.range)
        if area is not None:  # protocol reference: the reference's default range, as gencomm-infer evaluates
            self.overrides = (*self.overrides, range_override(area))
            self.cfg, self.model = load_any_run(spec.run_dir, self.overrides, echo=False)
        self.model.feature_cache = feature_cache
        if spec.fusion:
            set_fusion(self.model, spec.fusion)
        self.fusion = self.model.fusion
        self.split = split or self.cfg.eval.split
        # eval JSONs do not record the split: another split than the run's own gets its own labels
        self.suffix = "" if self.split == self.cfg.eval.split else f"_{self.split}"
        self.max_frames = max_frames if max_frames is not None else self.cfg.eval.max_frames

    def evaluate(self, level: Level, channel: ChannelConfig, latency: int, fusion: Optional[str] = None) -> dict:
        from .evaluate import evaluate
        from ..experiment import build_dataset
        fusion = fusion or self.fusion
        label = evaluation_label(fusion, channel, latency, split_suffix=self.suffix)
        name = self.folder.evaluation(label).name
        settings = EvaluationSettings(self.spec.run_dir, fusion, self.split, self.max_frames, label, channel=channel,
                                      latency_frames=latency, overrides=self.overrides)
        stamp = evaluation_stamp(settings, self.cfg, self.code)
        if self.folder.evaluation_current(label, stamp):
            return _point(level, name, self.folder.read_evaluation(label), reused=True)
        self.folder.clear_stamp(label)
        dataset = build_dataset(self.cfg, self.split, train=False, fusion=fusion, latency_frames=latency)
        original = self.model.fusion
        self.model.set_fusion(fusion)
        try:
            torch.manual_seed(self.seed)  # diffusion noise of generative receivers: the same at every level
            result = evaluate(self.model, dataset, out_dir=self.spec.run_dir, plot_every=0,
                              max_frames=self.max_frames, label=label, progress=self.progress, channel=channel)
        finally:
            self.model.set_fusion(original)
        self.folder.write_stamp(label, stamp)
        return _point(level, name, result.to_json(), reused=False)


def sweep(specs: Sequence[RunSpec], levels: Dict[str, List[Level]], seed: int = 0, split: Optional[str] = None,
          max_frames: Optional[int] = None, overrides: Sequence[str] = (), progress: bool = True,
          feature_cache=None) -> dict:
    """Evaluate every run at every level of every effect in ``levels`` ({effect: [level, ...]}); -> the
    ``robustness.json`` dict (module docstring). Runs are loaded one at a time. ``feature_cache``: a
    :class:`~opencood_ext.models.feature_cache.FeatureCache` every run encodes through (each test frame
    is then encoded once per set of encoder weights, not once per level)."""
    labels = [s.label for s in specs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"--runs: labels must be distinct, got {labels}")
    for name in levels:
        if name not in EFFECTS:
            raise ValueError(f"unknown effect {name!r}; known: {sorted(EFFECTS)}")
    total = len(specs) * (sum(len(v) for v in levels.values()) + (1 if "drop" in levels else 0))
    data = {"settings": {"channel_seed": seed, "split": split, "max_frames": max_frames, "overrides": list(overrides),
                         "levels": {k: list(v) for k, v in levels.items()}},
            "runs": [], "effects": {k: {"title": EFFECTS[k].title, "axis": EFFECTS[k].axis, "levels": list(v),
                                        "results": {}, **({"off": {}} if k == "drop" else {})}
                                    for k, v in levels.items()}}
    bar = tqdm(total=total, desc="robustness", unit="eval", disable=not progress)
    code = code_digest()  # once: every evaluation of the sweep runs the same code
    for spec in specs:
        bar.set_postfix_str(f"{spec.label}: loading")
        ev = _RunEvaluator(spec, seed, split, max_frames, overrides, progress, code, feature_cache)
        data["runs"].append({"label": spec.label, "run_dir": str(spec.run_dir), "fusion": ev.fusion,
                             "split": ev.split})
        for name, effect_levels in levels.items():
            effect = EFFECTS[name]
            points = []
            for level in effect_levels:
                bar.set_postfix_str(f"{spec.label}: {name} {level:g}")
                channel, latency = effect.setting(level, seed)
                points.append(ev.evaluate(level, channel, latency))
                bar.update()
            data["effects"][name]["results"][spec.label] = points
            if name == "drop":
                bar.set_postfix_str(f"{spec.label}: collaborators off")
                data["effects"][name]["off"][spec.label] = ev.evaluate(None, ChannelConfig(seed=seed), 0, "none")
                bar.update()
    bar.close()
    return data


# ---------------------------------------------------------------------------------------------- rendering
def _cell(point: Optional[dict]) -> str:
    """'AP@0.5 / AP@0.7', each with its 95% interval when the evaluation has one."""
    if not point:
        return "-"
    parts = []
    for thr in THRESHOLDS:
        text = f"{point['ap'][thr]:.3f}"
        ci = interval(point, thr)
        parts.append(text + (f" ({ci[0]:.3f}-{ci[1]:.3f})" if ci else ""))
    return " / ".join(parts)


def format_tables(data: dict, heading: str = "###") -> List[str]:
    """One markdown table per effect: a row per run, a column per level (and, for message loss, the
    same weights with the collaborators off); cells AP@0.5 / AP@0.7 (module docstring)."""
    lines: List[str] = []
    for name, eff in data["effects"].items():
        off = eff.get("off")
        head = [f"{v:g}" for v in eff["levels"]] + (["collaborators off"] if off is not None else [])
        lines += [f"{heading} {eff['title']} ({eff['axis']})", "", "| run | " + " | ".join(head) + " |",
                  "|---|" + "---|" * len(head)]
        for run in data["runs"]:
            points = eff["results"].get(run["label"], [])
            cells = [_cell(p) for p in points] + ([_cell(off.get(run["label"]))] if off is not None else [])
            lines.append(f"| {run['label']} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def format_markdown(data: dict) -> str:
    """``robustness.md``: what was run, then :func:`format_tables`."""
    s = data["settings"]
    has_ci = any(interval(p, t) for e in data["effects"].values() for ps in e["results"].values()
                 for p in ps for t in THRESHOLDS)
    lines = ["# Robustness: AP under an imperfect channel", "",
             f"Every cell is AP@0.5 / AP@0.7 (global order{', 95% interval in brackets' if has_ci else ''}). "
             f"Every run meets the same channel: draws seeded by channel seed {s['channel_seed']}, the frame "
             "index and the sender. Pose noise is Gaussian on each collaborator's transmitted x, y and yaw; "
             "latency gives each collaborator's data and pose from that many frames earlier (clamped at the "
             "scenario's start); loss drops each message with that probability.", "",
             "| run | folder | fusion | split | frames |", "|---|---|---|---|---|"]
    for run in data["runs"]:
        first = next((ps[0] for e in data["effects"].values() for lab, ps in e["results"].items()
                      if lab == run["label"] and ps), None)
        lines.append(f"| {run['label']} | `{run['run_dir']}` | {run['fusion']} | {run['split']} | "
                     f"{first['frames'] if first else '-'} |")
    lines.append("")
    return "\n".join(lines + format_tables(data, "##"))


def plot_robustness(data: dict, path: Path) -> Path:
    """AP@0.5 (top) and AP@0.7 (bottom) against the level, one panel per effect, one line per run
    (a band where intervals exist); the message-loss panels mark each run's collaborators-off AP (x)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    effects = list(data["effects"].items())
    fig, axes = plt.subplots(len(THRESHOLDS), len(effects), figsize=(4.3 * len(effects), 6.8), dpi=110,
                             squeeze=False, sharey="row")
    for col, (name, eff) in enumerate(effects):
        for row, thr in enumerate(THRESHOLDS):
            ax = axes[row][col]
            for k, run in enumerate(data["runs"]):
                points = eff["results"].get(run["label"], [])
                xs, ys = [p["level"] for p in points], [p["ap"][thr] for p in points]
                ax.plot(xs, ys, marker="o", color=f"C{k % 10}", label=run["label"])
                cis = [interval(p, thr) for p in points]
                if cis and all(cis):
                    ax.fill_between(xs, [c[0] for c in cis], [c[1] for c in cis], color=f"C{k % 10}", alpha=0.15)
                off = (eff.get("off") or {}).get(run["label"])
                if off and xs:
                    ax.scatter([max(xs)], [off["ap"][thr]], marker="x", s=60, color=f"C{k % 10}",
                               label="collaborators off" if k == 0 else None)
            ax.set_xticks(eff["levels"])
            ax.set_title(f"{eff['title']}: AP@{thr}", fontsize=10)
            ax.set_xlabel(eff["axis"], fontsize=8)
            ax.grid(alpha=0.3)
            if col == 0:
                ax.set_ylabel(f"AP@{thr} (global order)")
    legend = {}
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(lab, h)
    axes[0][0].legend(list(legend.values()), list(legend), fontsize=7, loc="best")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def write_outputs(data: dict, out: Path) -> Dict[str, Path]:
    """``robustness.json``, ``robustness.md`` and ``robustness.png`` in ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "robustness.json", "md": out / "robustness.md"}
    tmp = paths["json"].with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(paths["json"])
    paths["md"].write_text(format_markdown(data))
    paths["png"] = plot_robustness(data, out / "robustness.png")
    return paths
