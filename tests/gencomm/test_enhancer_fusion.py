"""Channel Enhancer and the Max / Att fusions."""
import math

import pytest
import torch

from gencomm.enhancer import ChannelEnhancer, PartialConv
from opencood_ext.models.fusion import AttFusion, MaxFusion


def test_enhancer_starts_as_identity_then_learns():
    torch.manual_seed(0)
    ce = ChannelEnhancer(channels=16, reduction=4)
    x = torch.randn(3, 16, 5, 6)
    torch.testing.assert_close(ce(x), x)
    opt = torch.optim.SGD(ce.parameters(), lr=0.5)
    target = x * 0.5
    for _ in range(3):
        opt.zero_grad()
        loss = (ce(x) - target).square().mean()
        loss.backward()
        opt.step()
    assert (ce(x) - target).square().mean() < (x - target).square().mean()


def test_enhancer_channel_attention_is_per_agent():
    torch.manual_seed(1)
    ce = ChannelEnhancer(channels=8, reduction=2)
    torch.nn.init.normal_(ce.att_fc2.weight)
    torch.nn.init.normal_(ce.project.weight)
    x = torch.randn(2, 8, 4, 4)
    y = ce(x)
    x2 = x.clone()
    x2[1] *= 3
    y2 = ce(x2)
    torch.testing.assert_close(y[0], y2[0])
    assert not torch.allclose(y[1], y2[1])
    assert y.shape == x.shape and ce.out_channels == 8


def test_partial_conv_touches_only_its_channels():
    pc = PartialConv(8, ratio=0.25)
    x = torch.randn(1, 8, 4, 4)
    y = pc(x)
    assert pc.conv_channels == 2
    torch.testing.assert_close(y[:, 2:], x[:, 2:])
    assert not torch.allclose(y[:, :2], x[:, :2])
    with pytest.raises(ValueError):
        ChannelEnhancer(channels=8)(torch.randn(1, 4, 2, 2))


def _att_reference(x):
    """Per-pixel loop: ego query over all agents of one sample."""
    l, c, h, w = x.shape
    out = torch.zeros(c, h, w)
    for i in range(h):
        for j in range(w):
            v = x[:, :, i, j]
            a = torch.softmax(v @ v[0] / math.sqrt(c), dim=0)
            out[:, i, j] = a @ v
    return out


def test_att_fusion_matches_loop_and_handles_single_agent():
    torch.manual_seed(2)
    feats = torch.randn(6, 4, 3, 5)
    counts = [3, 1, 2]
    fused = AttFusion(4)(feats, counts)
    assert fused.shape == (3, 4, 3, 5)
    torch.testing.assert_close(fused[0], _att_reference(feats[0:3]))
    torch.testing.assert_close(fused[1], feats[3])  # one agent -> its own feature
    torch.testing.assert_close(fused[2], _att_reference(feats[4:6]))


def test_max_fusion_and_valid_masks():
    feats = torch.tensor([-1.0, -5.0, 2.0, -3.0]).view(4, 1, 1, 1).repeat(1, 2, 2, 2)
    out = MaxFusion()(feats, [2, 1, 1])
    assert out.shape == (3, 2, 2, 2)
    assert out[0].eq(-1.0).all() and out[1].eq(2.0).all() and out[2].eq(-3.0).all()
    # The second agent covers only cell (0, 0): elsewhere it must not take part.
    feats2 = torch.stack([torch.full((2, 2, 2), -1.0), torch.full((2, 2, 2), 4.0)])
    valid = torch.zeros(2, 1, 2, 2)
    valid[1, 0, 0, 0] = 1
    fused = MaxFusion()(feats2, [2], valid)
    assert fused[0, :, 0, 0].eq(4.0).all() and fused[0, :, 1, 1].eq(-1.0).all()
    att = AttFusion(2)(feats2, [2], valid)
    torch.testing.assert_close(att[0, :, 1, 1], torch.full((2,), -1.0))


def test_fusion_bad_counts():
    with pytest.raises(ValueError, match="sum to"):
        MaxFusion()(torch.randn(3, 2, 2, 2), [1, 1])
    with pytest.raises(ValueError, match=">= 1"):
        AttFusion(2)(torch.randn(2, 2, 2, 2), [2, 0])


def test_att_fusion_gradients():
    feats = torch.randn(3, 4, 2, 2, requires_grad=True)
    AttFusion(4)(feats, [3]).sum().backward()
    assert feats.grad[1:].abs().sum() > 0
