"""The heterogeneous collaboration benchmark: m2 (LSS camera), m3 (SECOND 32-beam)
and m4 (LSS camera, wider image backbone) join the alliance of m1 (PointPillars
64-beam, the ego) by every onboarding method. GenComm starts from its own
homogeneous stage-1 runs (one per type). The competitors start, as the reference
code runs them (``baselines/stage1/m*_att.yaml`` there), from homogeneous
full-feature intermediate-fusion runs (``competitor_stage1``): the frozen ego
fusion and head they reuse were trained on full features. Given no such runs,
they start from GenComm's stage-1 runs instead, whose fusion saw only generated
features (the {m1} column then shows what that costs them).

For each method (``METHODS``): one onboarding run (``gencomm-onboard -y
<configs>/<family>/stage2/<method>_m1_m2m3m4.yaml``), evaluated dynamically as
the paper reports it: AP with {m1}, {m1, m2}, {m1, m2, m3}, {m1, m2, m3, m4}
(``gencomm-infer --dynamic``). ``types`` picks a smaller alliance in its
joining order (e.g. m1, m3: the LiDAR pair, no camera stage 1 needed) when
``<method>_m1_<new types>.yaml`` configs exist for it; with the trainable parameters and GFLOPs of
what trained for each new type, the onboarding wall time and the encoded bytes
per message. Plus two references built from the stage-1 runs alone: No fusion
(m1's run with its collaborators off) and Late fusion (each agent detecting with
its own run, ``gencomm-infer --late_of``).

``score_epochs``: every onboarding's kept epochs (``checkpoints/epoch_N.pth``) are evaluated dynamically
too (``gencomm-infer --dynamic ... --checkpoint epoch_N``, into ``eval_dynamic_epoch_N.json`` beside the
selected weights' ``eval_dynamic.json``), so the report can show AP per onboarding epoch
(:mod:`experiments.report_epochs`); it costs epochs x alliances evaluations per method.

Every step is a command-line program run in-process (:mod:`experiments.steps`), as the main
job's other steps, and is resumable: finished runs are skipped.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from opencood_ext.run_folder import DYNAMIC, RunFolder, epoch_checkpoint, evaluation_label

from .evaluation import Alliance, Evaluation
from .method_ids import LATE_OF_STAGE1, NONE_OF_STAGE1, ONBOARDING_ROWS
from .profiles import onboarding_folder, starts_from_own_stage1
from .run_facts import run_facts
from .results import ResultRow
from .steps import Command, cache_flag, onboard_command, sets

TYPES = ("m1", "m2", "m3", "m4")
METHODS = ONBOARDING_ROWS  # (row label, onboarding method key, which is the row's method id)


def stage2_config(family: str, method: str, types: Sequence[str] = TYPES, configs: Optional[Path] = None) -> Path:
    """The onboarding config of ``method`` for the alliance ``types`` (ego first, then the new types),
    under the configs root ``configs`` (default: the shipped configs)."""
    from opencood_ext.config_files import configs_root
    folder = (configs_root() if configs is None else Path(configs)) / family / "stage2"
    path = folder / f"{method}_{types[0]}_{''.join(types[1:])}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no stage-2 config of {method} for the alliance {', '.join(types)} "
                                f"({folder} holds the alliances with configs)")
    return path


def scored_methods(score_epochs, methods=METHODS) -> List[str]:
    """The method keys whose kept epochs are scored: ``score_epochs`` is a bool (True: every method,
    as ``--score_epochs`` alone) or method keys ("all" for every one); an unknown key raises naming it."""
    keys = [m for _, m in methods]
    if isinstance(score_epochs, bool):
        return keys if score_epochs else []
    chosen = list(score_epochs)
    if "all" in chosen:
        return keys
    unknown = [m for m in chosen if m not in keys]
    if unknown:
        raise ValueError(f"--score_epochs: unknown method {unknown[0]!r}; the benchmark's methods are {', '.join(keys)} "
                         "(or all)")
    return chosen


def _dynamic(run: Path) -> List[dict]:
    return RunFolder(run).read_evaluation(DYNAMIC)


def _row(method_id: str, name: str, run: Path, dynamic: List[dict], note: str, **extra) -> ResultRow:
    """A results row: ``eval`` is its last alliance's evaluation (ap, ap_ci, bytes, frames file)."""
    full = RunFolder(run).read_evaluation(evaluation_label(alliance=dynamic[-1]["types"]))
    kept = ("types", "ap", "ap_ci", "bytes_per_message", "onboard_params", "onboard_gflops", "frames", "num_scenes")
    return ResultRow(method_id, name, Evaluation.from_run_json(full, str(run)), table="heterogeneous", run=str(run),
                     note=note, alliances=[Alliance.from_run_json({k: d[k] for k in kept if k in d}) for d in dynamic],
                     **extra)


@dataclass(frozen=True)
class Onboarding:
    """One method's onboarding in the benchmark: its row label, method key, whether it starts from the
    competitors' own stage-1 runs, its run folder and the ``gencomm-onboard`` command that trains it."""

    name: str
    method: str
    own_stage1: bool
    run: Path
    command: Command


def onboardings(runs: Path, stage1: Dict[str, Path], family: str, overrides: Sequence[str],
                onboard_overrides: Sequence[str] = (), onboard_epochs=None, methods=METHODS,
                types: Sequence[str] = TYPES, competitor_stage1: Optional[Dict[str, Path]] = None,
                configs: Optional[Path] = None, feature_cache: Optional[str] = None) -> List[Onboarding]:
    """Every method's onboarding as :func:`run_benchmark` runs it (same arguments, which it passes on);
    the main job's side-by-side lanes run these before the benchmark finds them finished.
    Every config must exist before anything trains (FileNotFoundError naming the missing one)."""
    types = list(types)
    if competitor_stage1 is not None and not set(types) <= set(competitor_stage1):
        raise ValueError(f"competitor stage-1 runs for {sorted(competitor_stage1)}, the alliance is {types}")
    cfgs = {method: stage2_config(family, method, types, configs) for _, method in methods}
    out = []
    for name, method in methods:
        own = starts_from_own_stage1(method, competitor_stage1 is not None)
        start = competitor_stage1 if own else stage1
        run = runs / onboarding_folder(method, types, own)
        cmd = onboard_command(cfgs[method], start[types[0]], [start[t] for t in types[1:]], run,
                              [*overrides, *onboard_overrides], feature_cache, onboard_epochs)
        out.append(Onboarding(name, method, own, run, cmd))
    return out


def run_benchmark(runs: Path, stage1: Dict[str, Path], family: str, run_cmd: Callable[..., None],
                  overrides: Sequence[str], onboard_overrides: Sequence[str] = (),
                  onboard_epochs=None, methods=METHODS, types: Sequence[str] = TYPES,
                  competitor_stage1: Optional[Dict[str, Path]] = None,
                  eval_overrides: Sequence[str] = (), configs: Optional[Path] = None,
                  feature_cache: Optional[str] = None, score_epochs: Sequence[str] = ()) -> List[ResultRow]:
    """Onboard and evaluate every method, then the stage-1 references; -> results rows.

    stage1: GenComm's stage-1 run per type; competitor_stage1: the full-feature stage-1 run per
    type the other methods start from (None: GenComm's; their run folders then lack the
    ``_own_stage1`` suffix, so the two protocols never share a folder). run_cmd: runs one
    :class:`~experiments.steps.Command` (raises on failure); evaluations run ``gencomm-infer
    --reuse`` (skipped when their stamp is current, :class:`opencood_ext.run_folder.RunFolder`); configs: the
    configs root (default: the shipped configs). overrides: ``--set`` items for every step (data root, quick-profile
    caps); onboard_overrides: extra ones for onboarding only; eval_overrides: extra ones for
    evaluation only (e.g. the separate test set's data root); types: the alliance in joining
    order, the ego's type first (run folders are named after the new types); feature_cache: the folder
    every onboarding and evaluation keeps frozen encoders' features in (None: off); score_epochs: also
    evaluate every kept epoch of every onboarding (module docstring)."""
    types = list(types)
    eval_sets = cache_flag(feature_cache) + sets(overrides) + sets(eval_overrides)
    order = ",".join(types)
    joined = ", ".join(types[1:])
    scored = scored_methods(score_epochs, methods)
    rows = []
    for entry in onboardings(runs, stage1, family, overrides, onboard_overrides, onboard_epochs, methods, types,
                             competitor_stage1, configs, feature_cache):
        name, method, own, run = entry.name, entry.method, entry.own_stage1, entry.run
        run_cmd(entry.command)
        run_cmd(Command("gencomm-infer", ["--model_dir", run, "--dynamic", order, "--reuse", *eval_sets]))
        for n in RunFolder(run).checkpoints.epoch_files() if method in scored else ():
            run_cmd(Command("gencomm-infer", ["--model_dir", run, "--dynamic", order, "--checkpoint", epoch_checkpoint(n),
                                              "--reuse", *eval_sets]))
        ob = json.loads(RunFolder(run).onboarding_report.read_text())
        origin = "full-feature stage-1 runs" if own else "GenComm's stage-1 runs"
        rows.append(_row(method, f"{name} ({joined} onboarded)", run, _dynamic(run), f"stage 2 ({method}) from {origin}",
                         trainable_params=ob["trainable_params_total"],
                         trainable_params_per_type=ob["trainable_params_per_new_type"],
                         train_wall_s=ob["onboarding_wall_time_s"], onboard_method=method,
                         stage1="full_feature" if own else "gencomm", **run_facts(run)))
    late = runs / ("late_of_stage1" if types == list(TYPES) else f"late_of_stage1_{''.join(types)}")
    run_cmd(Command("gencomm-infer", [*[a for t in types for a in ("--late_of", f"{t}={stage1[t]}")],
                                      "-o", late, "--dynamic", order, "--reuse", *eval_sets]))
    rows.append(_row(LATE_OF_STAGE1, "Late fusion (stage-1 models)", late, _dynamic(late),
                     "each agent detects with its own stage-1 run; nothing trained", trainable_params=0,
                     train_wall_s=0.0, **run_facts(stage1[types[0]], trained=False)))
    alone = runs / "none_of_stage1"
    run_cmd(Command("gencomm-infer", ["--late_of", f"{types[0]}={stage1[types[0]]}", "-o", alone,
                                      "--fusion_method", "none", "--dynamic", types[0], "--reuse", *eval_sets]))
    row = _row(NONE_OF_STAGE1, f"No fusion ({types[0]} stage-1 model)", alone, _dynamic(alone), "the ego alone: the "
               "same AP for every alliance", trainable_params=0, train_wall_s=0.0,
               **run_facts(stage1[types[0]], trained=False))
    ego = row.alliances[0].to_run_json()  # one evaluation for every alliance; its records are {ego}'s alone
    row.alliances = [Alliance.from_run_json({**ego, "types": types[:k + 1]}) for k in range(len(types))]
    rows.append(row)
    return rows
