"""data.shuffle_points (the reference's per-scan shuffle, seeded): off keeps the file's order; on, a
voxel with at most max_points_per_voxel points keeps the same points, a fuller one keeps a
seed-dependent subset, and the same seed gives the same voxels. Unset, it follows the protocol:
on under protocol: reference, off otherwise; an explicit true / false wins."""
from pathlib import Path

import numpy as np
import torch

from opencood_ext.data.augment import AugmentConfig
from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.data.synthetic import make_frame

RANGE = (-32.0, -32.0, -3.0, 32.0, 32.0, 1.0)


def _voxels(shuffle, seed=0, cap=4):
    cfg = DataConfig(lidar_range=RANGE, augment=AugmentConfig(enabled=False), shuffle_points=shuffle,
                     agent_types={"m1": AgentTypeData(max_points_per_voxel=cap, max_voxels=100000)})
    ds = CooperativeDataset([make_frame(seed=3, num_agents=2)], cfg, {"m1": (0.8, 0.8, 4.0)}, train=False, seed=seed)
    return [a.voxels for a in ds[0].agents]


def _by_cell(v):
    """{(z, y, x): sorted tuple of the kept points' rows}."""
    out = {}
    for k in range(len(v.coords)):
        rows = v.voxels[k, : int(v.num_points[k])].numpy()
        out[tuple(v.coords[k].tolist())] = tuple(sorted(map(tuple, rows.round(5))))
    return out


def test_shuffle_keeps_unfilled_voxels_and_resamples_full_ones():
    plain, a, b, a_again = _voxels(False), _voxels(True, 1), _voxels(True, 2), _voxels(True, 1)
    for p, x, y, x2 in zip(plain, a, b, a_again):
        cp, ca, cb = _by_cell(p), _by_cell(x), _by_cell(y)
        assert set(cp) == set(ca) == set(cb)  # far below max_voxels: the same cells
        torch.testing.assert_close(x.voxels, x2.voxels)  # same seed, same tensors
        full = {c for c in cp if len(cp[c]) == 4}
        assert full and all(cp[c] == ca[c] == cb[c] for c in cp if c not in full)
        assert any(ca[c] != cb[c] for c in full)
    # off: the file's order, what the voxeliser makes of the raw scan
    again = _voxels(False, seed=5)
    for p, q in zip(plain, again):
        torch.testing.assert_close(p.voxels, q.voxels)
        assert np.array_equal(p.coords.numpy(), q.coords.numpy())


def _dataset(protocol, shuffle):
    cfg = DataConfig(lidar_range=RANGE, augment=AugmentConfig(enabled=False), shuffle_points=shuffle,
                     agent_types={"m1": AgentTypeData(max_points_per_voxel=4, max_voxels=100000)})
    return CooperativeDataset([make_frame(seed=3, num_agents=2)], cfg, {"m1": (0.8, 0.8, 4.0)}, train=False,
                              protocol=protocol)


def _same(a, b):
    return all(torch.equal(x.voxels.voxels, y.voxels.voxels) for x, y in zip(a.agents, b.agents))


def test_default_follows_the_protocol_and_an_explicit_value_wins():
    """Unset, data.shuffle_points is on under protocol: reference (the reference shuffles every scan) and
    off otherwise; true / false override it under either protocol."""
    assert DataConfig().shuffle_points is None
    rules = {(p, s): _dataset(p, s) for p in ("native", "reference") for s in (None, True, False)}
    assert {k: ds.shuffle_points for k, ds in rules.items()} == {
        ("native", None): False, ("native", True): True, ("native", False): False,
        ("reference", None): True, ("reference", True): True, ("reference", False): False}
    sample = {k: ds[0] for k, ds in rules.items()}
    for p in ("native", "reference"):  # the default equals its rule's explicit value, and differs from the other
        on, off = sample[(p, True)], sample[(p, False)]
        assert not _same(on, off)
        assert _same(sample[(p, None)], on if p == "reference" else off)


def test_an_experiment_under_protocol_reference_shuffles_unless_told_not_to(monkeypatch):
    """configs/opv2v_h (protocol: reference, data.shuffle_points unset) builds a dataset that shuffles;
    data.shuffle_points=false, or protocol: native, one that keeps the file's order."""
    from opencood_ext import experiment

    monkeypatch.setattr(experiment, "get_reader", lambda *a, **k: [make_frame(seed=3, num_agents=2)])
    path = Path(__file__).parents[3] / "configs" / "opv2v_h" / "gencomm_stage1_m1.yaml"
    got = {}
    for extra in ([], ["data.shuffle_points=false"], ["protocol=native"], ["protocol=native", "data.shuffle_points=true"]):
        cfg = experiment.load_experiment(path, extra)
        got[tuple(extra)] = (cfg.protocol, cfg.data.shuffle_points,
                             experiment.build_dataset(cfg, "test", train=False).shuffle_points)
    assert got == {(): ("reference", None, True), ("data.shuffle_points=false",): ("reference", False, False),
                   ("protocol=native",): ("native", None, False),
                   ("protocol=native", "data.shuffle_points=true"): ("native", True, True)}
