"""GenComm's onboarding with the ego-encoder generation target (beyond the paper, issue 49 item 5):
``model.link.generation_target: ego_encoder`` adds a generation loss whose target is the SENDER's
own scan as the ego type's frozen encoder reads it; the default (``none``) is the faithful method.

Tiny alliance on synthetic frames: ego m1 (PointPillars, 64 beams, 0.8 m pillars), new type m3
(SECOND, 32 beams, 0.4 m voxels), agents m1, m3, m3; the stage-2 freeze of the onboarding (only
``link.dme.m3`` trains, frozen BatchNorm in eval mode)."""
import copy

import pytest
import torch

import gencomm  # noqa: F401  (registers the link and the onboarding methods)
from gencomm.onboarding import GenCommEgoTargetOnboarding, GenCommOnboarding
from opencood_ext.data.batch import collate_samples
from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.data.ego_type_input import check_ego_type_inputs
from opencood_ext.data.inputs import LidarInput
from opencood_ext.data.synthetic import SyntheticReader
from opencood_ext.data.voxelize import Voxelizer, collate_voxels
from opencood_ext.experiment import needs_ego_type_inputs
from opencood_ext.methods import ONBOARDING
from opencood_ext.models import fusion_methods
from opencood_ext.models.detector import CooperativeDetector
from opencood_ext.models.warp import warp_to_ego
from opencood_ext.training.freeze import FreezePolicy
from gencomm.generator import generation_loss

RANGE = (-19.2, -19.2, -3.0, 19.2, 19.2, 1.0)
BACKBONE = {"layer_nums": [1], "layer_strides": [1], "num_filters": [8], "upsample_strides": [1],
            "num_upsample_filters": [8]}
TYPES = {"m1": {"encoder": {"type": "pointpillars", "voxel_size": [0.8, 0.8, 4.0], "num_filters": [8]},
                "backbone": BACKBONE, "shrink_channels": 8},
         "m3": {"encoder": {"type": "second", "voxel_size": [0.4, 0.4, 0.5], "channels": [8, 8], "blocks": [1, 1]},
                "backbone": BACKBONE, "shrink_channels": 8}}
DATA = {"m1": AgentTypeData(lidar_beams=64), "m3": AgentTypeData(lidar_beams=32, max_points_per_voxel=8)}
LINK = {"type": "gencomm", "message": {"hidden_channels": 8}, "generator": {"base_channels": 8},
        "generation_weight": 0.0}
TARGET = {"generation_target": "ego_encoder", "generation_target_weight": 3.0}


def _model(link: dict, protocol: str = "equalized") -> CooperativeDetector:
    torch.manual_seed(0)
    model = CooperativeDetector(TYPES, RANGE, fusion="intermediate", fusion_op="max", link=link, protocol=protocol)
    FreezePolicy(["link.dme.m3"], freeze_batchnorm_stats=True).apply(model)
    return model.train()


def _dataset(ego_type_inputs: bool, protocol: str = "native") -> CooperativeDataset:
    cfg = DataConfig(lidar_range=RANGE, agent_types=DATA, max_agents=3)
    reader = SyntheticReader(2, types=("m1", "m3", "m3"))
    sizes = {t: tuple(s["encoder"]["voxel_size"]) for t, s in TYPES.items()}
    return CooperativeDataset(reader, cfg, sizes, train=True, protocol=protocol, ego_type_inputs=ego_type_inputs)


def _batch(ego_type_inputs: bool):
    ds = _dataset(ego_type_inputs)
    torch.manual_seed(3)  # the training draws (augmentation)
    return collate_samples([ds[0], ds[1]]), ds


def _loss(model, batch, seed=5):
    torch.manual_seed(seed)  # the generator's noise
    return model.loss(model(batch), batch)


def test_the_option_defaults_to_the_faithful_method():
    plain, explicit = _model(LINK), _model({**LINK, "generation_target": "none"})
    assert plain.link.generation_target == "none" and not needs_ego_type_inputs(LINK)
    batch, _ = _batch(False)
    assert batch.ego_type_inputs == {} and batch.ego_type_index == {}
    a, b = _loss(plain, batch), _loss(explicit, batch)
    assert set(a.parts) == set(b.parts) == {"cls", "box", "dir"}
    assert torch.equal(a.total, b.total)
    # with a stage-1 generation weight the faithful generation term is there and identical too
    a = _loss(_model({**LINK, "generation_weight": 2.0}), batch)
    b = _loss(_model({**LINK, "generation_weight": 2.0, "generation_target": "none"}), batch)
    assert torch.equal(a.parts["generation"], b.parts["generation"]) and torch.equal(a.total, b.total)
    # the onboarding methods: the faithful one's link has no target, the variant's has
    assert "generation_target" not in GenCommOnboarding().link({**LINK, **TARGET}, "m1", ["m3"])
    assert GenCommEgoTargetOnboarding().link(LINK, "m1", ["m3"])["generation_target"] == "ego_encoder"
    assert ONBOARDING["gencomm_egotarget"] is GenCommEgoTargetOnboarding


def test_the_extra_term_trains_only_the_new_message_extractor():
    faithful, model = _model(LINK), _model({**LINK, **TARGET})
    batch, _ = _batch(True)
    assert set(batch.ego_type_inputs) == {"m1"}  # both samples' ego is m1; its m3 collaborators carry views
    a, out = _loss(faithful, batch), _loss(model, batch)
    assert set(out.parts) == {"cls", "box", "dir", "generation_ego_encoder"}
    assert float(out.parts["generation_ego_encoder"].detach()) > 0
    # the detection terms are the faithful method's: the option only adds its term
    for k in ("cls", "box", "dir"):
        assert torch.equal(a.parts[k], out.parts[k]), k
    before = copy.deepcopy(model.state_dict())
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    opt.zero_grad()
    out.parts["generation_ego_encoder"].backward()
    reached = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert reached and all(n.startswith("link.dme.m3.") for n in reached)
    opt.step()
    after = model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith("link.dme.m3.") for k in changed)  # frozen weights and BN statistics stay


def test_the_target_is_the_frozen_ego_encoder_on_the_senders_own_scan(monkeypatch):
    model = _model({**LINK, **TARGET})
    batch, ds = _batch(True)
    seen = {}
    losses = type(model.link).losses

    def spy(link, received, sender_features, arrival):
        seen.update(received=received, arrival=arrival)
        return losses(link, received, sender_features, arrival)
    monkeypatch.setattr(type(model.link), "losses", spy)
    attach = fusion_methods.attach_ego_type_features

    def record_rows(model_, batch_, source_rows, arrival_):
        seen["source_rows"] = list(source_rows)
        return attach(model_, batch_, source_rows, arrival_)
    monkeypatch.setattr(fusion_methods, "attach_ego_type_features", record_rows)
    out = _loss(model, batch)
    arrival, received = seen["arrival"], seen["received"]
    # by hand: each m3 collaborator's 64-beam scan (its own frame), m1's voxel size, m1's frozen encoder
    frames = [ds.read_frame(0), ds.read_frame(1)]
    vox = Voxelizer((0.8, 0.8, 4.0), RANGE, DATA["m1"].max_points_per_voxel, DATA["m1"].max_voxels)
    cross = [k for k, t in enumerate(arrival.sender_types) if t == "m3"]
    assert cross and [t for t in arrival.sender_types if t != "m3"] == ["m1"] * (len(arrival.sender_types) - len(cross))
    sample = batch.sample_index.tolist()
    rows = [batch.agent_ids[r] for r in range(batch.num_agents)]
    want = []
    for k in cross:
        r = seen["source_rows"][k]
        assert batch.agent_types[r] == "m3"
        agent = next(a for a in frames[sample[r]].agents if a.agent_id == rows[r])
        inp = LidarInput.from_batch(collate_voxels([vox(agent.lidar)]), 1)
        with torch.no_grad():
            want.append(model.encoders["m1"](inp).bev[0])
    want = torch.stack(want)
    idx = torch.as_tensor(cross)
    assert bool(arrival.has_ego_type_feature[idx].all()) and not bool(arrival.has_ego_type_feature.sum() > len(cross))
    torch.testing.assert_close(arrival.ego_type_features[idx], want, rtol=1e-5, atol=1e-6)
    # and the term is the stage-1 generation loss's MSE against it, warped to the ego alike
    target = warp_to_ego(want, arrival.T_ego_from_sender[idx], RANGE)
    expected = 3.0 * generation_loss(received[idx], target, arrival.valid[idx])
    torch.testing.assert_close(out.parts["generation_ego_encoder"], expected, rtol=1e-5, atol=1e-7)


def test_the_option_is_refused_where_it_cannot_hold():
    with pytest.raises(ValueError, match=r"^model\.link\.generation_target: .*protocol reference") as exc:
        _model({**LINK, **TARGET}, protocol="reference")
    assert "\n" not in str(exc.value)
    with pytest.raises(ValueError, match=r"^model\.link\.generation_target: .*protocol reference"):
        _dataset(True, protocol="reference")
    for fmt in ("dairv2x", "v2xreal"):
        with pytest.raises(ValueError, match=r"^model\.link\.generation_target: .*data\.format " + fmt) as exc:
            check_ego_type_inputs(fmt, "native")
        assert "\n" not in str(exc.value)
    check_ego_type_inputs("opv2v", "native")  # OPV2V-H and the simulator: every agent has every sensor
    with pytest.raises(ValueError, match="not evaluated"):
        CooperativeDataset(SyntheticReader(1), DataConfig(lidar_range=RANGE, agent_types=DATA),
                           {"m1": (0.8, 0.8, 4.0), "m3": (0.4, 0.4, 0.5)}, train=False, ego_type_inputs=True)
    # a training batch without the views: the link names the key instead of training on nothing
    model = _model({**LINK, **TARGET})
    batch, _ = _batch(False)
    with pytest.raises(ValueError, match="model.link.generation_target ego_encoder"):
        _loss(model, batch)
    # a stage-2 yaml naming the variant sets the option
    with pytest.raises(ValueError, match="gencomm_egotarget trains with model.link.generation_target ego_encoder"):
        GenCommEgoTargetOnboarding().check_stage2(LINK, "x.yaml")
    GenCommOnboarding().check_stage2(LINK, "x.yaml")
