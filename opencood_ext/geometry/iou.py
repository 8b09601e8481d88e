"""Exact BEV (bird's-eye view) rotated-box IoU and rotated NMS, in torch.

Boxes are ``(N, 7)`` ``[x, y, z, l, w, h, yaw]`` or ``(N, 5)`` ``[x, y, l, w, yaw]``:
centre, FULL sizes, yaw in radians turning +x towards +y. Only the xy plane is
used (the bottom-face polygon), so the same code serves left-handed (CARLA) and
right-handed frames.

Method, per pair (a, b): move into a's box frame, where a is the axis-aligned
rectangle ``[-la/2, la/2] x [-wa/2, wa/2]``; clip b's rectangle by those four
axis-aligned half-planes (Sutherland-Hodgman on fixed-size vertex buffers with
a per-pair vertex count); the shoelace area of what remains is the exact
intersection area. A convex quadrilateral clipped by four half-planes has at
most 8 vertices; pairs whose buffers would overflow (only possible through
rounding when edges nearly coincide) are recomputed with 64-vertex buffers, so
no vertex is ever dropped. Pairs whose bounding circles do not meet are known
to be disjoint and skipped (a sweep over x finds the candidates without an
``N x M`` distance matrix), and rows are processed in chunks of about
``chunk_pairs`` candidate pairs, so memory stays bounded for large ``N * M``.

Inputs may be torch tensors (results stay on their device) or numpy arrays /
sequences (results come back as numpy). Computation is float64 when an input
is float64 and float32 otherwise. IoU is clamped to ``[0, 1]``; a pair whose
union has zero area (two degenerate boxes) has IoU 0.
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import torch

_DEFAULT_CHUNK_PAIRS = 1 << 17
_BUFFER_SIZES = (5, 6, 7, 8)  # vertex buffer after each of the 4 clips (exact: n + 1)
_FALLBACK_VERTICES = 64  # 4 -> 8 -> 16 -> 32 -> 64: a clip at most doubles the vertex count


def _as_bev(boxes, name: str) -> Tuple[torch.Tensor, bool]:
    """Validate boxes and return ((N, 5) [x, y, l, w, yaw] floating tensor, was_numpy)."""
    was_numpy = not isinstance(boxes, torch.Tensor)
    t = torch.as_tensor(np.asarray(boxes)) if was_numpy else boxes
    if t.numel() == 0:
        t = t.reshape(0, 7)
    if t.dim() != 2 or t.shape[1] not in (5, 7):
        raise ValueError(f"{name}: expected boxes of shape (N, 7) [x, y, z, l, w, h, yaw] or "
                         f"(N, 5) [x, y, l, w, yaw], got shape {tuple(t.shape)}")
    if not t.is_floating_point():
        t = t.to(torch.float32)
    bev = t[:, [0, 1, 3, 4, 6]] if t.shape[1] == 7 else t
    if bev.numel() and not bool(torch.isfinite(bev).all()):
        raise ValueError(f"{name}: boxes contain NaN or infinite values")
    if bev.numel() and bool((bev[:, 2:4] < 0).any()):
        raise ValueError(f"{name}: box lengths and widths must be >= 0")
    return bev, was_numpy


def _common(a: torch.Tensor, b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    if a.device != b.device:
        raise ValueError(f"boxes_a is on {a.device} but boxes_b is on {b.device}")
    dtype = torch.float64 if torch.float64 in (a.dtype, b.dtype) else torch.float32
    return a.to(dtype), b.to(dtype)


def bev_corners(boxes):
    """(N, 7) or (N, 5) boxes -> (N, 4, 2) BEV corners.

    Order (box frame, x along the length): ``(+l,+w), (+l,-w), (-l,-w), (-l,+w)``,
    the bottom face of :func:`opencood_ext.geometry.boxes.boxes_to_corners`.
    numpy in, numpy out.
    """
    bev, was_numpy = _as_bev(boxes, "boxes")
    hl, hw = bev[:, 2:3] / 2, bev[:, 3:4] / 2
    ux = torch.cat([hl, hl, -hl, -hl], dim=1)
    uy = torch.cat([hw, -hw, -hw, hw], dim=1)
    c, s = torch.cos(bev[:, 4:5]), torch.sin(bev[:, 4:5])
    out = torch.stack([bev[:, 0:1] + c * ux - s * uy, bev[:, 1:2] + s * ux + c * uy], dim=-1)
    return out.numpy() if was_numpy else out


def _clip(px, py, n, out_size: int, axis: int, sign: float, bound):
    """Keep the part of polygons (px, py, n) where ``sign * coord[axis] <= bound``.

    px, py: (E, K) vertices, the first ``n`` (E,) valid, in cyclic order.
    Returns (px, py, n) with buffers of ``out_size`` and the (E,) bool overflow mask
    (rows that produced more than ``out_size`` vertices).
    """
    E, K = px.shape
    idx = torch.arange(K, device=px.device)
    valid = idx < n[:, None]
    nxt = torch.where(idx + 1 < n[:, None], idx + 1, torch.zeros_like(idx))
    qx, qy = torch.gather(px, 1, nxt), torch.gather(py, 1, nxt)
    coord_p, coord_q = (px, qx) if axis == 0 else (py, qy)
    s_p = bound[:, None] - sign * coord_p  # >= 0 means inside
    s_q = bound[:, None] - sign * coord_q
    in_p, in_q = s_p >= 0, s_q >= 0
    cross = valid & (in_p != in_q)
    denom = torch.where(cross, s_p - s_q, torch.ones_like(s_p))  # nonzero: signs differ strictly
    t = torch.where(cross, s_p / denom, torch.zeros_like(s_p)).clamp(0.0, 1.0)
    ix, iy = px + t * (qx - px), py + t * (qy - py)
    edge = (sign * bound)[:, None].expand(E, K)  # the crossing point lies exactly on the line
    if axis == 0:
        ix = edge
    else:
        iy = edge
    keep = valid & in_p
    cand_x = torch.stack([px, ix], dim=2).reshape(E, 2 * K)
    cand_y = torch.stack([py, iy], dim=2).reshape(E, 2 * K)
    mask = torch.stack([keep, cross], dim=2).reshape(E, 2 * K)
    pos = mask.cumsum(1) - 1
    count = mask.sum(1)
    pos = torch.where(mask & (pos < out_size), pos, torch.full_like(pos, out_size))  # spare slot
    ox = px.new_zeros(E, out_size + 1).scatter_(1, pos, cand_x)[:, :out_size]
    oy = py.new_zeros(E, out_size + 1).scatter_(1, pos, cand_y)[:, :out_size]
    return ox, oy, count.clamp(max=out_size), count > out_size


def _shoelace(px, py, n):
    """Area of polygons (E, K) with ``n`` valid vertices each."""
    K = px.shape[1]
    idx = torch.arange(K, device=px.device)
    valid = idx < n[:, None]
    nxt = torch.where(idx + 1 < n[:, None], idx + 1, torch.zeros_like(idx))
    qx, qy = torch.gather(px, 1, nxt), torch.gather(py, 1, nxt)
    cross = torch.where(valid, px * qy - qx * py, torch.zeros_like(px))
    return cross.sum(1).abs() * 0.5


def _intersection_in_a_frame(px, py, hla, hwa, sizes):
    """Clip polygons (E, 4) by |x| <= hla, |y| <= hwa with buffer ``sizes`` per step."""
    n = torch.full((px.shape[0],), px.shape[1], dtype=torch.long, device=px.device)
    overflow = torch.zeros_like(n, dtype=torch.bool)
    for size, (axis, sign, bound) in zip(sizes, ((0, 1.0, hla), (0, -1.0, hla),
                                                 (1, 1.0, hwa), (1, -1.0, hwa))):
        px, py, n, over = _clip(px, py, n, size, axis, sign, bound)
        overflow |= over
    return _shoelace(px, py, n), overflow


def _pair_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(E, 5) boxes a, (E, 5) boxes b -> (E,) IoU of each row pair."""
    if a.shape[0] == 0:
        return a.new_zeros(0)
    dx, dy = b[:, 0] - a[:, 0], b[:, 1] - a[:, 1]
    ca, sa = torch.cos(a[:, 4]), torch.sin(a[:, 4])
    cx, cy = ca * dx + sa * dy, -sa * dx + ca * dy  # b's centre in a's box frame
    rel = b[:, 4] - a[:, 4]
    cr, sr = torch.cos(rel)[:, None], torch.sin(rel)[:, None]
    hl, hw = b[:, 2:3] / 2, b[:, 3:4] / 2
    ux = torch.cat([hl, hl, -hl, -hl], dim=1)
    uy = torch.cat([hw, -hw, -hw, hw], dim=1)
    px = cx[:, None] + cr * ux - sr * uy
    py = cy[:, None] + sr * ux + cr * uy
    hla, hwa = a[:, 2] / 2, a[:, 3] / 2
    inter, overflow = _intersection_in_a_frame(px, py, hla, hwa, _BUFFER_SIZES)
    if bool(overflow.any()):
        rows = overflow.nonzero().squeeze(1)
        big = (_FALLBACK_VERTICES,) * 4
        inter[rows], _ = _intersection_in_a_frame(px[rows], py[rows], hla[rows], hwa[rows], big)
    area_a = a[:, 2] * a[:, 3]
    area_b = b[:, 2] * b[:, 3]
    inter = torch.minimum(inter.clamp(min=0), torch.minimum(area_a, area_b))
    union = area_a + area_b - inter
    iou = torch.where(union > 0, inter / torch.where(union > 0, union, torch.ones_like(union)),
                      torch.zeros_like(union))
    return iou.clamp(0.0, 1.0)


def _radius(bev: torch.Tensor) -> torch.Tensor:
    return 0.5 * torch.sqrt(bev[:, 2] ** 2 + bev[:, 3] ** 2)


def _reach(ra, rb):
    """Conservative centre distance beyond which two boxes cannot touch."""
    return (ra + rb) * (1 + 1e-5) + 1e-6


def _overlapping_pairs(a, b, chunk_pairs: int, upper_only: bool = False):
    """Yield (rows, cols, iou) for the pairs whose bounding circles meet.

    Pairs not yielded have zero intersection. Candidates come from a sweep over b
    sorted by x (each row of a sees the b boxes within its reach in x), then the
    circle test; rows are grouped so that a chunk holds about ``chunk_pairs``
    candidates. ``upper_only`` keeps only col > row (a set against itself).
    """
    N, M = a.shape[0], b.shape[0]
    if N == 0 or M == 0:
        return
    ra, rb = _radius(a), _radius(b)
    bx, perm = torch.sort(b[:, 0])
    half = _reach(ra, rb.max())
    lo = torch.searchsorted(bx, a[:, 0] - half)
    hi = torch.searchsorted(bx, a[:, 0] + half, right=True)
    counts = hi - lo
    ends = torch.cumsum(counts, 0).cpu()
    r0 = 0
    while r0 < N:
        done = int(ends[r0 - 1]) if r0 else 0
        r1 = int(torch.searchsorted(ends, done + chunk_pairs, right=True))
        r1 = min(N, max(r1, r0 + 1))
        cnt = counts[r0:r1]
        total = int(ends[r1 - 1]) - done
        r_start = r0
        r0 = r1
        if total == 0:
            continue
        rows = torch.repeat_interleave(torch.arange(r_start, r1, device=a.device), cnt,
                                       output_size=total)
        first = torch.cumsum(cnt, 0) - cnt
        step = torch.arange(total, device=a.device) - torch.repeat_interleave(first, cnt,
                                                                             output_size=total)
        cols = perm[lo[rows] + step]
        dx = a[rows, 0] - b[cols, 0]
        dy = a[rows, 1] - b[cols, 1]
        reach = _reach(ra[rows], rb[cols])
        near = dx * dx + dy * dy <= reach * reach
        if upper_only:
            near &= cols > rows
        rows, cols = rows[near], cols[near]
        if rows.numel():
            yield rows, cols, _pair_iou(a[rows], b[cols])


def bev_iou(boxes_a, boxes_b, chunk_pairs: int = _DEFAULT_CHUNK_PAIRS):
    """BEV rotated IoU of every pair: (N, 7|5) and (M, 7|5) -> (N, M).

    Exact for rectangles (see the module docstring). ``chunk_pairs`` bounds how many
    pairs are held in memory at once. numpy in (either argument) -> numpy out.
    """
    a, np_a = _as_bev(boxes_a, "boxes_a")
    b, np_b = _as_bev(boxes_b, "boxes_b")
    a, b = _common(a, b)
    out = a.new_zeros(a.shape[0], b.shape[0])
    for rows, cols, iou in _overlapping_pairs(a, b, chunk_pairs):
        out[rows, cols] = iou
    return out.cpu().numpy() if (np_a or np_b) else out


def bev_iou_aligned(boxes_a, boxes_b):
    """IoU of matched pairs: (N, 7|5) and (N, 7|5) -> (N,); numpy in -> numpy out."""
    a, np_a = _as_bev(boxes_a, "boxes_a")
    b, np_b = _as_bev(boxes_b, "boxes_b")
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"bev_iou_aligned needs as many boxes_b as boxes_a, got "
                         f"{b.shape[0]} and {a.shape[0]}")
    a, b = _common(a, b)
    out = a.new_zeros(a.shape[0])
    if a.shape[0]:
        d2 = ((a[:, :2] - b[:, :2]) ** 2).sum(-1)
        reach = _reach(_radius(a), _radius(b))
        rows = (d2 <= reach * reach).nonzero().squeeze(1)
        out[rows] = _pair_iou(a[rows], b[rows])
    return out.cpu().numpy() if (np_a or np_b) else out


def rotated_nms(boxes, scores, iou_threshold: float, max_out: Optional[int] = None,
                chunk_pairs: int = _DEFAULT_CHUNK_PAIRS) -> torch.Tensor:
    """Greedy rotated NMS: indices (LongTensor, into ``boxes``) of the kept boxes,
    highest score first.

    boxes: (N, 7|5); scores: (N,). A box is suppressed when its BEV IoU with an
    already kept, higher-scored box is strictly greater than ``iou_threshold``.
    Equal scores keep their input order. The IoU of every overlapping pair is
    computed once (pairs with disjoint bounding circles have IoU 0), then the
    suppression runs greedily. ``max_out`` caps the number kept.
    """
    bev, _ = _as_bev(boxes, "boxes")
    sc = scores if isinstance(scores, torch.Tensor) else torch.as_tensor(np.asarray(scores))
    sc = sc.reshape(-1)
    if sc.shape[0] != bev.shape[0]:
        raise ValueError(f"rotated_nms: scores has {sc.shape[0]} entries for {bev.shape[0]} boxes")
    if sc.numel() and not bool(torch.isfinite(sc.double()).all()):
        raise ValueError("rotated_nms: scores contain NaN or infinite values")
    if max_out is not None and max_out < 0:
        raise ValueError(f"rotated_nms: max_out must be >= 0, got {max_out}")
    N = bev.shape[0]
    if N == 0 or max_out == 0:
        return torch.zeros(0, dtype=torch.long, device=bev.device)
    order = torch.sort(sc.to(bev.device), descending=True, stable=True).indices
    sb = bev[order]
    rows_l, cols_l = [], []
    for rows, cols, iou in _overlapping_pairs(sb, sb, chunk_pairs, upper_only=True):
        hit = iou > iou_threshold
        rows_l.append(rows[hit].cpu())
        cols_l.append(cols[hit].cpu())
    rows = torch.cat(rows_l).numpy() if rows_l else np.zeros(0, dtype=np.int64)
    cols = torch.cat(cols_l).numpy() if cols_l else np.zeros(0, dtype=np.int64)
    # CSR adjacency: for sorted position i, the lower-scored positions it suppresses.
    by_row = np.argsort(rows, kind="stable")
    rows, cols = rows[by_row], cols[by_row]
    starts = np.searchsorted(rows, np.arange(N + 1))
    suppressed = np.zeros(N, dtype=bool)
    kept = []
    limit = N if max_out is None else max_out
    for i in range(N):
        if suppressed[i]:
            continue
        kept.append(i)
        if len(kept) >= limit:
            break
        suppressed[cols[starts[i]:starts[i + 1]]] = True
    return order[torch.as_tensor(kept, dtype=torch.long, device=order.device)]
