"""Our reference-structured modules against the reference's checkpoint layout and computation.

For each module (BaseBEVBackbone ``base_bev``, DownsampleConv ``downsample_conv``, the message
extractor, generator and enhancer ``variant: reference``) a state dict is built from a key list
written out by hand from the public reference source (jeffreychou777/GenComm and HEAL:
``sub_modules/base_bev_backbone.py``, ``sub_modules/downsample_conv.py``,
``gencomm_modules/message_extractor_v2.py``, ``unet.py``, ``cond_diff.py``, ``enhancer.py``) with
random values; it must import into our module with every key used, and our module must then
compute what the reference computes with those tensors, written here with torch.nn.functional
in the reference's own parameter names and order.
"""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gencomm  # noqa: F401  (registers GenComm's layouts)
from gencomm.enhancer import ChannelEnhancer
from gencomm.generator import SpatialAwareFeatureGenerator
from gencomm.message import DeformableMessageExtractor
from opencood_ext.interop.weights import WeightImportError, export_reference_state, import_reference_state
from opencood_ext.models.backbone import BaseBEVBackbone, DownsampleConv
from opencood_ext.models.deform_conv import deform_conv2d
from reference_keys import (SCHEDULE, base_bev, diffusion_unet, downsample_conv, enhancer, enhancer_unread,
                            gencomm_schedule, message_extractor, random_state, sinusoid)

torch.set_num_threads(1)


def _params(module):
    return sum(p.numel() for p in module.parameters())


def _at(path, module):
    """A model holding ``module`` at ``path`` (one of SLOTS' paths, e.g. link.dme.m1)."""
    root = node = nn.Module()
    *parents, last = path.split(".")
    for name in parents:
        child = nn.Module()
        node.add_module(name, child)
        node = child
    node.add_module(last, module)
    return root


def _import(path, module, ref):
    mapping = import_reference_state(ref, _at(path, module))
    missing = set(module.state_dict()) - {k[len(path) + 1:] for k in mapping.state}
    assert not missing and mapping.unused == []
    module.load_state_dict({k[len(path) + 1:]: v for k, v in mapping.state.items()})
    return mapping


def _bn(sd, prefix, x, eps):
    return F.batch_norm(x, sd[f"{prefix}.running_mean"], sd[f"{prefix}.running_var"], sd[f"{prefix}.weight"],
                        sd[f"{prefix}.bias"], False, 0.0, eps)


# ---------------------------------------------------------------- BaseBEVBackbone
# c_in, c, layer_num, stride, up, c_up: a strided-conv "upsample" (0.5), a 1x1 transposed conv (1), a 2x2 one
LEVELS = [(8, 8, 1, 1, 0.5, 8), (8, 16, 2, 2, 1, 8), (16, 16, 0, 2, 2, 8)]
BASE_BEV_KEYS = base_bev("backbone_m1", [(cin, c, num, up, cu) for cin, c, num, _, up, cu in LEVELS])


def _base_bev_reference(sd, x, prefix):
    ups = []
    for i, (_, _, num, stride, up, _) in enumerate(LEVELS):
        x = F.conv2d(F.pad(x, (1, 1, 1, 1)), sd[f"{prefix}.blocks.{i}.1.weight"], stride=stride)
        x = _bn(sd, f"{prefix}.blocks.{i}.2", x, 1e-3).relu()
        for k in range(1, num + 1):
            x = F.conv2d(x, sd[f"{prefix}.blocks.{i}.{1 + 3 * k}.weight"], padding=1)
            x = _bn(sd, f"{prefix}.blocks.{i}.{2 + 3 * k}", x, 1e-3).relu()
        w = sd[f"{prefix}.deblocks.{i}.0.weight"]
        y = F.conv_transpose2d(x, w, stride=int(up)) if up >= 1 else F.conv2d(x, w, stride=round(1 / up))
        ups.append(_bn(sd, f"{prefix}.deblocks.{i}.1", y, 1e-3).relu())
    return torch.cat(ups, dim=1)


def test_base_bev_backbone_is_the_reference_computation():
    bb = BaseBEVBackbone(8, layer_nums=[1, 2, 0], layer_strides=[1, 2, 2], num_filters=[8, 16, 16],
                         upsample_strides=[0.5, 1, 2], num_upsample_filters=[8, 8, 8]).eval()
    with pytest.raises(ValueError, match="different strides"):
        BaseBEVBackbone(8, layer_nums=[1, 1], layer_strides=[2, 2], num_filters=[8, 8], upsample_strides=[1, 1],
                        num_upsample_filters=[8, 8])
    ref = random_state(BASE_BEV_KEYS, seed=0)
    _import("encoders.m1.backbone", bb, ref)
    x = torch.randn(2, 8, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(bb(x), _base_bev_reference(ref, x, "backbone_m1"), atol=1e-5, rtol=1e-4)


def test_base_bev_backbone_parameters_follow_the_docstring():
    bb = BaseBEVBackbone(64)  # the reference m1: layer_nums 3 5 8, num_filters 64 128 256, upsample 1 2 4 -> 128
    assert [_params(level) for level in bb.levels] == [147_968, 812_544, 5_018_112]
    assert [_params(up) for up in bb.ups] == [8_448, 65_792, 524_544]
    assert _params(bb) == 6_577_408
    # level 0: a stride-2 conv 64 -> 64 and 3 more convs, BN each
    assert _params(bb.levels[0]) == 9 * 64 * 64 + 2 * 64 + 3 * (9 * 64 * 64 + 2 * 64)


# ---------------------------------------------------------------- DownsampleConv
def test_downsample_conv_is_the_reference_computation_and_size():
    sh = DownsampleConv(16, kernel_size=[3, 1], stride=[2, 1], padding=[1, 0], dims=[8, 4])
    shapes = downsample_conv("shrinker_m1", [(16, 8, 3), (8, 4, 1)])
    ref = random_state(shapes, seed=1)
    _import("encoders.m1.shrink", sh, ref)
    x = torch.randn(2, 16, 10, 12)
    want = x
    for i, (s, p) in enumerate(((2, 1), (1, 0))):
        w = {k.rsplit(".", 2)[-2] + "." + k.rsplit(".", 1)[-1]: v for k, v in ref.items() if f".layers.{i}." in k}
        want = F.conv2d(want, w["0.weight"], w["0.bias"], stride=s, padding=p).relu()
        want = F.conv2d(want, w["2.weight"], w["2.bias"], padding=1).relu()
    torch.testing.assert_close(sh(x), want)
    assert sh(x).shape == (2, 4, 5, 6) and sh.out_shape((10, 12)) == (5, 6) and sh.stride == 2
    assert _params(DownsampleConv(384, [3], [2], [1], [128])) == 442_496 + 147_584  # the reference m1 header
    with pytest.raises(ValueError, match="not a multiple of the shrink stride 2"):
        sh.out_shape((9, 12))
    with pytest.raises(ValueError, match="kernel 3, stride 2, padding 0"):
        DownsampleConv(16, [3], [2], [0], [8])


# ---------------------------------------------------------------- message extractor
C = 8  # the reference hard-codes the extractor's width 64 (SE 32) and 18 offset channels


def test_reference_message_extractor_is_the_reference_computation():
    dme = DeformableMessageExtractor(in_channels=C, variant="reference")
    ref = random_state(message_extractor("message_extractor_m1", C), seed=2)
    _import("link.dme.m1", dme, ref)
    w = {k.split("bev_extractor.")[1]: v for k, v in ref.items()}
    x = torch.randn(2, C, 6, 7)
    y = deform_conv2d(x, F.conv2d(x, w["offset1.weight"], w["offset1.bias"], padding=1), w["dcn1.weight"],
                      w["dcn1.bias"], padding=(1, 1))
    gate = F.conv2d(F.conv2d(y.mean(dim=(2, 3), keepdim=True), w["attn.1.weight"], w["attn.1.bias"]).relu(),
                    w["attn.3.weight"], w["attn.3.bias"]).sigmoid()
    want = F.conv2d(F.conv2d(y * gate, w["fuse.0.weight"], w["fuse.0.bias"]).relu(), w["fuse.2.weight"],
                    w["fuse.2.bias"])
    torch.testing.assert_close(dme(x), want, atol=1e-5, rtol=1e-4)


def test_default_message_extractor_is_refused_by_the_reference_layout():
    with pytest.raises(WeightImportError, match="link.dme.m1: DeformableMessageExtractor has no reference layout "
                                                r"\(variant 'default'.*variant: reference"):
        import_reference_state(random_state(message_extractor("message_extractor_m1", C), 0), _at("link.dme.m1", DeformableMessageExtractor(C)))


# ---------------------------------------------------------------- generator (DDPM UNet + schedule)
def _unet_reference(w, x, t, ch, mult, blocks):
    """DiffusionUNet.forward in the reference's names and order (GroupNorm(4, eps 1e-6), swish)."""
    def gn(h, name):
        return F.group_norm(h, 4, w[f"{name}.weight"], w[f"{name}.bias"], eps=1e-6)

    def conv(h, name, **kw):
        return F.conv2d(h, w[f"{name}.weight"], w[f"{name}.bias"], **kw)

    def block(h, name, temb):
        y = conv(F.silu(gn(h, f"{name}.norm1")), f"{name}.conv1", padding=1)
        y = y + F.linear(F.silu(temb), w[f"{name}.temb_proj.weight"], w[f"{name}.temb_proj.bias"])[:, :, None, None]
        y = conv(F.silu(gn(y, f"{name}.norm2")), f"{name}.conv2", padding=1)
        return (conv(h, f"{name}.nin_shortcut") if f"{name}.nin_shortcut.weight" in w else h) + y

    temb = sinusoid(t, ch)
    temb = F.linear(F.silu(F.linear(temb, w["temb.dense.0.weight"], w["temb.dense.0.bias"])),
                    w["temb.dense.1.weight"], w["temb.dense.1.bias"])
    hs = [conv(x, "conv_in", padding=1)]
    for i in range(len(mult)):
        for j in range(blocks):
            hs.append(block(hs[-1], f"down.{i}.block.{j}", temb))
        if i != len(mult) - 1:
            hs.append(conv(F.pad(hs[-1], (0, 1, 0, 1)), f"down.{i}.downsample.conv", stride=2))
    h = block(block(hs[-1], "mid.block_1", temb), "mid.block_2", temb)
    for i in reversed(range(len(mult))):
        for j in range(blocks + 1):
            h = block(torch.cat([h, hs.pop()], dim=1), f"up.{i}.block.{j}", temb)
        if i != 0:
            h = conv(F.interpolate(h, scale_factor=2.0, mode="nearest"), f"up.{i}.upsample.conv", padding=1)
    return conv(F.silu(gn(h, "norm_out")), "conv_out", padding=1)


@pytest.mark.parametrize("mult", [(1, 1), (1, 2)])
def test_reference_generator_is_the_reference_unet(mult):
    safg = SpatialAwareFeatureGenerator(C, 2, base_channels=8, variant="reference", channel_mult=mult).eval()
    shapes = diffusion_unet("gencomm.denoiser", 8, mult, 2, C + 2, C)
    ref = random_state(shapes, seed=3)
    ref.update({k: v for k, v in export_reference_state(_at("link.safg.m1", safg))[0].items()
                if k.split(".")[1] in SCHEDULE})
    assert set(ref) == set(shapes) | {f"gencomm.{n}" for n in SCHEDULE}
    _import("link.safg.m1", safg, ref)
    w = {k[len("gencomm.denoiser."):]: v for k, v in ref.items() if k.startswith("gencomm.denoiser.")}
    x, t = torch.randn(3, C + 2, 8, 12), torch.tensor([0, 1, 2])
    with torch.no_grad():
        torch.testing.assert_close(safg.unet(x, t), _unet_reference(w, x, t, 8, mult, 2), atol=1e-5, rtol=1e-4)


def test_reference_schedule_buffers_drive_our_sampler():
    """Our chain equals the reference's sampler run on the exported buffers (q_sample to the last step,
    posterior mean coef1 * x0 + coef2 * x_t plus exp(0.5 log variance) noise, x0 at t = 0), same noise."""
    torch.manual_seed(0)
    safg = SpatialAwareFeatureGenerator(C, 2, base_channels=8, variant="reference").eval()
    buf = {k.split(".", 1)[1]: v for k, v in export_reference_state(_at("link.safg.m1", safg))[0].items()
           if k.split(".")[1] in SCHEDULE}
    assert buf["betas"].tolist() == pytest.approx([5e-3, ((5e-3 ** 0.5 + 5e-2 ** 0.5) / 2) ** 2, 5e-2])
    for name, want in gencomm_schedule("s").items():  # the reference's buffers, computed as cond_diff.py does
        torch.testing.assert_close(buf[name[2:]], want, rtol=1e-6, atol=0)
    msg, init = torch.randn(2, 2, 6, 6), torch.randn(2, C, 6, 6)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        ours = safg(msg, init, generator=torch.Generator().manual_seed(5)).feature
        x = buf["sqrt_alphas_cumprod"][2] * init + buf["sqrt_one_minus_alphas_cumprod"][2] * torch.randn(
            init.shape, generator=g)
        for t in (2, 1, 0):
            x0 = safg.unet(torch.cat([msg, x], dim=1), torch.full((2,), t))
            if t:
                x = buf["posterior_mean_coef1"][t] * x0 + buf["posterior_mean_coef2"][t] * x + (
                    0.5 * buf["posterior_log_variance_clipped"][t]).exp() * torch.randn(x.shape, generator=g)
    torch.testing.assert_close(ours, x0, atol=1e-5, rtol=1e-4)


def test_a_different_schedule_is_refused():
    safg = SpatialAwareFeatureGenerator(C, 2, base_channels=8, variant="reference")
    ref, _ = export_reference_state(_at("link.safg.m1", safg))
    ref["gencomm.betas"] = ref["gencomm.betas"] * 0.1  # a checkpoint trained with another schedule
    with pytest.raises(WeightImportError, match=r"reference gencomm.betas = \[0.0005, 0.002166, 0.005\] "
                                                r"differs from this SpatialAwareFeatureGenerator's \[0.005, "):
        import_reference_state(ref, _at("link.safg.m1", safg))


# ---------------------------------------------------------------- enhancer
def _enhancer_reference(w, x):
    """Enhancer.forward: block_1 (x + LN1(x), then x + FRFN(LN2(x))) and SplitAttn, on (N, H*W, C) tokens."""
    n, c, h, wd = x.shape
    b = "block_1"
    t = x.permute(0, 2, 3, 1).reshape(n, h * wd, c)
    t = t + F.layer_norm(t, (c,), w[f"{b}.norm1.weight"], w[f"{b}.norm1.bias"])
    y = F.layer_norm(t, (c,), w[f"{b}.norm2.weight"], w[f"{b}.norm2.bias"])
    y = y.reshape(n, h, wd, c).permute(0, 3, 1, 2)
    y = torch.cat([F.conv2d(y[:, :c // 4], w[f"{b}.mlp.partial_conv3.weight"], padding=1), y[:, c // 4:]], dim=1)
    y = F.gelu(F.linear(y.flatten(2).transpose(1, 2), w[f"{b}.mlp.linear1.0.weight"], w[f"{b}.mlp.linear1.0.bias"]))
    y1, y2 = y.chunk(2, dim=-1)
    y1 = F.conv2d(y1.transpose(1, 2).reshape(n, 2 * c, h, wd), w[f"{b}.mlp.dwconv.0.weight"],
                  w[f"{b}.mlp.dwconv.0.bias"], padding=1, groups=2 * c)
    y = F.gelu(y1).flatten(2).transpose(1, 2) * y2
    t = t + F.linear(y, w[f"{b}.mlp.linear2.0.weight"], w[f"{b}.mlp.linear2.0.bias"])
    s = t.reshape(n, h, wd, c).mean(dim=(1, 2))
    s = F.linear(F.relu(F.layer_norm(F.linear(s, w["split_attn.fc1.weight"]), (c,), w["split_attn.bn1.weight"],
                                     w["split_attn.bn1.bias"])), w["split_attn.fc2.weight"]).sigmoid()
    return (t.reshape(n, h, wd, c) * s[:, None, None]).permute(0, 3, 1, 2)


def test_reference_enhancer_is_the_reference_computation():
    enh = ChannelEnhancer(C, variant="reference")
    ref = random_state(enhancer("enhancer", C), seed=4)
    mapping = _import("link.enhancer.m1", enh, ref)
    unread = enhancer_unread(ref)
    assert sorted(mapping.dropped) == sorted(unread) and len(unread) == 7 + 2 * 18
    assert "reference keys its forward never reads, dropped (43):" in mapping.summary()
    x = torch.randn(3, C, 5, 6)
    torch.testing.assert_close(enh(x), _enhancer_reference({k[len("enhancer."):]: v for k, v in ref.items()}, x),
                               atol=1e-5, rtol=1e-4)
    exported, _ = export_reference_state(_at("link.enhancer.m1", enh))
    assert set(exported) == set(ref) - set(unread)  # the unread ones are left out (the reference loads non-strict)


def test_reference_enhancer_size_and_arguments():
    assert _params(ChannelEnhancer(128, variant="reference")) == 144_256
    assert _params(ChannelEnhancer(128)) == _params(ChannelEnhancer(128, 0.25, 1.0, 8))  # defaults unchanged
    with pytest.raises(ValueError, match="apply to variant 'default' only"):
        ChannelEnhancer(8, expansion=2.0, variant="reference")


# ---------------------------------------------------------------- the encoder stack's shrink option
def test_encoder_stack_takes_a_reference_shrink_header():
    from opencood_ext.models import EncoderStack

    enc = {"type": "pointpillars", "voxel_size": [0.8, 0.8, 4.0], "num_filters": [8]}
    bb = {"type": "base_bev", "layer_nums": [1, 1], "layer_strides": [2, 2], "num_filters": [8, 16],
          "upsample_strides": [1, 2], "num_upsample_filters": [8, 8]}
    rng = [-32.0, -32.0, -3.0, 32.0, 32.0, 1.0]
    default = EncoderStack(enc, bb, rng, shrink_channels=8)  # ShrinkConv, the grid of the backbone
    assert type(default.shrink).__name__ == "ShrinkConv" and default.grid.shape == (40, 40)
    assert default.grid.cell == (1.6, 1.6) and EncoderStack(enc, bb, rng).out_channels == 128
    stack = EncoderStack(enc, bb, rng, shrink={"type": "downsample_conv", "stride": [2], "dims": [8]})
    assert isinstance(stack.shrink, DownsampleConv) and isinstance(stack.backbone, BaseBEVBackbone)
    assert stack.grid.shape == (20, 20) and stack.grid.cell == (3.2, 3.2) and stack.out_channels == 8
    with pytest.raises(ValueError, match=r"m1.shrink_channels: set the width inside m1.shrink"):
        EncoderStack(enc, bb, rng, shrink_channels=8, shrink={"type": "downsample_conv"}, where="m1")
    with pytest.raises(ValueError, match=r"m1.shrink.in_channels: is derived"):
        EncoderStack(enc, bb, rng, shrink={"type": "downsample_conv", "in_channels": 16}, where="m1")
    with pytest.raises(ValueError, match=r"m1: encoder BEV grid \(80, 80\).*not a multiple of the shrink stride 3"):
        EncoderStack(enc, bb, rng, shrink={"type": "downsample_conv", "stride": [3], "kernel_size": [3],
                                           "padding": [0]}, where="m1")
