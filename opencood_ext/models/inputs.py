"""What the per-type encoders return.

Every encoder takes a :class:`~opencood_ext.data.inputs.LidarInput` or
:class:`~opencood_ext.data.inputs.CameraInput` of ``A`` agents and returns BEV
maps ``(A, C, H, W)`` with H along y and W along x of the LiDAR frame
(row = ``(y - ymin) / cell_y``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class EncoderOutput:
    """What an encoder (and an :class:`EncoderStack`) returns.

    bev: (A, C, H, W) BEV features.
    depth_logits: (A, Ncam, D, h, w) per-pixel depth-bin logits (camera encoders), else None.
    """

    bev: torch.Tensor
    depth_logits: Optional[torch.Tensor] = None
