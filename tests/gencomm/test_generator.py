"""SAFG: schedule, DDPM step math vs diffusers, unrolled gradients, batching, determinism, loss;
both UNet variants (compact, and the reference GenComm's structure and size)."""
import numpy as np
import pytest
import torch

from gencomm.generator import (GenerationOutput, ResidualUNet, SpatialAwareFeatureGenerator, generation_loss,
                               sinusoidal_embedding)

C, M = 8, 2
VARIANTS = ["compact", "reference"]


def _gen(seed=0, **kw):
    torch.manual_seed(seed)
    return SpatialAwareFeatureGenerator(feature_channels=C, message_channels=M, base_channels=8, **kw)


def _params(module):
    return sum(p.numel() for p in module.parameters())


def _inputs(n=2, h=5, w=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, M, h, w, generator=g), torch.randn(n, C, h, w, generator=g)


def test_schedule_is_sqrt_linear_and_x0_parameterised():
    safg = _gen()
    betas = safg.scheduler.betas.double().numpy()
    np.testing.assert_allclose(betas, [5e-3, ((5e-3 ** 0.5 + 5e-2 ** 0.5) / 2) ** 2, 5e-2], rtol=1e-6)
    assert safg.scheduler.config.prediction_type == "sample"
    assert safg.scheduler.config.clip_sample is False
    assert safg.scheduler.config.num_train_timesteps == 3


def test_output_types_and_shapes():
    safg = _gen()
    msg, init = _inputs()
    out = safg(msg, init, generator=torch.Generator().manual_seed(0))
    assert isinstance(out, GenerationOutput)
    assert out.feature.shape == init.shape and out.x_start.shape == init.shape
    assert out.timesteps == (2, 1, 0) and len(out.x0_predictions) == 3
    assert out.feature is out.x0_predictions[-1]


def test_posterior_step_equals_diffusers_step():
    safg = _gen()
    g = torch.Generator().manual_seed(3)
    x0, xt = torch.randn(2, C, 4, 4, generator=g), torch.randn(2, C, 4, 4, generator=g)
    for t in (2, 1, 0):
        want = safg.scheduler.step(x0, t, xt, generator=torch.Generator().manual_seed(9)).prev_sample
        noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(9))
        torch.testing.assert_close(safg.posterior_step(x0, xt, t, noise), want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_full_chain_equals_diffusers_loop(variant):
    """The unrolled chain equals add_noise to the last step + scheduler.step loop with the same draws."""
    safg = _gen(variant=variant).eval()
    msg, init = _inputs()
    got = safg(msg, init, generator=torch.Generator().manual_seed(5)).feature
    sched = safg.scheduler
    sched.set_timesteps(3)
    g = torch.Generator().manual_seed(5)
    x = sched.add_noise(init, torch.randn(init.shape, generator=g), torch.tensor([2]))
    for t in sched.timesteps:
        x0 = safg.unet(torch.cat([msg, x], 1), torch.full((2,), int(t)))
        x = sched.step(x0, t, x, generator=g).prev_sample
    torch.testing.assert_close(got, x, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_gradients_flow_through_unrolled_chain(variant):
    safg = _gen(variant=variant)
    msg, init = _inputs()
    msg.requires_grad_()
    init.requires_grad_()
    out = safg(msg, init)
    out.feature.square().mean().backward()
    assert init.grad is not None and init.grad.abs().sum() > 0  # only reachable through all 3 steps
    assert msg.grad.abs().sum() > 0
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in safg.unet.parameters())
    if variant == "compact":  # the step embedding rows of all three steps are used
        emb = safg.unet.step_embed[0].weight.grad
        assert (emb.abs().sum(dim=1) > 0).all()


@pytest.mark.parametrize("variant", VARIANTS)
def test_batched_agents_are_independent(variant):
    safg = _gen(variant=variant).eval()
    msg, init = _inputs(n=3)
    a = safg(msg, init, generator=torch.Generator().manual_seed(0)).feature
    init2 = init.clone()
    init2[1] += 5.0
    b = safg(msg, init2, generator=torch.Generator().manual_seed(0)).feature
    torch.testing.assert_close(a[[0, 2]], b[[0, 2]])
    assert not torch.allclose(a[1], b[1])


@pytest.mark.parametrize("variant", VARIANTS)
def test_seeded_generator_is_deterministic(variant):
    safg = _gen(variant=variant)
    msg, init = _inputs()
    a = safg(msg, init, generator=torch.Generator().manual_seed(7)).feature
    b = safg(msg, init, generator=torch.Generator().manual_seed(7)).feature
    c = safg(msg, init, generator=torch.Generator().manual_seed(8)).feature
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)


def test_shape_mismatch_raises():
    safg = _gen()
    msg, init = _inputs()
    with pytest.raises(ValueError, match="share N, H, W"):
        safg(msg[:, :, :4], init)
    with pytest.raises(ValueError, match="message"):
        safg(torch.randn(2, 3, 5, 7), init)


def test_generation_loss_mask():
    pred = torch.zeros(2, 3, 2, 2)
    target = torch.ones(2, 3, 2, 2)
    target[1] = 3.0
    assert generation_loss(pred, target).item() == pytest.approx(5.0)
    mask = torch.zeros(2, 2, 2)
    mask[0] = 1
    assert generation_loss(pred, target, mask).item() == pytest.approx(1.0)
    assert generation_loss(pred, target, mask[:, None]).item() == pytest.approx(1.0)
    assert generation_loss(pred, target, torch.zeros(2, 2, 2)).item() == 0.0
    with pytest.raises(ValueError):
        generation_loss(pred, target[:, :2])


def test_compact_parameter_counts():
    """The counts the docstring and the configs quote (C=128, m=2)."""
    counts = {b: _params(SpatialAwareFeatureGenerator(128, 2, base_channels=b)) for b in (16, 32, 64)}
    assert counts == {16: 69_616, 32: 234_848, 64: 852_544}


def test_reference_variant_has_the_reference_size():
    """C=128, m=2, b=8: 43,176 parameters, part by part as the docstring adds them up."""
    safg = SpatialAwareFeatureGenerator(128, 2, base_channels=8, variant="reference")
    unet = safg.unet
    assert isinstance(unet, ResidualUNet)
    assert _params(safg) == 43_176
    assert _params(unet.step_embed) == 1_344
    assert _params(unet.inp) == 9_368
    assert [_params(b) for level in unet.down_blocks for b in level] == [1_464] * 4
    assert _params(unet.downsample) == 584
    assert [_params(b) for b in unet.mid] == [1_464] * 2
    assert [_params(b) for level in unet.up_blocks for b in level] == [2_192] * 6
    assert _params(unet.upsample) == 584
    assert _params(unet.out_norm) + _params(unet.out) == 9_360
    assert all(m.num_groups == 4 and m.eps == 1e-6 for m in unet.modules() if isinstance(m, torch.nn.GroupNorm))


def test_reference_unet_any_size_and_deeper_configs():
    """Odd maps come back at their size; three levels (x1, x2, x2) work; too small a map is refused."""
    torch.manual_seed(0)
    unet = ResidualUNet(10, 6, base_channels=8, channel_mult=(1, 2, 2), num_res_blocks=1)
    for hw in ((5, 7), (16, 16), (9, 4)):
        assert unet(torch.randn(2, 10, *hw), torch.tensor([0, 2])).shape == (2, 6, *hw)
    with pytest.raises(ValueError, match="H, W >= 4"):
        unet(torch.randn(1, 10, 3, 8), torch.tensor([0]))


def test_reference_unet_depends_on_the_step():
    torch.manual_seed(0)
    unet = ResidualUNet(10, 6, base_channels=8)
    x = torch.randn(1, 10, 6, 6).expand(3, -1, -1, -1)
    out = unet(x, torch.tensor([0, 1, 2]))
    assert not torch.allclose(out[0], out[1]) and not torch.allclose(out[1], out[2])


def test_sinusoidal_embedding():
    emb = sinusoidal_embedding(torch.tensor([0, 2]), 8)
    assert emb.shape == (2, 8)
    torch.testing.assert_close(emb[0], torch.tensor([0.0] * 4 + [1.0] * 4))
    freqs = torch.tensor([10000.0 ** (-i / 3) for i in range(4)])
    torch.testing.assert_close(emb[1], torch.cat([(2 * freqs).sin(), (2 * freqs).cos()]))
    assert sinusoidal_embedding(torch.tensor([1]), 9).shape == (1, 9)
    with pytest.raises(ValueError, match="dim >= 4"):
        sinusoidal_embedding(torch.tensor([1]), 3)


def test_variant_arguments_are_checked():
    with pytest.raises(ValueError, match="variant"):
        SpatialAwareFeatureGenerator(C, M, variant="large")
    with pytest.raises(ValueError, match="reference"):
        SpatialAwareFeatureGenerator(C, M, channel_mult=(1, 2))
    with pytest.raises(ValueError, match="norm_groups"):
        SpatialAwareFeatureGenerator(C, M, base_channels=6, variant="reference")
