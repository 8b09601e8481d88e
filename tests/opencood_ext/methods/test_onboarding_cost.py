"""The onboarding methods' cost hook: trainable parameters and GFLOPs of what trains for a
new type. The default profiles a real forward pass and counts only the trainable modules'
layers, per agent of the type; on GenComm it equals the message extractor profiled alone."""
import pytest
import torch

from opencood_ext.data.batch import collate_samples
from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.methods import ONBOARDING
from opencood_ext.methods.base import feature_map_cost
from opencood_ext.models.detector import CooperativeDetector
import gencomm  # noqa: F401  (registers GenComm's link and onboarding method)
from opencood_ext.data.synthetic import SyntheticReader

torch.set_num_threads(1)
RANGE = (-32.0, -32.0, -3.0, 32.0, 32.0, 1.0)


def _pp(filters):
    return {"encoder": {"type": "pointpillars", "voxel_size": [0.8, 0.8, 4.0], "num_filters": [filters]},
            "backbone": {"layer_nums": [1], "layer_strides": [2], "num_filters": [8], "upsample_strides": [1],
                         "num_upsample_filters": [8]}, "shrink_channels": 8}


@pytest.mark.parametrize("types", [("m1", "m3", "m1"), ("m1", "m3", "m3")])
def test_default_cost_is_the_dme_per_agent_of_the_type(types):
    torch.manual_seed(0)
    model = CooperativeDetector({"m1": _pp(8), "m3": _pp(6)}, RANGE, fusion="intermediate", fusion_op="max",
                                link={"type": "gencomm", "message": {"hidden_channels": 8},
                                      "generator": {"base_channels": 8}})
    cfg = DataConfig(lidar_range=RANGE, agent_types={"m1": AgentTypeData(), "m3": AgentTypeData()})
    ds = CooperativeDataset(SyntheticReader(1, types=types), cfg, model.voxel_sizes(), train=False)
    batch = collate_samples([ds[0]])
    model.train()
    params, gflops = ONBOARDING.get_class("gencomm")().cost(model, "m3", batch)
    want_params, want_gflops = feature_map_cost(model, ["link.dme.m3"])  # the DME alone on one feature map
    assert params == want_params and gflops == pytest.approx(want_gflops, rel=1e-9) and gflops > 0
    assert model.training  # the model's mode is restored
    with pytest.raises(ValueError, match="name no module"):
        ONBOARDING.get_class("gencomm")().cost(model, "m4", batch)
    m1_only = collate_samples([CooperativeDataset(SyntheticReader(1), cfg, model.voxel_sizes(), train=False)[0]])
    with pytest.raises(ValueError, match="no agent of that type"):
        ONBOARDING.get_class("gencomm")().cost(model, "m3", m1_only)

