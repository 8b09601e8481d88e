"""Evaluate a cooperative detector on a dataset split: AP@0.3/0.5/0.7 in both
accumulation orders (docs/formats.md section 4), bytes each collaborator sends per
frame, time per frame, BEV images of detections vs ground truth, and the
precision-recall curves (global order) as ``pr_<label>.png`` next to
``eval_<label>.json``. Every AP gets a 95% percentile-bootstrap interval over the test
scenes (``ap_ci``, :mod:`opencood_ext.eval.bootstrap`); the per-frame matched detections it
resamples go to ``eval_<label>_frames.npz``, so two runs can be compared paired
(``tools/compare.py``).

Every frame goes through :meth:`CooperativeDetector.predict`: each
collaborator's message is encoded (and signed, with an alliance key), passes
the channel (pose noise, loss; seeded by the frame index, so every method meets
the same channel), and is decoded by the receiver under the model's
``receiver:`` bounds; bytes are the encoded packets, signature included.
``channel`` in the results counts what was sent, lost and rejected (by rule:
``rejected_reasons``) and records the receiver's settings (the key by reference
only). A dataset with several classes (``data.class_groups``, V2X-Real) also gets AP per class
and mAP (``ap_by_class``, :mod:`opencood_ext.eval.class_ap`), as GenComm's V2X-Real inference.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Union

import numpy as np
import yaml
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from opencood_ext.comm.channel import ChannelConfig
from opencood_ext.comm.messages import rule_of
from opencood_ext.data.batch import collate_samples
from opencood_ext.data.errors import DataFormatError
from opencood_ext.data.frame import AgentObs
from opencood_ext.data.sample import Sample
from opencood_ext.eval.ap import APAccumulator, format_ap_table, plot_pr_curves, pr_envelope
from opencood_ext.eval.bootstrap import bootstrap_ap
from opencood_ext.eval.records import FrameRecords
from opencood_ext.eval.class_ap import ClassAP, format_class_table, to_json as class_ap_json
from opencood_ext.eval.localisation import LocalisationStats, format_localisation
from opencood_ext.eval.visibility import VisibilityRecall, visibility_groups
from opencood_ext.run_folder import RunFolder
from opencood_ext.viz import plot_agents_bev

log = logging.getLogger(__name__)


@dataclass
class EvalResult:
    """ap: {"global": {0.3: ., 0.5: ., 0.7: .}, "per_frame": {...}};
    bytes_per_message: mean bytes one collaborator sent per frame (0 with none);
    log2_bytes: log2 of that; frames, seconds_per_frame, num_gt, num_pred.
    pr_curves: the global-order PR curves, ``{"order": "global", "image": path of pr_<label>.png
    or None, "curves": {"0.3": {"recall": [...], "precision": [...]}, ...}}`` (each curve the
    VOC envelope on a recall grid, :func:`~opencood_ext.eval.ap.pr_envelope`).
    ap_ci: 95% interval of every AP, the same keys as ``ap`` (``[lo, hi]``, None where undefined),
    percentile bootstrap over the ``num_scenes`` test scenes (``bootstrap``: how); ``frames_file``:
    the per-frame records it resampled (``eval_<label>_frames.npz``, None without an out_dir).
    ap_by_class: with several classes, :meth:`~opencood_ext.eval.class_ap.ClassAP.summary` (AP per
    class and order, mAP); None for a one-class dataset."""

    fusion: str
    ap: Dict[str, Dict[float, float]]
    bytes_per_message: float
    frames: int
    seconds_per_frame: float
    num_gt: int
    num_pred: int
    collaborators_per_frame: float
    images: List[str] = field(default_factory=list)
    recall_by_visibility: Optional[Dict[str, dict]] = None
    localisation: Optional[Dict[str, dict]] = None  # opencood_ext.eval.localisation: box precision of found objects
    channel: Dict[str, object] = field(default_factory=dict)  # settings and counts: sent, lost, rejected
    pr_curves: Optional[dict] = None
    ap_ci: Optional[Dict[str, Dict[str, Optional[List[float]]]]] = None
    num_scenes: int = 0
    bootstrap: Optional[dict] = None
    frames_file: Optional[str] = None
    ap_by_class: Optional[dict] = None

    @property
    def log2_bytes(self) -> float:
        return math.log2(self.bytes_per_message) if self.bytes_per_message > 0 else 0.0

    def table(self) -> str:
        rows = [f"fusion: {self.fusion}   frames: {self.frames}   GT boxes: {self.num_gt}   "
                f"detections: {self.num_pred}"]
        rows.append(f"{'order':<12}{'AP@0.3':>9}{'AP@0.5':>9}{'AP@0.7':>9}")
        for order, aps in self.ap.items():
            rows.append(f"{order:<12}" + "".join(f"{aps[t]:>9.4f}" for t in (0.3, 0.5, 0.7)))
        if self.ap_ci:
            rows.append(f"95% intervals over {self.num_scenes} test scenes, global order: " + ", ".join(
                f"IoU {t} " + ("n/a" if ci is None else f"[{ci[0]:.3f}, {ci[1]:.3f}]")
                for t, ci in self.ap_ci["global"].items()))
        rows.append(f"bytes per message: {self.bytes_per_message:.0f} (log2 {self.log2_bytes:.2f}), "
                    f"{self.collaborators_per_frame:.2f} collaborators/frame, "
                    f"{self.seconds_per_frame * 1000:.0f} ms/frame")
        if self.channel:
            c = self.channel
            rows.append(f"channel: {c.get('describe', '')}; messages sent {c.get('sent', 0)}, lost {c.get('lost', 0)}, "
                        f"rejected by the receiver {c.get('rejected', 0)}"
                        + (" (" + ", ".join(f"{k}: {v}" for k, v in sorted(c["rejected_reasons"].items())) + ")"
                           if c.get("rejected_reasons") else "")
                        + ({"ed25519": "; signed messages (per-sender keys)"}.get(
                            c.get("signing"), "; signed messages (alliance key)" if c.get("authenticated") else "")))
        if self.ap_by_class:
            rows.extend(format_class_table(self.ap_by_class))
        if self.recall_by_visibility:
            rows.append("recall@0.5 by who sees the object (>= 5 LiDAR points): " + ", ".join(
                f"{g} {v['recall']:.3f} of {v['gt']}" if v["recall"] is not None else f"{g} - of 0"
                for g, v in self.recall_by_visibility.items()))
        if self.localisation and self.localisation["all"]["found"]:
            rows.append("box precision of found objects (best-IoU detection per GT):")
            rows.append(format_localisation(self.localisation))
        return "\n".join(rows)

    def to_json(self) -> dict:
        d = asdict(self)
        d["ap"] = {o: {str(t): v for t, v in aps.items()} for o, aps in self.ap.items()}
        d["log2_bytes"] = self.log2_bytes
        if self.ap_by_class is not None:
            d["ap_by_class"] = class_ap_json(self.ap_by_class)
        return d


@dataclass
class _FrameItem:
    """What the evaluation loop needs of one frame, made where the DataLoader makes items (a
    worker process, if any), so the frame is read once: the sample, who sees each GT box (the
    groups, None when not defined, or the DataFormatError computing them raised, which the loop
    raises only if it still wants groups) and, on frames that get a BEV image, the agents to draw
    (their LiDAR scans only)."""

    sample: Sample
    visibility: Union[np.ndarray, None, DataFormatError]
    plot_agents: Optional[List[AgentObs]] = None


class _EvalFrames(Dataset):
    """The first ``n`` frames of a :class:`~opencood_ext.data.dataset.CooperativeDataset` as
    :class:`_FrameItem` (None for a bad frame the dataset leaves out)."""

    def __init__(self, dataset, n: int, plot_every: int):
        self.dataset, self.n, self.plot_every = dataset, n, plot_every

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> Optional[_FrameItem]:
        sample, frame = self.dataset.sample_with_frame(index)
        if sample is None:
            return None
        try:
            groups = visibility_groups(self.dataset, index, sample.gt_boxes, frame=frame)
        except DataFormatError as exc:
            groups = exc
        agents = None
        if self.plot_every and index % self.plot_every == 0:
            agents = [dataclasses.replace(a, cameras=[], lidar_beams={})
                      for a in self.dataset.select_agents(frame, np.random.default_rng(0))]
        return _FrameItem(sample, groups, agents)


def _collate_item(items: List[Optional[_FrameItem]]):
    """batch_size 1 -> (Batch, _FrameItem), or None for a frame left out."""
    item = items[0]
    return None if item is None else (collate_samples([item.sample]), item)


def evaluate(model, dataset, out_dir: Optional[Path] = None, plot_every: int = 0, max_frames: Optional[int] = None,
             label: str = "", progress: bool = True, channel: Optional[ChannelConfig] = None,
             resamples: int = 1000, bootstrap_seed: int = 0) -> EvalResult:
    """Run ``model.predict`` over ``dataset`` one frame at a time (ego = first agent).
    Frames the dataset leaves out as bad (``skip_bad_frames``) are not counted in ``frames``.

    channel: pose noise / message loss (:class:`~opencood_ext.comm.channel.ChannelConfig`); the
    draws of frame i are keyed by i, so runs compared on the same frames meet the same channel.
    Besides AP, recall at IoU 0.5 is split by who sees each GT object: the ego, only a
    collaborator, nobody (:mod:`opencood_ext.eval.visibility`), for every fusion method alike.
    resamples / bootstrap_seed: the scene bootstrap behind ``ap_ci`` (the same seed draws the same
    scenes for every run on the same split, so their intervals are comparable)."""
    model.eval()
    channel = channel or ChannelConfig()
    vis = VisibilityRecall(0.5)
    loc = LocalisationStats()
    vis_defined = True
    device = next(model.parameters()).device
    acc = APAccumulator()
    class_names = list(getattr(getattr(dataset, "cfg", None), "class_groups", None) or {})
    by_class = ClassAP(class_names) if len(class_names) > 1 else None
    sent: List[int] = []
    collaborators = lost = 0
    rejected: Counter = Counter()
    images = []
    scenes: List[str] = []
    frame_keys: List[str] = []
    n = len(dataset) if max_frames is None else min(len(dataset), max_frames)
    plot_every = plot_every if out_dir is not None else 0
    loader = DataLoader(_EvalFrames(dataset, n, plot_every), batch_size=1, shuffle=False, collate_fn=_collate_item)
    start, done = time.perf_counter(), 0
    for i, got in enumerate(tqdm(loader, total=n, desc=f"eval {label or model.fusion}",
                                 disable=not (progress and sys.stderr.isatty()),
                                 leave=False)):
        if got is None:  # a bad frame the dataset left out (skip_bad_frames)
            continue
        batch, item = got
        done += 1
        batch = batch.to(device)
        pred = model.predict(batch, channel=channel, keys=lambda b, i=i: (i,))
        d = pred.detections[0]
        gt = batch.gt_boxes[0].cpu().numpy()
        boxes, scores = d.boxes.cpu().numpy(), d.scores.cpu().numpy()
        acc.add(boxes, scores, gt)
        if by_class is not None:
            by_class.add(boxes, scores, d.labels.cpu().numpy(), gt, batch.gt_classes[0].cpu().numpy())
        scenes.append(str(batch.scenarios[0]))
        frame_keys.append(f"{batch.scenarios[0]}/{batch.timestamps[0]}")
        if vis_defined:
            groups = item.visibility
            if isinstance(groups, DataFormatError):
                raise groups
            vis_defined = groups is not None
            if vis_defined:
                vis.add(groups, boxes, scores, gt)
        loc.add(groups if vis_defined else None, boxes, gt)
        sent.extend(pred.delivery.bytes_sent)
        collaborators += len(pred.delivery.bytes_sent)
        lost += len(pred.delivery.lost)
        rejected.update(rule_of(reason) for _, reason in pred.delivery.rejected)
        if item.plot_agents is not None:
            path = RunFolder(out_dir).bev_image(label or model.fusion, i)
            plot_agents_bev(path, item.plot_agents, gt_boxes=gt, pred_boxes=boxes,
                            lidar_range=dataset.cfg.lidar_range,
                            title=f"{label or model.fusion}: {batch.scenarios[0]} / {batch.timestamps[0]} "
                                  f"(green GT, red detections)")
            images.append(str(path))
    elapsed = time.perf_counter() - start
    res = acc.results()
    result = EvalResult(
        fusion=model.fusion,
        ap={order: dict(r.ap) for order, r in (("global", res["global"]), ("per_frame", res["per_frame"]))},
        bytes_per_message=float(np.mean(sent)) if sent else 0.0, frames=done,
        seconds_per_frame=elapsed / max(done, 1), num_gt=res["global"].num_gt, num_pred=res["global"].num_pred,
        collaborators_per_frame=collaborators / max(done, 1), images=images,
        recall_by_visibility=vis.summary() if vis_defined else None, localisation=loc.summary(),
        ap_by_class=by_class.summary() if by_class is not None else None,
        channel={**asdict(channel), "describe": channel.describe(),
                 "latency_frames": getattr(dataset, "latency_frames", 0), "sent": collaborators, "lost": lost,
                 "rejected": sum(rejected.values()), "rejected_reasons": dict(rejected),
                 "authenticated": bool(getattr(model, "authenticated", False)),
                 "signing": model.security.mode if hasattr(model, "security") else "none",
                 "receiver": asdict(model.receiver) if hasattr(model, "receiver") else {}})
    g = res["global"]
    result.pr_curves = {"order": g.order, "image": None,
                        "curves": {str(t): pr_envelope(g, t) for t in g.thresholds}}
    records = FrameRecords.from_accumulator(acc, scenes, frame_keys)
    if n:
        boot = bootstrap_ap(records, resamples=resamples, seed=bootstrap_seed)
        result.ap_ci, result.num_scenes, result.bootstrap = boot.ci_json(), boot.num_scenes, boot.method_json()
    if out_dir is not None:
        folder, name = RunFolder(out_dir), label or model.fusion
        folder.root.mkdir(parents=True, exist_ok=True)
        result.pr_curves["image"] = str(plot_pr_curves(g, folder.pr_plot(name)))
        result.frames_file = str(records.save(folder.frames(name)))
        folder.evaluation(name).write_text(json.dumps(result.to_json(), indent=2))
        folder.evaluation_yaml(name).write_text(yaml.safe_dump(result.to_json(), sort_keys=False))
        log.info("wrote %s and %s\n%s", folder.evaluation(name), folder.evaluation_yaml(name).name,
                 format_ap_table(res))
    return result
