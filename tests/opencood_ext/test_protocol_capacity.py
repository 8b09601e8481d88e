"""The protocols build what they say (issue 31): the layers that see the warped map, counted per method.

A layer "sees the warped map" when it runs in a forward pass after the first warp of a received
message into the ego's frame (:func:`opencood_ext.models.warp.warp_to_ego`, wherever a link or fusion
op imported it; the ego's own alignment in ``fusion_methods.ego_features`` is no message). The test counts
distinct convolutions with a kernel larger than 1x1 (a 1x1 layer reads each cell alone, so it cannot
undo a rotation), for every link on the registry contract's tiny sizes:

* ``equalized`` adds exactly the shared post-fusion block to every method, and full-feature fusion
  has nothing else after its warp;
* ``reference`` puts nothing but the 1x1 head after the warp for full-feature fusion and for GenComm,
  which generates in the sender's frame and warps afterwards; ``equalized`` keeps that order for GenComm
  (the better one there), so the shared block is all GenComm has after its warp too;
* every shipped simulator config is equalized, with the same block, whatever its fusion method.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import gencomm  # noqa: F401  (registers GenComm's link)
from opencood_ext.data.batch import collate_samples
from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.data.synthetic import SyntheticReader
from opencood_ext.experiment import build_model, load_experiment
from opencood_ext.models import warp as warp_module
from opencood_ext.models.detector import CooperativeDetector
from opencood_ext.protocol import EQUALIZED_POST_FUSION_LAYERS
from opencood_ext.models.links import LINKS

from test_registry_contract import LINK_ARGS, RANGE, TYPES, VOXEL

ROOT = Path(__file__).resolve().parents[2]


def _batch():
    cfg = DataConfig(lidar_range=RANGE, agent_types={"m1": AgentTypeData(), "m2": AgentTypeData()})
    reader = SyntheticReader(2, types=("m1", "m2"))
    ds = CooperativeDataset(reader, cfg, {t: VOXEL for t in TYPES}, train=False, cooperation="all")
    return collate_samples([ds[0], ds[1]])


def layers_after_warp(model: CooperativeDetector, batch, monkeypatch) -> int:
    """Distinct k x k convolutions (k > 1) that run after the first warp in one evaluation forward."""
    original = warp_module.warp_to_ego
    state = {"warped": 0}

    def marked(*args, **kw):
        state["warped"] += 1
        return original(*args, **kw)

    for name, module in list(sys.modules.items()):
        if name != "opencood_ext.models.fusion_methods" and getattr(module, "warp_to_ego", None) is original:
            monkeypatch.setattr(module, "warp_to_ego", marked)
    after = set()

    def hook(layer, _inputs, _output):
        if state["warped"]:
            after.add(id(layer))

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, nn.Conv2d) and max(m.kernel_size) > 1]
    try:
        model.eval()
        with torch.no_grad():
            model(batch)
    finally:
        for h in handles:
            h.remove()
        monkeypatch.undo()
    assert state["warped"], "the forward warped nothing: the count would say nothing"
    return len(after)


def _model(link: str, protocol: str) -> CooperativeDetector:
    """GenComm with its generation order left to the protocol, as the sim configs leave it."""
    spec = {**LINK_ARGS.get(link, {}), "type": link}
    spec.pop("warp_before_generation", None)
    torch.manual_seed(0)
    return CooperativeDetector(TYPES, RANGE, link=spec, fusion_op="max", protocol=protocol)


@pytest.fixture(scope="module")
def batch():
    return _batch()


@pytest.mark.parametrize("link", sorted(LINKS))
def test_equalized_adds_the_same_block_after_the_warp_to_every_link(link, batch, monkeypatch):
    native = layers_after_warp(_model(link, "native"), batch, monkeypatch)
    equalized = layers_after_warp(_model(link, "equalized"), batch, monkeypatch)
    if link == "gencomm":  # native warps first (its UNet and enhancer after the warp), equalized generates first
        assert native > 0 and equalized == EQUALIZED_POST_FUSION_LAYERS
        return
    assert equalized == native + EQUALIZED_POST_FUSION_LAYERS
    if link == "full_feature":
        assert native == 0 and equalized == EQUALIZED_POST_FUSION_LAYERS


def test_gencomm_warp_first_under_equalized_adds_the_block_to_its_own_layers(batch, monkeypatch):
    """Set explicitly, warp first still runs under equalized (the order comparison's other arm)."""
    def model(protocol):
        spec = {**LINK_ARGS.get("gencomm", {}), "type": "gencomm", "warp_before_generation": True}
        torch.manual_seed(0)
        return CooperativeDetector(TYPES, RANGE, link=spec, fusion_op="max", protocol=protocol)
    native = layers_after_warp(model("native"), batch, monkeypatch)
    assert native > 0
    assert layers_after_warp(model("equalized"), batch, monkeypatch) == native + EQUALIZED_POST_FUSION_LAYERS


@pytest.mark.parametrize("link", ["full_feature", "gencomm"])
def test_reference_leaves_only_the_1x1_head_after_the_warp(link, batch, monkeypatch):
    assert layers_after_warp(_model(link, "reference"), batch, monkeypatch) == 0


def test_native_gencomm_generates_after_the_warp(batch, monkeypatch):
    """Native's generation order (the archived native runs'): the UNet and the enhancer see the warped
    message, the capacity after the warp that the other methods lacked under native."""
    assert layers_after_warp(_model("gencomm", "native"), batch, monkeypatch) > 0


def test_equalized_refuses_another_block(tmp_path):
    with pytest.raises(ValueError, match="model.post_fusion_layers: protocol equalized gives every method the same 2"):
        CooperativeDetector(TYPES, RANGE, post_fusion_layers=1, protocol="equalized")
    assert len(CooperativeDetector(TYPES, RANGE, protocol="native").post_fusion) == 0
    assert len(CooperativeDetector(TYPES, RANGE, post_fusion_layers=1, protocol="native").post_fusion) == 1


SIM_CONFIGS = sorted(p.relative_to(ROOT / "configs") for p in (ROOT / "configs" / "sim").rglob("*.yaml")
                     if p.parent.name not in ("types", "methods") and p.name not in ("base.yaml", "gencomm_link.yaml",
                                                                                      "fusion_v2xvit.yaml"))


@pytest.mark.parametrize("config", [str(c) for c in SIM_CONFIGS])
def test_every_sim_config_is_equalized_with_the_same_block(config):
    cfg = load_experiment(ROOT / "configs" / config)
    assert cfg.protocol == "equalized"
    model = build_model(cfg)
    assert len(model.post_fusion) == EQUALIZED_POST_FUSION_LAYERS
    convs = [m for m in model.post_fusion.modules() if isinstance(m, nn.Conv2d)]
    assert [m.kernel_size for m in convs] == [(3, 3)] * EQUALIZED_POST_FUSION_LAYERS


def test_onboarding_refuses_stage1_runs_of_another_protocol(tmp_path):
    import yaml

    from opencood_ext.run_folder import RunFolder
    from opencood_ext.training.onboarding import plan_onboarding
    from tiny_runs import GENCOMM, PP, SECOND, tiny_config

    runs = {}
    for t, stack, protocol in (("m1", PP, "equalized"), ("m3", SECOND, "native")):
        path = tiny_config(tmp_path, tmp_path / "data", f"s1_{t}", {t: stack},
                           {"fusion": "intermediate", "link": GENCOMM}, modality=f"all:{t}")
        cfg = {**yaml.safe_load(path.read_text()), "protocol": protocol}
        runs[t] = tmp_path / f"s1_{t}"
        runs[t].mkdir()
        RunFolder(runs[t]).config.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ValueError, match=r"s1_m3: stage-1 run trained under protocol native, but the ego run's "
                                         r"protocol equalized"):
        plan_onboarding(runs["m1"], [runs["m3"]])
    cfg = yaml.safe_load(RunFolder(runs["m3"]).config.read_text())
    RunFolder(runs["m3"]).config.write_text(yaml.safe_dump({**cfg, "protocol": "equalized"}))
    assert plan_onboarding(runs["m1"], [runs["m3"]]).config.protocol == "equalized"


def test_generation_order_follows_the_protocol_unless_set():
    """``warp_before_generation`` left out (the sim configs): warp first under native, generate first
    under reference and equalized; set, it wins, except true under reference, refused naming the key."""
    from gencomm.link import GenCommLink
    link = GenCommLink(8, ["m1"], RANGE)
    assert link.warp_before_generation is None
    assert link.warps_first("native") and not link.warps_first("equalized") and not link.warps_first("reference")
    assert not GenCommLink(8, ["m1"], RANGE, warp_before_generation=False).warps_first("native")
    assert GenCommLink(8, ["m1"], RANGE, warp_before_generation=True).warps_first("equalized")
    with pytest.raises(ValueError, match="model.link.warp_before_generation: protocol reference"):
        GenCommLink(8, ["m1"], RANGE, warp_before_generation=True).warps_first("reference")
    sim = load_experiment(ROOT / "configs" / "sim" / "gencomm_stage1_m1.yaml", ["protocol=reference"])
    assert "warp_before_generation" not in sim.model["link"]  # so the sim configs run under either protocol
