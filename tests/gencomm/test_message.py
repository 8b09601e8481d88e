"""Deformable Message Extractor: shapes, parameter budget, deformable path, FLOP counting."""
import pytest
import torch
from torch import nn

from opencood_ext.models.deform_conv import DeformConv2d
from opencood_ext.eval.flops import count_flops, count_parameters, flops_during, profile_flops
from gencomm.message import DeformableMessageExtractor


def test_shape_and_frame_preserved():
    dme = DeformableMessageExtractor(in_channels=16, hidden_channels=8, message_channels=2, se_reduction=2)
    out = dme(torch.randn(3, 16, 5, 7))
    assert out.shape == (3, 2, 5, 7)
    assert dme.out_channels == 2


def test_parameter_count_near_paper():
    dme = DeformableMessageExtractor()  # C=128
    n = count_parameters(dme)
    assert n == 103_156  # the arithmetic in gencomm/message.py
    assert abs(n - 103_000) / 103_000 < 0.10
    assert count_parameters(dme, trainable_only=True) == n
    dme.offset.weight.requires_grad_(False)
    assert count_parameters(dme, trainable_only=True) == n - dme.offset.weight.numel()


def test_reference_variant_has_the_reference_layers_and_size():
    """variant reference: 103,028 parameters at C=128 (the docstring's sum), no BatchNorm, biases on the
    deformable and the 1x1 conv; the default variant is unchanged (checked above)."""
    dme = DeformableMessageExtractor(variant="reference")
    assert count_parameters(dme) == 103_028 == 20_754 + 73_728 + 64 + 4_192 + 4_096 + 64 + 130
    assert not any(isinstance(m, nn.BatchNorm2d) for m in dme.modules())
    assert dme.deform.bias is not None and dme.conv1.bias is not None
    assert dme(torch.randn(2, 128, 4, 5)).shape == (2, 2, 4, 5)
    with pytest.raises(ValueError, match="variant must be 'default' or 'reference'"):
        DeformableMessageExtractor(variant="paper")


def test_offsets_are_used_and_trainable():
    torch.manual_seed(0)
    dme = DeformableMessageExtractor(in_channels=8, hidden_channels=8, se_reduction=2).eval()
    x = torch.randn(2, 8, 6, 6)
    before = dme(x)
    with torch.no_grad():
        dme.offset.bias.fill_(0.7)  # shift every tap by 0.7 px
    after = dme(x)
    assert not torch.allclose(before, after)
    dme.train()
    dme(x).square().mean().backward()
    assert dme.offset.weight.grad is not None and dme.offset.weight.grad.abs().sum() > 0
    assert dme.deform.weight.grad.abs().sum() > 0


def test_wrong_channels_raises():
    with pytest.raises(ValueError, match=r"\(N, 128, H, W\)"):
        DeformableMessageExtractor()(torch.randn(1, 64, 4, 4))


def test_flops_count_deformable_sampling():
    c, d, h, w = 8, 4, 5, 6
    dme = DeformableMessageExtractor(in_channels=c, hidden_channels=d, message_channels=2, se_reduction=2)
    rep = profile_flops(dme, torch.randn(1, c, h, w))
    hw = h * w
    assert rep.by_type["Conv2d"] == hw * (c * 9 * 18 + d * d + d * 2)
    assert rep.by_type["DeformConv2d"] == hw * (c * 9 * d + 4 * c * 9)
    assert rep.by_type["Linear"] == d * (d // 2) * 2
    assert rep.by_type["BatchNorm2d"] == 2 * d * hw
    assert rep.flops == 2 * rep.macs == count_flops(dme, torch.randn(1, c, h, w))
    assert dme.training  # mode restored


def test_flops_during_counts_only_the_named_parts_of_a_whole_pass():
    c, d, h, w = 8, 4, 5, 6
    head = nn.Conv2d(2, 3, 1)
    dme = DeformableMessageExtractor(in_channels=c, hidden_channels=d, message_channels=2, se_reduction=2)
    model = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), dme, head)  # the DME's input comes from the first conv
    x = torch.randn(2, 3, h, w)
    assert flops_during([dme], lambda: model(x)) == count_flops(dme, torch.randn(2, c, h, w))
    assert flops_during([head], lambda: model(x)) == 2 * 2 * h * w * 2 * 3
    assert flops_during([dme, head, dme], lambda: model(x)) == count_flops(dme, torch.randn(2, c, h, w)) + 2 * 2 * h * w * 6
    assert flops_during([model], lambda: model(x)) == count_flops(model, x)


def test_flops_modulated_and_conv_match_torch_counter():
    from torch.utils.flop_counter import FlopCounterMode
    conv = nn.Conv2d(3, 5, 3, padding=1, groups=1)
    x = torch.randn(2, 3, 4, 4)
    with FlopCounterMode(display=False) as fc:
        conv(x)
    assert count_flops(conv, x) == fc.get_total_flops()

    class Wrap(nn.Module):
        def __init__(self):
            super().__init__()
            self.dc = DeformConv2d(2, 3, 3, padding=1)

        def forward(self, a, off, m):
            return self.dc(a, off, m)

    rep = profile_flops(Wrap(), (torch.randn(1, 2, 4, 4), torch.zeros(1, 18, 4, 4), torch.ones(1, 9, 4, 4)))
    assert rep.macs == 16 * (2 * 9 * 3) + 16 * 2 * 9 * 5
