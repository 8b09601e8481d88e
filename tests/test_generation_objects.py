"""The generation loss's weight on vehicle cells (``model.link.generation_object_weight``): the cells
inside ground-truth boxes on the BEV grid, the weighted mean, and that a stage-1 forward fills the
arrival's object cells only when the link asks, in training."""
import math

import pytest
import torch

import gencomm  # noqa: F401  (registers the link)
from gencomm.generator import generation_loss
from gencomm.link import GenCommLink
from opencood_ext.geometry.bev_cells import cells_in_boxes
from opencood_ext.models.links import Arrival
from opencood_ext.models.warp import warp_mask

RANGE = [-4.0, -4.0, -3.0, 4.0, 4.0, 1.0]  # an 8 x 8 grid of 1 m cells: centres at -3.5 .. 3.5


def test_cells_in_boxes_on_the_cell_centres():
    # 3 m x 1 m at (0.6, -0.4), along x: x in [-0.9, 2.1] -> centres -0.5, 0.5, 1.5; y in [-0.9, 0.1] -> -0.5
    box = torch.tensor([[0.6, -0.4, 0.0, 3.0, 1.0, 1.5, 0.0]])
    m = cells_in_boxes(box, RANGE, (8, 8))
    assert m.nonzero().tolist() == [[3, 3], [3, 4], [3, 5]]  # row = y index, column = x index
    # the same box turned a quarter: now 3 m along y
    turned = box.clone()
    turned[0, 6] = math.pi / 2
    assert cells_in_boxes(turned, RANGE, (8, 8)).nonzero().tolist() == [[2, 4], [3, 4], [4, 4]]
    grown = cells_in_boxes(box, RANGE, (8, 8), margin=0.5)
    assert grown.sum() == 4 * 2 and grown[m].all()  # x in [-1.4, 2.6], y in [-1.4, 0.6]
    assert not cells_in_boxes(torch.zeros(0, 7), RANGE, (8, 8)).any()
    assert cells_in_boxes(torch.tensor([[40.0, 0, 0, 4, 2, 1.5, 0]]), RANGE, (8, 8)).sum() == 0  # off the grid
    with pytest.raises(ValueError, match=r"boxes must be \(G, 7\)"):
        cells_in_boxes(torch.zeros(2, 5), RANGE, (8, 8))


def test_weighted_generation_loss_counts_vehicle_cells_more():
    pred, target = torch.zeros(1, 2, 8, 8), torch.zeros(1, 2, 8, 8)
    target[0, :, 3, 4] = 2.0  # one vehicle cell, error 4 per element; the 63 others exact
    valid = torch.ones(1, 1, 8, 8)
    objects = torch.zeros(1, 1, 8, 8)
    objects[0, 0, 3, 4] = 1.0
    assert generation_loss(pred, target, valid).item() == pytest.approx(4.0 / 64)
    assert generation_loss(pred, target, valid * (1 + 9 * objects)).item() == pytest.approx(40.0 / (63 + 10))


def _arrival(n, C, H, W, objects=None):
    T = torch.eye(4).repeat(n, 1, 1)
    T[:, 0, 3] = 2.0
    return Arrival(T, ["m1"] * n, torch.randn(n, C, H, W), ["m1"] * n, warp_mask(T, RANGE, (H, W)), objects=objects)


def test_link_weights_its_loss_on_the_arrivals_object_cells():
    torch.manual_seed(0)
    C, H, W = 8, 8, 8
    plain = GenCommLink(C, ["m1"], RANGE, message={"hidden_channels": 8}, generator={"base_channels": 8})
    weighted = GenCommLink(C, ["m1"], RANGE, message={"hidden_channels": 8}, generator={"base_channels": 8},
                           generation_object_weight=9.0)
    assert not plain.wants_objects and weighted.wants_objects
    got, sender = torch.randn(2, C, H, W), torch.randn(2, C, H, W)
    objects = torch.zeros(2, 1, H, W)
    objects[:, :, 2:4, 2:4] = 1.0
    a = _arrival(2, C, H, W, objects)
    base = plain.losses(got, sender, a)["generation"]
    heavy = weighted.losses(got, sender, a)["generation"]
    from opencood_ext.models.warp import warp_to_ego
    target = warp_to_ego(sender, a.T_ego_from_sender, RANGE)
    assert base.item() == pytest.approx(generation_loss(got, target, a.valid).item())
    assert heavy.item() == pytest.approx(generation_loss(got, target, a.valid * (1 + 9 * objects)).item())
    assert heavy.item() != pytest.approx(base.item())
    with pytest.raises(RuntimeError, match="needs the arrival's object cells"):
        weighted.losses(got, sender, _arrival(2, C, H, W))
    with pytest.raises(ValueError, match="generation_object_weight and object_margin must be >= 0"):
        GenCommLink(C, ["m1"], RANGE, generation_object_weight=-1.0)


def test_a_stage1_training_step_fills_the_object_cells_only_when_asked():
    """A tiny GenComm stage-1 model (the registry contract's sizes) on two synthetic three-agent frames."""
    from opencood_ext.data.batch import collate_samples
    from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
    from opencood_ext.data.synthetic import SyntheticReader
    from opencood_ext.models.detector import CooperativeDetector
    from test_registry_contract import GENCOMM, RANGE as R, TYPES, VOXEL
    cfg = DataConfig(lidar_range=R, agent_types={"m1": AgentTypeData()})
    ds = CooperativeDataset(SyntheticReader(2, types=("m1", "m1", "m1")), cfg, {"m1": VOXEL}, train=False,
                            cooperation="all")
    batch = collate_samples([ds[0], ds[1]])
    torch.manual_seed(0)
    model = CooperativeDetector({"m1": TYPES["m1"]}, R, link={**GENCOMM, "type": "gencomm"}, fusion_op="max",
                                protocol="equalized")
    seen = []
    original = model.link.losses

    def spy(received, sender_features, arrival):
        seen.append(arrival.objects)
        return original(received, sender_features, arrival)

    model.link.losses = spy
    model.train()
    model.link.generation_object_weight, model.link.wants_objects = 0.0, False
    model(batch)
    model.link.generation_object_weight, model.link.wants_objects = 5.0, True
    out = model(batch)
    assert seen[0] is None
    cells = seen[1]
    assert cells is not None and cells.shape[1] == 1 and set(cells.unique().tolist()) <= {0.0, 1.0}
    assert cells.sum() > 0  # the tiny scene's vehicles cover some cells
    assert torch.isfinite(out.losses["generation"])


def test_protocol_reference_refuses_the_object_weight():
    link = GenCommLink(8, ["m1"], RANGE, message={"hidden_channels": 8}, generator={"base_channels": 8},
                       generation_object_weight=1.0)
    link.use_protocol("equalized")
    with pytest.raises(ValueError, match="generation_object_weight: protocol reference"):
        link.use_protocol("reference")
