"""Same config and seed -> the same run: two fresh tools/train.py runs give bit-identical
checkpoints (every tensor: weights, optimizer state, RNG states) and the same evaluation."""
import json
import sys
from pathlib import Path

import pytest
import torch

from opencood_ext.training.checkpoint import load_checkpoint
from tiny_runs import GENCOMM, PP, tiny_config, tiny_dataset

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))

import inference  # noqa: E402
import train  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def _tensors(obj, prefix=""):
    """Every tensor in a nested checkpoint structure, by its path."""
    if isinstance(obj, torch.Tensor):
        return {prefix: obj}
    out = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(_tensors(v, f"{prefix}/{k}"))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(_tensors(v, f"{prefix}/{i}"))
    return out


def test_two_fresh_runs_are_bit_identical(tmp_path, capsys, monkeypatch):
    data = tiny_dataset(tmp_path / "data")
    # score threshold 0: the (barely trained) detector outputs boxes for the evaluation to compare
    cfg = tiny_config(tmp_path, data, "repro", {"m1": PP},
                      {"fusion": "intermediate", "link": GENCOMM, "score_threshold": 0.0, "max_boxes": 20})
    runs = [tmp_path / "a", tmp_path / "b"]
    evals = []
    for run in runs:
        assert train.main(["-y", str(cfg), "--model_dir", str(run), "--set", "train.max_steps_per_epoch=2"]) == 0
        assert inference.main(["--model_dir", str(run), "--max_frames", "2", "--plot_every", "0"]) == 0
        res = json.loads((run / "eval_intermediate.json").read_text().replace(str(run), "<run>"))
        evals.append({k: v for k, v in res.items() if k not in ("seconds_per_frame",)})
    a, b = (_tensors(load_checkpoint(r / "checkpoints" / "latest.pth")) for r in runs)
    assert a.keys() == b.keys() and len([k for k in a if k.startswith("/model/")]) > 50
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert differ == [], f"{len(differ)} of {len(a)} tensors differ, e.g. {differ[:5]}"
    assert evals[0]["num_pred"] > 0 and evals[0] == evals[1]

    # the evaluation starts from the run's seed whatever was drawn before it (GenComm's receiver
    # samples diffusion noise from torch's RNG): record the first draws evaluate() would make
    import opencood_ext.eval.evaluate as E
    real, first_draws = E.evaluate, []

    def recording(*args, **kw):
        first_draws.append(torch.rand(4))
        return real(*args, **kw)

    monkeypatch.setattr(E, "evaluate", recording)
    for junk in (10, 1000):
        torch.rand(junk)
        assert inference.main(["--model_dir", str(runs[0]), "--max_frames", "1", "--plot_every", "0"]) == 0
    assert len(first_draws) == 2 and torch.equal(first_draws[0], first_draws[1])
    capsys.readouterr()
