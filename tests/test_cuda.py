"""The CUDA path: what a GPU user runs, on a machine with a GPU.

Skipped where ``torch.cuda.is_available()`` is False (this project's CPU CI);
run on a GPU machine with ``python -m pytest tests/test_cuda.py``. The encoders
here are PointPillars only: SECOND on CUDA needs a CUDA build of spconv
(spconv-cu12x), which the CPU install does not have.
"""
import json
import sys
from pathlib import Path

import pytest
import torch

from tiny_runs import GENCOMM, PP, tiny_config, tiny_dataset

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import inference  # noqa: E402
import onboard  # noqa: E402
import train  # noqa: E402


def _deform_inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 17, 23, generator=g)
    offset = torch.randn(2, 2 * 9, 17, 23, generator=g) * 2
    mask = torch.rand(2, 9, 17, 23, generator=g)
    weight = torch.randn(6, 8, 3, 3, generator=g)
    bias = torch.randn(6, generator=g)
    return x, offset, mask, weight, bias


def test_deform_conv_on_cuda_matches_cpu():
    from opencood_ext.models.deform_conv import deform_conv2d

    x, offset, mask, weight, bias = _deform_inputs()
    grads = {}
    for dev in ("cpu", "cuda"):
        leaves = [t.detach().to(dev).requires_grad_(True) for t in (x, offset, mask, weight)]
        out = deform_conv2d(leaves[0], leaves[1], leaves[3], bias.to(dev), padding=1, mask=leaves[2])
        out.square().sum().backward()
        grads[dev] = (out.detach().cpu(), [t.grad.cpu() for t in leaves])
    torch.testing.assert_close(grads["cuda"][0], grads["cpu"][0], atol=1e-4, rtol=1e-4)
    for got, want in zip(grads["cuda"][1], grads["cpu"][1]):
        torch.testing.assert_close(got, want, atol=2e-3, rtol=1e-3)


def test_deform_conv_on_cuda_matches_torchvision():
    from opencood_ext.models.deform_conv import deform_conv2d

    tv_ops = pytest.importorskip("torchvision.ops", reason="torchvision is not installed beside this torch")
    x, offset, mask, weight, bias = (t.cuda() for t in _deform_inputs())
    want = tv_ops.deform_conv2d(x, offset, weight, bias, padding=(1, 1), mask=mask)
    got = deform_conv2d(x, offset, weight, bias, padding=1, mask=mask)
    torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-4)


def test_gencomm_stage1_onboarding_and_inference_on_cuda(tmp_path, capsys):
    """The trainer picks cuda:0 by itself; checkpoints come back as CPU tensors, so a
    GPU-trained run evaluates and onboards anywhere."""
    data = tiny_dataset(tmp_path / "data")
    runs = {}
    for t in ("m1", "m3"):   # m3 here: PointPillars on the 32-beam scan (another vendor's stack)
        cfg = tiny_config(tmp_path, data, f"s1_{t}", {t: PP}, {"fusion": "intermediate", "link": GENCOMM},
                          modality=f"all:{t}")
        runs[t] = tmp_path / f"s1_{t}"
        assert train.main(["-y", str(cfg), "--model_dir", str(runs[t])]) == 0
    from opencood_ext.training.checkpoint import load_checkpoint
    state = load_checkpoint(runs["m1"] / "checkpoints" / "latest.pth")["model"]
    assert all(v.device.type == "cpu" for v in state.values())
    log = [json.loads(ln) for ln in (runs["m1"] / "train_log.jsonl").read_text().splitlines()]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in log if "loss" in r)
    out = tmp_path / "onboard"
    assert onboard.main(["--ego", str(runs["m1"]), "--new", str(runs["m3"]), "-o", str(out), "--epochs", "1"]) == 0
    s2 = load_checkpoint(out / "checkpoints" / "latest.pth")["model"]
    for k, v in state.items():
        assert torch.equal(v, s2[k]), k
    capsys.readouterr()
    assert inference.main(["--model_dir", str(out), "--max_frames", "2", "--dynamic", "m1,m3"]) == 0
    assert "+m3" in capsys.readouterr().out


def test_second_on_cuda_with_cpu_only_spconv_says_what_to_install():
    from opencood_ext.data.inputs import LidarInput
    from opencood_ext.models.second import SPCONV_CPU_ONLY, SecondEncoder

    if not SPCONV_CPU_ONLY:
        pytest.skip("spconv here is a CUDA build: SECOND runs on CUDA (covered by the encoder tests)")
    enc = SecondEncoder((-8.0, -8.0, -3.0, 8.0, 8.0, 1.0), (0.4, 0.4, 0.5), channels=(8, 8), blocks=(1, 1)).cuda()
    voxels = torch.rand(4, 5, 4, device="cuda")
    coords = torch.tensor([[0, 1, 2, 3]] * 4, device="cuda")
    data = LidarInput(voxels=voxels, num_points=torch.full((4,), 5, dtype=torch.int32, device="cuda"),
                      coords=coords.int(), num_agents=1)
    with pytest.raises(RuntimeError, match="CPU-only build.*spconv-cu"):
        enc(data)
