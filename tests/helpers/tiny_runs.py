"""Tiny experiment configs and a tiny OPV2V-format dataset for CLI-level tests."""
import json
from pathlib import Path

import yaml

from opencood_ext.data.formats import write_opv2v_frame
from opencood_ext.data.synthetic import make_frame

TINY = {
    "data": {"format": "opv2v", "lidar_range": [-32.0, -32.0, -3.0, 32.0, 32.0, 1.0], "max_agents": 3,
             "augment": {"enabled": True, "rotation_deg": 20.0}},
    "model": {"anchors": {"z_center": -1.0}},
    "train": {"epochs": 1, "batch_size": 2, "lr": 0.002, "log_every": 1, "progress_bar": False},
    "eval": {"split": "test", "plot_every": 1},
}
BACKBONE = {"layer_nums": [1, 1], "layer_strides": [2, 2], "num_filters": [8, 16],
            "upsample_strides": [1, 2], "num_upsample_filters": [8, 8]}


def stack(encoder):
    return {"encoder": encoder, "backbone": BACKBONE, "shrink_channels": 8}


PP = stack({"type": "pointpillars", "voxel_size": [0.8, 0.8, 4.0], "num_filters": [8]})
SECOND = stack({"type": "second", "voxel_size": [0.4, 0.4, 0.5], "channels": [8, 8], "blocks": [1, 1]})
GENCOMM = {"type": "gencomm", "message": {"hidden_channels": 8}, "generator": {"base_channels": 8}}


def tiny_dataset(root: Path) -> Path:
    """Seven synthetic frames written in the OPV2V layout (train 4, validate 1, test 2)."""
    for split, seeds in {"train": [0, 1, 2, 3], "validate": [4], "test": [5, 6]}.items():
        for s in seeds:
            f = make_frame(seed=s, scenario=f"scn_{s}", timestamp="000068")
            write_opv2v_frame(root, split, f, write_cameras=False)
    return root


def tiny_config(tmp_path, root, name, agent_types, model, modality="all:m1"):
    cfg = json.loads(json.dumps(TINY))
    cfg["name"] = name
    cfg["data"].update(root=str(root), modality=modality,
                       agent_types={t: {"sensor": "lidar", "lidar_beams": 64 if t == "m1" else 32}
                                    for t in agent_types})
    cfg["model"].update(model, agent_types=agent_types)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def one_step_gencomm_run(tmp: Path, name: str) -> Path:
    """A GenComm m1 run on a tiny dataset, trained one step through tools/train.py (a model the live
    demo can load; its weights do not matter). -> the run folder ``tmp/run``."""
    from opencood_ext.cli import train

    data = tiny_dataset(tmp / "data")
    cfg = tiny_config(tmp, data, name, {"m1": PP}, {"fusion": "intermediate", "link": GENCOMM})
    run = tmp / "run"
    assert train.main(["-y", str(cfg), "--model_dir", str(run), "--set", "train.max_steps_per_epoch=1"]) == 0
    return run


def gencomm_stage1_runs(tmp: Path) -> dict:
    """GenComm's homogeneous stage-1 runs m1 (PointPillars) and m3 (SECOND) on a tiny dataset, trained
    through tools/train.py: what every onboarding method starts from. -> {type: run folder}."""
    import torch

    from opencood_ext.cli import train

    torch.set_num_threads(1)
    data = tiny_dataset(tmp / "data")
    runs = {}
    for t, stack_ in (("m1", PP), ("m3", SECOND)):
        cfg = tiny_config(tmp, data, f"s1_{t}", {t: stack_}, {"fusion": "intermediate", "link": GENCOMM},
                          modality=f"all:{t}")
        runs[t] = tmp / f"s1_{t}"
        assert train.main(["-y", str(cfg), "--model_dir", str(runs[t]), "--set", "train.val_every=0"]) == 0
    return runs
