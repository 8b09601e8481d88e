"""The feature cache of frozen encoder stacks (opencood_ext/models/feature_cache.py): a cached and an
uncached onboarding step give the same loss and gradients (LiDAR and camera types, the camera's depth
term included), the cache is keyed by the weights and the input (another checkpoint or changed data
is never served an old feature), trainable or train-mode stacks and an augmented ego are never
served, and evaluation through the cache detects what it detects without one.

Tiny models: m1 (PointPillars, the ego), m2 (LSS camera with depth) and m3 (PointPillars) on a
24 x 24 grid, GenComm's link; synthetic frames."""
import copy
import errno

import pytest
import torch

import gencomm  # noqa: F401  (registers GenComm's link)
from opencood_ext.data.batch import collate_samples
from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.data.synthetic import SyntheticReader
from opencood_ext.models.detector import CooperativeDetector
from opencood_ext.models.feature_cache import FeatureCache, agent_slice, frozen, input_digests
from opencood_ext.training.freeze import FreezePolicy

from test_registry_contract import BACKBONE, GENCOMM, RANGE, VOXEL  # the contract's tiny sizes

TYPES = {"m1": {"encoder": {"type": "pointpillars", "voxel_size": list(VOXEL), "num_filters": [8]},
                "backbone": BACKBONE, "shrink_channels": 8},
         "m2": {"encoder": {"type": "lss", "voxel_size": list(VOXEL), "channels": [8, 8, 8],
                            "depth_bins": [1.0, 40.0, 3.0], "context_channels": 8},
                "backbone": BACKBONE, "shrink_channels": 8},
         "m3": {"encoder": {"type": "pointpillars", "voxel_size": list(VOXEL), "num_filters": [16]},
                "backbone": BACKBONE, "shrink_channels": 8}}
DATA = {"m1": AgentTypeData(), "m2": AgentTypeData(sensor="camera", image_size=[48, 64], use_depth=True),
        "m3": AgentTypeData()}


def _model() -> CooperativeDetector:
    torch.manual_seed(0)
    return CooperativeDetector(TYPES, RANGE, link=GENCOMM, fusion_op="max", score_threshold=0.01)


def _batch(seed: int = 0, frames=(0, 1), augment: bool = True):
    cfg = DataConfig(lidar_range=RANGE, agent_types=DATA)
    cfg.augment.enabled = augment
    reader = SyntheticReader(max(frames) + 1, types=("m1", "m2", "m3"))
    ds = CooperativeDataset(reader, cfg, {t: VOXEL for t in TYPES}, train=True, cooperation="all")
    torch.manual_seed(seed)
    return collate_samples([ds[i] for i in frames])


def _onboarding(model: CooperativeDetector) -> CooperativeDetector:
    """Stage 2 as GenComm runs it: only m3's message extractor trains, frozen BatchNorm in eval mode."""
    model = copy.deepcopy(model).train()
    FreezePolicy(["link.dme.m3"], freeze_batchnorm_stats=True).apply(model)
    return model


def _step(model, batch):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(7)  # the diffusion draws the same noise on every path
    loss = model.loss(model(batch), batch)
    loss.total.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss, grads


def test_cached_and_uncached_onboarding_steps_agree(tmp_path):
    torch.set_num_threads(1)
    base = _onboarding(_model())
    batch = _batch()
    want, want_grads = _step(base, batch)
    assert want_grads and "depth_m2" in want.parts

    cached = copy.deepcopy(base)
    cached.feature_cache = cache = FeatureCache(tmp_path / "features")
    cold, cold_grads = _step(cached, batch)  # fills the cache
    assert cache.stats.misses == 4 and cache.stats.hits == 0  # m2, m3 of two samples; the m1 egos never
    assert cache.stats.skipped == 2
    warm, warm_grads = _step(cached, batch)  # served from it
    assert cache.stats.hits == 4 and cache.stats.misses == 4
    for got, grads in ((cold, cold_grads), (warm, warm_grads)):
        assert set(got.parts) == set(want.parts)
        for k in want.parts:
            torch.testing.assert_close(got.parts[k], want.parts[k], rtol=1e-5, atol=1e-6)
        assert set(grads) == set(want_grads)
        for k in want_grads:
            torch.testing.assert_close(grads[k], want_grads[k], rtol=1e-4, atol=1e-6)


def test_another_checkpoint_or_changed_data_is_never_served_an_old_feature(tmp_path):
    torch.set_num_threads(1)
    model = _onboarding(_model())
    model.feature_cache = cache = FeatureCache(tmp_path / "features")
    batch = _batch()
    _step(model, batch)
    assert cache.stats.misses == 4
    # another checkpoint: one frozen weight of m3's stack differs
    with torch.no_grad():
        next(model.encoders["m3"].parameters()).add_(0.01)
    _step(model, batch)
    assert (cache.stats.hits, cache.stats.misses) == (2, 6)  # m2 served, m3 encoded again
    uncached = copy.deepcopy(model)
    uncached.feature_cache = None
    want, _ = _step(uncached, batch)
    got, _ = _step(model, batch)
    torch.testing.assert_close(got.total, want.total, rtol=1e-5, atol=1e-6)
    # changed data: another frame in the second sample
    hits = cache.stats.hits
    _step(model, _batch(frames=(0, 2)))
    assert cache.stats.hits == hits + 2  # only the first sample's m2 and m3 repeat
    assert len(list((tmp_path / "features").rglob("*.pt"))) == cache.stats.misses


def test_trainable_or_train_mode_stacks_and_augmented_egos_are_never_cached(tmp_path):
    model = _model().train()
    assert not any(frozen(s) for s in model.encoders.values())  # stage 1: everything trains
    with torch.no_grad():
        assert not any(frozen(s) for s in model.encoders.values())  # BatchNorm in training mode
        assert all(frozen(s) for s in copy.deepcopy(model).eval().encoders.values())  # evaluation
    model.feature_cache = cache = FeatureCache(tmp_path / "features")
    _step(model, _batch())
    assert (cache.stats.hits, cache.stats.misses, cache.stats.skipped) == (0, 0, 0)
    backalign = copy.deepcopy(model)  # BackAlign trains the new type's whole stack
    FreezePolicy(["encoders.m3"], freeze_batchnorm_stats=True).apply(backalign)
    assert [t for t, s in backalign.encoders.items() if frozen(s)] == ["m1", "m2"]
    no_freeze = copy.deepcopy(model)  # frozen weights but BatchNorm still in train mode: batch statistics
    FreezePolicy(["link.dme.m3"], freeze_batchnorm_stats=False).apply(no_freeze)
    assert not any(frozen(s) for s in no_freeze.encoders.values())


def test_evaluation_through_the_cache_detects_the_same(tmp_path):
    torch.set_num_threads(1)
    model = _model().eval()
    batch = _batch(augment=False)
    torch.manual_seed(3)
    want = model.predict(batch).detections
    model.feature_cache = cache = FeatureCache(tmp_path / "features")
    for _ in range(2):  # cold, then every agent (egos too: no augmentation in evaluation) served
        torch.manual_seed(3)
        got = model.predict(batch).detections
        for g, w in zip(got, want):
            assert len(g.boxes) == len(w.boxes) > 0
            torch.testing.assert_close(g.boxes, w.boxes, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(g.scores, w.scores, rtol=1e-4, atol=1e-5)
    assert cache.stats.misses == 6 and cache.stats.hits == 6


def test_agent_slices_and_digests():
    batch = _batch()
    lidar = batch.inputs["m1"] if batch.inputs["m1"].num_agents > 1 else batch.inputs["m3"]
    both = input_digests(lidar)
    assert len(set(both)) == lidar.num_agents
    for a in range(lidar.num_agents):
        assert input_digests(agent_slice(lidar, [a])) == [both[a]]
    assert input_digests(agent_slice(lidar, list(range(lidar.num_agents))[::-1])) == both[::-1]
    cam = batch.inputs["m2"]
    assert input_digests(agent_slice(cam, [1])) == [input_digests(cam)[1]]
    changed = copy.deepcopy(cam)
    changed.depth[0, 0, 0, 0] += 1.0  # the depth supervision is part of the input
    assert input_digests(changed)[0] != input_digests(cam)[0]


def test_an_unreadable_entry_names_its_file(tmp_path):
    model = _model().eval()
    model.feature_cache = FeatureCache(tmp_path / "features")
    batch = _batch(augment=False)
    with torch.no_grad():
        model.predict(batch)
    victim = sorted((tmp_path / "features").rglob("*.pt"))[0]
    victim.write_bytes(b"torn")
    with pytest.raises(RuntimeError, match=victim.name):
        with torch.no_grad():
            model.predict(batch)


def test_the_tools_give_the_same_results_through_the_cache(tmp_path):
    """gencomm-infer and gencomm-onboard with --feature_cache: the same AP and the same onboarding losses
    as without; a second evaluation is served from the cache (no new entry)."""
    import json

    from opencood_ext.cli import inference, onboard
    from tiny_runs import gencomm_stage1_runs

    runs = gencomm_stage1_runs(tmp_path / "stage1")
    cache = tmp_path / "features"
    logs = {}
    for name, extra in (("plain", []), ("cached", ["--feature_cache", str(cache)])):
        out = tmp_path / name
        assert onboard.main(["--ego", str(runs["m1"]), "--new", str(runs["m3"]), "-o", str(out), "--epochs", "2",
                             "--set", "train.val_every=0", *extra]) == 0
        logs[name] = [json.loads(line)["loss"] for line in (out / "train_log.jsonl").read_text().splitlines()
                      if json.loads(line)["kind"] == "step"]
    assert len(logs["cached"]) == len(logs["plain"]) > 2
    for a, b in zip(logs["cached"], logs["plain"]):
        assert abs(a - b) <= 1e-4 * max(1.0, abs(b))
    stored = len(list(cache.rglob("*.pt")))
    assert stored > 0  # the m3 collaborators' features (the augmented m1 egos are never kept)

    results = {}
    for name, extra in (("plain", []), ("cold", ["--feature_cache", str(cache)]), ("warm", ["--feature_cache", str(cache)])):
        assert inference.main(["--model_dir", str(tmp_path / "cached"), "--label", name, "--plot_every", "0",
                               *extra]) == 0
        results[name] = json.loads((tmp_path / "cached" / f"eval_{name}.json").read_text())["ap"]["global"]
        if name == "cold":
            after_cold = len(list(cache.rglob("*.pt")))
    assert after_cold > stored  # evaluation keeps the egos too (no augmentation)
    assert len(list(cache.rglob("*.pt"))) == after_cold  # the warm pass computed nothing new
    for name in ("cold", "warm"):
        for thr, ap in results["plain"].items():
            assert abs(results[name][thr] - ap) <= 1e-6, (name, thr)


def test_a_full_disk_is_named_as_such_and_leaves_no_torn_file(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    from opencood_ext.models import feature_cache as fc
    cache = FeatureCache(tmp_path / "cache")
    path = tmp_path / "cache" / "stack" / "input.pt"

    def torn(entry, f):  # what torch.save raises when the disk fills mid-write
        f.write(b"partial")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    monkeypatch.setattr(fc.torch, "save", torn)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10 * 2**30, 10 * 2**30 - 2**20, 2**20))
    with pytest.raises(OSError, match=r"feature cache .*cache: writing input.pt failed .* 1 MiB free .*the disk is "
                                      r"full.*--no_feature_cache") as err:
        cache._write(path, {"feats": torch.zeros(2)})
    assert err.value.errno == errno.ENOSPC
    assert list(path.parent.iterdir()) == []  # the torn temporary file is gone
    # with room on the disk the failure is something else: reported as it is
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10 * 2**30, 2**30, 9 * 2**30))
    with pytest.raises(RuntimeError, match="unexpected pos"):
        cache._write(path, {"feats": torch.zeros(2)})
    assert list(path.parent.iterdir()) == []
