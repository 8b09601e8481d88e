"""The main job's trainings side by side (experiments/lanes.py): how lanes share the threads, the order
runs are handed out, and that lanes are separate processes on their share of threads whose failure
stops the job with the step's error."""
import multiprocessing
import os
from pathlib import Path

import pytest
import torch

from experiments.lanes import MAX_LANES, LanePlan, lane_plan, train_side_by_side
from experiments.pipeline import trainings_longest_first
from experiments.steps import StepError


@pytest.mark.parametrize("jobs, threads, cuda, expected", [
    (None, 2, False, (2, 1)),        # this 2-core machine: two one-thread lanes
    (None, 16, False, (MAX_LANES, 4)),
    (None, 1, False, (1, 1)),
    (None, 16, True, (1, 16)),       # one device: runs would queue on it
    (3, 2, False, (2, 1)),           # more lanes than threads: one thread each at most
    (1, 2, False, (1, 2)),           # --jobs 1: one after another on every thread, as before
    (2, 7, True, (2, 3)),
])
def test_lanes_share_the_threads(jobs, threads, cuda, expected):
    plan = lane_plan(jobs, threads, cuda)
    assert (plan.lanes, plan.threads) == expected


def test_bad_lane_counts_are_refused():
    with pytest.raises(ValueError, match="--jobs must be a positive whole number, got 0"):
        lane_plan(0, 2, False)
    with pytest.raises(ValueError, match="threads must be >= 1"):
        lane_plan(None, 0, False)


def test_the_longest_trainings_go_first(tmp_path):
    order = [run.name for _, run in trainings_longest_first(tmp_path, tmp_path / "runs", ["m1", "m3"], ["m1", "m3"])]
    assert order == ["gencomm_stage1_m1", "gencomm_stage1_m3", "m1m3_intermediate", "baseline_stage1_m1",
                     "baseline_stage1_m3", "m1_none", "m1m3_late", "m1m3_early"]
    configs = [c for c, _ in trainings_longest_first(tmp_path, tmp_path / "runs", ["m1", "m3"], [])]
    assert configs[0] == tmp_path / "sim" / "gencomm_stage1_m1.yaml" and len(configs) == 6


def record_lane(config, run, data, profile, threads):
    """A lane's work in these tests: note the process, its thread count and what it was given."""
    Path(run).mkdir(parents=True)
    (Path(run) / "lane.txt").write_text(f"{os.getpid()} {torch.get_num_threads()} {threads} {os.environ.get('OMP_NUM_THREADS')} "
                                        f"{multiprocessing.get_context().get_start_method()}")
    return Path(run).name, 1.0


def fail_on_b(config, run, data, profile, threads):
    if Path(run).name == "b":
        raise StepError("step failed (exit 2): gencomm-train -y b.yaml")
    return Path(run).name, 0.0


def enter_then_record(config, run, data, profile, threads):
    from experiments.lanes import enter_lane
    enter_lane(threads)
    return record_lane(config, run, data, profile, threads)


def test_two_lanes_are_two_processes_on_one_thread_each(tmp_path):
    trainings = [(tmp_path / f"{n}.yaml", tmp_path / n) for n in "abcd"]
    done = train_side_by_side(trainings, tmp_path, None, LanePlan(2, 1), work=enter_then_record)
    assert done == ["a", "b", "c", "d"]
    seen = [(tmp_path / n / "lane.txt").read_text().split() for n in "abcd"]
    pids = {s[0] for s in seen}
    assert str(os.getpid()) not in pids and 1 <= len(pids) <= 2
    assert all(s[1:4] == ["1", "1", "1"] for s in seen)  # torch's count, the share given, OMP_NUM_THREADS
    # a lane's data loader starts its workers the platform's way (fork on Linux), not by spawn
    assert all(s[4] == multiprocessing.get_all_start_methods()[0] for s in seen)


def test_a_failed_lane_stops_the_job_with_its_step_error(tmp_path):
    """The real lane work (gencomm-train in a spawned process) on a config that does not exist: the
    step's one-line error comes back and nothing else is trained."""
    from experiments.pipeline import train_in_lane
    from experiments.profiles import PROFILES
    trainings = [(tmp_path / "missing.yaml", tmp_path / "runs" / "a")]
    with pytest.raises(StepError, match=r"step failed .*gencomm-train -y .*missing.yaml"):
        train_side_by_side(trainings, tmp_path, PROFILES["quick"], LanePlan(2, 1), work=train_in_lane)
    assert not (tmp_path / "runs" / "a" / "latest.pth").exists()


def test_one_lane_trains_here_in_order(tmp_path):
    trainings = [(tmp_path / f"{n}.yaml", tmp_path / n) for n in "ab"]
    assert train_side_by_side(trainings, tmp_path, None, LanePlan(1, 2), work=record_lane) == ["a", "b"]
    assert (tmp_path / "a" / "lane.txt").read_text().split()[0] == str(os.getpid())
