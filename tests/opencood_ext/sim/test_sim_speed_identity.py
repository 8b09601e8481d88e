"""The faster simulator writes the same bytes (issue 30): every file of a small
``gencomm-sim`` run (PCD, PNG, yaml, depth, markers, modality json) must match
the sha256 digests in ``assets/sim_identity/digests.json``, which the simulator
of the commit named there (``commit``, before any speed-up) wrote with the same
arguments (``args``).

Ray casting (Embree), numpy's SIMD maths and the PNG encoder may round
differently on another CPU or with other library versions, so the digests are
trusted only where the machine fingerprint (library versions, numpy's CPU
features) equals the recorded one. Elsewhere the recorded commit's simulator is
extracted with ``git archive`` and run here, and its files are the reference.
"""
import hashlib
import io
import json
import platform
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from opencood_ext.cli.simulate import main as simulate_main

REPO = Path(__file__).resolve().parents[3]
RECORD = Path(__file__).resolve().parents[2] / "assets" / "sim_identity" / "digests.json"
LOCK = ".gencomm_sim/lock"


def fingerprint() -> dict:
    """What the output bytes may depend on besides the code."""
    import open3d
    import PIL
    import scipy
    import yaml
    from PIL import features

    cpu = np._core._multiarray_umath.__cpu_features__
    return {"machine": platform.machine(), "python": ".".join(platform.python_version_tuple()[:2]),
            "numpy": np.__version__, "numpy_cpu": sorted(k for k, on in cpu.items() if on),
            "open3d": open3d.__version__, "scipy": scipy.__version__, "pillow": PIL.__version__,
            "zlib": features.version("zlib"), "pyyaml": yaml.__version__}


def digests(root: Path) -> dict:
    """sha256 of every file the simulator wrote, but the recorder's folder lock (empty once it ends;
    simulators before the lock wrote none)."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.relative_to(root).as_posix() != LOCK}


def _reference_run(commit: str, args, tmp: Path) -> dict:
    """Digests written by ``commit``'s simulator, run from a ``git archive`` of it."""
    try:
        tar = subprocess.run(["git", "-C", str(REPO), "archive", commit, "opencood_ext"],
                             capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"this machine differs from the one that recorded {RECORD.name} and commit {commit[:12]} "
                    f"cannot be extracted to run instead ({exc})")
    src = tmp / "reference_src"
    with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
        tf.extractall(src, filter="data")
    out = tmp / "reference_out"
    subprocess.run([sys.executable, "-m", "opencood_ext.cli.simulate", "-o", str(out), *args],
                   cwd=tmp, env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"}, check=True)
    return digests(out)


@pytest.fixture(scope="module")
def expected(tmp_path_factory) -> dict:
    rec = json.loads(RECORD.read_text())
    if rec["fingerprint"] == fingerprint():
        return rec["files"]
    return _reference_run(rec["commit"], rec["args"], tmp_path_factory.mktemp("reference"))


def _compare(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want), f"file sets differ: {sorted(set(got) ^ set(want))[:10]}"
    changed = [name for name in want if got[name] != want[name]]
    assert not changed, f"{len(changed)} of {len(want)} files changed, e.g. {changed[:5]}"


@pytest.mark.parametrize("workers", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_output_is_byte_identical_to_the_recorded_simulator(tmp_path, expected, workers):
    """Two workers (the default: the process pool) in the quick suite; one (in-process, the same
    sensor code) with the slow tests."""
    args = json.loads(RECORD.read_text())["args"]
    assert simulate_main(["-o", str(tmp_path / "out"), *args, "--workers", str(workers)]) == 0
    _compare(digests(tmp_path / "out"), expected)


def test_digests_catch_a_changed_file(tmp_path, expected):
    """The comparison is not vacuous: one flipped byte in one PNG is reported."""
    got = dict(expected)
    name = next(n for n in got if n.endswith("_camera0.png"))
    got[name] = hashlib.sha256(b"other").hexdigest()
    with pytest.raises(AssertionError, match="1 of"):
        _compare(got, expected)


@pytest.mark.slow
def test_recorded_commit_reproduces_its_digests_here(tmp_path):
    """The fallback path: the recorded commit, extracted and run, writes the recorded digests (on the
    recording machine; elsewhere this shows the digests are machine-dependent)."""
    rec = json.loads(RECORD.read_text())
    if rec["fingerprint"] != fingerprint():
        pytest.skip("not the recording machine: its digests are not expected here")
    _compare(_reference_run(rec["commit"], rec["args"], tmp_path), rec["files"])
