"""An independent restatement, in functional torch, of the reference models' forward pass
(jeffreychou777/GenComm ``heter_model_baseline_w_gencomm_stage1/2``, yifanlu0227/HEAL
``heter_model_baseline``), read from their public source and written here in the reference's
parameter names and order of operations; used by tests/opencood_ext/models/test_reference_e2e.py on state dicts in
the reference's layout. Nothing here imports the project's models.

Per agent type: PillarVFE (PFN: linear, BatchNorm1d eps 1e-3, ReLU, max over points; inputs
[x, y, z, i, xyz - pillar mean, xyz - pillar centre], padding points zeroed) -> PointPillarScatter
-> BaseBEVBackbone (ZeroPad2d, conv / BN eps 1e-3 / ReLU stacks, deblocks) -> DownsampleConv
(conv with bias, ReLU, 3x3 conv with bias, ReLU per layer). GenComm: MessageExtractorv2 on every
agent's feature in its own frame; the generator starts every agent of a sample from the EGO's
feature (noised to the last step; noise zero here), conditions on the agent's own message, runs
the x0-parameterised chain; the Enhancer's block_1 (attention disabled there) and split attention
act per agent; then every feature is warped to the ego by ``normalize_pairwise_tfm`` +
``affine_grid`` and fused (AttFusion: self-attention over the agents at each cell, the ego's row
kept; MaxFusion: max), then the 1x1 heads (regression in the reference's hwl order).
"""
import math

import torch
import torch.nn.functional as F

from test_interop_reference_modules import _enhancer_reference, _unet_reference


def _bn(sd, p, x, eps):
    return F.batch_norm(x, sd[f"{p}.running_mean"], sd[f"{p}.running_var"], sd[f"{p}.weight"], sd[f"{p}.bias"],
                        False, 0.0, eps)


def pillar_vfe(sd, p, voxels, num_points, coords, voxel_size, lidar_range):
    """voxels (V, P, 4), num_points (V,), coords (V, 4) [agent, z, y, x] -> (V, C) pillar features."""
    vx, vy, vz = voxel_size
    xyz = voxels[:, :, :3]
    mean = xyz.sum(dim=1, keepdim=True) / num_points.to(voxels.dtype).view(-1, 1, 1)
    offset = torch.tensor([vx / 2 + lidar_range[0], vy / 2 + lidar_range[1], vz / 2 + lidar_range[2]])
    cell = torch.stack([coords[:, 3], coords[:, 2], coords[:, 1]], dim=1).to(voxels.dtype) * torch.tensor([vx, vy, vz])
    centre = xyz - (cell + offset)[:, None, :]
    feats = torch.cat([voxels, xyz - mean, centre], dim=-1)
    real = torch.arange(voxels.shape[1])[None, :] < num_points[:, None]
    feats = feats * real[..., None].to(feats.dtype)
    x = F.linear(feats, sd[f"{p}.pillar_vfe.pfn_layers.0.linear.weight"])
    x = _bn(sd, f"{p}.pillar_vfe.pfn_layers.0.norm", x.permute(0, 2, 1), 1e-3).permute(0, 2, 1)
    return x.relu().max(dim=1).values


def scatter(features, coords, num_agents, nx, ny):
    """PointPillarScatter: (V, C) at coords (V, 4) -> (A, C, ny, nx) canvases (one z layer)."""
    out = features.new_zeros(num_agents, features.shape[1], ny * nx)
    for a in range(num_agents):
        sel = coords[:, 0] == a
        idx = (coords[sel, 1] + coords[sel, 2] * nx + coords[sel, 3]).long()
        out[a][:, idx] = features[sel].t()
    return out.view(num_agents, -1, ny, nx)


def base_bev(sd, p, x, layer_nums, strides, ups):
    """BaseBEVBackbone.forward: blocks.<i> (ZeroPad2d(1), strided conv, BN, ReLU, then layer_nums[i]
    x (conv, BN, ReLU)), deblocks.<i> (ConvTranspose2d k = s = up, or a strided conv for up < 1), cat."""
    outs = []
    for i, (num, stride, up) in enumerate(zip(layer_nums, strides, ups)):
        x = F.conv2d(F.pad(x, (1, 1, 1, 1)), sd[f"{p}.blocks.{i}.1.weight"], stride=stride)
        x = _bn(sd, f"{p}.blocks.{i}.2", x, 1e-3).relu()
        for k in range(1, num + 1):
            x = _bn(sd, f"{p}.blocks.{i}.{2 + 3 * k}", F.conv2d(x, sd[f"{p}.blocks.{i}.{1 + 3 * k}.weight"],
                                                               padding=1), 1e-3).relu()
        w = sd[f"{p}.deblocks.{i}.0.weight"]
        y = F.conv_transpose2d(x, w, stride=int(up)) if up >= 1 else F.conv2d(x, w, stride=round(1 / up))
        outs.append(_bn(sd, f"{p}.deblocks.{i}.1", y, 1e-3).relu())
    return torch.cat(outs, dim=1)


def downsample_conv(sd, p, x, strides, paddings):
    for i, (s, pad) in enumerate(zip(strides, paddings)):
        q = f"{p}.layers.{i}.double_conv"
        x = F.conv2d(x, sd[f"{q}.0.weight"], sd[f"{q}.0.bias"], stride=s, padding=pad).relu()
        x = F.conv2d(x, sd[f"{q}.2.weight"], sd[f"{q}.2.bias"], padding=1).relu()
    return x


def _deform_conv3x3(x, offset, weight, bias):
    """torchvision's DeformConv2d (3x3, padding 1, one offset group): tap k of output (h, w) reads
    input (h - 1 + k // 3 + dy, w - 1 + k % 3 + dx) bilinearly, (dy, dx) = offset[2k], offset[2k + 1];
    a sample at or beyond -1 / the size reads 0, and so does every corner outside the map."""
    n, c, H, W = x.shape
    hh = torch.arange(H, dtype=x.dtype)[:, None].expand(H, W)
    ww = torch.arange(W, dtype=x.dtype)[None, :].expand(H, W)
    cols = []
    for k in range(9):
        py = hh - 1 + k // 3 + offset[:, 2 * k]
        px = ww - 1 + k % 3 + offset[:, 2 * k + 1]
        inside = (py > -1) & (py < H) & (px > -1) & (px < W)
        y0, x0 = py.floor(), px.floor()
        val = torch.zeros(n, c, H, W, dtype=x.dtype)
        for dy in (0, 1):
            for dx in (0, 1):
                yy, xx = y0 + dy, x0 + dx
                wgt = (1 - (py - yy).abs()) * (1 - (px - xx).abs())
                ok = inside & (yy >= 0) & (yy <= H - 1) & (xx >= 0) & (xx <= W - 1)
                idx = (yy.clamp(0, H - 1) * W + xx.clamp(0, W - 1)).long().view(n, 1, H * W).expand(n, c, H * W)
                got = x.reshape(n, c, H * W).gather(2, idx).view(n, c, H, W)
                val = val + got * (wgt * ok.to(x.dtype))[:, None]
        cols.append(val)
    cols = torch.stack(cols, dim=2)  # (n, c, 9, H, W)
    return torch.einsum("nckhw,ock->nohw", cols, weight.reshape(weight.shape[0], c, 9)) + bias[None, :, None, None]


def message_extractor(sd, p, x):
    """MessageExtractorv2.bev_extractor with one branch: offset1, dcn1, SE gate attn, fuse."""
    q = f"{p}.bev_extractor"
    y = _deform_conv3x3(x, F.conv2d(x, sd[f"{q}.offset1.weight"], sd[f"{q}.offset1.bias"], padding=1),
                        sd[f"{q}.dcn1.weight"], sd[f"{q}.dcn1.bias"])
    gate = F.conv2d(F.conv2d(y.mean(dim=(2, 3), keepdim=True), sd[f"{q}.attn.1.weight"], sd[f"{q}.attn.1.bias"]).relu(),
                    sd[f"{q}.attn.3.weight"], sd[f"{q}.attn.3.bias"]).sigmoid()
    y = F.conv2d(F.conv2d(y * gate, sd[f"{q}.fuse.0.weight"], sd[f"{q}.fuse.0.bias"]).relu(),
                 sd[f"{q}.fuse.2.weight"], sd[f"{q}.fuse.2.bias"])
    return y


def generate(sd, ego_repeated, messages, ch, mult, blocks, steps=3):
    """GenComm.forward in evaluation, noise zero: x_T-1 = sqrt(abar) x_start; for t = T-1 .. 0 the
    denoiser predicts x0 from cat(message, x_t); x_t-1 = coef1 x0 + coef2 x_t; x0 at t = 0."""
    w = {k[len("gencomm.denoiser."):]: v for k, v in sd.items() if k.startswith("gencomm.denoiser.")}
    x = sd["gencomm.sqrt_alphas_cumprod"][steps - 1] * ego_repeated
    for t in reversed(range(steps)):
        x0 = _unet_reference(w, torch.cat([messages, x], dim=1), torch.full((x.shape[0],), t), ch, mult, blocks)
        if t == 0:
            return x0
        x = sd["gencomm.posterior_mean_coef1"][t] * x0 + sd["gencomm.posterior_mean_coef2"][t] * x


def enhance(sd, x):
    return _enhancer_reference({k[len("enhancer."):]: v for k, v in sd.items() if k.startswith("enhancer.")}, x)


def ego_row_affine(T_world_from_agent, lidar_range):
    """normalize_pairwise_tfm's row of the ego: pairwise_t_matrix[0, j] = inv(T_j) @ T_0 (ego -> agent j),
    its 2x3 BEV part scaled by the range (H, W in metres; the reference's normalisation assumes a range
    centred on the agent), float64 (N, 2, 3) as the reference's collated numpy matrices are."""
    W, H = lidar_range[3] - lidar_range[0], lidar_range[4] - lidar_range[1]
    T = torch.linalg.solve(T_world_from_agent.double(), T_world_from_agent[0].double().expand_as(T_world_from_agent))
    M = T[:, [0, 1]][:, :, [0, 1, 3]].clone()
    M[:, 0, 1] *= H / W
    M[:, 1, 0] *= W / H
    M[:, 0, 2] = M[:, 0, 2] / W * 2
    M[:, 1, 2] = M[:, 1, 2] / H * 2
    return M


def warp_to_ego(x, T_world_from_agent, lidar_range):
    """normalize_pairwise_tfm + warp_affine_simple for the ego's row (:func:`ego_row_affine`)."""
    M = ego_row_affine(T_world_from_agent, lidar_range)
    grid = F.affine_grid(M, list(x.shape), align_corners=False).to(x)  # warp_affine_simple's .to(src)
    return F.grid_sample(x, grid, align_corners=False)


def att_fusion(x):
    """(N, C, H, W) warped features of one sample -> (C, H, W): ScaledDotProductAttention over the
    agents at every cell, the ego's (first) row."""
    n, c, h, w = x.shape
    t = x.view(n, c, -1).permute(2, 0, 1)  # (HW, N, C)
    score = torch.bmm(t, t.transpose(1, 2)) / math.sqrt(c)
    return torch.bmm(F.softmax(score, -1), t).permute(1, 2, 0).reshape(n, c, h, w)[0]


def heads(sd, x):
    return tuple(F.conv2d(x, sd[f"{h}_head.weight"], sd[f"{h}_head.bias"]) for h in ("cls", "reg", "dir"))


def voxel_backbone_8x(sd, p, voxels, num_points, coords, num_agents, grid):
    """SECOND (MeanVFE + VoxelBackBone8x + HeightCompression) densely: a submanifold conv is the dense
    3x3x3 conv read at the active sites; a strided sparse conv is the dense one, its active sites those
    whose window holds an active input. grid: (nz, ny, nx) of the range; the sparse grid has one z
    layer more; conv4 pads z by 0; conv_out (3, 1, 1) stride (2, 1, 1) without padding."""
    feats = voxels.sum(dim=1) / num_points.clamp(min=1).to(voxels.dtype)[:, None]
    D, H, W = grid[0] + 1, grid[1], grid[2]
    x = feats.new_zeros(num_agents, feats.shape[1], D, H, W)
    c = coords.long()
    x[c[:, 0], :, c[:, 1], c[:, 2], c[:, 3]] = feats
    act = torch.zeros(num_agents, 1, D, H, W, dtype=torch.bool)
    act[c[:, 0], 0, c[:, 1], c[:, 2], c[:, 3]] = True

    def layer(x, act, name, stride=1, padding=1, kernel=3):
        w = sd[f"{name}.0.weight"].permute(0, 4, 1, 2, 3)  # spconv 2.x (out, kz, ky, kx, in) -> conv3d
        y = F.conv3d(x, w, stride=stride, padding=padding)
        if stride != 1:
            ones = torch.ones((1, 1) + tuple(w.shape[2:]))
            act = F.conv3d(act.float(), ones, stride=stride, padding=padding) > 0
        y = _bn(sd, f"{name}.1", y, 1e-3).relu()
        return y * act, act

    b = f"{p}.spconv_block"
    x, act = layer(x, act, f"{b}.conv_input")
    x, act = layer(x, act, f"{b}.conv1.0")
    for stage, pad in (("conv2", 1), ("conv3", 1), ("conv4", (0, 1, 1))):
        x, act = layer(x, act, f"{b}.{stage}.0", stride=2, padding=pad)
        for j in (1, 2):
            x, act = layer(x, act, f"{b}.{stage}.{j}")
    x, act = layer(x, act, f"{b}.conv_out", stride=(2, 1, 1), padding=0)
    n, ch, d, h, w = x.shape
    return x.reshape(n, ch * d, h, w)
