"""Installs two packages: ``opencood_ext`` (the OpenCOOD-compatible substrate any
cooperative-perception method needs: configs, data and the simulator, encoders,
detector, wire format, training engine, evaluation) and ``gencomm`` (the
generative-communication method and its experiment)."""
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent


def _requirements(name):
    lines = (HERE / name).read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


setup(
    name="gencomm",
    version="0.1.0",
    description="Generative communication for heterogeneous cooperative perception",
    long_description=(HERE / "README.md").read_text(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["opencood_ext", "opencood_ext.*", "gencomm", "gencomm.*"]),
    install_requires=_requirements("requirements.txt"),
    extras_require={"test": _requirements("requirements-test.txt"), "carla": ["carla==0.9.16"]},
    include_package_data=True,
)
