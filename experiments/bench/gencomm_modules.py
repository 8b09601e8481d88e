"""Cost of the GenComm modules and the wire format.

    python tools/bench.py gencomm [--reps 3] [--threads 1] [--device cpu|cuda] [--quick]

Figures (times are medians over ``--reps`` runs after one warm-up, in ms):
forward+backward of DeformConv2d (grid_sample) at 3x128x64x128 -> 64 channels in
both orders (sample_first, project_first: the one ``auto`` takes here) and their
largest difference, and of torchvision's deform_conv2d where torchvision imports;
DME, SAFG (3 steps, unrolled; the compact UNet at ``--safg_base`` and the
reference-size UNet) and CE forward+backward at the same size; parameter counts;
DME and SAFG FLOPs at one 128x100x352 map; bytes per message and encode/decode
time for a 2x100x352 payload per dtype.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Dict

import torch

from opencood_ext.comm import Message, decode, encode
from opencood_ext.models.deform_conv import deform_conv2d
from gencomm.enhancer import ChannelEnhancer
from opencood_ext.eval.flops import count_parameters, profile_flops
from gencomm.generator import SpatialAwareFeatureGenerator
from gencomm.message import DeformableMessageExtractor


def _time_ms(fn: Callable[[], object], reps: int, device: torch.device) -> float:
    fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _fwd_bwd(fn: Callable[[], torch.Tensor]) -> Callable[[], None]:
    def run():
        fn().square().mean().backward()
    return run


def timing_parser(prog: str, doc: str, quick: str) -> argparse.ArgumentParser:
    """The options every module-timing benchmark takes: --reps, --threads, --device, --quick."""
    p = argparse.ArgumentParser(prog=prog, description=doc)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1: the 2-core dev box is shared; 0 leaves torch's default)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--quick", action="store_true", help=quick)
    return p


def main(argv=None) -> Dict[str, object]:
    p = timing_parser("bench gencomm", __doc__, "quarter-size maps (smoke run)")
    p.add_argument("--safg_base", type=int, default=32, help="width of the compact generator UNet timed as 'safg'")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    n, c, h, w = (3, 128, 64, 128) if not a.quick else (3, 128, 16, 32)
    torch.manual_seed(0)
    res: Dict[str, object] = {"device": str(dev), "threads": torch.get_num_threads(), "size": f"{n}x{c}x{h}x{w}"}

    x = torch.randn(n, c, h, w, device=dev, requires_grad=True)
    off = (torch.randn(n, 18, h, w, device=dev) * 0.5).requires_grad_()
    wt = (torch.randn(64, c, 3, 3, device=dev) * 0.03).requires_grad_()
    for method in ("sample_first", "project_first"):
        res[f"deform_conv_{method}_fwd_bwd_ms"] = _time_ms(
            _fwd_bwd(lambda: deform_conv2d(x, off, wt, padding=1, method=method)), a.reps, dev)
    with torch.no_grad():
        res["deform_conv_max_abs_diff_between_orders"] = float(
            (deform_conv2d(x, off, wt, padding=1, method="sample_first")
             - deform_conv2d(x, off, wt, padding=1, method="project_first")).abs().max())
    try:
        from torchvision.ops import deform_conv2d as tv_deform
        res["torchvision_deform_fwd_bwd_ms"] = _time_ms(
            _fwd_bwd(lambda: tv_deform(x, off, wt, padding=(1, 1))), a.reps, dev)
        res["max_abs_diff_vs_torchvision"] = float(
            (deform_conv2d(x, off, wt, padding=1) - tv_deform(x, off, wt, padding=(1, 1))).abs().max())
    except Exception as err:  # torchvision missing or its ops not built for this torch
        res["torchvision"] = f"unavailable ({type(err).__name__})"

    dme = DeformableMessageExtractor(c).to(dev)
    safgs = {"safg": SpatialAwareFeatureGenerator(c, base_channels=a.safg_base).to(dev),
             "safg_reference": SpatialAwareFeatureGenerator(c, base_channels=8, variant="reference").to(dev)}
    ce = ChannelEnhancer(c).to(dev)
    res["dme_params"] = count_parameters(dme)
    for name, safg in safgs.items():
        res[f"{name}_params"] = count_parameters(safg)
    res["ce_params"] = count_parameters(ce)
    msg = torch.randn(n, 2, h, w, device=dev)
    res["dme_fwd_bwd_ms"] = _time_ms(_fwd_bwd(lambda: dme(x)), a.reps, dev)
    for name, safg in safgs.items():
        res[f"{name}_3step_fwd_bwd_ms"] = _time_ms(_fwd_bwd(lambda: safg(msg, x).feature), a.reps, dev)
        with torch.no_grad():
            safg.eval()
            res[f"{name}_3step_eval_ms"] = _time_ms(lambda: safg(msg, x, torch.Generator().manual_seed(0)),
                                                    a.reps, dev)
            safg.train()
    safg = safgs["safg"]
    res["ce_fwd_bwd_ms"] = _time_ms(_fwd_bwd(lambda: ce(x)), a.reps, dev)

    fh, fw = (100, 352) if not a.quick else (25, 88)
    one = torch.randn(1, c, fh, fw, device=dev)
    rep = profile_flops(dme, one)
    res[f"dme_gflops_at_{c}x{fh}x{fw}"] = rep.flops / 1e9
    res["dme_gmacs_deform_conv_incl_sampling"] = rep.by_type.get("DeformConv2d", 0) / 1e9
    # What a counter that skips the deformable layer (e.g. an unknown-module hook) would report.
    res["dme_gflops_if_deform_conv_skipped"] = (rep.macs - rep.by_type.get("DeformConv2d", 0)) * 2 / 1e9
    for name, safg in safgs.items():
        res[f"{name}_3step_gflops_at_{c}x{fh}x{fw}"] = profile_flops(
            safg, (torch.randn(1, 2, fh, fw, device=dev), one)).flops / 1e9
    res[f"ce_gflops_at_{c}x{fh}x{fw}"] = profile_flops(ce, one).flops / 1e9

    payload = torch.randn(2, fh, fw)
    message = Message(sender_id=1, agent_type="m1", timestamp=0.0, pose=torch.eye(4).double().numpy(),
                      payload=payload)
    res[f"feature_float32_bytes_{c}x{fh}x{fw}"] = c * fh * fw * 4
    for dtype in ("float32", "float16", "int8"):
        data = encode(message, dtype)
        res[f"msg_{dtype}_bytes"] = len(data)
        res[f"encode_{dtype}_ms"] = _time_ms(lambda: encode(message, dtype), max(a.reps, 5), torch.device("cpu"))
        res[f"decode_{dtype}_ms"] = _time_ms(lambda: decode(data), max(a.reps, 5), torch.device("cpu"))
    return res


if __name__ == "__main__":
    for k, v in main().items():
        print(f"{k}: {v}")
