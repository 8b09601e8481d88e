"""End to end under ``protocol: reference``: a checkpoint in the reference's layout (keys written out
by hand from the public source, tests/helpers/reference_keys.py; random weights and BatchNorm statistics),
imported with the weight importer, gives the classification, regression and direction maps that
an independent restatement of the reference's forward pass (tests/helpers/reference_forward.py) computes
from the same tensors, to 1e-4 of their magnitude, diffusion noise zero on both sides:

* GenComm stage 1 (``heter_model_baseline_w_gencomm_stage1``): PointPillars m1 everywhere, and SECOND
  (VoxelBackBone8x restated densely; a 0.1 m grid over a smaller crop);
* GenComm stage 2 (``..._stage2``): m1 ego, m3 collaborators (a one-level backbone, as the
  reference's V2X-Real m3), one generator and enhancer (the ego's) for all;
* HEAL ``heter_model_baseline`` with attention (and max) fusion: no link modules, the ego keeps
  its feature.

The frame: the real V2XSet scan of ../shared/fixtures (ego), and two collaborators placed 6-9 m
away that see the same real points from their own poses; a cropped, centred range keeps it fast.
The same models under ``protocol: native`` differ from the reference (the ego keeps its feature
there, fusion masks coverage), which is what the protocol switch is for.
"""
from pathlib import Path

import numpy as np
import pytest
import torch

import gencomm  # noqa: F401  (registers the GenComm link and its layouts)
import reference_forward as ref
from gencomm.generator import SpatialAwareFeatureGenerator
from opencood_ext.data.augment import AugmentConfig
from opencood_ext.data.batch import collate_samples
from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.data.frame import AgentObs, Frame
from opencood_ext.geometry import invert_transform, pose_to_matrix, transform_points
from opencood_ext.interop.weights import import_reference_state
from opencood_ext.models.detector import CooperativeDetector
from reference_keys import (base_bev, diffusion_unet, downsample_conv, enhancer, gencomm_schedule, heads,
                            message_extractor, pillar_vfe)

torch.set_num_threads(1)
FIXTURE = Path(__file__).resolve().parents[4] / "shared" / "fixtures" / "v2xset_real"
RANGE = [-38.4, -19.2, -3.0, 38.4, 19.2, 1.0]  # centred: the reference's warp normalisation assumes it
VOXEL = (0.4, 0.4, 4.0)
C = 16  # fused feature width
# (layer_nums, layer_strides, num_filters, upsample_strides, num_upsample_filters) per type
BACKBONES = {"m1": ([1, 1], [2, 2], [16, 32], [1, 2], [16, 16]), "m3": ([1], [2], [16], [1], [32])}
UNET = dict(ch=8, mult=(1, 1), blocks=2)


def _frame():
    from opencood_ext.data.formats import OPV2VReader

    if not FIXTURE.exists():
        pytest.skip("../shared/fixtures is not present (a user's clone)")
    real = OPV2VReader(FIXTURE, "validate", load_cameras=False)[0]
    ego = real.agents[0]
    world = transform_points(ego.T_world_from_lidar, ego.lidar[:, :3].astype(np.float64))
    agents = [AgentObs(ego.agent_id, "", ego.T_world_from_lidar, ego.lidar, visible_ids=ego.visible_ids)]
    for k, offset in enumerate(([8.0, 3.0, 0.0, 0.0, 20.0, 0.0], [-6.0, -2.5, 0.0, 0.0, -35.0, 0.0])):
        T = ego.T_world_from_lidar @ pose_to_matrix(offset)
        local = transform_points(invert_transform(T), world)
        agents.append(AgentObs(9000 + k, "", T, np.c_[local, ego.lidar[:, 3]].astype(np.float32),
                               visible_ids=ego.visible_ids))
    return Frame(real.scenario, real.timestamp, agents, real.objects, split="validate")


class _Reader(list):
    pass


def _batch(types, modality, rng=RANGE, voxel=VOXEL):
    cfg = DataConfig(lidar_range=tuple(rng), augment=AugmentConfig(enabled=False), modality=modality,
                     agent_types={t: AgentTypeData(lidar_beams=64) for t in types}, max_agents=3)
    ds = CooperativeDataset(_Reader([_frame()]), cfg, {t: voxel for t in types}, train=False, cooperation="all")
    return collate_samples([ds[0]])


def _stack(t):
    nums, strides, filters, ups, up_filters = BACKBONES[t]
    return {"encoder": {"type": "pointpillars", "voxel_size": list(VOXEL), "num_filters": [C]},
            "backbone": {"type": "base_bev", "layer_nums": nums, "layer_strides": strides, "num_filters": filters,
                         "upsample_strides": ups, "num_upsample_filters": up_filters},
            "shrink": {"type": "downsample_conv", "kernel_size": [3], "stride": [2], "padding": [1], "dims": [C]}}


# the reference's anchors: from xmin + 0.4 to xmax - 0.4 (its yamls' voxel size; tests/opencood_ext/models/test_reference_anchors.py)
ANCHORS = {"margin": [0.4, 0.4]}


def _model(types, link, protocol="reference", fusion_op="att"):
    return CooperativeDetector({t: _stack(t) for t in types}, RANGE, fusion="intermediate", fusion_op=fusion_op,
                               link=link, protocol=protocol, anchors=ANCHORS).eval()


GENCOMM_LINK = {"type": "gencomm", "message": {"variant": "reference"}, "enhancer": {"variant": "reference"},
                "generator": {"variant": "reference", "base_channels": UNET["ch"], "num_steps": 3},
                "warp_before_generation": False, "wire_dtype": "float32"}


def _shapes(types, gencomm_keys):
    shapes = {}
    for t in types:
        nums, _, filters, ups, up_filters = BACKBONES[t]
        cins = [C] + filters[:-1]
        shapes.update({**pillar_vfe(f"encoder_{t}", 10, C),
                       **base_bev(f"backbone_{t}", list(zip(cins, filters, nums, ups, up_filters))),
                       **downsample_conv(f"shrinker_{t}", [(sum(up_filters), C, 3)])})
        if gencomm_keys:
            shapes.update(message_extractor(f"message_extractor_{t}", C))
    if gencomm_keys:
        shapes.update({**diffusion_unet("gencomm.denoiser", UNET["ch"], UNET["mult"], UNET["blocks"], C + 2, C),
                       **enhancer("enhancer", C)})
    shapes.update(heads(C))
    return shapes


def _checkpoint(shapes, seed):
    """Random reference weights scaled by fan-in (so activations stay of order 1 through the stack),
    BatchNorm statistics random; the offset convs small (sampling offsets of a few cells)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, shape in shapes.items():
        if k.endswith("num_batches_tracked"):
            out[k] = torch.tensor(11)
        elif k.endswith("running_var"):
            out[k] = torch.rand(shape, generator=g) + 0.5
        elif k.endswith("running_mean") or k.endswith(".bias"):
            out[k] = torch.randn(shape, generator=g) * 0.1
        elif len(shape) == 1:  # BN / LayerNorm / GroupNorm scales
            out[k] = 1.0 + torch.randn(shape, generator=g) * 0.1
        else:
            fan_in = int(np.prod(shape[1:])) if "deblocks" not in k else int(shape[0])
            out[k] = torch.randn(shape, generator=g) / np.sqrt(fan_in) * (0.05 if ".offset1." in k else 1.0)
    if any(k.startswith("gencomm.") for k in shapes):
        out.update(gencomm_schedule("gencomm"))
    return out


def _load(model, sd):
    mapping = import_reference_state(sd, model)
    model.load_state_dict(mapping.state, strict=False)
    missing = set(model.state_dict()) - set(mapping.state)
    assert not missing and not mapping.unused, (sorted(missing)[:5], mapping.unused[:5])


def _reference(sd, batch, types_of_agents, gencomm_keys, fusion="att"):
    """The reference's forward on one sample: per agent its type's stack, GenComm's generation from
    the ego's feature and each agent's own message, the enhancer, warp, fusion, heads."""
    feats = []
    by_type = {}
    for t, inp in batch.inputs.items():
        pf = ref.pillar_vfe(sd, f"encoder_{t}", inp.voxels, inp.num_points, inp.coords, VOXEL, RANGE)
        nx, ny = round((RANGE[3] - RANGE[0]) / VOXEL[0]), round((RANGE[4] - RANGE[1]) / VOXEL[1])
        x = ref.scatter(pf, inp.coords, inp.num_agents, nx, ny)
        nums, strides, _, ups, _ = BACKBONES[t]
        x = ref.base_bev(sd, f"backbone_{t}", x, nums, strides, ups)
        by_type[t] = ref.downsample_conv(sd, f"shrinker_{t}", x, [2], [1])
    for a, t in enumerate(types_of_agents):
        row = int((batch.type_index[t] == a).nonzero()[0, 0])
        feats.append(by_type[t][row])
    x = torch.stack(feats)
    if gencomm_keys:
        msgs = torch.cat([ref.message_extractor(sd, f"message_extractor_{t}", x[a:a + 1])
                          for a, t in enumerate(types_of_agents)])
        x = ref.enhance(sd, ref.generate(sd, x[:1].expand_as(x), msgs, **UNET))
    x = ref.warp_to_ego(x, batch.T_world_from_agent, RANGE)
    fused = (ref.att_fusion(x) if fusion == "att" else x.max(dim=0).values)[None]
    return ref.heads(sd, fused)


def _compare(model, sd, batch, gencomm_keys, fusion="att"):
    types = list(batch.agent_types)
    with torch.no_grad():
        ours = model(batch).head
        want = _reference(sd, batch, types, gencomm_keys, fusion)
    hwl = torch.tensor([a * 7 + j for a in range(ours.reg.shape[1] // 7) for j in (0, 1, 2, 5, 4, 3, 6)])
    errors = []
    for name, a, b in (("cls", ours.cls, want[0]), ("reg", ours.reg, want[1][:, hwl]), ("dir", ours.dir, want[2])):
        assert a.shape == b.shape, (name, a.shape, b.shape)
        errors.append(float((a - b).abs().max() / b.abs().max()))
    return errors


@pytest.fixture
def no_noise(monkeypatch):
    """The reference draws torch.randn for the start and every posterior step; both sides use 0."""
    monkeypatch.setattr(SpatialAwareFeatureGenerator, "_noise", staticmethod(lambda like, g: torch.zeros_like(like)))


def test_gencomm_stage1_pointpillars_is_the_reference_forward(no_noise):
    batch = _batch(["m1"], "all:m1")
    assert batch.num_agents == 3 and batch.agent_types == ["m1"] * 3
    sd = _checkpoint(_shapes(["m1"], True), seed=0)
    model = _model(["m1"], GENCOMM_LINK)
    _load(model, sd)
    errors = _compare(model, sd, batch, True)
    assert max(errors) < 1e-4, errors
    # the native protocol keeps the ego's feature and masks coverage: not the reference's maps
    native = _model(["m1"], {**GENCOMM_LINK, "warp_before_generation": True}, protocol="native")
    _load(native, sd)
    assert max(_compare(native, sd, batch, True)) > 1e-2


def test_gencomm_stage2_m1_m3_is_the_reference_forward(no_noise):
    batch = _batch(["m1", "m3"], "cycle:m1,m3")
    assert batch.agent_types == ["m1", "m3", "m1"]
    sd = _checkpoint(_shapes(["m1", "m3"], True), seed=1)
    model = _model(["m1", "m3"], GENCOMM_LINK)
    _load(model, sd)  # one reference generator and enhancer fill both receiver types'
    errors = _compare(model, sd, batch, True)
    assert max(errors) < 1e-4, errors


@pytest.mark.parametrize("fusion", ["att", "max"])
def test_heal_heter_model_baseline_is_the_reference_forward(fusion):
    batch = _batch(["m1"], "all:m1")
    sd = _checkpoint(_shapes(["m1"], False), seed=2)
    model = _model(["m1"], {"type": "full_feature", "wire_dtype": "float32"}, fusion_op=fusion)
    _load(model, sd)
    errors = _compare(model, sd, batch, False, fusion)
    assert max(errors) < 1e-4, errors
    if fusion == "att":  # coverage masks (native) change the attention where a collaborator sees nothing
        native = _model(["m1"], {"type": "full_feature", "wire_dtype": "float32"}, protocol="native")
        _load(native, sd)
        assert max(_compare(native, sd, batch, False)) > 1e-3


def test_a_reference_training_step_runs_and_reaches_the_ego_message_extractor():
    """Training under protocol reference: targets by the reference's rule, the ego's own message
    generated into its fused feature, so the extractor learns from the ego's own detections too."""
    batch = _batch(["m1"], "all:m1")
    model = _model(["m1"], GENCOMM_LINK)
    _load(model, _checkpoint(_shapes(["m1"], True), seed=3))
    model.criterion.pos_cls_weight = 2.0
    model.train()
    out = model(batch)
    loss = model.loss(out, batch)
    loss.total.backward()
    assert torch.isfinite(loss.total) and {"cls", "box", "dir", "generation"} <= set(loss.parts)
    grad = model.link.dme["m1"].head.weight.grad
    assert grad is not None and float(grad.abs().sum()) > 0
    t = model.targets(batch.gt_boxes, batch.gt_classes)
    assert int((t.labels == 1).sum()) >= len(batch.gt_boxes[0])  # every box has its best anchor


RANGE_S = [-12.8, -6.4, -3.0, 12.8, 6.4, 1.0]
VOXEL_S = (0.1, 0.1, 0.1)


def _second_keys(p, cin=4, widths=(16, 32, 64, 64), out=64):
    """VoxelBackBone8x in spconv 2.x layout (weights (out, kz, ky, kx, in)), BatchNorm1d after each conv."""
    from reference_keys import bn

    shapes = {}

    def conv(name, i, o, k=(3, 3, 3)):
        shapes[f"{p}.spconv_block.{name}.0.weight"] = (o, *k, i)
        shapes.update(bn(f"{p}.spconv_block.{name}.1", o))
    conv("conv_input", cin, widths[0])
    conv("conv1.0", widths[0], widths[0])
    for s, (i, o) in zip(("conv2", "conv3", "conv4"), zip(widths[:-1], widths[1:])):
        conv(f"{s}.0", i, o)
        conv(f"{s}.1", o, o)
        conv(f"{s}.2", o, o)
    conv("conv_out", widths[-1], out, (3, 1, 1))
    return shapes


def _second_model(rng=RANGE_S, voxel=VOXEL_S):
    """GenComm stage 1 with SECOND (type m3), protocol reference (the shapes of :func:`_second_shapes`
    hold for any x-y voxel size and range with RANGE_S's z: 40 cells, 2 after the 8x backbone)."""
    stack = {"encoder": {"type": "second", "voxel_size": list(voxel), "channels": [16, 32, 64, 64],
                         "blocks": [1, 2, 2, 2], "out_z_channels": 64},
             "backbone": {"type": "base_bev", "layer_nums": [1], "layer_strides": [1], "num_filters": [C],
                          "upsample_strides": [1], "num_upsample_filters": [C]},
             "shrink": {"type": "downsample_conv", "kernel_size": [3], "stride": [2], "padding": [1], "dims": [C]}}
    return CooperativeDetector({"m3": stack}, rng, fusion="intermediate", fusion_op="att", link=GENCOMM_LINK,
                               protocol="reference", anchors=ANCHORS).eval()


def _second_shapes():
    return {**_second_keys("encoder_m3"), **base_bev("backbone_m3", [(128, C, 1, 1, C)]),
            **downsample_conv("shrinker_m3", [(C, C, 3)]), **message_extractor("message_extractor_m3", C),
            **diffusion_unet("gencomm.denoiser", UNET["ch"], UNET["mult"], UNET["blocks"], C + 2, C),
            **enhancer("enhancer", C), **heads(C)}


def _second_reference(sd, batch, rng=RANGE_S, voxel=VOXEL_S):
    """The reference's forward of the SECOND model on one sample -> (cls, reg, dir) maps."""
    inp = batch.inputs["m3"]
    grid = [round((rng[k + 3] - rng[k]) / voxel[k]) for k in (2, 1, 0)]
    x = ref.voxel_backbone_8x(sd, "encoder_m3", inp.voxels, inp.num_points, inp.coords, inp.num_agents, grid)
    x = ref.downsample_conv(sd, "shrinker_m3", ref.base_bev(sd, "backbone_m3", x, [1], [1], [1]), [2], [1])
    x = x[torch.argsort(batch.type_index["m3"])]  # the type's rows back in agent order
    msgs = ref.message_extractor(sd, "message_extractor_m3", x)
    x = ref.enhance(sd, ref.generate(sd, x[:1].expand_as(x), msgs, **UNET))
    fused = ref.att_fusion(ref.warp_to_ego(x, batch.T_world_from_agent, rng))[None]
    return ref.heads(sd, fused)


def test_gencomm_stage1_second_is_the_reference_forward(no_noise):
    pytest.importorskip("spconv")
    batch = _batch(["m3"], "all:m3", RANGE_S, VOXEL_S)
    model = _second_model()
    sd = _checkpoint(_second_shapes(), seed=4)
    _load(model, sd)
    with torch.no_grad():
        ours = model(batch).head
        want = _second_reference(sd, batch)
    hwl = torch.tensor([a * 7 + j for a in range(2) for j in (0, 1, 2, 5, 4, 3, 6)])
    for a, b in ((ours.cls, want[0]), (ours.reg, want[1][:, hwl]), (ours.dir, want[2])):
        assert float((a - b).abs().max() / b.abs().max()) < 1e-4
