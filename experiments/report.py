"""``REPORT.md`` for a reproduction run: the comparison table (every AP with its 95%
scene-bootstrap interval), the paired differences against GenComm and which are
significant, the onboarding cost against stage 1, a plot of AP against bytes per
message, every row's precision-recall curves at IoU 0.5 and 0.7, and the
robustness sweep's tables and curves when the main job ran it."""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import List, Sequence

import matplotlib
import yaml

from opencood_ext.eval.localisation import FOUND_IOU
from opencood_ext.run_folder import RunFolder

from .family_figures import compute_family_figures
from .method_ids import GENCOMM
from .plateau import plateau_section
from .profiles import STAGE1
from .report_cells import differences
from .report_family import family_section
from .report_epochs import epoch_sections
from .report_hetero import hetero_section
from .results import ResultRow, Results
from .tables import bytes_cell, row, short_name, table

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _training_minutes(results: Results) -> float:  # every table's rows
    """Every row's training (GenComm's row is its onboarding) plus stage 1, from the logged epoch times."""
    return (sum(r.train_wall_s for r in results.rows) + sum(results.stage1_wall_s.values())) / 60


def _note(row: ResultRow) -> str:
    """The row's note plus its budget, e.g. '; 8 epochs, max fusion', from the run folder's resolved
    config.yaml (what the row was actually trained with); the note alone when there is no run folder."""
    if not row.run:
        return row.note
    path = RunFolder(row.run).config
    if not path.is_file():
        return f"{row.note}; {path} missing"
    cfg = yaml.safe_load(path.read_text())
    model, train = cfg.get("model", {}), cfg.get("train", {})
    epochs = train.get("epochs", "?")
    text = f"{epochs} epoch{'' if epochs == 1 else 's'}"
    if model.get("fusion") == "intermediate":
        text += f", {model.get('fusion_op', '?')} fusion"
    return f"{row.note}; {text}" if row.note else text


def _interval_note(rows: Sequence[ResultRow]) -> list:
    """How the intervals were computed, from the rows' eval results, and the widest AP@0.5 half-width."""
    boot = [r.eval for r in rows if r.eval.ap_ci and r.eval.bootstrap]
    if not boot:
        return []
    b = boot[0].bootstrap
    half = [(ci[1] - ci[0]) / 2 for ev in boot for ci in [ev.ci_at("0.5")] if ci]
    scenes = sorted({ev.num_scenes for ev in boot})
    return ["", f"Brackets: 95% {b['interval'].split(',')[0]} interval over the {'/'.join(map(str, scenes))} test "
            f"scenes ({b['resamples']} resamples of whole scenes, seed {b['seed']}; docs/statistics.md)"
            + (f"; the widest AP@0.5 half-width is {max(half):.3f}." if half else ".")]


def plot_ap_vs_bytes(rows: Sequence[ResultRow], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for thr, marker in ((0.5, "o"), (0.7, "s")):
        for k, r in enumerate(rows):  # one colour per method, shared by its two markers
            b = max(r.eval.bytes_per_message, 1.0)
            ap = r.eval.ap_at(str(thr))
            ax.scatter(math.log2(b), ap, marker=marker, s=60, color=f"C{k % 10}")
            ax.annotate(short_name(r.method), (math.log2(b), ap), textcoords="offset points",
                        xytext=(4, 4), fontsize=7)
    ax.set_xlabel("log2(bytes one collaborator sends per frame)  (0 = nothing sent)")
    ax.set_ylabel("AP (global order)")
    ax.set_title("AP against communication volume (circles AP@0.5, squares AP@0.7)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


PR_THRESHOLDS = ("0.5", "0.7")


def plot_pr_rows(rows: Sequence[ResultRow], path: Path):
    """Every row's global-order PR curve (the envelope stored in its eval result,
    ``eval.pr_curves``), one panel per IoU in :data:`PR_THRESHOLDS`; None when no row has curves."""
    have = [(k, r) for k, r in enumerate(rows) if r.eval.pr_curves.get("curves")]
    if not have:
        return None
    fig, axes = plt.subplots(1, len(PR_THRESHOLDS), figsize=(11, 4.5), dpi=110, sharey=True)
    for ax, thr in zip(axes, PR_THRESHOLDS):
        for k, r in have:
            c = r.eval.pr_curves["curves"].get(thr, {"recall": [], "precision": []})
            ap = r.eval.ap["global"].get(thr)
            ax.plot(c["recall"], c["precision"], color=f"C{k % 10}", drawstyle="steps-post",
                    label=f"{r.method} (AP {ap:.3f})" if ap is not None else r.method)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("recall")
        ax.set_title(f"IoU {thr}")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower left", fontsize=7)
    axes[0].set_ylabel("precision (best at this recall or higher)")
    fig.suptitle("Precision-recall, global order, test split")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _pr_section(rows: Sequence[ResultRow], out: Path) -> list:
    """The PR figure and a link to each row's own pr_<label>.png (AP@0.3/0.5/0.7), when evaluated."""
    plot = plot_pr_rows(rows, out / "pr_curves.png")
    if plot is None:
        return []
    lines = ["## Precision-recall curves", "",
             "Each row's curve is the precision that AP integrates (the best precision at that recall or "
             "higher), global order; the legend repeats the row's AP.", "", f"![PR curves]({plot.name})", ""]
    images = [(r.method, r.eval.pr_curves["image"]) for r in rows if r.eval.pr_curves.get("image")]
    if images:
        lines += ["Per row, AP@0.3 / 0.5 / 0.7 on one plot: " + ", ".join(
            f"[{m}]({Path(os.path.relpath(img, out)).as_posix()})" for m, img in images), ""]
    return lines


def _visibility_table(rows: Sequence[ResultRow]) -> list:
    """Recall@0.5 by who sees each GT object (ego / only a collaborator / nobody), when evaluated."""
    have = [r for r in rows if r.eval.recall_by_visibility]
    if not have:
        return []
    groups = list(have[0].eval.recall_by_visibility)
    lines = ["", "Recall@0.5 by who sees each test object (>= 5 of an agent's LiDAR points, or its own car); "
             "only the collaborator-only column can show what a message carries that the ego cannot see:", ""]
    cells = []
    for r in have:
        found = [r.eval.recall_by_visibility[g] for g in groups]
        cells.append([r.method, *("-" if v["recall"] is None else f"{v['recall']:.3f} of {v['gt']}" for v in found)])
    lines += table(["method", *(g.replace("_", " ") for g in groups)], cells)
    lines += ["", "A row counts the agents of its own alliance: for an m1-only model (no fusion) what only an m3 "
              "collaborator sees falls under nobody."]
    return lines


def _localisation_table(rows: Sequence[ResultRow]) -> list:
    """Box precision of the objects each method finds (opencood_ext.eval.localisation), when evaluated:
    what separates AP@0.7 from AP@0.5."""
    have = [r for r in rows if r.eval.localisation]
    if not have:
        return []
    cells = []
    for r in have:
        a = r.eval.localisation["all"]
        c = r.eval.localisation.get("collaborators_only", {})
        if not a["found"]:
            cells.append([r.method, f"0 of {a['gt']}", "-", "-", "-", "-", "-"])
            continue
        collab = f"{c['share_iou_0.7']:.2f} of {c['found']}" if c.get("found") else "-"
        cells.append([r.method, f"{a['found']} of {a['gt']}", f"{a['mean_iou']:.3f}", f"{a['share_iou_0.7']:.2f}",
                      f"{a['median_centre_m']:.2f} m", f"{a['median_yaw_deg']:.1f} deg", collab])
    return ["", "Box precision of the objects each method finds (best-IoU detection per test object, found = "
            f"IoU >= {FOUND_IOU}; yaw modulo 180 deg): what separates AP@0.7 from AP@0.5:", "",
            *table(["method", "found", "mean IoU", "share reaching IoU 0.7", "median centre error", "median yaw error",
                    "share reaching 0.7, collaborator-only objects"], cells)]


def robustness_section(out: Path, rows: Sequence[ResultRow] = ()) -> list:
    """The robustness sweep's tables and curves (``out/robustness/robustness.json``, written by the
    main job's robustness step); nothing when the sweep has not run. When the sweep's runs are not
    the table's ``rows`` (an invocation that only added a training seed), it says whose they are."""
    path = Path(out) / "robustness" / "robustness.json"
    if not path.is_file():
        return []
    import json
    from opencood_ext.eval.robustness import format_tables
    data = json.loads(path.read_text())
    seed = data["settings"]["channel_seed"]
    theirs = sorted({str(Path(r["run_dir"]).parent) for r in data["runs"]})
    ours = {str(Path(r.run).parent) for r in rows if r.run}
    whose = [] if not ours or set(theirs) <= ours else [
        f"This sweep comes from an earlier invocation, on the runs in {', '.join(f'`{t}`' for t in theirs)}, "
        "not on the runs of the table above.", ""]
    lines = ["## Robustness: pose noise, latency and message loss", "", *whose,
             "Every method row above, the same weights, evaluated again through an imperfect channel; every "
             f"row meets the same draws (channel seed {seed}, keyed by frame and sender). Cells are AP@0.5 / "
             "AP@0.7 in the global order. Pose noise: Gaussian on each collaborator's transmitted x, y (std in "
             "m) and yaw (std in deg); latency: each collaborator's data and pose from that many frames "
             "earlier; loss: each message lost with that probability.", ""]
    latency = data["effects"].get("latency")
    if latency and [float(v) for v in latency.get("levels", [])] == [0.0]:
        lines += ["Latency is not swept here: the test scenes have one frame each, so a collaborator's data "
                  "cannot come from an earlier frame (a sweep on such scenes would show no effect at any level).", ""]
    drop = data["effects"].get("drop")
    if drop and drop.get("off") and 1.0 in drop["levels"]:
        k = drop["levels"].index(1.0)
        diffs = [f"{lab} {ps[k]['ap']['0.5'] - drop['off'][lab]['ap']['0.5']:+.3f}"
                 for lab, ps in drop["results"].items() if lab in drop["off"]]
        lines += ["With every message lost (drop 1) a cooperative method should detect as the same weights "
                  "with the collaborators off; AP@0.5 at drop 1 minus AP@0.5 collaborators off: "
                  + ", ".join(diffs) + ".", ""]
    return lines + format_tables(data, "###") + ["![AP under channel effects](robustness/robustness.png)", ""]


STEP_KINDS = (("simulate", "simulation"), ("train ", "training (stage 1, baselines)"), ("onboard", "onboarding"),
              ("evaluate", "evaluation"), ("robustness", "robustness sweep"))


def step_kind(name: str) -> str:
    """The cost table's group of step ``name`` ("simulate the test set" -> "simulation", ...)."""
    return next((kind for prefix, kind in STEP_KINDS if name.startswith(prefix)), "other")


def steps_section(results: Results) -> list:
    """The wall time of every step of this invocation and of each kind of step (where the main job's
    time goes, so the next change can see it)."""
    steps = results.steps
    if not steps:
        return []
    total = results.total_wall_s
    kinds = {}
    for st in steps:
        n, s = kinds.get(step_kind(st.step), (0, 0.0))
        kinds[step_kind(st.step)] = (n + 1, s + st.seconds)
    lines = ["## Where the time went (this invocation)", "",
             "A step that a rerun found finished takes seconds; the training rows above give each run's logged "
             "training time. " + (f"Frozen encoders' features were kept in `{results.feature_cache}` and reused "
                                  f"by every onboarding and evaluation." if results.feature_cache else
                                  "No feature cache: every onboarding and evaluation encoded every frame.")
             + (f" Precision: {results.precision['choice']} ({results.precision['reason']})."
                if results.precision else ""), ""]
    lines += table(["kind", "steps", "minutes", "share"],
                   [[k, n, f"{s / 60:.1f}", f"{s / max(total, 1e-9):.0%}"]
                    for k, (n, s) in sorted(kinds.items(), key=lambda kv: -kv[1][1])])
    lines += [f"| **total** | {len(steps)} | **{total / 60:.1f}** | |", ""]  # no share: the total is all of it
    lines += table(["step", "minutes"], [[st.step, f"{st.seconds / 60:.1f}"] for st in steps])
    lines += [row(["**total**", f"**{total / 60:.1f}**"]), ""]
    if results.from_scratch is not None:  # results of older invocations do not say
        lines += ["From scratch: nothing existed before this invocation, so the total is the main job's whole cost."
                  if results.from_scratch else
                  "Not from scratch: this invocation found " + ", ".join(f"`{p}`" for p in results.found_finished or [])
                  + " and reused what was finished there, so the total is not the main job's whole cost.", ""]
    return lines


def seed_section(results: Results) -> list:
    """The spread over training seeds (:mod:`experiments.seeds`), from the seed archives the main job
    listed (``results.seed_archives``); nothing with fewer than two."""
    folders = results.seed_archives
    if len(folders) < 2:
        return []
    from .archives import load_archives
    from .seeds import seed_section as spread_section
    return spread_section(load_archives(folders))


def scene_family_section(results: Results) -> list:
    """AP per scene family of the main table and the benchmark's full alliance (:mod:`experiments.report_family`):
    results.json's ``scene_families``, computed here from the rows' per-frame records and the test data
    when an older results.json lacks them."""
    figures, why_not = results.scene_families, None
    if figures is None:
        figures, why_not = compute_family_figures(results.rows, results.test_data or results.data)
    return family_section(figures, why_not)


def _test_split(results: Results) -> str:
    """Which test split every AP is on (results.json's ``test_data``; older results: the dataset's)."""
    test = results.test_data or results.data
    if test == results.data:
        return "AP on the dataset's test split."
    return (f"AP on the separate test set `{test}` (its scenes are never in the training data; "
            "docs/statistics.md).")


def trained_runs(results: Results) -> List[tuple]:
    """(label, run folder) of every model the main table trained: its rows' runs, then GenComm's stage-1
    runs (beside the onboarding's run folder, named by :data:`experiments.profiles.STAGE1`)."""
    runs = [(r.method, r.run) for r in results.main_rows() if r.run]
    gencomm = [r for r in results.main_rows() if r.method_id == GENCOMM and r.run]
    if gencomm:
        folder = Path(gencomm[0].run).parent
        runs += [(f"GenComm stage 1, {t}", str(folder / Path(STAGE1[t]).stem)) for t in results.stage1_wall_s
                 if t in STAGE1]
    return runs


def write_report(results: Results, out: Path) -> Path:
    """``out/REPORT.md`` (and its plots) from ``results``; returns its path."""
    rows: List[ResultRow] = results.main_rows()
    plot = plot_ap_vs_bytes(rows, out / "ap_vs_bytes.png")
    lines = ["# GenComm on the embedded default (built-in simulator)", "",
             f"Profile `{results.profile}`, seed {results.seed}, data `{results.data}`; "
             f"this invocation took {results.total_wall_s / 60:.1f} min (a rerun skips finished training "
             f"and only re-evaluates); training itself took {_training_minutes(results):.0f} min on this machine.", "",
             "Ego m1 (PointPillars, 64-beam LiDAR); collaborators m3 (SECOND, 32-beam LiDAR) and other m1 "
             "agents, assigned m1, m3, m1, ... by agent id. " + _test_split(results) + " IoU on BEV rotated boxes.",
             ""]
    cells = []
    for r in rows:
        ev, e = r.eval, r.ego_only
        solo = " / ".join(e.cell(t) for t in ("0.3", "0.5", "0.7")) if e is not None and e.ap else "-"
        cells.append([r.method, ev.cell("0.3"), ev.cell("0.5"), ev.cell("0.7"),
                      f"{ev.cell('0.5', 'per_frame')} / {ev.cell('0.7', 'per_frame')}", solo,
                      bytes_cell(ev.bytes_per_message), f"{r.trainable_params:,}", f"{r.train_wall_s:.0f} s", _note(r)])
    lines += table(["method", "AP@0.3", "AP@0.5", "AP@0.7", "AP@0.5 / 0.7 (per-frame order)",
                    "AP@0.3 / 0.5 / 0.7, same weights, collaborators off", "bytes per message", "trainable params",
                    "training wall time", "note"], cells)
    lines += _interval_note(rows)
    lines += differences(rows)
    lines += _visibility_table(rows)
    lines += _localisation_table(rows)
    ob = results.onboarding
    s1 = results.stage1_wall_s
    lines += ["", "AP columns use the GLOBAL sort of all detections (HEAL's default); the per-frame order "
              "(OpenCOOD's default) is given for comparison. Bytes are the encoded packets one collaborator "
              "sends per frame (header included), averaged over collaborators. \"Collaborators off\" runs the "
              "same trained weights on the ego's input alone: the difference to the AP columns is what "
              "cooperation adds, free of the run-to-run training noise that separates two methods' rows.", "",
              "## Onboarding m3 (stage 2) against stage 1", "",
              f"- trainable parameters: {ob['trainable_params_per_new_type']} (m3's message extractor only); "
              f"{ob['frozen_params']:,} parameters and {ob['frozen_batchnorm_layers']} BatchNorm layers frozen",
              f"- wall time: onboarding {ob['onboarding_wall_time_s']:.0f} s vs stage 1 "
              + ", ".join(f"{t} {v:.0f} s" for t, v in s1.items()),
              "", f"![AP against bytes]({plot.name})", ""]
    lines += plateau_section(trained_runs(results))
    lines += _pr_section(rows, out)
    lines += robustness_section(out, rows)
    lines += hetero_section(results.hetero_rows(), out)
    lines += epoch_sections(results, out)  # only when the benchmark scored its onboarding epochs
    lines += scene_family_section(results)
    lines += seed_section(results)
    lines += steps_section(results)
    path = out / "REPORT.md"
    path.write_text("\n".join(lines))
    return path
