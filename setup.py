"""Installs ``opencood_ext`` (the OpenCOOD-compatible substrate any
cooperative-perception method needs: configs, data and the simulator, encoders,
detector, wire format, training engine, evaluation) and ``gencomm`` (the
generative-communication method and its experiment).

Dependencies are compatible ranges, never the CPU builds of the development
machine (those pins live in ``requirements.txt``, which ``scripts/setup_env.sh``
installs before ``pip install --no-deps -e .``):

* torch: install the build for your machine first (CUDA or CPU); torch >= 2.6: checkpoints load with
  ``torch.load(weights_only=True)``, which torch before 2.6 let a crafted file bypass
  (CVE-2025-32434).
* spconv is NOT declared: its CUDA builds are other distributions
  (``spconv-cu126``, ...) that provide the same ``spconv`` module, so declaring
  ``spconv`` would pull the CPU build onto a GPU machine. Install
  ``spconv-cuXXX`` (GPU) or ``spconv`` (CPU); importing the models without it
  says so (:mod:`opencood_ext.deps`).
* extras: ``[sim]`` the built-in simulator's open3d and scipy (a CPU-only machine
  may use ``open3d-cpu`` instead), ``[carla]`` the CARLA client for the CARLA
  bridge, ``[test]`` the test runner.

Packages: ``opencood_ext``, ``gencomm``, ``experiments`` (the experiment driver: the main job,
the benchmark, reports, seed archives, ``experiments.bench``) and ``gencomm_configs``, the
checkout's ``configs/`` shipped as package data, so a config is found by name from any directory
(:mod:`opencood_ext.config_files`).

Console scripts: one per command, listed in ``CONSOLE_SCRIPTS`` and documented in
:mod:`gencomm.cli`; in a checkout ``python tools/<name>.py`` runs the same commands.
"""
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent

INSTALL_REQUIRES = [
    "torch>=2.6",  # weights_only loading: CVE-2025-32434 before 2.6
    "numpy>=1.24",
    "pyyaml>=6.0",
    "tqdm>=4.66",
    "Pillow>=10.0",
    "matplotlib>=3.8",
    "tensorboard>=2.16",
    "diffusers>=0.27",
    "cryptography>=42.0",  # Ed25519 per-sender message signatures
]


def _requirements(name):
    lines = (HERE / name).read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


EXTRAS_REQUIRE = {
    "sim": ["open3d>=0.18", "scipy>=1.11"],
    # the client must match the CARLA server's version (docker/ pins the 0.9.16 server)
    "carla": ["carla~=0.9.16"],
    "test": _requirements("requirements-test.txt"),
}

CONSOLE_SCRIPTS = [
    "gencomm-train = gencomm.cli:train",
    "gencomm-infer = gencomm.cli:infer",
    "gencomm-onboard = gencomm.cli:onboard",
    "gencomm-sim = gencomm.cli:simulate",
    "gencomm-demo = gencomm.cli:demo",
    "gencomm-compare = gencomm.cli:compare",
    "gencomm-robustness = gencomm.cli:robustness",
    "gencomm-import-config = gencomm.cli:import_config",
    "gencomm-import-weights = gencomm.cli:import_weights",
    "gencomm-inspect-data = gencomm.cli:inspect_data",
    "gencomm-reproduce = experiments.reproduce:main",
    "gencomm-seed-report = experiments.seeds:main",
    "gencomm-fair-benchmark = experiments.fair:main",
    "gencomm-curves = experiments.curves_run:main",
    "gencomm-bench = experiments.bench.cli:main",
]

CONFIGS_PACKAGE = "gencomm_configs"  # opencood_ext.config_files.PACKAGE: configs/ installed under this name
# configs/ and each folder below it, as data-only packages (gencomm_configs.sim.types, ...)
CONFIG_PACKAGES = [CONFIGS_PACKAGE] + sorted(
    ".".join((CONFIGS_PACKAGE, *d.relative_to(HERE / "configs").parts))
    for d in (HERE / "configs").rglob("*") if d.is_dir() and d.name != "__pycache__")
CODE_PACKAGES = ["opencood_ext", "opencood_ext.*", "gencomm", "gencomm.*", "experiments", "experiments.*"]

setup(
    name="gencomm",
    version="0.1.0",
    description="Generative communication for heterogeneous cooperative perception",
    long_description=(HERE / "README.md").read_text(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=CODE_PACKAGES) + CONFIG_PACKAGES,
    package_dir={CONFIGS_PACKAGE: "configs"},
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
    entry_points={"console_scripts": CONSOLE_SCRIPTS},
    package_data={"opencood_ext.sim": ["agent_types.yaml"], **{p: ["*.yaml"] for p in CONFIG_PACKAGES}},
    include_package_data=True,
)
