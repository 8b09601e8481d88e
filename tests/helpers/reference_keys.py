"""Reference (HEAL / GenComm) checkpoint key lists with shapes, written out by hand from the public
source (jeffreychou777/GenComm, yifanlu0227/HEAL), for the interop tests:

* ``sub_modules/pillar_vfe.py`` PillarVFE, ``sub_modules/base_bev_backbone.py`` BaseBEVBackbone,
  ``sub_modules/downsample_conv.py`` DownsampleConv, ``heter_model_baseline*.py`` heads;
* ``gencomm_modules/message_extractor_v2.py`` (``bev_extractor``: width 64, SE 32, 18 offsets),
  ``unet.py`` DiffusionUNet + ``cond_diff.py`` GenComm's schedule buffers, ``enhancer.py`` Enhancer.

Each function returns ``{key: shape}``; :func:`random_state` fills them.
"""
import math

import torch

BN = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
SCHEDULE = ("betas", "alphas_cumprod", "alphas_cumprod_prev", "sqrt_alphas_cumprod", "sqrt_one_minus_alphas_cumprod",
            "log_one_minus_alphas_cumprod", "sqrt_recip_alphas_cumprod", "sqrt_recipm1_alphas_cumprod",
            "posterior_variance", "posterior_log_variance_clipped", "posterior_mean_coef1", "posterior_mean_coef2")


def random_state(shapes, seed):
    """Random tensors for {key: shape} (BN variances positive, counters integer)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, shape in shapes.items():
        if k.endswith("num_batches_tracked"):
            out[k] = torch.tensor(7)
        elif k.endswith("running_var"):
            out[k] = torch.rand(shape, generator=g) + 0.5
        else:
            out[k] = torch.randn(shape, generator=g) * 0.3
    return out


def bn(prefix, c):
    return {f"{prefix}.{p}": ((c,) if p != "num_batches_tracked" else ()) for p in BN}


def pillar_vfe(prefix, cin, c):
    """One PFN layer (the last: full width): linear without bias, BatchNorm1d."""
    return {f"{prefix}.pillar_vfe.pfn_layers.0.linear.weight": (c, cin), **bn(f"{prefix}.pillar_vfe.pfn_layers.0.norm", c)}


def base_bev(prefix, levels):
    """levels: (c_in, c, layer_num, up, c_up) each; blocks.<i> = ZeroPad2d, (conv, BN, ReLU) x (1 + layer_num);
    deblocks.<i> = ConvTranspose2d (weight (c, c_up, k, k)) when up >= 1 else Conv2d ((c_up, c, k, k)), BN, ReLU."""
    shapes = {}
    for i, (cin, c, num, up, cu) in enumerate(levels):
        for k in range(num + 1):
            shapes[f"{prefix}.blocks.{i}.{1 + 3 * k}.weight"] = (c, cin if k == 0 else c, 3, 3)
            shapes.update(bn(f"{prefix}.blocks.{i}.{2 + 3 * k}", c))
        k = int(up) if up >= 1 else round(1 / up)
        shapes[f"{prefix}.deblocks.{i}.0.weight"] = (c, cu, k, k) if up >= 1 else (cu, c, k, k)
        shapes.update(bn(f"{prefix}.deblocks.{i}.1", cu))
    return shapes


def downsample_conv(prefix, layers):
    """layers: (c_in, dim, kernel) each; layers.<i>.double_conv = conv (bias), ReLU, 3x3 conv (bias), ReLU."""
    shapes = {}
    for i, (cin, d, k) in enumerate(layers):
        p = f"{prefix}.layers.{i}.double_conv"
        shapes.update({f"{p}.0.weight": (d, cin, k, k), f"{p}.0.bias": (d,), f"{p}.2.weight": (d, d, 3, 3),
                       f"{p}.2.bias": (d,)})
    return shapes


def message_extractor(prefix, c, out=2, d=64):
    p = f"{prefix}.bev_extractor"
    return {f"{p}.offset1.weight": (18, c, 3, 3), f"{p}.offset1.bias": (18,), f"{p}.dcn1.weight": (d, c, 3, 3),
            f"{p}.dcn1.bias": (d,), f"{p}.attn.1.weight": (d // 2, d, 1, 1), f"{p}.attn.1.bias": (d // 2,),
            f"{p}.attn.3.weight": (d, d // 2, 1, 1), f"{p}.attn.3.bias": (d,), f"{p}.fuse.0.weight": (d, d, 1, 1),
            f"{p}.fuse.0.bias": (d,), f"{p}.fuse.2.weight": (out, d, 1, 1), f"{p}.fuse.2.bias": (out,)}


def diffusion_unet(prefix, ch, mult, blocks, cin, cout):
    """DiffusionUNet with attention at no level (temb width 4 ch)."""
    shapes = {}

    def resblock(name, i, o):
        shapes.update({f"{name}.norm1.weight": (i,), f"{name}.norm1.bias": (i,), f"{name}.conv1.weight": (o, i, 3, 3),
                       f"{name}.conv1.bias": (o,), f"{name}.temb_proj.weight": (o, 4 * ch),
                       f"{name}.temb_proj.bias": (o,), f"{name}.norm2.weight": (o,), f"{name}.norm2.bias": (o,),
                       f"{name}.conv2.weight": (o, o, 3, 3), f"{name}.conv2.bias": (o,)})
        if i != o:
            shapes.update({f"{name}.nin_shortcut.weight": (o, i, 1, 1), f"{name}.nin_shortcut.bias": (o,)})

    p = prefix
    shapes.update({f"{p}.temb.dense.0.weight": (4 * ch, ch), f"{p}.temb.dense.0.bias": (4 * ch,),
                   f"{p}.temb.dense.1.weight": (4 * ch, 4 * ch), f"{p}.temb.dense.1.bias": (4 * ch,),
                   f"{p}.conv_in.weight": (ch, cin, 3, 3), f"{p}.conv_in.bias": (ch,)})
    in_mult = (1,) + tuple(mult)
    for i, m in enumerate(mult):
        block_in = ch * in_mult[i]
        for j in range(blocks):
            resblock(f"{p}.down.{i}.block.{j}", block_in, ch * m)
            block_in = ch * m
        if i != len(mult) - 1:
            shapes.update({f"{p}.down.{i}.downsample.conv.weight": (block_in, block_in, 3, 3),
                           f"{p}.down.{i}.downsample.conv.bias": (block_in,)})
    resblock(f"{p}.mid.block_1", block_in, block_in)
    resblock(f"{p}.mid.block_2", block_in, block_in)
    for i in reversed(range(len(mult))):
        skip = ch * mult[i]
        for j in range(blocks + 1):
            if j == blocks:
                skip = ch * in_mult[i]
            resblock(f"{p}.up.{i}.block.{j}", block_in + skip, ch * mult[i])
            block_in = ch * mult[i]
        if i != 0:
            shapes.update({f"{p}.up.{i}.upsample.conv.weight": (block_in, block_in, 3, 3),
                           f"{p}.up.{i}.upsample.conv.bias": (block_in,)})
    shapes.update({f"{p}.norm_out.weight": (block_in,), f"{p}.norm_out.bias": (block_in,),
                   f"{p}.conv_out.weight": (cout, block_in, 3, 3), f"{p}.conv_out.bias": (cout,)})
    return shapes


def gencomm_schedule(prefix, steps=3):
    """GenComm's persistent buffers, as cond_diff.py computes them: 'linear' (in sqrt(beta)) betas from the
    hard-coded 5e-3 to 5e-2 in float64, stored float32; posterior variance clipped at 1e-20 in the log."""
    b = torch.linspace(5e-3 ** 0.5, 5e-2 ** 0.5, steps, dtype=torch.float64) ** 2
    a = 1 - b
    ac = torch.cumprod(a, 0)
    prev = torch.cat([torch.ones(1, dtype=torch.float64), ac[:-1]])
    var = b * (1 - prev) / (1 - ac)
    values = [b, ac, prev, ac.sqrt(), (1 - ac).sqrt(), (1 - ac).log(), (1 / ac).sqrt(), (1 / ac - 1).sqrt(), var,
              var.clamp(min=1e-20).log(), b * prev.sqrt() / (1 - ac), (1 - prev) * a.sqrt() / (1 - ac)]
    return {f"{prefix}.{n}": v.float() for n, v in zip(SCHEDULE, values)}


def enhancer(prefix, c, heads=4):
    """Enhancer(C, [8, 8], 4): three blocks (attention + FRFN + two LayerNorms) and the split attention."""
    shapes = {}
    for b in (1, 2, 3):
        p = f"{prefix}.block_{b}"
        shapes.update({f"{p}.attn.angle_bias_table": (5, heads), f"{p}.attn.qkv.to_q.weight": (c, c),
                       f"{p}.attn.qkv.to_q.bias": (c,), f"{p}.attn.qkv.to_kv.weight": (2 * c, c),
                       f"{p}.attn.qkv.to_kv.bias": (2 * c,), f"{p}.attn.proj.weight": (c, c),
                       f"{p}.attn.proj.bias": (c,), f"{p}.mlp.linear1.0.weight": (4 * c, c),
                       f"{p}.mlp.linear1.0.bias": (4 * c,), f"{p}.mlp.dwconv.0.weight": (2 * c, 1, 3, 3),
                       f"{p}.mlp.dwconv.0.bias": (2 * c,), f"{p}.mlp.linear2.0.weight": (c, 2 * c),
                       f"{p}.mlp.linear2.0.bias": (c,), f"{p}.mlp.partial_conv3.weight": (c // 4, c // 4, 3, 3),
                       f"{p}.norm1.weight": (c,), f"{p}.norm1.bias": (c,), f"{p}.norm2.weight": (c,),
                       f"{p}.norm2.bias": (c,)})
    shapes.update({f"{prefix}.split_attn.fc1.weight": (c, c), f"{prefix}.split_attn.bn1.weight": (c,),
                   f"{prefix}.split_attn.bn1.bias": (c,), f"{prefix}.split_attn.fc2.weight": (c, c)})
    return shapes


def enhancer_unread(keys, prefix="enhancer"):
    """The Enhancer keys its forward never reads (block_1's attention, blocks 2 and 3)."""
    return [k for k in keys if k.startswith((f"{prefix}.block_1.attn.", f"{prefix}.block_2.", f"{prefix}.block_3."))]


def heads(c, anchors=2, bins=2):
    return {"cls_head.weight": (anchors, c, 1, 1), "cls_head.bias": (anchors,),
            "reg_head.weight": (7 * anchors, c, 1, 1), "reg_head.bias": (7 * anchors,),
            "dir_head.weight": (bins * anchors, c, 1, 1), "dir_head.bias": (bins * anchors,)}


def sinusoid(t, dim):
    """The reference's get_timestep_embedding: [sin, cos] of t * 10000^(-i / (dim/2 - 1))."""
    half = dim // 2
    freq = torch.exp(torch.arange(half, dtype=torch.float32) * -(math.log(10000) / (half - 1)))
    ang = t.float()[:, None] * freq[None]
    return torch.cat([ang.sin(), ang.cos()], dim=1)
