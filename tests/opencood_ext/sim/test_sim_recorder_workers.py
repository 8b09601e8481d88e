"""The recorder's worker processes and its reuse rule, checked without recording a dataset (the
recordings themselves: test_sim_recorder.py): a worker never starts a scenario once its recorder is
gone, an idle one leaves when its recorder is killed, and which recorded settings a rerun may reuse."""
import subprocess
import sys
from pathlib import Path

import pytest


def test_a_worker_whose_recorder_died_starts_no_scenario(monkeypatch):
    """A recorder killed mid-run leaves its worker processes behind; they must not start the queued
    scenarios, which would write into a folder another recorder may now hold."""
    from opencood_ext.sim import recorder
    monkeypatch.setattr(recorder, "_WORKER_PARENT", -1)
    monkeypatch.setattr(recorder, "_record_scenario", lambda *a, **k: pytest.fail("a scenario was started"))
    with pytest.raises(SystemExit, match="parent -1 is gone, not starting scenario 3"):
        recorder._worker_job(recorder._Job(3, "train", 1, 1, Path("."), None, {}, False, "binary"))


def test_reuse_verdict_per_setting():
    """The rule itself: only the camera switch is tolerated; a camera change of a camera recording is not."""
    from opencood_ext.sim.recorder import _reuse_verdict
    base = {"seed": 11, "frames": 2, "format": 2, "cameras": True, "camera_size": [64, 48], "shadows": True}
    lidar = {**base, "cameras": False, "camera_size": [], "shadows": True}
    done = {"seed": 5, "split": "train", "run": base}
    assert _reuse_verdict(done, 5, "train", base) == "reuse"
    assert _reuse_verdict(done, 5, "train", lidar) == "reuse"
    assert _reuse_verdict({**done, "run": lidar}, 5, "train", base) == "add cameras"
    assert _reuse_verdict(done, 5, "train", {**base, "camera_size": [400, 300]}) == \
        "camera_size: recorded [64, 48], asked [400, 300]"
    assert _reuse_verdict(done, 5, "train", {**lidar, "frames": 3}) == \
        "camera_size: recorded [64, 48], asked [], cameras: recorded True, asked False, frames: recorded 2, asked 3"
    assert _reuse_verdict(done, 6, "train", base) == "seed 5 / split 'train' recorded, seed 6 / split 'train' asked"
    assert _reuse_verdict(done, 5, "test", base).endswith("split 'test' asked")
    assert _reuse_verdict({**done, "run": {k: v for k, v in lidar.items() if k != "cameras"}}, 5, "train", base) \
        == "camera_size: recorded [], asked [64, 48], cameras: recorded None, asked True"


def test_an_idle_worker_leaves_once_its_recorder_is_killed(tmp_path):
    """A recorder killed on its own (SIGKILL, or a kill of its pid alone) used to leave its pool workers
    waiting on the queue for good, each holding a world; they now exit once their parent is gone."""
    import os
    import signal
    import textwrap
    import time
    script = textwrap.dedent("""
        import os, sys, time
        from concurrent.futures import ProcessPoolExecutor
        import multiprocessing
        from opencood_ext.sim import recorder
        pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=recorder._init_worker, initargs=(dict,))
        print(pool.submit(os.getpid).result(), flush=True)   # the worker, idle from here on
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              cwd=str(Path(__file__).resolve().parents[3]))
    try:
        worker = int(parent.stdout.readline())
    finally:
        os.kill(parent.pid, signal.SIGKILL)  # the recorder dies, as under a kill -9 (never left running)
        parent.wait()

    def alive(pid):
        try:
            return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
        except FileNotFoundError:
            return False
    for _ in range(300):  # 30 s at most (a spawned worker imports the module afresh: it polls every 2 s)
        if not alive(worker):
            break
        time.sleep(0.1)
    assert not alive(worker), f"worker {worker} still alive after its recorder was killed"
