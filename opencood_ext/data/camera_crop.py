"""The reference's test-time camera image transform, for ``protocol: reference``.

GenComm / HEAL (``opencood/utils/camera_utils.py`` ``sample_augmentation`` with ``is_train`` False,
then ``img_transform``) bring an (H0, W0) image to ``final_dim`` (H, W) without changing its aspect:

* resize factor ``r = max(H / H0, W / W0)``; the image is resized (PIL, bicubic: Pillow's default
  filter for RGB images) to ``(int(W0 r), int(H0 r))`` (width, height);
* crop box ``(x0, y0, x0 + W, y0 + H)`` in the resized image with
  ``y0 = int((1 - mean(bot_pct_lim)) int(H0 r)) - H`` and ``x0 = int(max(0, int(W0 r) - W) / 2)``;
  PIL fills the part of the box outside the image with black. For OPV2V (600 x 800) at 384 x 512
  and ``bot_pct_lim`` [0, 0.05] (every GenComm / HEAL yaml): ``r = 0.64``, ``y0 = -10``: ten black
  rows on top, the image's last ten rows cut;
* the depth image (``use_depth``, training) goes through the same resize and crop: the reference
  reads OPV2V-H's 8-bit depth PNG as a PIL ``L`` image and resizes it with the default filter,
  bicubic, in 8 bits (rounded and clipped to 0..255; depths blend across edges, and with the 0 of
  "no value"), then ``ToTensor() * 255``;
* no flip, no rotation at test time;
* the frustum undoes it with ``post_rot = diag(r, r, 1)`` and ``post_tran = (-x0, -y0, 0)``:
  a pixel ``u'`` of the output looks through ``u = (u' - post_tran) / r`` of the original image.
  Folded into the intrinsics here: ``K' = P K`` with ``P = [[r, 0, -x0], [0, r, -y0], [0, 0, 1]]``,
  so ``K'^-1 (u' d, v' d, d) = K^-1 (u d, v d, d)`` (both LSS encoders read ``K``).

The reference computes ``r`` from its yaml's ``data_aug_conf.H`` / ``W``; here from the image itself
(the config importer accepts only ``H: 600``, ``W: 800``, OPV2V's camera size).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np
from PIL import Image

# the mean of ``bot_pct_lim`` [0.0, 0.05], the value of every GenComm / HEAL camera yaml
REFERENCE_BOTTOM_CROP = 0.025


@dataclass(frozen=True)
class ImageCrop:
    """resize: the factor r; resized: (W, H) after resizing; box: (x0, y0, x1, y1) in the resized
    image (may reach outside it: black there)."""

    resize: float
    resized: Tuple[int, int]
    box: Tuple[int, int, int, int]


def reference_image_crop(image_hw: Sequence[int], final_hw: Sequence[int],
                         bottom: float = REFERENCE_BOTTOM_CROP) -> ImageCrop:
    """The reference's test-time resize and crop of an ``image_hw`` (H0, W0) image to ``final_hw``."""
    h0, w0 = (int(v) for v in image_hw)
    fh, fw = (int(v) for v in final_hw)
    if min(h0, w0, fh, fw) <= 0:
        raise ValueError(f"image sizes must be positive, got image {h0}x{w0} and final {fh}x{fw}")
    r = max(fh / h0, fw / w0)
    new_w, new_h = int(w0 * r), int(h0 * r)
    y0 = int((1 - bottom) * new_h) - fh
    x0 = int(max(0, new_w - fw) / 2)
    return ImageCrop(r, (new_w, new_h), (x0, y0, x0 + fw, y0 + fh))


def resize_crop(image: np.ndarray, crop: ImageCrop, resample: Optional[int] = None) -> np.ndarray:
    """(H0, W0, 3) uint8 RGB or (H0, W0) float depth -> the same kind of array of the crop's size.

    resample: PIL filter; None is the reference's, PIL's default: bicubic, for images and depth maps
    alike. A depth map of whole metres in 0..255 (OPV2V-H's 8-bit PNG, as the reader returns it) is
    resized as the reference's ``L`` image: 8-bit, so every output is rounded and clipped to 0..255;
    any other depth map (finer or farther values, which the reference cannot read) as a 32-bit float
    ``F`` image, unrounded. Outside the image the crop box reads 0 ("no value")."""
    arr = np.asarray(image)
    if arr.ndim == 3:
        pil = Image.fromarray(np.ascontiguousarray(arr, dtype=np.uint8))  # RGB
    elif arr.ndim == 2:
        whole = np.isfinite(arr).all() and (arr == np.round(arr)).all() and arr.min(initial=0) >= 0 \
            and arr.max(initial=0) <= 255
        if whole:  # the reference's 8-bit depth image (mode L)
            pil = Image.fromarray(np.ascontiguousarray(arr, dtype=np.uint8))
        else:
            pil = Image.fromarray(np.ascontiguousarray(arr, dtype=np.float32))  # mode F
    else:
        raise ValueError(f"expected an (H, W, 3) image or an (H, W) depth map, got shape {arr.shape}")
    filt = Image.Resampling.BICUBIC if resample is None else resample
    out = np.asarray(pil.resize(crop.resized, resample=filt).crop(crop.box))
    return out.astype(np.float32) if arr.ndim == 2 else out


def post_transform(crop: ImageCrop) -> np.ndarray:
    """(3, 3) P with ``P (u, v, 1) = (u', v', 1)``: ``post_rot`` and ``post_tran`` in one matrix."""
    x0, y0 = crop.box[:2]
    return np.array([[crop.resize, 0.0, -x0], [0.0, crop.resize, -y0], [0.0, 0.0, 1.0]])


def cropped_intrinsics(K: np.ndarray, crop: ImageCrop) -> np.ndarray:
    """(3, 3) intrinsics of the cropped image: ``P K`` (module docstring)."""
    return post_transform(crop) @ np.asarray(K, dtype=np.float64)
