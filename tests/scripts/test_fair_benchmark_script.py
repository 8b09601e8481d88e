"""scripts/fair_benchmark.sh, the fair benchmark's four main jobs run N at a time: the commands it
runs, at most N at once, nothing new after a failure, the combining step last and only when all
finished. The jobs are a stand-in python that records its arguments (the real jobs take hours)."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fair_benchmark.sh"

FAKE_PYTHON = """#!/usr/bin/env bash
# records its call; a job whose --out ends in $FAIL fails; counts the jobs running beside it
echo "$*" >> "$ROOT/calls.log"
mkdir -p "$ROOT/running"; touch "$ROOT/running/$$"
ls "$ROOT/running" | wc -l >> "$ROOT/concurrency.log"
sleep 0.3
rm -f "$ROOT/running/$$"
case "$*" in *"/$FAIL "*) exit 1 ;; esac
exit 0
"""


def _checkout(tmp_path):
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, root / "scripts" / SCRIPT.name)
    (root / "scripts" / "setup_env.sh").write_text("exit 0\n")
    (root / ".venv" / "bin").mkdir(parents=True)
    fake = root / ".venv" / "bin" / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    return root


def _run(root, *args, fail="none"):
    env = {**os.environ, "ROOT": str(root), "FAIL": fail}
    return subprocess.run(["bash", str(root / "scripts" / SCRIPT.name), *args], env=env, capture_output=True,
                          text=True, timeout=120)


def _calls(root):
    return (root / "calls.log").read_text().splitlines()


def test_the_four_jobs_run_two_at_a_time_then_the_archive_is_combined(tmp_path):
    root = _checkout(tmp_path)
    res = _run(root, "--jobs", "2", "--out", "R", "--data", "D")
    assert res.returncode == 0, res.stderr
    calls = _calls(root)
    jobs, combine = calls[:4], calls[4:]
    assert sorted(jobs) == sorted([
        "tools/reproduce.py --data D --out R/seed0 --no_robustness --profile full --seeds 0 --benchmark --score_epochs gencomm",
        "tools/reproduce.py --data D --out R/seed1 --no_robustness --profile full --seeds 1 --benchmark --score_epochs gencomm",
        "tools/reproduce.py --data D --out R/seed2 --no_robustness --profile full --seeds 2 --benchmark --score_epochs gencomm",
        "tools/reproduce.py --data D --out R/reference --no_robustness --profile full --seeds 0 --protocol reference "
        "--benchmark_types m1,m3"])
    assert combine == ["tools/fair_benchmark.py R/seed0/seeds/seed0 R/seed1/seeds/seed1 R/seed2/seeds/seed2 "
                       "R/reference/seeds/seed0 -o archive/fair_benchmark"]
    assert max(int(n) for n in (root / "concurrency.log").read_text().split()[:4]) <= 2
    for name in ("seed0", "seed1", "seed2", "reference"):
        assert f"[fair] {name} finished" in res.stdout
        assert (root / "R" / "logs" / f"{name}.log").is_file()


def test_a_failed_job_stops_new_starts_and_the_combining(tmp_path):
    root = _checkout(tmp_path)
    res = _run(root, "--jobs", "1", "--out", "R", fail="seed0")
    assert res.returncode == 1
    assert _calls(root) == ["tools/reproduce.py --data data/sim --out R/seed0 --no_robustness --profile full --seeds 0 "
                            "--benchmark --score_epochs gencomm"]   # one job at a time: nothing after seed0
    assert "seed0 failed; its log: R/logs/seed0.log" in res.stderr and "rerun this command to resume" in res.stderr
    # the rerun resumes: seed0 runs again and, once it works, everything else follows
    res = _run(root, "--jobs", "1", "--out", "R")
    assert res.returncode == 0, res.stderr
    assert len(_calls(root)) == 1 + 5 and not list((root / "R" / "logs").glob("*.failed"))


@pytest.mark.parametrize("args, message", [(["--jobs", "0"], "--jobs must be a positive integer"),
                                           (["--jobs"], "usage"), (["--seeds", "1"], "unknown argument --seeds")])
def test_bad_arguments_exit_2_before_anything_runs(tmp_path, args, message):
    root = _checkout(tmp_path)
    res = _run(root, *args)
    assert res.returncode == 2 and message in res.stderr
    assert not (root / "calls.log").exists()


def test_dry_run_prints_the_commands_and_runs_nothing(tmp_path):
    root = _checkout(tmp_path)
    res = _run(root, "--dry_run")
    assert res.returncode == 0
    lines = res.stdout.splitlines()
    assert len(lines) == 5 and lines[0].startswith("python tools/reproduce.py --data data/sim --out results_fair/seed0")
    assert not (root / "calls.log").exists()


def test_quick_keeps_its_runs_and_archive_apart_from_the_real_ones(tmp_path):
    root = _checkout(tmp_path)
    lines = _run(root, "--quick", "--dry_run").stdout.splitlines()
    assert lines[0] == ("python tools/reproduce.py --data data/sim_quick --out results_fair_quick/seed0 "
                        "--no_robustness --quick --seeds 0 --benchmark --score_epochs gencomm")
    assert lines[-1].endswith("-o results_fair_quick/fair_benchmark")  # never archive/fair_benchmark


def test_a_thread_count_the_user_set_wins(tmp_path):
    root = _checkout(tmp_path)
    env = {**os.environ, "ROOT": str(root), "FAIL": "none", "OMP_NUM_THREADS": "3"}
    res = subprocess.run(["bash", str(root / "scripts" / SCRIPT.name), "--jobs", "4"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.count("(3 thread(s))") == 4
    env.pop("OMP_NUM_THREADS")
    res = subprocess.run(["bash", str(root / "scripts" / SCRIPT.name), "--jobs", "4"], env=env, capture_output=True,
                         text=True, timeout=120)
    shared = max(1, len(os.sched_getaffinity(0)) // 4)  # what nproc counts
    assert res.returncode == 0 and res.stdout.count(f"({shared} thread(s))") == 4


def test_a_stop_ends_the_running_jobs_too(tmp_path):
    """Ctrl-C (SIGINT) or kill (SIGTERM) on the script reaches each running job's python, not only the
    script: background jobs of a script ignore SIGINT, so without this they would go on as orphans."""
    import signal
    import time
    root = _checkout(tmp_path)
    fake = root / ".venv" / "bin" / "python"
    fake.write_text(FAKE_PYTHON.replace("sleep 0.3", "sleep 60"))
    env = {**os.environ, "ROOT": str(root), "FAIL": "none"}
    # Ctrl-C as a terminal delivers it: a suite started in the background (nohup ... &) inherits an
    # ignored SIGINT, which bash can neither trap nor reset, so the child starts with the default
    proc = subprocess.Popen(["bash", str(root / "scripts" / SCRIPT.name), "--jobs", "2", "--out", "R"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    running = root / "running"
    for _ in range(500):  # until both jobs run (10 s at most)
        if running.is_dir() and len(list(running.iterdir())) == 2:
            break
        time.sleep(0.02)
    pids = [int(p.name) for p in running.iterdir()]
    assert len(pids) == 2
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "stopping the running jobs" in err
    def gone(pid):  # exited (or a zombie); a process that was signalled may take a moment to end on a busy machine
        try:
            return "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
        except FileNotFoundError:
            return True
    for pid in pids:  # the jobs' processes end within seconds, not orphans sleeping on for their 60 s
        for _ in range(500):
            if gone(pid):
                break
            time.sleep(0.02)
        assert gone(pid), f"job process {pid} still runs after the stop"
    assert len(_calls(root)) == 2  # nothing new started, no combining


LOG = """\
2026-12-04 13:32:29,354 INFO experiments.steps: $ gencomm-sim -o /d/data/sim --scenarios 48
2026-12-04 13:32:34,975 INFO experiments.steps: $ gencomm-train -y /c/gencomm_stage1_m3.yaml --model_dir /r/seed0/runs/gencomm_stage1_m3 --set data.root=/d
2026-12-04 13:36:48,304 INFO opencood_ext.training: epoch 3/8  train_loss 1.499  time_s 223.5
2026-12-04 13:40:50,251 INFO opencood_ext.training: epoch 4/8  train_loss 1.189  time_s 214
"""


def test_status_tells_each_jobs_state_step_and_epoch(tmp_path):
    """--status reads OUT/logs only: a job with no log is pending, one with a .failed marker failed, one
    whose recorded script process is alive runs, one whose process is gone stopped (it resumes on a
    rerun); the step is the log's last driver step, its epoch the last one logged after that step."""
    import time
    root = _checkout(tmp_path)
    logs = root / "R" / "logs"
    logs.mkdir(parents=True)
    (logs / "seed0.log").write_text(LOG)
    alive = subprocess.Popen(["bash", "-c", "sleep 60; : fair_benchmark"])  # stands in for a running job's script
    dead = subprocess.Popen(["true"])
    dead.wait()
    try:
        (logs / "seed0.pid").write_text(f"{alive.pid}\n")
        (logs / "seed1.log").write_text(LOG + "2026-12-04 13:41:00,000 INFO experiments.steps: $ gencomm-infer "
                                              "--model_dir /r/seed1/runs/gencomm_stage1_m3 --fusion_method none\n")
        (logs / "seed1.pid").write_text(f"{dead.pid}\n")
        (logs / "reference.log").write_text("Traceback ...\n")
        (logs / "reference.failed").touch()
        time.sleep(0.1)
        res = _run(root, "--status", "--out", "R")
    finally:
        alive.kill()
        alive.wait()
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [
        "[fair] seed0: running; step 2 since 2026-12-04 13:32:34: gencomm-train gencomm_stage1_m3, epoch 4/8 at 13:40:50",
        "[fair] seed1: stopped (rerun the command to resume); step 3 since 2026-12-04 13:41:00: gencomm-infer "
        "gencomm_stage1_m3",
        "[fair] seed2: pending",
        "[fair] reference: failed (its log: R/logs/reference.log)"]
    assert not (root / "calls.log").exists()  # nothing ran


def test_status_after_a_finished_run(tmp_path):
    root = _checkout(tmp_path)
    assert _run(root, "--jobs", "2", "--out", "R").returncode == 0
    assert not list((root / "R" / "logs").glob("*.pid"))  # removed when each job ended
    res = _run(root, "--status", "--out", "R")
    assert res.stdout.splitlines() == [f"[fair] {n}: finished" for n in ("seed0", "seed1", "seed2", "reference")]
