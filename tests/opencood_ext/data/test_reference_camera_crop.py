"""protocol: reference camera input: the reference's test-time resize (keeping the aspect) and crop,
and the intrinsics its frustum effectively uses (post_rot / post_tran), against a restatement of
GenComm's ``sample_augmentation`` (is_train False) and ``img_transform``; native unchanged."""
import numpy as np
import pytest
import torch
from PIL import Image

from opencood_ext.data.camera_crop import cropped_intrinsics, reference_image_crop, resize_crop
from opencood_ext.data.dataset import IMAGE_MEAN, IMAGE_STD, AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.data.synthetic import make_frame

K_OPV2V = np.array([[400.0, 0.0, 400.0], [0.0, 400.0, 300.0], [0.0, 0.0, 1.0]])


def _restated_crop(H0, W0, fH, fW, bot_pct_lim=(0.0, 0.05)):
    """GenComm camera_utils.sample_augmentation, is_train False, restated."""
    resize = max(fH / H0, fW / W0)
    newW, newH = int(W0 * resize), int(H0 * resize)
    crop_h = int((1 - np.mean(bot_pct_lim)) * newH) - fH
    crop_w = int(max(0, newW - fW) / 2)
    return resize, (newW, newH), (crop_w, crop_h, crop_w + fW, crop_h + fH)


def _restated_pixels(img, resize_dims, crop):
    """PIL resize (its default filter), then the crop box read with zeros outside the image."""
    resized = np.asarray(Image.fromarray(img).resize(resize_dims))
    x0, y0, x1, y1 = crop
    out = np.zeros((y1 - y0, x1 - x0, *resized.shape[2:]), np.uint8)
    ys, xs = np.arange(y0, y1), np.arange(x0, x1)
    iy, ix = (ys >= 0) & (ys < resized.shape[0]), (xs >= 0) & (xs < resized.shape[1])
    out[np.ix_(iy, ix)] = resized[np.ix_(ys[iy], xs[ix])]
    return out


def _reference_frustum(K, resize, crop, pix_d):
    """The LSS geometry of the reference for pixels (u', v') at depth d of the cropped image:
    undo post_tran and post_rot, then (u d, v d, d) through inv(intrins). pix_d: (P, 3) u', v', d."""
    post_rot = torch.eye(3)
    post_rot[:2, :2] = torch.eye(2) * resize
    post_tran = torch.zeros(3)
    post_tran[:2] = -torch.tensor(crop[:2], dtype=torch.float32)
    pts = torch.as_tensor(pix_d, dtype=torch.float64) - post_tran.double()
    pts = (torch.inverse(post_rot.double()) @ pts.T).T
    pts = torch.cat([pts[:, :2] * pts[:, 2:3], pts[:, 2:3]], dim=1)
    return (torch.inverse(torch.as_tensor(K, dtype=torch.float64)) @ pts.T).T.numpy()


@pytest.mark.parametrize("hw,final", [((600, 800), (384, 512)), ((600, 800), (336, 448)),
                                      ((90, 200), (64, 96)), ((60, 80), (59, 80))])
def test_crop_pixels_and_intrinsics(hw, final):
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (*hw, 3), dtype=np.uint8)
    crop = reference_image_crop(hw, final)
    resize, dims, box = _restated_crop(*hw, *final)
    assert (crop.resize, crop.resized, crop.box) == (resize, dims, box)
    out = resize_crop(img, crop)
    assert out.shape == (*final, 3) and out.dtype == np.uint8
    np.testing.assert_array_equal(out, _restated_pixels(img, dims, box))
    # the frustum: K' folds post_rot / post_tran in
    Kc = cropped_intrinsics(K_OPV2V, crop)
    pix_d = np.c_[rng.uniform(0, final[1], 50), rng.uniform(0, final[0], 50), rng.uniform(2, 50, 50)]
    ours = (np.linalg.inv(Kc) @ np.c_[pix_d[:, :2] * pix_d[:, 2:], pix_d[:, 2]].T).T
    np.testing.assert_allclose(ours, _reference_frustum(K_OPV2V, resize, box, pix_d), rtol=1e-6, atol=1e-6)


def test_opv2v_size_has_ten_black_rows_on_top():
    img = np.full((600, 800, 3), 200, np.uint8)
    out = resize_crop(img, reference_image_crop((600, 800), (384, 512)))
    assert (out[:10] == 0).all() and (out[10:] == 200).all()


def test_no_resampling_case_is_a_pure_shift_and_the_intrinsics_follow_it():
    """r = 1: the output is the image moved down by one row (one black row on top), and a point
    that projects onto a marked pixel of the original projects onto the same mark in the output."""
    img = np.zeros((60, 80, 3), np.uint8)
    img[20, 30] = 255
    crop = reference_image_crop((60, 80), (59, 80))
    assert crop.box == (0, -1, 80, 58)
    out = resize_crop(img, crop)
    np.testing.assert_array_equal(out[1:], img[:58])
    assert (out[0] == 0).all()
    K = np.array([[50.0, 0, 40.0], [0, 50.0, 30.0], [0, 0, 1.0]])
    X = np.linalg.inv(K) @ np.array([30.0, 20.0, 1.0]) * 7.0  # a camera-frame point seen at (30, 20)
    u, v, w = cropped_intrinsics(K, crop) @ X
    assert np.allclose([u / w, v / w], [30.0, 21.0])
    assert tuple(np.argwhere(out[..., 0] == 255)[0]) == (21, 30)


def _restated_depth(depth_png, resize_dims, crop):
    """The reference's depth: the 8-bit PNG as a PIL image (mode L), ``img_transform``'s resize (PIL's
    default filter) and crop, then ``img_to_tensor(img) * 255``."""
    pil = Image.fromarray(depth_png)
    assert pil.mode == "L"
    return _restated_pixels(depth_png, resize_dims, crop).astype(np.float32) / np.float32(255.0) * np.float32(255.0)


def _depth_image(h, w, seed):
    """An OPV2V-H-like 8-bit depth image: sky (255) on top, a ground plane whose depth grows toward the
    horizon, three boxes of constant depth, a few pixels of "no value" (0); whole metres."""
    rng = np.random.default_rng(seed)
    rows = np.arange(h, dtype=np.float64)[:, None]
    d = np.where(rows < h * 0.45, 255.0, np.clip(1.7 * h / np.maximum(rows - h * 0.45, 1.0), 1, 254))
    d = np.broadcast_to(d, (h, w)).copy()
    for k in range(3):
        y, x = int(h * (0.4 + 0.1 * k)), int(w * (0.15 + 0.3 * k))
        d[y:y + h // 6, x:x + w // 8] = 8 + 9 * k
    d[rng.integers(0, h, 20), rng.integers(0, w, 20)] = 0
    return np.rint(d).astype(np.uint8)


@pytest.mark.parametrize("hw,final", [((600, 800), (384, 512)), ((90, 200), (64, 96))])
def test_depth_is_resized_as_the_reference_bicubic_in_8_bits(hw, final):
    png = _depth_image(*hw, seed=3)
    crop = reference_image_crop(hw, final)
    resize, dims, box = _restated_crop(*hw, *final)
    ours = resize_crop(png.astype(np.float32), crop)  # what the OPV2V reader returns: metres as float32
    want = _restated_depth(png, dims, box)
    assert ours.dtype == np.float32 and ours.shape == final
    np.testing.assert_array_equal(ours, want)
    # not the nearest values: bicubic blends the depths at the boxes' and the horizon's edges
    nearest = resize_crop(png.astype(np.float32), crop, resample=Image.Resampling.NEAREST)
    assert int((nearest != want).sum()) > 0
    assert np.isin(nearest, np.r_[png.ravel().astype(np.float32), 0.0]).all()


def test_a_depth_map_of_finer_values_is_resized_bicubic_unrounded():
    """A depth the reference cannot read (not whole metres in 0..255): bicubic as a float image."""
    d = np.random.default_rng(4).uniform(1, 80, (90, 200)).astype(np.float32)
    crop = reference_image_crop((90, 200), (64, 96))
    out = resize_crop(d, crop)
    want = np.asarray(Image.fromarray(d).resize(crop.resized, Image.Resampling.BICUBIC).crop(crop.box))
    np.testing.assert_array_equal(out, want)
    assert (out != np.round(out)).any()


def test_resize_crop_refuses_other_shapes():
    with pytest.raises(ValueError, match="shape"):
        resize_crop(np.zeros((2, 3, 4, 5), np.uint8), reference_image_crop((3, 4), (2, 2)))


def _camera_dataset(protocol, depth=False):
    frame = make_frame(seed=1, num_agents=1, num_objects=2, types=("m2",))  # 150 x 200 images
    rng = np.random.default_rng(2)
    for c in frame.agents[0].cameras:
        c.image = rng.integers(0, 256, (90, 200, 3), dtype=np.uint8)  # wider than 64 x 96: a centred crop
        c.depth = _depth_image(90, 200, seed=c.image[0, 0, 0]).astype(np.float32) if depth else None
    cfg = DataConfig(modality="all:m2", agent_types={"m2": AgentTypeData(sensor="camera", image_size=(64, 96),
                                                                         use_depth=depth)})
    return frame, CooperativeDataset([frame], cfg, {}, train=False, protocol=protocol)


def test_dataset_reference_camera_input_is_the_crop():
    frame, ds = _camera_dataset("reference", depth=True)
    inp = ds[0].agents[0]
    for k, cam in enumerate(frame.agents[0].cameras):
        resize, dims, box = _restated_crop(90, 200, 64, 96)
        pixels = _restated_pixels(cam.image, dims, box).astype(np.float32) / 255.0
        np.testing.assert_allclose(inp.images[k], ((pixels - IMAGE_MEAN) / IMAGE_STD).transpose(2, 0, 1),
                                   rtol=0, atol=1e-6)
        P = np.array([[resize, 0, -box[0]], [0, resize, -box[1]], [0, 0, 1.0]])
        np.testing.assert_allclose(inp.K[k], P @ cam.K, rtol=1e-6)
        # depth: the same geometry, resized as the reference's 8-bit image (bicubic)
        np.testing.assert_array_equal(inp.depth[k], _restated_depth(cam.depth.astype(np.uint8), dims, box))


def test_dataset_native_camera_input_unchanged():
    frame, ds = _camera_dataset("native")
    inp = ds[0].agents[0]
    cam = frame.agents[0].cameras[0]
    img = torch.from_numpy(cam.image.astype(np.float32)).permute(2, 0, 1)[None] / 255.0
    img = torch.nn.functional.interpolate(img, size=(64, 96), mode="bilinear", align_corners=False)[0]
    expected = ((img.numpy().transpose(1, 2, 0) - IMAGE_MEAN) / IMAGE_STD).transpose(2, 0, 1)
    np.testing.assert_allclose(inp.images[0], expected, rtol=0, atol=1e-6)
    np.testing.assert_allclose(inp.K[0], np.diag([96 / 200, 64 / 90, 1.0]) @ cam.K, rtol=1e-6)
