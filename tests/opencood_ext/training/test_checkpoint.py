"""Checkpoint files: atomic writes, field checks, RNG capture, model-weight loading."""
import os
import random

import numpy as np
import pytest
import torch
from torch import nn

from opencood_ext.training import checkpoint as C
from opencood_ext.training.checkpoint import (CheckpointError, CheckpointPaths, atomic_write_bytes, capture_rng_state,
                                         load_checkpoint, load_model_state, restore_rng_state, save_checkpoint)


def _full_state(**over):
    state = {k: None for k in C.CHECKPOINT_KEYS}
    state.update(format_version=1, model={"w": torch.arange(3.0)}, epoch=2, step_in_epoch=0, global_step=10,
                 history=[], rng=[], world_size=1, batch_size=2, config={})
    state.update(over)
    return state


def test_save_load_round_trip_to_several_paths(tmp_path):
    paths = [tmp_path / "c" / "a.pth", tmp_path / "c" / "b.pth"]
    save_checkpoint(_full_state(), paths)
    for p in paths:
        st = load_checkpoint(p)
        assert st["epoch"] == 2 and torch.equal(st["model"]["w"], torch.arange(3.0))
    assert sorted(os.listdir(tmp_path / "c")) == ["a.pth", "b.pth"]  # no temporary files left
    mode = (tmp_path / "c" / "a.pth").stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask


def test_failed_write_keeps_old_file_and_leaves_no_tmp(tmp_path, monkeypatch):
    target = tmp_path / "latest.pth"
    atomic_write_bytes(target, b"old contents")

    def exploding_replace(src, dst):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(C.os, "replace", exploding_replace)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_bytes(target, b"new contents that never land")
    assert target.read_bytes() == b"old contents"
    assert os.listdir(tmp_path) == ["latest.pth"]


def test_missing_field_and_corrupt_file_name_the_file(tmp_path):
    p = tmp_path / "x.pth"
    state = _full_state()
    del state["optimizer"], state["rng"]
    torch.save(state, p)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(p)
    assert str(p) in str(err.value) and "optimizer" in str(err.value) and "rng" in str(err.value)

    bad = tmp_path / "torn.pth"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(CheckpointError, match="torn.pth"):
        load_checkpoint(bad)
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "absent.pth")
    torch.save(_full_state(format_version=99), p)
    with pytest.raises(CheckpointError, match="format_version"):
        load_checkpoint(p)


def test_rng_capture_restore_reproduces_draws():
    state = capture_rng_state()
    a = (random.random(), np.random.rand(), torch.rand(3))
    random.random(), np.random.rand(), torch.rand(5)  # move on
    restore_rng_state(state)
    b = (random.random(), np.random.rand(), torch.rand(3))
    assert a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])


class _Two(nn.Module):
    def __init__(self, width=3):
        super().__init__()
        self.enc = nn.Linear(2, width)
        self.head = nn.Linear(width, 1)


def test_load_model_state_full_prefix_map_and_errors(tmp_path):
    src = _Two()
    p = tmp_path / "src.pth"
    save_checkpoint(_full_state(model={"module." + k: v for k, v in src.state_dict().items()}), [p])

    dst = _Two()
    loaded = load_model_state(dst, p)  # "module." (DDP) prefixes are stripped
    assert set(loaded) == set(dst.state_dict())
    assert all(torch.equal(dst.state_dict()[k], v) for k, v in src.state_dict().items())

    part = _Two()
    head_before = {k: v.clone() for k, v in part.head.state_dict().items()}
    loaded = load_model_state(part, p, prefix_map={"enc.": "enc."})
    assert loaded == ["enc.bias", "enc.weight"]
    assert torch.equal(part.enc.weight, src.enc.weight)
    assert all(torch.equal(part.head.state_dict()[k], v) for k, v in head_before.items())

    with pytest.raises(CheckpointError, match="no key starting with 'encoder.'"):
        load_model_state(_Two(), p, prefix_map={"encoder.": "enc."})
    with pytest.raises(CheckpointError, match="shape"):
        load_model_state(_Two(width=4), p, prefix_map={"enc.": "enc."})
    with pytest.raises(CheckpointError, match="does not fit"):
        load_model_state(_Two(width=4), p)


def test_prune_epochs_keeps_newest(tmp_path):
    paths = CheckpointPaths(tmp_path)
    for n in (1, 2, 3, 10):
        save_checkpoint(_full_state(epoch=n), [paths.epoch(n)])
    assert list(paths.epoch_files()) == [1, 2, 3, 10]
    paths.prune_epochs(2)
    assert list(paths.epoch_files()) == [3, 10]
