"""Packaging: the wheel's metadata, contents (shipped configs, the experiment driver) and console
scripts, run from a fresh virtual environment outside the checkout (a config found by name there),
and the core without the simulator's dependencies (open3d, scipy) or without spconv."""
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_console_scripts import SCRIPTS  # noqa: E402  {script: "module:function"} from setup.py


def _env(**extra):
    """The test's environment minus anything that would put the checkout on the path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


def _run_python(code: str, tmp_path: Path, timeout=600):
    """``code`` in a fresh interpreter with the checkout (and tests/helpers/) on the path."""
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          timeout=timeout,
                          env=_env(PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests" / "helpers")])))


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-")


# ---------------------------------------------------------------------------------- the wheel

@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """A wheel built from a copy of the sources (the checkout stays clean)."""
    src = tmp_path_factory.mktemp("src")
    for f in ("setup.py", "README.md", "requirements.txt", "requirements-test.txt"):
        shutil.copy(REPO / f, src / f)
    for pkg in ("opencood_ext", "gencomm", "experiments", "configs"):
        shutil.copytree(REPO / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("wheel")
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                          "-w", str(out), str(src)], capture_output=True, text=True, timeout=600, env=_env())
    assert res.returncode == 0, res.stderr[-3000:]
    (whl,) = out.glob("gencomm-*.whl")
    return whl


def _metadata(whl: Path):
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry = z.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    requires = [ln.split(":", 1)[1].strip() for ln in meta.splitlines() if ln.startswith("Requires-Dist:")]
    return names, requires, entry


def test_wheel_metadata_ranges_extras_scripts_and_rig(wheel):
    names, requires, entry = _metadata(wheel)
    core = [r for r in requires if "extra ==" not in r]
    extra = {m.group(1): [] for r in requires if (m := re.search(r"extra == \"(\w+)\"", r))}
    for r in requires:
        if (m := re.search(r"extra == \"(\w+)\"", r)):
            extra[m.group(1)].append(_name(r))
    # compatible ranges only: no exact pins, no CPU builds, no spconv (a GPU user's spconv-cu12x
    # provides the module under another distribution name)
    assert core and not [r for r in core if "==" in r], core
    assert {_name(r) for r in core} >= {"torch", "numpy", "pyyaml", "diffusers", "matplotlib"}
    assert not {_name(r) for r in core} & {"spconv", "open3d", "open3d-cpu", "scipy", "carla"}
    torch_min = [m for r in core if (m := re.fullmatch(r"torch>=2\.(\d+)", r.replace(" ", "")))]
    # weights_only loading had a published bypass before torch 2.6 (CVE-2025-32434)
    assert torch_min and int(torch_min[0].group(1)) >= 6, core
    assert set(extra["sim"]) == {"open3d", "scipy"} and extra["carla"] == ["carla"] and "pytest" in extra["test"]
    for script, target in SCRIPTS.items():
        assert re.search(rf"^{script} = {re.escape(target)}$", entry, re.M), (script, entry)
    assert "opencood_ext/sim/agent_types.yaml" in names
    # configs/ ships as the gencomm_configs package, every yaml of the checkout's folder
    shipped = {n[len("gencomm_configs/"):] for n in names if n.startswith("gencomm_configs/") and n.endswith(".yaml")}
    assert shipped == {str(p.relative_to(REPO / "configs")) for p in (REPO / "configs").rglob("*.yaml")}
    assert {"experiments/reproduce.py", "experiments/seeds.py", "experiments/bench/cli.py"} <= set(names)


def test_setup_env_installs_everything_the_wheel_needs(wheel):
    """scripts/setup_env.sh installs the pinned requirements, then the project with --no-deps:
    every core and [sim] dependency must therefore be in requirements.txt (open3d as open3d-cpu)."""
    _, requires, _ = _metadata(wheel)
    pinned = {_name(ln) for ln in (REPO / "requirements.txt").read_text().splitlines()
              if ln.strip() and not ln.startswith("#")}
    provides = {"open3d-cpu": "open3d"}
    have = {provides.get(n, n) for n in pinned}
    needed = {_name(r) for r in requires if "extra ==" not in r or 'extra == "sim"' in r}
    assert needed <= have, needed - have
    script = (REPO / "scripts" / "setup_env.sh").read_text()
    reqs = script.index("-r requirements.txt")
    assert reqs < script.index("install -q --no-deps -e .")


def test_console_scripts_run_from_the_wheel_outside_a_checkout(wheel, tmp_path):
    """A fresh venv (dependencies reached through a .pth pointing at this interpreter's
    site-packages, whose own .pth files -- e.g. an editable install of the checkout -- are
    not processed), the wheel installed into it, its scripts run from an empty folder."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "deps_of_the_test_interpreter.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    res = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
                          str(wheel)], capture_output=True, text=True, timeout=600, env=_env())
    assert res.returncode == 0, res.stderr[-3000:]
    work = tmp_path / "elsewhere"
    work.mkdir()

    def run(*args):
        return subprocess.run([str(a) for a in args], cwd=work, capture_output=True, text=True, timeout=600,
                              env=_env())

    where = run(py, "-c", "from importlib.util import find_spec as f; print(f('gencomm').origin, f('opencood_ext').origin)")
    assert where.returncode == 0 and all(line.startswith(purelib) for line in where.stdout.split()), where
    for script in SCRIPTS:  # every entry point imports from the wheel and prints its help
        res = run(venv / "bin" / script, "--help")
        assert res.returncode == 0 and "usage:" in res.stdout, (script, res.stderr[-3000:])
    for script, expect in (("gencomm-infer", "--model_dir"), ("gencomm-train", "--hypes_yaml")):
        res = run(venv / "bin" / script, "--help")
        assert res.returncode == 0 and f"usage: {script}" in res.stdout and expect in res.stdout, res.stderr
    # a shipped config by name, found in the installed package data, not in a checkout
    res = run(venv / "bin" / "gencomm-train", "-y", "opv2v_h/gencomm_stage1_m1", "--dry_run")
    assert res.returncode == 0 and "trainable" in res.stdout, res.stderr[-3000:]
    assert not (work / "runs").exists()
    # the simulator's default rig is package data: a tiny recording works from the wheel
    res = run(venv / "bin" / "gencomm-sim", "-o", "sim", "--scenarios", "1", "--frames", "1", "--no_cameras",
              "--vehicles", "20", "21", "--points_per_second", "100000", "--raster_res", "0.5", "--quiet")
    assert res.returncode == 0, res.stderr[-3000:]
    assert list((work / "sim").rglob("*_bev_visibility.png")) and (work / "sim" / "modality_assignment.json").exists()


# ---------------------------------------------------------------------------------- optional dependencies

# imports every module of the child's PACKAGES; what failed to import is the assertion
IMPORT_EVERY_MODULE = r"""
failed = []
for pkg in PACKAGES:
    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        try:
            importlib.import_module(m.name)
        except ImportError as exc:
            failed.append((m.name, str(exc)))
assert not failed, failed
"""


CORE_WITHOUT_SIM_DEPS = r"""
import importlib, pkgutil, sys
for name in ("open3d", "scipy"):
    sys.modules[name] = None          # import open3d / scipy now fails, as when not installed
import opencood_ext, gencomm
PACKAGES = (opencood_ext, gencomm)    # the driver's simulator benchmark needs open3d itself
""" + IMPORT_EVERY_MODULE + r"""
from pathlib import Path
import torch
torch.set_num_threads(1)
from gencomm.cli import infer, train
from tiny_runs import PP, tiny_config, tiny_dataset
root = tiny_dataset(Path("data"))
cfg = tiny_config(Path("."), root, "nosim", {"m1": PP}, {"fusion": "intermediate", "link": {"type": "full_feature"}})
assert train(["-y", str(cfg), "--model_dir", "run", "--set", "train.max_steps_per_epoch=1"]) == 0
assert infer(["--model_dir", "run", "--max_frames", "1", "--plot_every", "0"]) == 0
from opencood_ext.sim.builtin import BuiltinWorld
try:
    BuiltinWorld().reset(0)
except ImportError as exc:
    print("SIM ERROR:", exc)
else:
    raise AssertionError("the simulator ran without scipy / open3d")
"""


def test_core_trains_and_evaluates_without_open3d_and_scipy(tmp_path):
    res = _run_python(CORE_WITHOUT_SIM_DEPS, tmp_path)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "SIM ERROR:" in res.stdout and "pip install 'gencomm[sim]'" in res.stdout


WITHOUT_SPCONV = r"""
import importlib, importlib.abc, pkgutil, sys


class NoSpconv(importlib.abc.MetaPathFinder):  # import spconv fails, as when it is not installed
    def find_spec(self, name, path=None, target=None):
        if name == "spconv" or name.startswith("spconv."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NoSpconv())
import opencood_ext, gencomm, experiments
PACKAGES = (opencood_ext, gencomm, experiments)
""" + IMPORT_EVERY_MODULE + r"""
import torch
from opencood_ext.models import build
from opencood_ext.models.inputs import EncoderOutput
R = [-32.0, -32.0, -3.0, 32.0, 32.0, 1.0]
pp = build({"type": "pointpillars", "voxel_size": [0.8, 0.8, 4.0], "num_filters": [8]}, {"pointpillars":
           opencood_ext.models.ENCODERS["pointpillars"]}, "pp", lidar_range=R)
from opencood_ext.data.inputs import LidarInput
out = pp(LidarInput(voxels=torch.rand(5, 4, 4), num_points=torch.full((5,), 4, dtype=torch.int32),
                    coords=torch.tensor([[0, 0, i, i] for i in range(5)], dtype=torch.int32), num_agents=1))
assert isinstance(out, EncoderOutput) and out.bev.shape[:2] == (1, pp.out_channels), out.bev.shape
from gencomm.cli import train
try:
    train(["--help"])
except SystemExit as exc:
    assert exc.code == 0
import contextlib, io
assert train(["-y", "opv2v_h/gencomm_stage1_m1", "--dry_run"]) == 0  # PointPillars: no spconv needed
from opencood_ext.data.voxelize import Voxelizer
assert Voxelizer([0.8, 0.8, 4.0], R).backend == "torch"  # "auto" voxelises in pure PyTorch
from pathlib import Path
from gencomm.cli import infer
from tiny_runs import PP, tiny_config, tiny_dataset
torch.set_num_threads(1)
root = tiny_dataset(Path("data"))  # dataset samples voxelised, a training step, an evaluated frame
cfg = tiny_config(Path("."), root, "nospconv", {"m1": PP}, {"fusion": "intermediate", "link": {"type": "full_feature"}})
assert train(["-y", str(cfg), "--model_dir", "run", "--set", "train.max_steps_per_epoch=1"]) == 0
assert infer(["--model_dir", "run", "--max_frames", "1", "--plot_every", "0"]) == 0
err = io.StringIO()
with contextlib.redirect_stderr(err):  # SECOND: one line saying what to install, exit status 2
    status = train(["-y", "opv2v_h/gencomm_stage1_m3", "--dry_run"])
lines = [ln for ln in err.getvalue().splitlines() if ln.strip() and " INFO " not in ln]
assert status == 2 and len(lines) == 1 and "pip install spconv" in lines[0], (status, err.getvalue())
try:
    build({"type": "second", "voxel_size": [0.4, 0.4, 0.5]}, opencood_ext.models.ENCODERS, "m3", lidar_range=R)
except ImportError as exc:
    print(exc)
else:
    raise AssertionError("built SECOND without spconv")
"""


def test_everything_but_a_second_model_works_without_spconv(tmp_path):
    """Every module of the three packages imports, a PointPillars encoder builds and runs, a command
    prints its help, a PointPillars config's --dry_run works and a tiny PointPillars run voxelises its
    samples (pure-PyTorch voxeliser), trains a step and evaluates while ``import spconv`` fails;
    building SECOND says what to install (gencomm-train: one line, exit status 2)."""
    res = _run_python(WITHOUT_SPCONV, tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "spconv-cu126" in res.stdout and "pip install spconv" in res.stdout


def test_setup_requires_a_torch_whose_weights_only_load_holds():
    """Checkpoints load with ``torch.load(weights_only=True)``; before torch 2.6 a crafted file
    could run code through it (CVE-2025-32434), so setup.py may not allow an older torch (read
    from setup.py itself: no wheel build needed)."""
    import ast
    tree = ast.parse((REPO / "setup.py").read_text())
    reqs = next(ast.literal_eval(node.value) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                and any(getattr(t, "id", None) == "INSTALL_REQUIRES" for t in node.targets))
    torch_req = [r.replace(" ", "") for r in reqs if re.match(r"torch\b", r)]
    assert len(torch_req) == 1 and (m := re.fullmatch(r"torch>=(\d+)\.(\d+)", torch_req[0])), torch_req
    assert (int(m.group(1)), int(m.group(2))) >= (2, 6), torch_req
