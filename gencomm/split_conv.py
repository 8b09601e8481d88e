"""The generator UNet's input conv on ``[message, x_t]``, computed in two halves.

:class:`MessageInputConv` is an ``nn.Conv2d`` (same parameters, initialisation and state-dict
keys; called with the input alone it is the plain conv). A conv is linear in its input channels,
so on the channel concatenation it is ``conv_m(message) + conv_x(x_t)`` with the bias in the
message half. The message is the same at every diffusion step, so that half is computed once
(:meth:`MessageInputConv.message_term`), and each step convolves only ``x_t`` and adds it, with no
(N, m + C, H, W) concatenation built per step. Each step still CALLS the module, so the forward
hooks of :mod:`opencood_ext.eval.flops` count it per step as the whole conv, as before (the
message half, a 2/130 share at C=128, is not discounted).
"""
from __future__ import annotations

from typing import Optional

import torch.nn.functional as F
from torch import Tensor, nn


class MessageInputConv(nn.Conv2d):
    """Conv2d over ``[message (m channels), x (in_channels - m channels)]``.

    ``forward(x)``: the plain conv on the concatenated (N, in_channels, H, W) input.
    ``forward(x, message_term)``: ``x`` is the feature part only, (N, in_channels - m, H, W), and
    ``message_term`` is :meth:`message_term` of the message; the result equals the plain conv on
    the concatenation (to float rounding; tests/gencomm/test_gencomm_link_equivalence.py).
    """

    def message_term(self, message: Tensor) -> Tensor:
        """(N, m, H, W) message -> (N, out_channels, H', W'): its half of the conv, bias included."""
        m = message.shape[1]
        if not 0 < m < self.in_channels:
            raise ValueError(f"MessageInputConv: message has {m} channels; the conv takes {self.in_channels} in all")
        return F.conv2d(message, self.weight[:, :m], self.bias, self.stride, self.padding, self.dilation)

    def forward(self, x: Tensor, message_term: Optional[Tensor] = None) -> Tensor:
        if message_term is None:
            return super().forward(x)
        if self.padding_mode != "zeros" or self.groups != 1:
            raise ValueError("MessageInputConv: the split needs zero padding and groups 1")
        m = self.in_channels - x.shape[1]
        out = F.conv2d(x, self.weight[:, m:], None, self.stride, self.padding, self.dilation)
        return out.add_(message_term)

