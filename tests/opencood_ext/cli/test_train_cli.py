"""End to end on a tiny OPV2V-format dataset written from synthetic frames:
train.py (new run and resume), inference.py, onboard.py (GenComm stage 2)."""
import json
import sys
from pathlib import Path

import pytest
import torch

from opencood_ext.models.second import SPCONV_CPU_ONLY
from tiny_runs import GENCOMM, PP, SECOND, tiny_config as _config, tiny_dataset

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))

import inference  # noqa: E402
import onboard  # noqa: E402
import train  # noqa: E402

@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return tiny_dataset(tmp_path_factory.mktemp("tiny_opv2v"))


def test_train_resume_and_inference(dataset, tmp_path, capsys):
    torch.set_num_threads(1)
    cfg = _config(tmp_path, dataset, "tiny_inter", {"m1": PP},
                  {"fusion": "intermediate", "link": {"type": "full_feature"}})
    run = tmp_path / "run"
    assert train.main(["-y", str(cfg), "--model_dir", str(run)]) == 0
    assert (run / "config.yaml").exists() and (run / "checkpoints" / "latest.pth").exists()
    # resume: one more epoch on the same folder continues from epoch 1
    assert train.main(["--model_dir", str(run), "--set", "train.epochs=2"]) == 0
    epochs = [json.loads(ln)["epoch"] for ln in (run / "train_log.jsonl").read_text().splitlines()
              if json.loads(ln)["kind"] == "epoch"]
    assert epochs == [1, 2]
    capsys.readouterr()
    assert inference.main(["--model_dir", str(run), "--max_frames", "2"]) == 0
    out = capsys.readouterr().out
    assert "AP@0.5" in out and "global" in out and "per_frame" in out
    res = json.loads((run / "eval_intermediate.json").read_text())
    assert res["frames"] == 2 and res["bytes_per_message"] > 8 * 40 * 40 * 4
    assert list((run / "bev").glob("*.png"))
    # the same weights as no fusion and late fusion
    assert inference.main(["--model_dir", str(run), "--fusion_method", "no", "--max_frames", "1"]) == 0
    assert json.loads((run / "eval_none.json").read_text())["bytes_per_message"] == 0
    assert inference.main(["--model_dir", str(run), "--fusion_method", "late", "--max_frames", "1"]) == 0


def test_bad_config_is_reported(dataset, tmp_path, capsys):
    cfg = _config(tmp_path, dataset, "bad", {"m1": PP}, {"fusion": "intermediate", "lnk": {}})
    capsys.readouterr()
    assert train.main(["-y", str(cfg), "--model_dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "lnk" in err and "did you mean 'link'" in err and "Traceback" not in err
    assert train.main(["--set", "train.epochs=1"]) == 2


@pytest.mark.skipif(torch.cuda.is_available() and SPCONV_CPU_ONLY,
                    reason="the trainer would put SECOND on CUDA, and this spconv is a CPU-only build")
def test_gencomm_stage1_then_onboarding(dataset, tmp_path, capsys):
    torch.set_num_threads(1)
    runs = {}
    for t, stack in (("m1", PP), ("m3", SECOND)):
        cfg = _config(tmp_path, dataset, f"s1_{t}", {t: stack}, {"fusion": "intermediate", "link": GENCOMM},
                      modality=f"all:{t}")
        runs[t] = tmp_path / f"s1_{t}"
        assert train.main(["-y", str(cfg), "--model_dir", str(runs[t])]) == 0
    out = tmp_path / "onboard"
    capsys.readouterr()
    assert onboard.main(["--ego", str(runs["m1"]), "--new", str(runs["m3"]), "-o", str(out), "--epochs", "1"]) == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "onboarding.json").read_text())
    dme = report["trainable_params_per_new_type"]["m3"]
    assert report["trainable_params_total"] == dme and f"{dme:,}" in printed
    assert report["onboarding_wall_time_s"] > 0
    assert report["best_epoch"] == 1 and report["select_on"] == "detection_loss" and "best.pth: epoch 1" in printed
    # a rerun finds the run finished and still reports the time it took
    assert onboard.main(["--ego", str(runs["m1"]), "--new", str(runs["m3"]), "-o", str(out), "--epochs", "1"]) == 0
    again = json.loads((out / "onboarding.json").read_text())
    assert again["onboarding_wall_time_s"] == report["onboarding_wall_time_s"]
    # everything but m3's message extractor is unchanged from stage 1
    from opencood_ext.training.checkpoint import load_checkpoint
    s1 = load_checkpoint(runs["m1"] / "checkpoints" / "latest.pth")["model"]
    s2 = load_checkpoint(out / "checkpoints" / "latest.pth")["model"]
    for k, v in s1.items():
        assert torch.equal(v, s2[k]), k
    s1m3 = load_checkpoint(runs["m3"] / "checkpoints" / "latest.pth")["model"]
    changed = [k for k in s1m3 if k.startswith("link.dme.m3.") and not torch.equal(s1m3[k], s2[k])]
    assert changed
    assert all(torch.equal(s1m3[k], s2[k]) for k in s1m3 if k.startswith("encoders.m3."))
    assert inference.main(["--model_dir", str(out), "--max_frames", "1"]) == 0
    capsys.readouterr()
    assert inference.main(["--model_dir", str(out), "--max_frames", "2", "--dynamic", "m1,m3"]) == 0
    table = capsys.readouterr().out
    assert "+m3" in table and f"{dme:,}" in table
    rows = json.loads((out / "eval_dynamic.json").read_text())
    assert [r["types"] for r in rows] == [["m1"], ["m1", "m3"]]
    # cycle m1, m3, m1: the m1 alliance has one m1 collaborator, adding m3 brings the second
    assert rows[0]["collaborators_per_frame"] == 1 and rows[1]["collaborators_per_frame"] == 2
    assert rows[1]["bytes_per_message"] > 0
    assert inference.main(["--model_dir", str(out), "--dynamic", "m1,m9"]) == 2


def test_torchrun_two_processes_with_the_real_detector(dataset, tmp_path):
    """tools/train.py under torchrun (gloo, 2 CPU ranks) trains and rank 0 writes the run folder.
    (Identical weights across ranks are checked on the engine in test_ddp.py.)"""
    import socket
    import subprocess
    cfg = _config(tmp_path, dataset, "ddp", {"m1": PP}, {"fusion": "intermediate", "link": {"type": "full_feature"}})
    run = tmp_path / "ddp_run"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = (
        "import sys; sys.path.insert(0, %r); import train\n"
        "sys.exit(train.main(['-y', %r, '--model_dir', %r, '--set', 'train.max_steps_per_epoch=2']))\n"
    ) % (str(ROOT / "tools"), str(cfg), str(run))
    entry = tmp_path / "ddp_entry.py"
    entry.write_text(script)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                           "--master_addr=127.0.0.1", f"--master_port={port}", str(entry)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1",
                               "CUDA_VISIBLE_DEVICES": ""})   # CPU ranks even on a GPU machine
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (run / "checkpoints" / "latest.pth").exists() and (run / "config.yaml").exists()
    from opencood_ext.training.checkpoint import load_checkpoint
    state = load_checkpoint(run / "checkpoints" / "latest.pth")
    assert state["world_size"] == 2
