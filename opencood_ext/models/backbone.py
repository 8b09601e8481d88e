"""BEV 2D backbones (multi-scale, upsample-and-concat: residual or plain levels) and shrink headers.

Maps are ``(A, C, H, W)`` (H along y, W along x). Level i downsamples by the
product of ``layer_strides[:i + 1]`` and is brought back by
``upsample_strides[i]`` (values < 1 mean a strided conv), so every level must
end at the same overall stride ``out_stride`` (may be fractional, e.g. 0.5 to
upsample the input grid). Input H and W must be multiples of the deepest
level's total stride.
"""
from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import Callable, Sequence, Tuple

import torch
from torch import nn


class BasicBlock(nn.Module):
    """Two 3x3 convs with BN (``eps``) and an identity (or 1x1 strided) shortcut."""

    def __init__(self, cin: int, cout: int, stride: int = 1, eps: float = 1e-3):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout, eps=eps, momentum=0.01)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout, eps=eps, momentum=0.01)
        self.shortcut = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout, eps=eps, momentum=0.01))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn2(self.conv2(self.bn1(self.conv1(x)).relu()))
        return (y + self.shortcut(x)).relu()


def _resample(cin: int, cout: int, factor: Fraction) -> nn.Module:
    """Upsample by ``factor`` (transposed conv), keep (1x1 conv) or downsample (strided conv)."""
    if factor >= 1:
        if factor.denominator != 1:
            raise ValueError(f"upsample stride {factor} must be an integer when >= 1")
        k = int(factor)
        conv = nn.ConvTranspose2d(cin, cout, k, stride=k, bias=False) if k > 1 else nn.Conv2d(cin, cout, 1, bias=False)
    else:
        inv = 1 / factor
        if inv.denominator != 1:
            raise ValueError(f"upsample stride {factor} must be 1/integer when < 1")
        conv = nn.Conv2d(cin, cout, int(inv), stride=int(inv), bias=False)
    return nn.Sequential(conv, nn.BatchNorm2d(cout, eps=1e-3, momentum=0.01), nn.ReLU(inplace=True))


def check_levels(layer_nums: Sequence[int], layer_strides: Sequence[int], num_filters: Sequence[int],
                 upsample_strides: Sequence[float], num_upsample_filters: Sequence[int]) -> None:
    """A multi-scale backbone's per-level lists have one entry per level (at least one level); the
    two upsampling lists may both be empty (no resampling). ValueError otherwise: what the config
    loader checks before anything is built (:mod:`opencood_ext.experiment_checks`)."""
    lists = [list(x) for x in (layer_nums, layer_strides, num_filters, upsample_strides, num_upsample_filters)]
    n = len(lists[0])
    others = lists[1:3] if not lists[3] and not lists[4] else lists[1:]
    if not n or any(len(x) != n for x in others):
        raise ValueError(f"backbone: layer_nums, layer_strides, num_filters, upsample_strides and "
                         f"num_upsample_filters need the same non-zero length; got "
                         f"{', '.join(str(x) for x in lists)}")


class _LevelBackbone(nn.Module):
    """Levels of a multi-scale BEV backbone, each resampled to a common stride and concatenated.

    ``make_level(cin, cout, num, stride)`` builds level i; the upsampling (``ups``), the stride check,
    :meth:`out_shape` and :meth:`forward` are shared by :class:`ResNetBEVBackbone` and
    :class:`BaseBEVBackbone`.
    """

    def __init__(self, in_channels: int, layer_nums: Sequence[int], layer_strides: Sequence[int],
                 num_filters: Sequence[int], upsample_strides: Sequence[float], num_upsample_filters: Sequence[int],
                 make_level: Callable[[int, int, int, int], nn.Module]):
        super().__init__()
        n = len(layer_nums)
        check_levels(layer_nums, layer_strides, num_filters, upsample_strides, num_upsample_filters)
        if not len(upsample_strides) and not len(num_upsample_filters):  # no resampling: the levels as they are
            upsample_strides, num_upsample_filters = [None] * n, list(num_filters)
        levels, ups, strides = [], [], set()
        cin, total = int(in_channels), Fraction(1)
        for num, stride, c, up, cu in zip(layer_nums, layer_strides, num_filters, upsample_strides,
                                          num_upsample_filters):
            levels.append(make_level(cin, int(c), int(num), int(stride)))
            total *= int(stride)
            upf = Fraction(1) if up is None else Fraction(up).limit_denominator(64)
            ups.append(nn.Identity() if up is None else _resample(int(c), int(cu), upf))
            strides.add(total / upf)
            cin = int(c)
        if len(strides) != 1:
            raise ValueError(f"backbone: levels end at different strides {sorted(map(float, strides))}; "
                             f"choose upsample_strides so cumprod(layer_strides) / upsample_strides is constant")
        self.levels = nn.ModuleList(levels)
        self.ups = nn.ModuleList(ups)
        self.max_stride = int(total)
        self.out_stride = float(strides.pop())
        self.out_channels = int(sum(num_upsample_filters))

    def out_shape(self, in_hw: Tuple[int, int]) -> Tuple[int, int]:
        """Output (H, W) for input (H, W); raises when the input is not a multiple of the deepest stride."""
        h, w = in_hw
        if h % self.max_stride or w % self.max_stride:
            raise ValueError(f"backbone: BEV grid {h}x{w} must be a multiple of the deepest stride "
                             f"{self.max_stride}; change lidar_range or voxel_size")
        return int(round(h / self.out_stride)), int(round(w / self.out_stride))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(A, in_channels, H, W) -> (A, out_channels, H / out_stride, W / out_stride)."""
        outs = []
        for level, up in zip(self.levels, self.ups):
            x = level(x)
            outs.append(up(x))
        return torch.cat(outs, dim=1)


def _residual_level(cin: int, cout: int, num: int, stride: int, eps: float = 1e-3) -> nn.Module:
    return nn.Sequential(BasicBlock(cin, cout, stride, eps), *[BasicBlock(cout, cout, eps=eps) for _ in range(num - 1)])


def _plain_level(cin: int, cout: int, num: int, stride: int) -> nn.Module:
    """ZeroPad2d(1), 3x3 conv with ``stride`` (padding 0, no bias), BN, ReLU, then ``num`` x
    (3x3 conv, BN, ReLU): indices 1 + 3k are the convs, 2 + 3k their BatchNorms."""
    layers = [nn.ZeroPad2d(1), nn.Conv2d(cin, cout, 3, stride=stride, bias=False),
              nn.BatchNorm2d(cout, eps=1e-3, momentum=0.01), nn.ReLU()]
    for _ in range(num):
        layers += [nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout, eps=1e-3, momentum=0.01),
                   nn.ReLU()]
    return nn.Sequential(*layers)


class ResNetBEVBackbone(_LevelBackbone):
    """Multi-scale ResNet BEV backbone (PointPillars RPN / ResNet-BEV style).

    in_channels: from the encoder's ``out_channels``.
    layer_nums[i] BasicBlocks at level i, the first with stride ``layer_strides[i]``
    and width ``num_filters[i]``; each level is resampled by ``upsample_strides[i]``
    to ``num_upsample_filters[i]`` channels; the levels are concatenated.
    out_channels = sum(num_upsample_filters); out_stride = common overall stride.
    Empty ``upsample_strides`` and ``num_upsample_filters``: no resampling, the levels are concatenated
    as they are (they must end on one grid; HEAL's ResNetBEVBackbone without ``upsample_strides``).
    norm_eps: the blocks' BatchNorm eps (HEAL's residual blocks: 1e-5).
    """

    def __init__(self, in_channels: int, layer_nums: Sequence[int] = (3, 4, 5),
                 layer_strides: Sequence[int] = (2, 2, 2), num_filters: Sequence[int] = (64, 128, 256),
                 upsample_strides: Sequence[float] = (1, 2, 4),
                 num_upsample_filters: Sequence[int] = (128, 128, 128), norm_eps: float = 1e-3):
        super().__init__(in_channels, layer_nums, layer_strides, num_filters, upsample_strides,
                         num_upsample_filters, functools.partial(_residual_level, eps=float(norm_eps)))


class BaseBEVBackbone(_LevelBackbone):
    """Plain multi-scale BEV backbone, the structure of the reference's ``BaseBEVBackbone``
    (HEAL / GenComm ``heter_model_baseline*``, OpenCOOD's PointPillars RPN).

    Level i: a zero-padded stride-``layer_strides[i]`` 3x3 conv to ``num_filters[i]`` then
    ``layer_nums[i]`` more 3x3 convs, each conv without bias, BatchNorm (eps 1e-3), ReLU; no
    residuals. Resampling and concatenation as in :class:`ResNetBEVBackbone` (a stride-1 level
    uses a 1x1 conv where the reference has a 1x1 transposed conv: the weight is transposed on
    import). Same arguments as :class:`ResNetBEVBackbone`.

    Parameters (BN = 2 per channel; up_k = upsample stride, or 1 / it when < 1)::

        level i   9 * c_in * c_i + 2 c_i + layer_nums[i] * (9 c_i^2 + 2 c_i)
        up i      up_k^2 * c_i * u_i + 2 u_i

    e.g. the reference PointPillars m1 (in 64, layer_nums 3 5 8, num_filters 64 128 256,
    upsample 1 2 4, 128 each): levels 147,968 + 812,544 + 5,018,112, ups 8,448 + 65,792 +
    524,544: 6,577,408 parameters.
    """

    def __init__(self, in_channels: int, layer_nums: Sequence[int] = (3, 5, 8),
                 layer_strides: Sequence[int] = (2, 2, 2), num_filters: Sequence[int] = (64, 128, 256),
                 upsample_strides: Sequence[float] = (1, 2, 4),
                 num_upsample_filters: Sequence[int] = (128, 128, 128)):
        super().__init__(in_channels, layer_nums, layer_strides, num_filters, upsample_strides,
                         num_upsample_filters, _plain_level)


class ShrinkConv(nn.Module):
    """3x3 conv + BN + ReLU to ``out_channels`` (the fused feature width, 128); keeps the grid.

    Parameters: 9 * in_channels * out_channels + 2 * out_channels (BN).
    """

    stride = 1

    def __init__(self, in_channels: int, out_channels: int = 128):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
                                 nn.BatchNorm2d(out_channels, eps=1e-3, momentum=0.01), nn.ReLU(inplace=True))
        self.out_channels = int(out_channels)

    def out_shape(self, in_hw: Tuple[int, int]) -> Tuple[int, int]:
        return tuple(in_hw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class IdentityBackbone(nn.Module):
    """No BEV backbone: the encoder's map passes unchanged, (A, C, H, W) -> (A, C, H, W) (the
    reference's ``backbone_args: identity``, an ``nn.Identity``). in_channels: derived."""

    out_stride = 1.0

    def __init__(self, in_channels: int):
        super().__init__()
        self.out_channels = int(in_channels)

    def out_shape(self, in_hw: Tuple[int, int]) -> Tuple[int, int]:
        return tuple(in_hw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class DownsampleConv(nn.Module):
    """Shrink header with the structure of the reference's ``DownsampleConv`` (HEAL / GenComm
    ``shrinker_<m>``): per layer i a ``kernel_size[i]`` conv with ``stride[i]`` and ``padding[i]``
    to ``dims[i]`` channels (bias), ReLU, a 3x3 conv (padding 1, bias), ReLU; no BatchNorm.

    in_channels: derived (the backbone's width). out_channels = dims[-1];
    stride = prod(stride): (A, in_channels, H, W) -> (A, dims[-1], H / stride, W / stride).
    Each layer must keep the grid exact (``k - 2 p`` in ``[1, s]`` and H, W multiples of s),
    so the feature cells stay ``stride`` times the backbone's.

    Parameters: per layer ``k^2 * c_in * d + d + 9 d^2 + d``; the reference m1 header
    (384 -> 128, k 3, stride 2) has 442,496 + 147,584 = 590,080.
    """

    def __init__(self, in_channels: int, kernel_size: Sequence[int] = (3,), stride: Sequence[int] = (1,),
                 padding: Sequence[int] = (1,), dims: Sequence[int] = (128,)):
        super().__init__()
        n = len(dims)
        if not n or any(len(x) != n for x in (kernel_size, stride, padding)):
            raise ValueError(f"shrink: kernel_size, stride, padding and dims need the same non-zero length; got "
                             f"{list(kernel_size)}, {list(stride)}, {list(padding)}, {list(dims)}")
        layers, cin = [], int(in_channels)
        for k, s, p, d in zip(kernel_size, stride, padding, dims):
            k, s, p, d = int(k), int(s), int(p), int(d)
            if s < 1 or not 1 <= k - 2 * p <= s:
                raise ValueError(f"shrink: kernel {k}, stride {s}, padding {p} do not map an H multiple of {s} "
                                 f"onto H / {s} cells; need stride >= 1 and 1 <= kernel - 2 * padding <= stride")
            layers.append(nn.Sequential(nn.Conv2d(cin, d, k, stride=s, padding=p), nn.ReLU(inplace=True),
                                        nn.Conv2d(d, d, 3, padding=1), nn.ReLU(inplace=True)))
            cin = d
        self.layers = nn.ModuleList(layers)
        self.strides = [int(s) for s in stride]
        self.stride = math.prod(self.strides)
        self.out_channels = int(dims[-1])

    def out_shape(self, in_hw: Tuple[int, int]) -> Tuple[int, int]:
        """(H, W) after every layer; raises unless each layer's stride divides the grid."""
        h, w = in_hw
        for s in self.strides:
            if h % s or w % s:
                raise ValueError(f"shrink: BEV grid {h}x{w} is not a multiple of the shrink stride {s}")
            h, w = h // s, w // s
        return h, w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(A, in_channels, H, W) -> (A, dims[-1], H / stride, W / stride)."""
        for layer in self.layers:
            x = layer(x)
        return x
