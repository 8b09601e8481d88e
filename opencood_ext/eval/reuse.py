"""What an evaluation's result depends on, so an evaluation already in a run folder is reused only
when nothing of it changed (the rule: :mod:`opencood_ext.run_folder`).

:class:`EvaluationSettings` holds every setting that decides the numbers, resolved (no default left
to the config); its :meth:`~EvaluationSettings.argv` is the inference command that runs exactly that
evaluation, and is the stamp's command. The inference CLI (``--reuse``) and the robustness sweep build
the same settings for the same evaluation, so either reuses what the other wrote.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, List, Optional, Tuple

from ..comm.channel import ChannelConfig
from ..run_folder import EvaluationStamp, RunFolder, dynamic_label

if TYPE_CHECKING:
    from ..experiment import ExperimentConfig

PROGRAM = "gencomm-infer"  # the command line program the stamp's command names


@dataclass(frozen=True)
class EvaluationSettings:
    """One evaluation of a run, every setting resolved.

    run_dir: the folder the results go to; fusion: the method it runs with ("none", "late", ...);
    split / max_frames: the frames (max_frames None: all of the split); channel / latency_frames /
    wire_dtype: the imperfect channel (a perfect channel's seed draws nothing and is left out);
    blank_messages: types sending all-zero maps; overrides: the ``--set`` items the config was loaded
    with, in order; label: the ``eval_<label>.json`` written; dynamic: the joining order of a
    growing-alliance evaluation (its label is ``dynamic``, or ``dynamic_<checkpoint>``); late_of: ``TYPE=RUN`` items of a late
    fusion of single-type runs (then run_dir is only where the results go); checkpoint: the named
    weights evaluated (best, last, epoch_N), None: the run's evaluation weights."""

    run_dir: Path
    fusion: str
    split: str
    max_frames: Optional[int]
    label: str
    channel: ChannelConfig = ChannelConfig()
    latency_frames: int = 0
    wire_dtype: Optional[str] = None
    blank_messages: Tuple[str, ...] = ()
    overrides: Tuple[str, ...] = ()
    dynamic: Tuple[str, ...] = ()
    late_of: Tuple[str, ...] = ()
    checkpoint: Optional[str] = None

    def argv(self) -> List[str]:
        """The inference command of these settings, every setting spelt out in one order."""
        out = [PROGRAM, *(["--model_dir", str(self.run_dir)] if not self.late_of else
                          [a for item in self.late_of for a in ("--late_of", item)] + ["-o", str(self.run_dir)])]
        out += ["--checkpoint", self.checkpoint] if self.checkpoint is not None else []
        out += ["--fusion_method", self.fusion, "--split", self.split]
        if self.max_frames is not None:
            out += ["--max_frames", str(self.max_frames)]
        c = self.channel
        if not c.perfect:
            out += ["--pose_noise", f"{c.pose_noise_m:g},{c.pose_noise_deg:g}", "--drop", f"{c.drop:g}",
                    "--channel_seed", str(c.seed)]
        if self.latency_frames:
            out += ["--latency_frames", str(self.latency_frames)]
        if self.wire_dtype:
            out += ["--wire_dtype", self.wire_dtype]
        if self.blank_messages:
            out += ["--blank_messages", ",".join(self.blank_messages)]
        if self.dynamic:
            out += ["--dynamic", ",".join(self.dynamic)]
        else:
            out += ["--label", self.label]
        return out + [a for item in self.overrides for a in ("--set", item)]

    @property
    def stamp_label(self) -> str:
        """The label whose stamp the evaluation keeps: ``label``, or for a growing alliance its table's
        (``dynamic``: eval_dynamic.json; with a named checkpoint ``dynamic_epoch_2``: eval_dynamic_epoch_2.json)."""
        return dynamic_label(self.checkpoint) if self.dynamic else self.label

    def runs(self) -> List[Path]:
        """The run folders the evaluated model is loaded from."""
        return [Path(item.split("=", 1)[1]) for item in self.late_of] if self.late_of else [Path(self.run_dir)]


def evaluated_data(cfg: "ExperimentConfig", split: str) -> List[Path]:
    """The data an evaluation of ``split`` reads: the split's folder under ``data.root`` (the root itself
    when it has none), the same under ``data.reader_options.hetero_root`` (OPV2V-H), and the modality
    file when ``data.modality`` names one."""
    out = []
    for root in (cfg.data.root, cfg.data.reader_options.get("hetero_root")):
        if root:
            root = Path(root)
            out.append(root / split if (root / split).is_dir() else root)
    modality = Path(cfg.data.root) / cfg.data.modality
    if not cfg.data.modality.startswith(("all:", "cycle:")) and cfg.data.modality != "in_order":
        out.append(modality if not Path(cfg.data.modality).is_absolute() else Path(cfg.data.modality))
    return out


def evaluation_stamp(settings: EvaluationSettings, cfg: "ExperimentConfig", code: Optional[str] = None,
                     extra_reads: Iterable[Path] = ()) -> EvaluationStamp:
    """The stamp of evaluating ``settings`` now: its command, the code, and the files of every run it loads
    (:meth:`RunFolder.inputs`) and of the test data (:func:`evaluated_data` of ``cfg``, the config loaded with
    the settings' overrides)."""
    reads = [p for run in settings.runs() for p in RunFolder(run).inputs()]
    return EvaluationStamp.of(settings.argv(), [*reads, *evaluated_data(cfg, settings.split), *extra_reads], code)


def parse_types(text: Optional[str]) -> Tuple[str, ...]:
    """"m1, m3" -> ("m1", "m3") (blanks dropped)."""
    return tuple(t.strip() for t in (text or "").split(",") if t.strip())
