"""V2X-ViT fusion (Xu et al., ECCV 2022) as a fusion op: ``model.fusion_op: v2xvit``.

Same interface as :mod:`.fusion`: features (sum N, C, H, W), each sample's agents stacked with
the ego FIRST, all already warped into that sample's ego frame on the common BEV grid;
``agents_per_sample`` (B,); ``valid`` (sum N, 1, H, W) or None: the cells each agent covers
(:func:`~opencood_ext.models.warp.warp_mask`). Output (B, C, H, W): the ego's row after the
transformer, in the ego frame. Samples are padded to the largest agent count (padding slots are
invalid everywhere).

The encoder, as in the reference (V2X-ViT, and HEAL / GenComm ``fusion_method: v2xvit``), is
``depth`` layers of ``blocks_per_layer`` x [agent attention, multi-scale window attention], then a
feed-forward net, each a pre-LayerNorm residual unit, working channels-last at width C:

* heterogeneous multi-agent self-attention (HMSA): at each cell, every agent attends to every
  agent of its sample. The paper's node types (vehicle / infrastructure) are here the ROLES ego /
  collaborator: each role has its own query, key, value and output projections, and each
  (query role, key role) pair its own per-head relation matrices for the attention logits
  (``q_i . W_att k_j``) and the message (``W_msg v_j``). ``role_specific: false`` shares one set
  among all agents: what the HEAL / GenComm reference actually runs, since it feeds an all-zero
  prior encoding (every agent type 0). Agent TYPES (m1, m3, ...) are not used: the op does not
  see them, and a new type joins without changing the receiver.
* multi-scale window attention (MSwin): per agent map, self-attention inside non-overlapping
  w x w windows for each window size (own heads and head width per size), with a learned relative
  position bias (one (2w-1)^2 table per size, shared by its heads); the branches are merged by
  split attention (per-map pooled context -> FC, LayerNorm, ReLU, FC -> softmax over branches per
  channel) or by their mean (``window_fuse: mean``). A map whose sides are not multiples of w is
  zero-padded, and the padding is masked.
* delay-aware positional encoding (RTE), ``delay_encoding: true``: a fixed sinusoid table over
  delay steps (``round(delay / delay_step)``, clamped to [0, max_delay_steps - 1]) through a
  learned linear map, added to every cell of an agent's map before the first layer. The caller
  passes ``delays`` (sum N,): how much older each row's data is than its ego's, in timestamp units
  (OPV2V counts 50 ms per unit). The reference GPU configs run without it (``use_RTE: false``).
* not here: V2X-ViT's spatial-temporal correction module (STTF) - the link warps every feature
  into the ego frame before fusion; and the reference's absolute (non-relative) window bias,
  which no reference config uses. Initialisation differs from the reference: relation matrices
  start as identities (plain dot-product attention), window biases as N(0, 0.02).

Masking: an invalid key (a collaborator cell outside its coverage, a padding slot or padding
cell) gets zero attention weight everywhere (agent attention, window attention) and is left
out of the split-attention pooling, so nothing of it reaches a valid cell; the ego is valid
everywhere. Only the ego's row is computed in the last unit.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .fusion import _pad_by_sample, check_channels


class _RowLinear(nn.Linear):
    """nn.Linear computed row by row (x (N, C) -> (N, O)), so a map's result does not depend on
    how many maps share the batch (BLAS rounds a single row, a GEMV, differently from a GEMM)."""

    def forward(self, x: Tensor) -> Tensor:
        out = (x[:, None, :] * self.weight).sum(-1)
        return out if self.bias is None else out + self.bias


class DelayEncoding(nn.Module):
    """V2X-ViT's RTE: x (B, L, P, C) + Linear(sinusoid(step)) per agent; steps (B, L) long."""

    def __init__(self, dim: int, max_steps: int):
        super().__init__()
        pos = torch.arange(max_steps, dtype=torch.float32)[:, None]
        freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
        table = torch.zeros(max_steps, dim)
        table[:, 0::2] = torch.sin(pos * freq)
        table[:, 1::2] = torch.cos(pos * freq)[:, : dim // 2]
        self.register_buffer("table", table / math.sqrt(dim), persistent=False)
        self.proj = _RowLinear(dim, dim)

    def forward(self, x: Tensor, steps: Tensor) -> Tensor:
        B, L = steps.shape
        return x + self.proj(self.table[steps.flatten()]).view(B, L, 1, -1)


class AgentAttention(nn.Module):
    """HMSA over the L agents at each of P cells. x (B, L, P, C), key_ok (B, L, P) bool ->
    (B, L, P, C); with ``ego_only`` only the ego's row is updated -> (B, 1, P, C) (and only the
    ego role has query / output projections: the last unit, whose other rows nothing reads)."""

    def __init__(self, dim: int, heads: int, head_dim: int, roles: int, dropout: float, ego_only: bool):
        super().__init__()
        inner = heads * head_dim
        self.heads, self.head_dim, self.roles, self.ego_only = heads, head_dim, roles, ego_only
        query_roles = 1 if ego_only else roles
        self.q = nn.ModuleList(nn.Linear(dim, inner) for _ in range(query_roles))
        self.k, self.v = (nn.ModuleList(nn.Linear(dim, inner) for _ in range(roles)) for _ in range(2))
        self.out = nn.ModuleList(nn.Linear(inner, dim) for _ in range(query_roles))
        # one (heads, D, D) matrix per (query role, key role); identity = plain dot product
        eye = torch.eye(head_dim).expand(query_roles * roles, heads, head_dim, head_dim)
        self.rel_att = nn.Parameter(eye.clone())
        self.rel_msg = nn.Parameter(eye.clone())
        self.drop = nn.Dropout(dropout)

    def _groups(self, stop: int):
        """(start, stop, role) slot ranges: slot 0 is the ego, the rest collaborators."""
        if self.roles == 1:
            return [(0, stop, 0)]
        return [(0, 1, 0)] + ([(1, stop, 1)] if stop > 1 else [])

    def _heads(self, lin: nn.Linear, x: Tensor) -> Tensor:
        return lin(x).unflatten(-1, (self.heads, self.head_dim))  # (B, l, P, M, D)

    def forward(self, x: Tensor, key_ok: Tensor) -> Tensor:
        keys = self._groups(x.shape[1])
        k = [self._heads(self.k[r], x[:, a:b]) for a, b, r in keys]
        v = [self._heads(self.v[r], x[:, a:b]) for a, b, r in keys]
        drop = ~key_ok[:, None, :, :, None]  # (B, 1, L, P, 1)
        outs = []
        for a, b, ri in self._groups(1 if self.ego_only else x.shape[1]):
            q = self._heads(self.q[ri], x[:, a:b]) * self.head_dim ** -0.5
            logits, msgs = [], []
            for kj, vj, (_, _, rj) in zip(k, v, keys):
                pair = ri * self.roles + rj
                kt = torch.einsum("mde,bjpme->bjpmd", self.rel_att[pair], kj)
                logits.append(torch.einsum("bipmd,bjpmd->bijpm", q, kt))
                msgs.append(torch.einsum("mde,bjpme->bjpmd", self.rel_msg[pair], vj))
            weights = torch.softmax(torch.cat(logits, 2).masked_fill(drop, float("-inf")), dim=2)
            mixed = torch.einsum("bijpm,bjpmd->bipmd", weights, torch.cat(msgs, 1))
            outs.append(self.out[ri](mixed.flatten(-2)))
        return self.drop(torch.cat(outs, 1))


class WindowAttention(nn.Module):
    """Self-attention inside w x w windows of each map, relative position bias.
    x (N, H, W, C), ok (N, H, W) bool (invalid cells are not attended) -> (N, H, W, C)."""

    def __init__(self, dim: int, window: int, heads: int, head_dim: int, dropout: float):
        super().__init__()
        self.window, self.heads, self.head_dim = window, heads, head_dim
        self.qkv = nn.Linear(dim, 3 * heads * head_dim, bias=False)
        self.bias_table = nn.Parameter(torch.randn(2 * window - 1, 2 * window - 1) * 0.02)
        yx = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
        rel = yx[:, None, :] - yx[:, :, None] + window - 1  # (2, w*w, w*w) offsets in [0, 2w-2]
        self.register_buffer("rel_index", rel[0] * (2 * window - 1) + rel[1], persistent=False)
        self.out = nn.Sequential(nn.Linear(heads * head_dim, dim), nn.Dropout(dropout))

    def forward(self, x: Tensor, ok: Tensor) -> Tensor:
        N, H, W, C = x.shape
        w, M, D = self.window, self.heads, self.head_dim
        ph, pw = -H % w, -W % w
        if ph or pw:
            x = F.pad(x, (0, 0, 0, pw, 0, ph))
            ok = F.pad(ok, (0, pw, 0, ph), value=False)
        nh, nw = (H + ph) // w, (W + pw) // w
        qkv = self.qkv(x).view(N, nh, w, nw, w, 3, M, D).permute(5, 0, 1, 3, 6, 2, 4, 7)
        q, k, v = qkv.reshape(3, N * nh * nw, M, w * w, D)
        bias = self.bias_table.flatten()[self.rel_index]  # (w*w, w*w)
        if not bool(ok.all()):
            okw = ok.view(N, nh, w, nw, w).permute(0, 1, 3, 2, 4).reshape(N * nh * nw, 1, 1, w * w)
            # a window without a valid key holds only invalid cells, which nothing reads: let it
            # attend to all so that no softmax row is empty
            okw = okw | ~okw.any(-1, keepdim=True)
            bias = bias.masked_fill(~okw, float("-inf"))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype))
        out = out.view(N, nh, nw, M, w, w, D).permute(0, 1, 4, 2, 5, 3, 6).reshape(N, nh * w, nw * w, M * D)
        return self.out(out[:, :H, :W])


class MultiScaleWindowAttention(nn.Module):
    """MSwin: one :class:`WindowAttention` per window size, merged by split attention or mean.
    x (N, H, W, C), ok (N, H, W) bool -> (N, H, W, C)."""

    def __init__(self, dim: int, windows: Sequence[int], heads: Sequence[int], head_dims: Sequence[int],
                 fuse: str, dropout: float):
        super().__init__()
        self.branches = nn.ModuleList(WindowAttention(dim, w, m, d, dropout)
                                      for w, m, d in zip(windows, heads, head_dims))
        self.fuse = fuse
        n = len(self.branches)
        self.gate = nn.Sequential(_RowLinear(dim, dim, bias=False), nn.LayerNorm(dim), nn.ReLU(),
                                  _RowLinear(dim, dim * n, bias=False)) if fuse == "split_attn" else None

    def forward(self, x: Tensor, ok: Tensor) -> Tensor:
        outs = [branch(x, ok) for branch in self.branches]
        if self.gate is None:
            return torch.stack(outs).mean(0)
        m = ok[..., None].to(x.dtype)  # pool over the valid cells of each map
        pooled = (sum(outs) * m).sum((1, 2)) / m.sum((1, 2)).clamp(min=1.0)  # (N, C)
        g = self.gate(pooled).view(len(x), len(outs), -1)
        g = torch.softmax(g, dim=1) if len(outs) > 1 else torch.sigmoid(g)
        return sum(o * g[:, i, None, None, :] for i, o in enumerate(outs))


class _Block(nn.Module):
    """One pre-norm [agent attention, window attention] pair."""

    def __init__(self, dim: int, agent: AgentAttention, window: MultiScaleWindowAttention):
        super().__init__()
        self.norm_agent, self.agent = nn.LayerNorm(dim), agent
        self.norm_window, self.window = nn.LayerNorm(dim), window

    def forward(self, x: Tensor, ok: Tensor, hw) -> Tensor:
        """x (B, L, P, C), ok (B, L, P) -> (B, L, P, C), or (B, 1, P, C) when ego-only."""
        B, _, P, C = x.shape
        x = x[:, :1 if self.agent.ego_only else None] + self.agent(self.norm_agent(x), ok)
        n = x.shape[1]
        maps = self.norm_window(x).view(B * n, *hw, C)
        return x + self.window(maps, ok[:, :n].reshape(B * n, *hw)).view(B, n, P, C)


class V2XViTFusion(nn.Module):
    """See the module docstring. Constructor arguments are ``model.fusion_args`` (``channels``
    is derived from the encoders). Defaults are the reference GPU configs' (GenComm / HEAL
    ``m1_v2xvit.yaml``: depth 3, one block a layer, agent attention 8 heads x 32, windows
    4 / 8 / 16 with 16 x 16, 8 x 32, 4 x 64 heads x widths, split attention, MLP 128, dropout 0.3,
    no delay encoding); the sim configs use a smaller setting (configs/sim/fusion_v2xvit.yaml).

    features (sum N, C, H, W), agents_per_sample (B,), valid (sum N, 1, H, W) or None, delays
    (sum N,) or None (only with ``delay_encoding``) -> (B, C, H, W) in each ego frame.
    """

    def __init__(self, channels: int, depth: int = 3, blocks_per_layer: int = 1, agent_heads: int = 8,
                 agent_head_dim: int = 32, role_specific: bool = True,
                 windows: Sequence[int] = (4, 8, 16), window_heads: Sequence[int] = (16, 8, 4),
                 window_head_dims: Sequence[int] = (16, 32, 64), window_fuse: str = "split_attn",
                 mlp_dim: int = 128, dropout: float = 0.3, delay_encoding: bool = False,
                 delay_step: float = 1.0, max_delay_steps: int = 100):
        super().__init__()
        where = "model.fusion_args"
        windows, window_heads, window_head_dims = list(windows), list(window_heads), list(window_head_dims)
        if not windows or not len(windows) == len(window_heads) == len(window_head_dims):
            raise ValueError(f"{where}: windows {windows}, window_heads {window_heads} and window_head_dims "
                             f"{window_head_dims} need one entry per window size (at least one)")
        for name, val in (("depth", depth), ("blocks_per_layer", blocks_per_layer), ("agent_heads", agent_heads),
                          ("agent_head_dim", agent_head_dim), ("mlp_dim", mlp_dim),
                          ("max_delay_steps", max_delay_steps)):
            if int(val) < 1:
                raise ValueError(f"{where}.{name} must be >= 1, got {val}")
        if min(windows + window_heads + window_head_dims) < 1:
            raise ValueError(f"{where}: window sizes, heads and head widths must be >= 1")
        if window_fuse not in ("split_attn", "mean"):
            raise ValueError(f"{where}.window_fuse: 'split_attn' or 'mean', got {window_fuse!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"{where}.dropout must be in [0, 1), got {dropout}")
        if delay_step <= 0:
            raise ValueError(f"{where}.delay_step must be > 0, got {delay_step}")
        self.channels = self.out_channels = int(channels)
        self.blocks_per_layer = int(blocks_per_layer)
        self.delay_step, self.max_delay_steps = float(delay_step), int(max_delay_steps)
        self.delay = DelayEncoding(channels, self.max_delay_steps) if delay_encoding else None
        roles = 2 if role_specific else 1
        self.blocks = nn.ModuleList(
            _Block(channels, AgentAttention(channels, agent_heads, agent_head_dim, roles, dropout,
                                            ego_only=i == depth * self.blocks_per_layer - 1),
                   MultiScaleWindowAttention(channels, windows, window_heads, window_head_dims, window_fuse,
                                             dropout))
            for i in range(depth * self.blocks_per_layer))
        self.ffn_norms = nn.ModuleList(nn.LayerNorm(channels) for _ in range(depth))
        self.ffns = nn.ModuleList(
            nn.Sequential(nn.Linear(channels, mlp_dim), nn.GELU(), nn.Dropout(dropout),
                          nn.Linear(mlp_dim, channels), nn.Dropout(dropout)) for _ in range(depth))

    @property
    def needs_delays(self) -> bool:
        """Whether the caller must pass ``delays`` (the delay encoding is on)."""
        return self.delay is not None

    def _steps(self, delays: Optional[Tensor], counts: Sequence[int]) -> Tensor:
        """(sum N,) delays -> (B, L) table rows (padding slots: row 0)."""
        n = sum(int(c) for c in counts)
        if delays is None or tuple(delays.shape) != (n,):
            got = None if delays is None else tuple(delays.shape)
            raise ValueError(f"V2XViTFusion with delay_encoding needs delays ({n},), one per row, got {got}")
        padded, _ = _pad_by_sample(delays.to(torch.float32).view(n, 1, 1, 1), counts, None)
        steps = torch.round(padded.view(len(counts), -1) / self.delay_step)
        return steps.clamp(0, self.max_delay_steps - 1).long()

    def forward(self, features: Tensor, agents_per_sample: Sequence[int], valid: Optional[Tensor] = None,
                delays: Optional[Tensor] = None) -> Tensor:
        check_channels(self, features)
        if delays is not None and self.delay is None:
            raise ValueError("V2XViTFusion got delays but was built without delay_encoding")
        x, ok = _pad_by_sample(features, agents_per_sample, valid)  # (B, L, C, H, W), (B, L, 1, H, W)
        B, L, C, H, W = x.shape
        x = x.permute(0, 1, 3, 4, 2).reshape(B, L, H * W, C)
        ok = ok.view(B, L, H * W)
        if self.delay is not None:
            x = self.delay(x, self._steps(delays, agents_per_sample).to(x.device))
        for i, block in enumerate(self.blocks):
            x = block(x, ok, (H, W))
            if (i + 1) % self.blocks_per_layer == 0:
                layer = i // self.blocks_per_layer
                x = x + self.ffns[layer](self.ffn_norms[layer](x))
        return x[:, 0].view(B, H, W, C).permute(0, 3, 1, 2).contiguous()
