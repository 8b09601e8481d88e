"""Opening a checkpoint never runs code: every entry point loads with weights_only and refuses a
file that asks for anything but tensors and plain types; format-1 files (numpy RNG state) still load."""
import os
import random

import numpy as np
import pytest
import torch

from opencood_ext.training import TrainConfig, Trainer
from opencood_ext.training import checkpoint as C
from opencood_ext.training.checkpoint import (CheckpointError, UnsafeCheckpointError, capture_rng_state,
                                              load_checkpoint, load_model_state, restore_rng_state)
from toy_training import ToyDataset, ToyModel, collate

pytestmark = pytest.mark.usefixtures("one_thread")


class _Payload:
    """Unpickling this calls os.mkdir(marker): the stand-in for arbitrary code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def _state(**over):
    state = {k: None for k in C.CHECKPOINT_KEYS}
    state.update(format_version=C.FORMAT_VERSION, model=ToyModel().state_dict(), epoch=1, step_in_epoch=0,
                 global_step=4, history=[], rng=[capture_rng_state()], world_size=1, batch_size=4, config={})
    state.update(over)
    return state


def _malicious(path, marker):
    state = _state()
    state["model"] = dict(state["model"], evil=_Payload(marker))
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    return path


def test_the_payload_is_real(tmp_path):
    """Control: an unrestricted torch.load of the same kind of file does run the payload."""
    marker = tmp_path / "ran"
    path = _malicious(tmp_path / "evil.pth", marker)
    torch.load(path, weights_only=False)
    assert marker.is_dir()


def test_every_entry_point_refuses_a_malicious_checkpoint(tmp_path, caplog):
    marker = tmp_path / "payload_ran"
    path = _malicious(tmp_path / "run" / "checkpoints" / "latest.pth", marker)
    with pytest.raises(UnsafeCheckpointError) as err:
        load_checkpoint(path)
    msg = str(err.value)
    assert str(path) in msg and "mkdir" in msg and "nothing in it was executed" in msg and "\n" not in msg
    with pytest.raises(UnsafeCheckpointError, match="latest.pth"):
        load_model_state(ToyModel(), path)
    trainer = Trainer(ToyModel(), ToyDataset(8), None, collate,
                      TrainConfig(epochs=1, batch_size=4, progress_bar=False), tmp_path / "run", device="cpu")
    with pytest.raises(UnsafeCheckpointError, match="latest.pth"):
        trainer.fit()
    assert not marker.exists()
    assert isinstance(err.value, CheckpointError)


def test_new_checkpoints_are_tensors_and_plain_types_only(tmp_path):
    path = tmp_path / "c.pth"
    C.save_checkpoint(_state(), [path])
    assert torch.serialization.get_unsafe_globals_in_checkpoint(path) == []
    raw = torch.load(path, weights_only=True)  # no allow-list at all
    assert raw["format_version"] == 2 and isinstance(raw["rng"][0]["numpy"]["key"], torch.Tensor)


def test_format_1_checkpoint_with_numpy_rng_state_still_loads_and_resumes(tmp_path):
    """Today's (format 1) files hold np.random.get_state(); they load without unpickling anything
    else, their RNG state restores the same draws, and the trainer resumes from them."""
    cfg = TrainConfig(epochs=1, batch_size=4, progress_bar=False)
    Trainer(ToyModel(), ToyDataset(8), None, collate, cfg, tmp_path / "run", device="cpu").fit()
    path = tmp_path / "run" / "checkpoints" / "latest.pth"
    state = torch.load(path, weights_only=True)
    random.seed(5), np.random.seed(5), torch.manual_seed(5)
    state["rng"] = [{"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}]
    expect = (random.random(), np.random.rand(), torch.rand(2))
    state["format_version"] = 1
    torch.save(state, path)
    assert "numpy.ndarray" in torch.serialization.get_unsafe_globals_in_checkpoint(path)
    loaded = load_checkpoint(path)
    np.random.seed(0)
    restore_rng_state(loaded["rng"][0])
    got = (random.random(), np.random.rand(), torch.rand(2))
    assert got[0] == expect[0] and got[1] == expect[1] and torch.equal(got[2], expect[2])
    result = Trainer(ToyModel(), ToyDataset(8), None, collate, TrainConfig(epochs=2, batch_size=4, progress_bar=False),
                     tmp_path / "run", device="cpu").fit()
    assert result.epochs_done == 2 and result.global_step == 4


def test_a_format_1_file_with_other_numpy_objects_is_still_refused(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "x.pth"
    state = _state(format_version=1, rng=[{"numpy": np.random.get_state()}])
    state["history"] = [_Payload(marker)]
    torch.save(state, path)
    with pytest.raises(UnsafeCheckpointError, match="x.pth"):
        load_checkpoint(path)
    assert not marker.exists()


def test_a_torchscript_archive_is_refused_before_torch_load_sees_it(tmp_path, monkeypatch):
    """torch.load would hand a TorchScript archive to torch.jit.load (with a warning) or, safely, refuse it
    with advice to retry with weights_only=False: it is recognised first and refused by what it is."""
    import warnings

    from opencood_ext.models.feature_cache import FeatureCache
    path = tmp_path / "program.pth"
    torch.jit.script(torch.nn.Linear(2, 2)).save(str(path))
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load was called"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for load in (load_checkpoint, lambda p: load_model_state(ToyModel(), p), lambda p: C.safe_torch_load(p, "cpu")):
            with pytest.raises(UnsafeCheckpointError) as err:
                load(path)
            msg = str(err.value)
            assert msg.startswith(f"{path}: refused to open: a TorchScript archive") and "\n" not in msg
            assert "weights_only" not in msg and "jit.load" not in msg
        with pytest.raises(RuntimeError, match="TorchScript archive") as err:
            FeatureCache(tmp_path / "cache")._read(path)
        assert "weights_only" not in str(err.value)


def test_torch_advice_is_taken_out_of_any_load_error():
    from opencood_ext.torch_files import without_unsafe_advice
    torch_text = ("Cannot use ``weights_only=True`` with TorchScript archives passed to ``torch.load``. In PyTorch "
                  "2.6, we changed the default value of the `weights_only` argument. Re-running `torch.load` with "
                  "`weights_only` set to `False` will likely succeed, but it can result in arbitrary code execution. "
                  "Do it only if you got the file from a trusted source.")
    assert without_unsafe_advice(torch_text) == "the safe loader refused it"
    assert without_unsafe_advice("not a ZIP archive. Re-run with weights_only=False.") == "not a ZIP archive."
