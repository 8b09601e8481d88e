"""The FLOP counter counts spconv's sparse 3D convolutions (SECOND) by the site pairs they form."""
import itertools

import pytest
import torch

from opencood_ext.data.inputs import LidarInput
from opencood_ext.eval.flops import profile_flops, sparse_conv_pairs
from opencood_ext.models.second import SecondEncoder, spconv


def _sites(seed=0, n=60, size=7):
    g = torch.Generator().manual_seed(seed)
    pts = set()
    while len(pts) < n:
        pts.add((int(torch.randint(0, 2, (1,), generator=g)),
                 *torch.randint(0, size, (3,), generator=g).tolist()))
    return torch.tensor(sorted(pts), dtype=torch.int32)


def test_submanifold_pairs_are_every_active_neighbour():
    coords = _sites()
    active = {tuple(c.tolist()) for c in coords}
    brute = sum((c[0], *(a + d for a, d in zip(c[1:], off))) in active
                for c in active for off in itertools.product((-1, 0, 1), repeat=3))
    assert sparse_conv_pairs(coords, [7, 7, 7], (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), subm=True) == brute


@pytest.mark.parametrize("kernel,stride,padding",
                         [((3, 3, 3), (2, 2, 2), (1, 1, 1)), ((3, 1, 1), (2, 1, 1), (0, 0, 0))])
def test_strided_pairs_match_spconvs_rulebook(kernel, stride, padding):
    coords = _sites(1)
    conv = spconv.SparseConv3d(4, 8, kernel, stride=stride, padding=padding, bias=False, indice_key="k")
    out = conv(spconv.SparseConvTensor(torch.randn(len(coords), 4), coords, [7, 7, 7], 2))
    rulebook = int(out.indice_dict["k"].indice_pair_num.sum())
    assert sparse_conv_pairs(coords, [7, 7, 7], kernel, stride, padding, (1, 1, 1), subm=False) == rulebook
    rep = profile_flops(spconv.SparseSequential(conv), (spconv.SparseConvTensor(
        torch.randn(len(coords), 4), coords, [7, 7, 7], 2),))
    assert rep.by_type == {"SparseConv3d": rulebook * 4 * 8}


def test_second_encoder_cost_includes_its_sparse_backbone():
    torch.manual_seed(0)
    enc = SecondEncoder([-8.0, -8.0, -3.0, 8.0, 8.0, 1.0], voxel_size=(0.5, 0.5, 0.5), channels=(8, 8), blocks=(1, 1))
    coords = _sites(2, n=200, size=8)
    coords = torch.cat([torch.zeros(len(coords), 1, dtype=torch.int32), coords[:, 1:]], dim=1).unique(dim=0)
    inp = LidarInput(voxels=torch.randn(len(coords), 5, 4), num_points=torch.full((len(coords),), 5),
                     coords=coords, num_agents=1)
    rep = profile_flops(enc, (inp,))
    assert rep.by_type["SubMConv3d"] > 0 and rep.by_type["SparseConv3d"] > 0
