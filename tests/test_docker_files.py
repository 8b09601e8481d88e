"""Lint docker/Dockerfile and docker/docker-compose.yml (no Docker engine here).

Checks what a build or ``docker compose up`` would trip on first: unpinned
images, a CPU torch in the GPU image, COPY sources or commands naming files
the repository lacks, compose paths that do not resolve from docker/.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"


# ----------------------------------------------------------------------------- Dockerfile parsing

def parse_dockerfile(text: str):
    """Dockerfile text -> [(INSTRUCTION, argument string)], continuations joined,
    comments dropped."""
    out, buf = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue  # comment inside a continued instruction
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        op, _, arg = buf.strip().partition(" ")
        out.append((op.upper(), arg.strip()))
        buf = ""
    assert not buf, "Dockerfile ends inside a line continuation"
    return out


def arg_defaults(instrs):
    d = {}
    for op, arg in instrs:
        if op == "ARG" and "=" in arg:
            k, v = arg.split("=", 1)
            d[k.strip()] = v.strip()
    return d


def expand(s: str, env: dict) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), m.group(0)), s)


@pytest.fixture(scope="module")
def dockerfile():
    instrs = parse_dockerfile((DOCKER / "Dockerfile").read_text())
    return instrs, arg_defaults(instrs)


def requirement_pin(name: str) -> str:
    for line in (REPO / "requirements.txt").read_text().splitlines():
        m = re.match(rf"^{re.escape(name)}==(\S+)", line.strip())
        if m:
            return m.group(1)
    raise AssertionError(f"requirements.txt has no {name}== pin")


def test_parser_joins_continuations_and_drops_comments():
    instrs = parse_dockerfile("# c\nFROM a:1\nRUN x \\\n  # inner\n  && y\nCMD [\"z\"]\n")
    assert instrs == [("FROM", "a:1"), ("RUN", "x  && y"), ("CMD", '["z"]')]


def test_from_is_a_pinned_cuda_image(dockerfile):
    instrs, _ = dockerfile
    froms = [a for op, a in instrs if op == "FROM"]
    assert len(froms) == 1
    image = froms[0].split()[0]
    assert "$" not in image, "FROM must not depend on a build argument"
    name, _, tag = image.partition(":")
    assert name == "nvidia/cuda" and tag and tag != "latest"
    assert re.fullmatch(r"\d+\.\d+\.\d+-(cudnn-)?(runtime|devel|base)-ubuntu\d\d\.\d\d", tag), tag
    # open3d 0.20.0's cp311 wheel needs glibc 2.35: Ubuntu 22.04 or newer
    assert float(tag.rsplit("ubuntu", 1)[1]) >= 22.04


def test_python_and_system_packages(dockerfile):
    instrs, _ = dockerfile
    runs = " ".join(a for op, a in instrs if op == "RUN")
    assert "python3.11" in runs and "libusb-1.0-0" in runs


def test_torch_pinned_to_the_project_version_with_cuda(dockerfile):
    instrs, env = dockerfile
    runs = [expand(a, env) for op, a in instrs if op == "RUN"]
    torch_runs = [r for r in runs if re.search(r"pip install .*torch==", r)]
    assert torch_runs, "no pinned torch install"
    assert "torch==2.13.0" in torch_runs[0] and requirement_pin("torch") == "2.13.0"
    m = re.search(r"--index-url\s+(\S+)", torch_runs[0])
    assert m, "torch must come from an explicit index"
    url = m.group(1)
    # PyPI (whose Linux wheel is the CUDA build) or a CUDA index of download.pytorch.org,
    # never the CPU index
    assert url == "https://pypi.org/simple" or re.fullmatch(r"https://download\.pytorch\.org/whl/cu\d+", url)
    # torch is installed before any other requirement, and the later install is constrained
    first_req = next(i for i, r in enumerate(runs) if "requirements" in r and "pip install" in r)
    assert runs.index(torch_runs[0]) < first_req
    assert "-c /tmp/constraints.txt" in runs[first_req] and "torch==2.13.0" in runs[first_req]


def test_spconv_cuda_wheel_and_full_open3d(dockerfile):
    instrs, env = dockerfile
    runs = " ".join(expand(a, env) for op, a in instrs if op == "RUN")
    m = re.search(r"spconv-cu(\d+)==(\d+\.\d+\.\d+)", runs)
    assert m, "spconv must be a pinned CUDA wheel (spconv-cuXXX==X.Y.Z)"
    assert m.group(2) == requirement_pin("spconv")
    assert re.search(r"open3d==\d+\.\d+\.\d+", runs)
    assert requirement_pin("open3d-cpu") in re.search(r"open3d==(\S+?)\"?\s", runs + " ").group(1)


def test_requirement_filter_drops_only_cpu_pins(dockerfile):
    """Apply the Dockerfile's own grep filter to requirements.txt."""
    instrs, _ = dockerfile
    run = next(a for op, a in instrs if op == "RUN" and "grep -v -E" in a)
    pattern = re.search(r"grep -v -E '([^']+)' requirements.txt", run).group(1)
    kept = [ln for ln in (REPO / "requirements.txt").read_text().splitlines()
            if not re.search(pattern, ln)]
    names = [re.split(r"[=<>~! ]", ln.strip())[0] for ln in kept if ln.strip() and not ln.startswith("#")]
    assert not {"torch", "spconv", "open3d-cpu"} & set(names)
    assert {"diffusers", "pyyaml", "scipy"} <= set(names)


def test_project_installed_without_deps(dockerfile):
    instrs, _ = dockerfile
    runs = [a for op, a in instrs if op == "RUN"]
    assert any(re.search(r"pip install --no-deps -e \.(\s|$)", r) for r in runs)
    assert any("requirements-test.txt" in r for r in runs)  # carla client, pytest


def test_every_copy_source_exists(dockerfile):
    instrs, _ = dockerfile
    copies = [a for op, a in instrs if op in ("COPY", "ADD")]
    assert copies
    for arg in copies:
        parts = [p for p in shlex.split(arg) if not p.startswith("--")]
        for src in parts[:-1]:
            assert (REPO / src).exists(), f"COPY source {src} is not in the repository (build context)"
    copied = {p for a in copies for p in shlex.split(a)[:-1]}
    for needed in ("setup.py", "requirements.txt", "opencood_ext", "gencomm", "tools", "configs"):
        assert needed in copied, f"{needed} is not copied into the image"


def test_cmd_runs_an_existing_tool(dockerfile):
    instrs, _ = dockerfile
    cmds = [a for op, a in instrs if op in ("CMD", "ENTRYPOINT")]
    assert cmds
    import json
    cmd = json.loads(cmds[-1])  # exec form
    assert cmd[0] == "python" and cmd[1].startswith("tools/")
    assert (REPO / cmd[1]).is_file()
    for a in cmd[2:]:
        if a.endswith(".yaml"):
            assert (REPO / a).is_file(), f"CMD names {a}, which does not exist"


# ----------------------------------------------------------------------------- compose

@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load((DOCKER / "docker-compose.yml").read_text())


def _gpu_reserved(svc) -> bool:
    devices = svc.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    return any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices)


def test_services_images_pinned_and_on_gpus(compose):
    svcs = compose["services"]
    assert set(svcs) >= {"carla", "gencomm"}
    for name, svc in svcs.items():
        image = svc.get("image")
        assert image, f"service {name} has no image name"
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest" and "/" not in tag, f"{name}: image {image} is not pinned"
        assert _gpu_reserved(svc), f"service {name} reserves no NVIDIA GPU"
    assert svcs["carla"]["image"] == "carlasim/carla:0.9.16"


def test_carla_service(compose):
    carla = compose["services"]["carla"]
    # published on the loopback interface only: CARLA's RPC port takes any client's commands
    assert carla["ports"] == ["127.0.0.1:2000-2002:2000-2002"]
    assert all(str(p).startswith("127.0.0.1:") for p in carla["ports"])
    cmd = carla["command"]
    assert "CarlaUE4.sh" in cmd and "-RenderOffScreen" in cmd
    assert "healthcheck" in carla


def test_gencomm_service(compose):
    svc = compose["services"]["gencomm"]
    ctx = (DOCKER / svc["build"]["context"]).resolve()
    assert ctx == REPO, "the build context must be the repository root"
    assert (ctx / svc["build"]["dockerfile"]).is_file()
    deps = svc["depends_on"]
    assert "carla" in deps
    assert svc["environment"]["CARLA_HOST"] == "carla"
    cmd = svc["command"]
    cmd = shlex.split(cmd) if isinstance(cmd, str) else cmd
    assert cmd[:2] == ["python", "tools/carla_demo.py"]
    assert (REPO / cmd[1]).is_file(), f"the demo command names {cmd[1]}, which does not exist"
    assert "live" in cmd and cmd[cmd.index("--backend") + 1] == "carla" and cmd[cmd.index("--host") + 1] == "carla"
    model_dir = cmd[cmd.index("--model_dir") + 1]
    m = re.fullmatch(r"\$\{GENCOMM_MODEL_DIR:-([\w./-]+)\}", model_dir)
    assert m and m.group(1).startswith(("results/", "runs/")), "the model must come from a mounted folder"
    mounts = {}
    for v in svc["volumes"]:
        host, container = v.split(":")[:2]
        mounts[(DOCKER / host).resolve()] = container
    assert mounts[REPO / "data"] == "/workspace/gencomm/data"
    assert mounts[REPO / "runs"] == "/workspace/gencomm/runs"
    assert mounts[REPO / "results"] == "/workspace/gencomm/results"


def test_readme_commands_match_the_files(compose):
    text = (DOCKER / "README.md").read_text()
    assert "docker compose -f docker/docker-compose.yml build" in text
    assert "docker build -f docker/Dockerfile" in text
    assert "torchrun" in text
    assert compose["services"]["gencomm"]["image"] in text
    for path in set(re.findall(r"\b((?:tools|configs)/[\w/.-]+\.(?:py|yaml))", text)):
        assert (REPO / path).is_file(), f"docker/README.md names {path}, which does not exist"
