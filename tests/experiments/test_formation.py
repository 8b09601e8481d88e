"""The cooperative-path table (experiments.formation): rows read from run folders written here with
made-up figures (nothing is trained), the formed count, errors naming file and field, README blocks
rewritten and checked, and the committed archive/stage1_formation README kept fresh."""
import json
from pathlib import Path

import pytest
import yaml

from experiments.formation import FormationError, main, read_row, render, summary, update

ROOT = Path(__file__).resolve().parents[2]


def _run(folder: Path, seed=0, threads=(1, 1), found=None, total=119, onboarding=False, weight=10.0):
    folder.mkdir(parents=True)
    cfg = {"data": {"modality": "cycle:m1,m3" if onboarding else "all:m1"}, "train": {"seed": seed},
           "model": {"link": {"generation_weight": weight}}}
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    lines = [{"kind": "step", "epoch": 1, "step": 10, "loss": 5.0}]
    lines += [{"kind": "epoch", "epoch": k + 1, "steps": 72, "threads": t, "val_detection_loss": 1.0}
              for k, t in enumerate(threads)]
    (folder / "train_log.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    if onboarding:
        (folder / "onboarding.json").write_text(json.dumps({"new_types": ["m3"]}))
    ev = {"ap": {"global": {"0.3": 0.8, "0.5": 0.75, "0.7": 0.4}},
          "ap_ci": {"global": {"0.3": [0.78, 0.82], "0.5": [0.73, 0.77], "0.7": [0.38, 0.42]}}}
    if found is not None:
        ev["recall_by_visibility"] = {"collaborators_only": {"gt": total, "recall": found / total},
                                      "ego": {"gt": 1000, "recall": 0.9}}
    (folder / "eval_intermediate.json").write_text(json.dumps(ev))
    return folder


def test_a_row_reads_seed_threads_steps_and_the_collaborator_only_count(tmp_path):
    row = read_row(_run(tmp_path / "s1", seed=1, threads=(1, 2, 1), found=42))
    assert (row.name, row.kind, row.agents, row.seed) == ("s1", "stage 1", "all:m1", 1)
    assert row.threads == (1, 2) and row.steps == 216 and row.generation_weight == 10.0
    assert (row.found, row.total, row.formed) == (42, 119, True)
    assert row.ap == (0.8, 0.75, 0.4) and row.ci[1] == [0.73, 0.77]
    onboarded = read_row(_run(tmp_path / "on", found=56, total=118, onboarding=True, weight=0.0))
    assert onboarded.kind == "onboarded m3" and onboarded.agents == "cycle:m1,m3"
    assert onboarded.found == 56 and onboarded.total == 118
    full = tmp_path / "full"
    _run(full, found=64, total=118, weight=None)
    cfg = yaml.safe_load((full / "config.yaml").read_text())
    cfg["model"]["link"] = {"type": "full_feature"}
    (full / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert read_row(full).kind == "full feature" and read_row(full).generation_weight is None


def test_the_summary_counts_runs_whose_path_formed(tmp_path):
    rows = [read_row(_run(tmp_path / n, found=f)) for n, f in (("a", 0), ("b", 7), ("c", 36))]
    assert not rows[0].formed
    assert summary(rows).startswith("The cooperative path formed") and "in 2 of 3 runs; found 0-36." in summary(rows)
    no_visibility = read_row(_run(tmp_path / "d", found=None))
    assert no_visibility.total is None and no_visibility.cells()[7] == "-"
    assert summary([no_visibility]) == "No run here defines collaborator-only objects."
    text = "\n".join(render(rows, links=True))
    assert "| [b](b) | stage 1 | all:m1 | 0 | 1 | 144 | 10 | 7 of 119 (0.059) | 0.800 [0.78, 0.82] |" in text


@pytest.mark.parametrize("breakage, message", [
    (lambda f: (f / "eval_intermediate.json").unlink(), "eval_intermediate.json: no such file"),
    (lambda f: (f / "eval_intermediate.json").write_text(json.dumps({"ap": {"global": {}}})),
     "eval_intermediate.json: no field 'ap.global.0.3'"),
    (lambda f: (f / "config.yaml").write_text(yaml.safe_dump({"data": {"modality": "all:m1"}})),
     "config.yaml: no field 'train.seed'"),
    (lambda f: (f / "config.yaml").write_text("train: [seed\n"), "config.yaml: not YAML"),
    (lambda f: (f / "train_log.jsonl").write_text(""), "train_log.jsonl: no epoch record"),
    (lambda f: (f / "train_log.jsonl").write_text("{not json\n"), "train_log.jsonl: line 1 is not JSON"),
])
def test_a_broken_run_folder_is_an_error_naming_file_and_field(tmp_path, capsys, breakage, message):
    run = _run(tmp_path / "r", found=3)
    breakage(run)
    with pytest.raises(FormationError, match=message.replace(".", r"\.")):
        read_row(run)
    assert main([str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_update_rewrites_a_stale_block_and_check_reports_it(tmp_path, capsys):
    _run(tmp_path / "a", found=5)
    _run(tmp_path / "b", seed=2, found=0)
    readme = tmp_path / "README.md"
    readme.write_text("# runs\n\n<!-- formation: a b -->\nold table\n<!-- /formation -->\n\nafter\n")
    assert main(["--check", str(readme)]) == 1
    assert "stale: formation table of a b" in capsys.readouterr().out
    assert "old table" in readme.read_text()  # --check writes nothing
    assert main(["--update", str(readme)]) == 0
    text = readme.read_text()
    assert "old table" not in text and "| [b](b) | stage 1 | all:m1 | 2 |" in text and text.endswith("\nafter\n")
    assert "formed (at least one collaborator-only object found) in 1 of 2 runs" in text
    assert update(readme, check=True) == [] and main(["--check", str(readme)]) == 0
    (tmp_path / "a" / "eval_intermediate.json").write_text(json.dumps(
        {"ap": {"global": {"0.3": 0.9, "0.5": 0.85, "0.7": 0.5}}}))
    assert update(readme, check=True) == ["a b"]


@pytest.mark.parametrize("text, message", [
    ("# nothing generated\n", "no '<!-- formation: RUN ... -->' block"),
    ("<!-- formation: -->\n<!-- /formation -->\n", "names no run folder"),
])
def test_a_readme_without_a_block_or_naming_no_run_is_an_error(tmp_path, text, message):
    readme = tmp_path / "README.md"
    readme.write_text(text)
    with pytest.raises(FormationError, match=message.replace(".", r"\.")):
        update(readme)
    assert readme.read_text() == text


def test_the_committed_stage1_formation_tables_are_fresh():
    """archive/stage1_formation/README.md's generated tables equal what its run folders give."""
    assert update(ROOT / "archive" / "stage1_formation" / "README.md", check=True) == []
