"""Every shipped experiment config loads, builds its model, and trains a step.

The sim configs (the embedded default) run a forward and backward pass on a
synthetic batch of their real shapes in the default suite; the GPU-sized
OPV2V-H / DAIR-V2X / V2X-Real configs do so in the slow suite (a 256 x 256
grid with HEAL's backbone takes minutes on a laptop CPU).
"""
from pathlib import Path

import pytest
import torch
import yaml

from opencood_ext.data.batch import collate_samples
from opencood_ext.data.dataset import CooperativeDataset
from opencood_ext.experiment import build_model, cooperation_for, load_experiment, needs_ego_type_inputs
from opencood_ext.data.synthetic import SyntheticReader

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
EXPERIMENTS = sorted(p for p in CONFIGS.rglob("*.yaml") if "name" in (yaml.safe_load(p.read_text()) or {}))


def _id(p):
    return str(p.relative_to(CONFIGS))


def test_every_dataset_family_has_configs():
    families = {p.relative_to(CONFIGS).parts[0] for p in EXPERIMENTS}
    assert {"sim", "opv2v_h", "dairv2x", "v2xreal"} <= families
    for fam in ("sim", "opv2v_h", "dairv2x", "v2xreal"):
        names = [_id(p) for p in EXPERIMENTS if p.relative_to(CONFIGS).parts[0] == fam]
        assert any(n.startswith(f"{fam}/gencomm_stage1") for n in names)
        assert any(n.startswith((f"{fam}/gencomm_stage2", f"{fam}/stage2/gencomm_")) for n in names)


@pytest.mark.parametrize("path", EXPERIMENTS, ids=_id)
def test_config_builds(path):
    cfg = load_experiment(path)
    model = build_model(cfg)
    assert model.grid.shape[0] > 0
    if cfg.stage.new_types and cfg.stage.method in ("gencomm", "gencomm_egotarget"):  # baselines: test_onboard_*.py
        assert model.link is not None and set(cfg.stage.new_types) <= set(model.link.dme)
        assert cfg.model["link"]["generation_weight"] == 0.0
        assert cfg.train.lr == pytest.approx(5e-4)
        # the faithful stage 2 trains on detection alone; the variant beside it adds the ego-encoder target
        target = "ego_encoder" if cfg.stage.method == "gencomm_egotarget" else "none"
        assert model.link.generation_target == target
    if "gencomm_stage1" in path.name:
        assert cfg.train.lr == pytest.approx(2e-3) and model.link.payload_channels == 2
        # the reference's fused width: 256 on V2X-Real, 128 elsewhere (docs/protocol.md)
        width = 256 if path.relative_to(CONFIGS).parts[0] == "v2xreal" else 128
        assert model.channels == width and model.link.safg[next(iter(model.link.safg))].num_steps == 3
        # the simulator's stage-1 recipe weighs the generation MSE 10 (archive/stage1_formation: at the reference's
        # 1 the collaborator path formed in some runs only); the real-data configs keep the reference's 1
        family = path.relative_to(CONFIGS).parts[0]
        assert model.link.generation_weight == (10.0 if family == "sim" else 1.0)


def _train_step(path):
    torch.manual_seed(0)
    cfg = load_experiment(path)
    model = build_model(cfg)
    types = list(cfg.data.agent_types)
    reader = SyntheticReader(1, num_agents=max(2, len(types)), types=tuple(types * 2))
    ds = CooperativeDataset(reader, cfg.data, model.voxel_sizes(), train=True,
                            cooperation=cooperation_for(model.fusion, train=True),
                            ego_type_inputs=needs_ego_type_inputs(cfg.model.get("link")))
    batch = collate_samples([ds[0]])
    out = model(batch)
    loss = model.loss(out, batch)
    loss.total.backward()
    assert torch.isfinite(loss.total)
    assert out.head.cls.shape[-2:] == model.grid.shape


SIM = [p for p in EXPERIMENTS if p.relative_to(CONFIGS).parts[0] == "sim"]
GPU = [p for p in EXPERIMENTS if p not in SIM]


@pytest.mark.parametrize("path", SIM, ids=_id)
def test_sim_config_train_step(path):
    torch.set_num_threads(2)
    _train_step(path)


@pytest.mark.slow
@pytest.mark.parametrize("path", GPU, ids=_id)
def test_gpu_config_train_step(path):
    _train_step(path)
