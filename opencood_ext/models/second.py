"""SECOND encoder: mean voxel features -> sparse 3D conv backbone -> dense BEV.

Input :class:`LidarInput` with small cubic voxels (coords ``[a, z, y, x]`` on the
``(nz, ny, nx)`` grid of ``lidar_range`` / ``voxel_size``). Each stage after the
first halves z, y and x with a stride-2 ``SparseConv3d`` and refines with
``SubMConv3d`` blocks; a final ``(3, 1, 1)`` stride-``(2, 1, 1)`` conv compresses
z. The dense result ``(A, Cz, D, H, W)`` is reshaped to ``(A, Cz * D, H, W)``
(H along y, W along x), one cell = ``voxel_size[:2] * 2 ** (len(channels) - 1)``.

spconv is imported when the first SECOND encoder is built (:func:`sparse_ops`), not when this module
is imported: a PointPillars or camera model, and every command's ``--help``, work without it.

CPU note (applied once, when spconv is first loaded, only when CUDA is absent):
spconv 2.3.8 asks ``torch.cuda.current_stream()`` for a stream handle in its
backward and hash-table code even for CPU tensors, which fails on a CPU-only
torch. :func:`install_cpu_stream_shim` replaces that lookup with one returning 0
(no stream), which the CPU kernels ignore.

CPU threads: spconv 2.3.8's CPU ``SubMConv3d`` gives wrong results with more than
one intra-op thread, forward and backward alike (5% of the output's norm against
a dense ``conv3d`` with 2 threads, different on every call; exact with 1: see
``tests/opencood_ext/models/test_encoders.py``). So on the CPU the sparse part runs on one thread,
forward and backward (:class:`_SetThreadsInBackward` marks both ends of its part
of the autograd graph), and everything else keeps the caller's thread count.
"""
from __future__ import annotations

from contextlib import contextmanager
from types import ModuleType
from typing import Iterator, Literal, Optional, Sequence, Tuple

import torch
from torch import nn

from opencood_ext.data.voxelize import grid_shape
from opencood_ext.deps import require_spconv

from ..data.inputs import LidarInput
from .inputs import EncoderOutput

_SPCONV: Optional[ModuleType] = None


def sparse_ops() -> ModuleType:
    """``spconv.pytorch``, imported on first use (with the CPU stream shim installed once); an
    ImportError saying what to install when spconv is missing (not a declared dependency: see
    :mod:`opencood_ext.deps`)."""
    global _SPCONV
    if _SPCONV is None:
        module = require_spconv("spconv.pytorch")
        install_cpu_stream_shim()
        _SPCONV = module
    return _SPCONV


def spconv_cpu_only() -> bool:
    """True when the installed spconv is a CPU-only build (imports spconv)."""
    return bool(require_spconv("spconv.cppconstants").CPU_ONLY_BUILD)


def __getattr__(name: str):
    """``second.spconv`` and ``second.SPCONV_CPU_ONLY`` resolve (importing spconv) on first access."""
    if name == "spconv":
        return sparse_ops()
    if name == "SPCONV_CPU_ONLY":
        return spconv_cpu_only()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _no_stream() -> int:
    return 0


def install_cpu_stream_shim() -> bool:
    """Make spconv's CPU backward work without CUDA (see module docstring).

    Returns True when the shim was installed, False when CUDA is available and
    spconv is left untouched.
    """
    if torch.cuda.is_available():
        return False
    import spconv.pytorch.hash as sp_hash
    import spconv.pytorch.ops as sp_ops

    sp_ops.get_current_stream = _no_stream
    sp_hash.get_current_stream = _no_stream
    return True


@contextmanager
def _threads(n: int) -> Iterator[int]:
    """torch's intra-op thread count set to ``n`` inside; yields (and afterwards restores) the count before."""
    before = torch.get_num_threads()
    if before != n:
        torch.set_num_threads(n)
    try:
        yield before
    finally:
        if before != n:
            torch.set_num_threads(before)


class _SetThreadsInBackward(torch.autograd.Function):
    """Identity whose backward sets torch's intra-op thread count to ``n`` before passing the gradient on.

    Put on the sparse part's output with n = 1 and on its input with the caller's count: the backward
    reaches the output first and the input last, so spconv's backward runs between them on one thread."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, n: int) -> torch.Tensor:
        ctx.n = n
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        torch.set_num_threads(ctx.n)
        return grad, None


def _conv_out(n: int, kernel: int, stride: int, padding: int) -> int:
    return (n + 2 * padding - kernel) // stride + 1


def _block(conv: nn.Module, channels: int) -> nn.Module:
    """conv -> BatchNorm1d -> ReLU as one ``spconv.SparseSequential``."""
    return sparse_ops().SparseSequential(conv, nn.BatchNorm1d(channels, eps=1e-3, momentum=0.01), nn.ReLU())


class SecondEncoder(nn.Module):
    """Mean-VFE + sparse 3D backbone + height compression.

    channels: width of each stage; stage 0 keeps the resolution, each later stage
        downsamples by 2 in z, y, x (so the BEV stride is ``2 ** (len(channels) - 1)``).
    blocks: ``SubMConv3d`` blocks per stage (same length as ``channels``).
    out_z_channels: channels of the z-compression conv; ``out_channels`` is this
        times the remaining depth, derived from the grid.
    protocol (derived, the model's): "reference" is OpenCOOD's VoxelBackBone8x: the sparse grid has
        one z layer more than the range (``grid_size[::-1] + [1, 0, 0]``) and the last stage's
        stride-2 conv pads z by 0 (y, x by 1); "native" pads every stage by 1 on the range's grid.
        Same shapes on OPV2V-H's 4 m z range, different z alignment; on DAIR-V2X's 5 m the
        reference keeps 2 z layers (128 BEV channels), native 3.
    """

    input_kind = "lidar"

    def __init__(self, lidar_range: Sequence[float], voxel_size: Sequence[float] = (0.1, 0.1, 0.1),
                 channels: Sequence[int] = (16, 32, 64, 64), blocks: Sequence[int] = (1, 2, 2, 2),
                 out_z_channels: int = 128, protocol: Literal["native", "reference"] = "native"):
        super().__init__()
        spconv = sparse_ops()  # ImportError naming what to install when spconv is missing
        if len(channels) != len(blocks) or not channels:
            raise ValueError(f"second: channels {list(channels)} and blocks {list(blocks)} must be "
                             f"non-empty lists of the same length")
        self.lidar_range = tuple(float(x) for x in lidar_range)
        self.voxel_size = tuple(float(x) for x in voxel_size)
        self.protocol = protocol
        self.sparse_shape = list(grid_shape(lidar_range, voxel_size))  # [nz, ny, nx]
        if protocol == "reference":
            self.sparse_shape[0] += 1
        stages = []
        shape = list(self.sparse_shape)
        cin = 4
        for i, (c, nb) in enumerate(zip(channels, blocks)):
            if i == 0:
                layers = [_block(spconv.SubMConv3d(cin, c, 3, padding=1, bias=False, indice_key="subm0"), c)]
            else:
                pad = (0, 1, 1) if protocol == "reference" and i == len(channels) - 1 else (1, 1, 1)
                layers = [_block(spconv.SparseConv3d(cin, c, 3, stride=2, padding=pad, bias=False,
                                                     indice_key=f"down{i}"), c)]
                shape = [_conv_out(n, 3, 2, q) for n, q in zip(shape, pad)]
            layers += [_block(spconv.SubMConv3d(c, c, 3, padding=1, bias=False, indice_key=f"subm{i}"), c)
                       for _ in range(nb)]
            stages.append(spconv.SparseSequential(*layers))
            cin = c
        self.stages = nn.ModuleList(stages)
        self.z_conv = _block(spconv.SparseConv3d(cin, out_z_channels, (3, 1, 1), stride=(2, 1, 1),
                                                 padding=0, bias=False, indice_key="zdown"), out_z_channels)
        depth = _conv_out(shape[0], 3, 2, 0)
        if depth < 1:
            raise ValueError(f"second: the grid has only {self.sparse_shape[0]} z layers, too few for "
                             f"{len(channels) - 1} stride-2 stages plus the z-compression conv")
        self.out_depth = depth
        self.out_channels = int(out_z_channels * depth)
        self.out_stride = 2 ** (len(channels) - 1)
        self.bev_shape: Tuple[int, int] = (shape[1], shape[2])
        self.bev_cell = (self.voxel_size[0] * self.out_stride, self.voxel_size[1] * self.out_stride)

    @staticmethod
    def mean_features(voxels: torch.Tensor, num_points: torch.Tensor) -> torch.Tensor:
        """(V, P, 4), (V,) -> (V, 4) mean of the valid points (padding rows are zero)."""
        return voxels.sum(dim=1) / num_points.clamp(min=1)[:, None].to(voxels.dtype)

    def forward(self, data: LidarInput) -> EncoderOutput:
        if data.coords.shape[0] == 0:  # spconv cannot run on an empty tensor: nothing seen, all zeros
            h, w = self.bev_shape
            return EncoderOutput(bev=data.voxels.new_zeros(data.num_agents, self.out_channels, h, w))
        if data.voxels.is_cuda and spconv_cpu_only():
            raise RuntimeError("second: the input is on CUDA but the installed spconv is a CPU-only build; "
                               "install the CUDA build that matches your torch (e.g. pip install spconv-cu126) "
                               "or train on the CPU (CUDA_VISIBLE_DEVICES='')")
        # float32 even under mixed precision (train.amp): spconv has no bfloat16 kernels
        with torch.autocast(data.voxels.device.type, enabled=False):
            feats = self.mean_features(data.voxels.float(), data.num_points)
            if data.voxels.is_cuda:
                dense = self._sparse(feats, data)
            else:  # spconv's CPU kernels are only right on one thread (module docstring)
                with _threads(1) as caller:
                    fence = torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())
                    if fence:  # the input end: its backward, the last of the sparse part's, restores the count
                        feats = _SetThreadsInBackward.apply(feats.requires_grad_(), caller)
                    dense = self._sparse(feats, data)
                    if fence:  # the output end: its backward, the first, sets one thread
                        dense = _SetThreadsInBackward.apply(dense, 1)
        a, c, d, h, w = dense.shape
        return EncoderOutput(bev=dense.reshape(a, c * d, h, w))

    def _sparse(self, feats: torch.Tensor, data: LidarInput) -> torch.Tensor:
        """(V, 4) mean voxel features -> (A, Cz, D, H, W) dense output of the sparse backbone."""
        x = sparse_ops().SparseConvTensor(feats, data.coords.int(), self.sparse_shape, data.num_agents)
        for stage in self.stages:
            x = stage(x)
        return self.z_conv(x).dense()
