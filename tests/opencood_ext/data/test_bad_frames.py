"""Bad frames: every data error names its file and is one skip_bad_frames can skip, and a
skipped frame is left out, not replaced by another (which then appeared twice an epoch)."""
import json
import logging
import sys
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from opencood_ext.data.batch import collate_samples
from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.data.errors import DataFormatError
from opencood_ext.data.formats import DairV2XReader, OPV2VReader, V2XRealReader
from opencood_ext.data.formats.v2xreal import read_bin
from opencood_ext.training.checkpoint import load_checkpoint
from test_dairv2x_reader import make_dair
from test_v2xreal_reader import SCEN, make_v2xreal
from tiny_runs import PP, tiny_config, tiny_dataset

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))

import inference  # noqa: E402
import train  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
RANGE = (-32.0, -32.0, -3.0, 32.0, 32.0, 1.0)
VOXELS = {"m1": (0.8, 0.8, 4.0), "m3": (0.8, 0.8, 4.0)}


def _dataset(root, split="train", beams=64, skip=False):
    cfg = DataConfig(root=str(root), modality="all:m1", lidar_range=RANGE, skip_bad_frames=skip,
                     agent_types={"m1": AgentTypeData(lidar_beams=beams)})
    reader = OPV2VReader(root, split, load_cameras=False, load_beams=beams != 64, skip_bad=skip)
    return CooperativeDataset(reader, cfg, VOXELS, train=False)


def test_non_utf8_opv2v_yaml_names_the_file_and_is_skipped(tmp_path):
    root = tiny_dataset(tmp_path / "data")
    bad = root / "train" / "scn_1" / "20" / "000068.yaml"
    bad.write_bytes(bad.read_bytes().replace(b"lidar_pose", b"lidar_p\xf6se", 1))
    with pytest.raises(DataFormatError) as err:
        OPV2VReader(root, "train", load_cameras=False)[1]
    assert str(bad) in str(err.value) and "not UTF-8" in str(err.value) and "0xf6" in str(err.value)
    assert [f.scenario for f in OPV2VReader(root, "train", load_cameras=False, skip_bad=True)] == \
        ["scn_0", "scn_2", "scn_3"]


def test_non_utf8_dair_json_names_the_file_and_is_skipped(tmp_path):
    root = make_dair(tmp_path / "dair")
    label = root / "cooperative" / "label_world" / "000011.json"
    label.write_bytes(label.read_bytes().replace(b"Car", b"C\xe4r", 1))
    with pytest.raises(DataFormatError) as err:
        DairV2XReader(root)[1]
    assert str(label) in str(err.value) and "not UTF-8" in str(err.value)
    assert [f.timestamp for f in DairV2XReader(root, skip_bad=True)] == ["000010"]
    (root / "cooperative" / "data_info.json").write_bytes(b"[\xff]")
    with pytest.raises(DataFormatError, match="data_info.json: not UTF-8"):
        DairV2XReader(root)


def test_missing_reduced_beam_scan_names_the_file_and_is_skipped(tmp_path, caplog):
    root = tiny_dataset(tmp_path / "data")
    (root / "train" / "scn_2" / "20" / "000068_32.pcd").unlink()
    with pytest.raises(DataFormatError) as err:
        _dataset(root, beams=32)[2]
    msg = str(err.value)
    assert str(root / "train" / "scn_2") in msg and "20/000068_32.pcd" in msg and "[agent 20]" in msg
    ds = _dataset(root, beams=32, skip=True)
    with caplog.at_level(logging.WARNING):
        assert ds[2] is None and ds[2] is None
    assert ds.skipped == {2} and caplog.text.count("skipping bad frame 2") == 1


def _corrupt_frames(root, split, scenarios):
    for s in scenarios:
        pcd = root / split / s / "10" / "000068.pcd"
        pcd.write_bytes(pcd.read_bytes()[:-10])  # truncated binary body


def test_a_skipped_frame_is_left_out_not_replaced(tmp_path):
    root = tiny_dataset(tmp_path / "data")
    _corrupt_frames(root, "train", ["scn_1"])
    ds = _dataset(root, skip=True)
    for batch_size in (1, 2, 3):
        seen = []
        for batch in DataLoader(ds, batch_size=batch_size, collate_fn=collate_samples):
            if batch is not None:
                seen += batch.scenarios
        assert seen == ["scn_0", "scn_2", "scn_3"], batch_size  # each good frame once, the bad one never
    # a batch of bad frames only collates to None
    _corrupt_frames(root, "train", ["scn_0"])
    ds = _dataset(root, skip=True)
    assert collate_samples([ds[0], ds[1]]) is None


def test_training_and_evaluation_leave_bad_frames_out(tmp_path, capsys):
    root = tiny_dataset(tmp_path / "data")
    _corrupt_frames(root, "train", ["scn_1", "scn_2"])  # batch 2 of [0, 1, 2, 3] unshuffled is all bad
    _corrupt_frames(root, "test", ["scn_5"])
    cfg = tiny_config(tmp_path, root, "skip", {"m1": PP}, {"fusion": "none"})
    run = tmp_path / "run"
    assert train.main(["-y", str(cfg), "--model_dir", str(run), "--set", "data.skip_bad_frames=true",
                       "--set", "train.shuffle=false", "--set", "train.batch_size=1", "--set", "train.epochs=1"]) == 0
    latest = load_checkpoint(run / "checkpoints" / "latest.pth")
    assert latest["history"][0]["steps"] == 4 and latest["global_step"] == 2  # 2 good frames, 2 left out
    assert inference.main(["--model_dir", str(run), "--plot_every", "0"]) == 0
    assert json.loads((run / "eval_none.json").read_text())["frames"] == 1  # of 2 test frames
    capsys.readouterr()


def test_v2xreal_bin_cut_by_15_bytes_is_refused_with_its_true_size(tmp_path):
    root = make_v2xreal(tmp_path)
    path = root / "train" / SCEN / "2" / "000000.bin"
    whole = path.read_bytes()
    path.write_bytes(whole[:-15])
    with pytest.raises(DataFormatError) as err:
        read_bin(path)
    msg = str(err.value)
    assert str(path) in msg and f"size {len(whole) - 15} bytes" in msg and "16-byte" in msg
    with pytest.raises(DataFormatError, match="000000.bin"):
        V2XRealReader(root, "train")[0]
    path.write_bytes(whole)
    assert read_bin(path).shape[1] == 4  # the whole file reads
