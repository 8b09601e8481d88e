"""experiments/bench/train_step.py: the rows the speed issue reads, consistent ratios and shares (no timing asserted)."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from experiments.bench import train_step  # noqa: E402

REF = '{"generator": {"variant": "reference", "base_channels": 8}}'


@pytest.fixture(autouse=True)
def _keep_threads():
    """main() sets torch's thread count; give the session its own back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_rows_ratios_and_shares():
    res = train_step.main(["--repeat", "1", "--threads", "1", "--clock", "cpu", "--also", f"ref={REF}", "--autocast"])
    for phase in ("train_step", "inference_frame"):
        for tag in ("none", "intermediate", "gencomm", "gencomm_ref"):
            assert res[f"m1_{tag}_{phase}_s"] > 0
        for tag in ("gencomm", "gencomm_ref"):
            assert res[f"m1_{tag}_over_intermediate_{phase}"] == pytest.approx(
                res[f"m1_{tag}_{phase}_s"] / res[f"m1_intermediate_{phase}_s"])
            assert res[f"m1_{tag}_over_none_{phase}"] == pytest.approx(
                res[f"m1_{tag}_{phase}_s"] / res[f"m1_none_{phase}_s"])
        for tag in ("none", "intermediate", "gencomm", "gencomm_ref"):  # each also timed under bf16 autocast
            assert res[f"m1_{tag}_fp32_over_bf16_{phase}"] == pytest.approx(
                res[f"m1_{tag}_{phase}_s"] / res[f"m1_{tag}_bf16_{phase}_s"])
        assert res[f"m1_gencomm_bf16_over_intermediate_bf16_{phase}"] == pytest.approx(
            res[f"m1_gencomm_bf16_{phase}_s"] / res[f"m1_intermediate_bf16_{phase}_s"])
    for short in ("train", "inference"):
        shares = [res[f"m1_gencomm_{short}_share_{n}"]
                  for n in ("encoders", "message_extractor", "generator", "enhancer", "warp", "fusion")]
        assert all(0 < s < 1 for s in shares) and sum(shares) < 1
        # the deformable convolutions are part of the message extractors
        assert 0 < res[f"m1_gencomm_{short}_share_deform_sampling"] < res[f"m1_gencomm_{short}_share_message_extractor"]
    # the figures side by side: time and FLOP ratios, their quotient, the time ratio's spread
    phases = {"train": ("train_step", "forward"), "inference": ("inference_frame", "inference")}
    for short, (phase, flops) in phases.items():
        key = f"m1_gencomm_over_intermediate_{short}"
        assert res[f"{key}_time"] == res[f"m1_gencomm_over_intermediate_{phase}"]
        assert res[f"{key}_flops"] == pytest.approx(
            res[f"m1_gencomm_{flops}_gflops"] / res[f"m1_intermediate_{flops}_gflops"])
        assert res[f"{key}_time_over_flops"] == pytest.approx(res[f"{key}_time"] / res[f"{key}_flops"])
        assert res[f"{key}_time_min"] <= res[f"{key}_time"] <= res[f"{key}_time_max"]
    assert list(res)[-6] == "m1_gencomm_over_intermediate_inference_time_max"  # printed last, before the setup
    assert res["m1_gencomm_inference_gflops"] > res["m1_intermediate_inference_gflops"] > 0
    # the sim config's generator and the override's
    assert res["m1_gencomm_generator_params"] == 69_616
    assert res["m1_gencomm_ref_generator_params"] == 43_176
    assert res["clock"] == "cpu" and res["family"] == "sim"
    # the arithmetic: GenComm's parts add up within its whole pass, which holds the same encoders
    parts = sum(res[f"m1_gencomm_forward_gflops_{n}"]
                for n in ("encoders", "message_extractor", "generator", "enhancer"))
    assert parts < res["m1_gencomm_forward_gflops"]
    assert res["m1_gencomm_forward_gflops_encoders"] < res["m1_intermediate_forward_gflops"] \
        < res["m1_gencomm_forward_gflops"]
    assert res["m1_gencomm_ref_forward_gflops"] < res["m1_gencomm_forward_gflops"]  # the smaller generator
    assert res["m1_gencomm_over_intermediate_forward_gflops"] == pytest.approx(
        res["m1_gencomm_forward_gflops"] / res["m1_intermediate_forward_gflops"])


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit):
        train_step.main(["--also", "no_json_here"])
    with pytest.raises(SystemExit):
        train_step.main(["--link", "[1, 2]"])
    with pytest.raises(SystemExit, match="no config file"):
        train_step.main(["--family", "no_such_family", "--repeat", "1"])
