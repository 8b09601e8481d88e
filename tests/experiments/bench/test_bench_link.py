"""experiments/bench/link_cost.py: its straightforward restatement of the link computes what the
link computes (the bench checks it before timing), and the rows the docs quote (no timing asserted)."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from experiments.bench import link_cost  # noqa: E402
from opencood_ext.models import deform_conv  # noqa: E402


@pytest.fixture(autouse=True)
def _keep_threads():
    """main() sets torch's thread count; give the session its own back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_rows_and_equal_computations():
    gather = deform_conv._WeightedGather
    res = link_cost.main(["--messages", "1", "--repeat", "1"])
    assert deform_conv._WeightedGather is gather  # the straightforward gather was swapped back
    assert res["max_abs_diff_output"] < 1e-4 and res["max_abs_diff_gradients"] < 1e-4
    for part in ("link", "message_extractor", "generator"):
        assert res[f"{part}_current_over_straightforward"] == pytest.approx(
            res[f"{part}_current_s"] / res[f"{part}_straightforward_s"])
    assert (res["messages"], res["grid"], res["channels"], res["threads"]) == (1, "80x80", 128, 1)
    assert (res["protocol"], res["warp_first"]) == ("equalized", False)  # the sim configs' order


def test_warp_first_under_native_too():
    """Native warps first: the restatement follows, so both generation orders are checked."""
    res = link_cost.main(["--messages", "2", "--repeat", "1", "--protocol", "native"])
    assert (res["protocol"], res["warp_first"]) == ("native", True)
    assert res["max_abs_diff_output"] < 1e-4 and res["max_abs_diff_gradients"] < 1e-4


def test_bad_message_count():
    with pytest.raises(SystemExit, match="--messages"):
        link_cost.main(["--messages", "0"])
