"""JointCrop (fastpipe/data/joint/crop.py) and its kernels (fastpipe/data/joint/kernels.py): the
spec's checks, the draw, exactly aligned pixels at every flip/rot90 and scale, masks that keep
their values, boxes equal to torchvision v2's, and the hook into the records readers."""

from __future__ import annotations

import io
import itertools
import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from fastpipe._geometry import Box
from fastpipe.data import ImageField, JointCrop, JointParams
from fastpipe.data.joint.crop import JOINT_STREAM
from fastpipe.data.joint.kernels import crop_pixels, joint_record, move_boxes
from fastpipe.data.sampling.seeds import sample_seed

tv = pytest.importorskip("torchvision", exc_type=ImportError)
from torchvision import tv_tensors  # noqa: E402
from torchvision.transforms import v2  # noqa: E402
from torchvision.transforms.v2 import functional as TF  # noqa: E402


def png(array: np.ndarray, mode: str | None = None, palette: bool = False) -> bytes:
    image = Image.fromarray(array, mode) if mode else Image.fromarray(array)
    if palette:
        image = image.convert("P") if image.mode != "P" else image
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def images(*names: str) -> dict[str, ImageField]:
    """The fields of a record of encoded images (role Image), as joint_record takes them."""
    return {name: ImageField() for name in names}


def area_down(chw: torch.Tensor, s: int) -> torch.Tensor:
    return F.avg_pool2d(chw.float()[None], s)[0].round().to(torch.uint8)


ORIENTATIONS = list(itertools.product([False, True], [False, True], range(4)))


# --- the spec -------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(size=0), "size"),
    (dict(size=(48, 0)), "size"),
    (dict(size="48"), "size"),
    (dict(size=48, mode="centre-ish"), "mode"),
    (dict(size=48, mode="resized", scale=(0.5, 0.1)), "scale"),
    (dict(size=48, mode="resized", scale=(0.1, 2.0)), "scale"),
    (dict(size=48, mode="resized", ratio=(0, 1)), "ratio"),
    (dict(size=48, scale=(0.5, 1.0)), "mode='resized'"),
    (dict(size=48, hflip=True), "hflip"),
    (dict(size=48, hflip=1.5), "hflip"),
    (dict(size=48, vflip=-0.1), "vflip"),
    (dict(size=48, rot90=1), "rot90"),
    (dict(size=(48, 32), rot90=True), "square"),
    (dict(size=48, factors={"hr": 0}), "factors"),
    (dict(size=48, factors={"hr": 1.5}), "factors"),
    (dict(size=48, factors={"hr": True}), "factors"),
    (dict(size=48, factors=[("hr", 2)]), "factors"),
    (dict(size=48, interpolation="lanczos"), "interpolation"),
    (dict(size=48, interpolation={"mask": "area"}), "interpolation"),
    (dict(size=48, boxes={"boxes": "labels"}), "boxes"),
    (dict(size=48, boxes=["boxes"]), "boxes"),
    (dict(size=48, boxes={"boxes": ()}, factors={"boxes": 2}), "box field"),
    (dict(size=48, boxes={"boxes": ("mask",)}, interpolation={"mask": "nearest"}), "per-box"),
])
def test_every_bad_value_is_refused_naming_it(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        JointCrop(**kwargs)


def test_the_spec_is_frozen_normalized_and_picklable():
    crop = JointCrop(48, factors={"hr": 2.0}, interpolation={"mask": "nearest"})
    assert crop.size == (48, 48) and crop.factors == {"hr": 2}
    assert crop.filter_of("mask") == "nearest" and crop.filter_of("image") == "bilinear"
    assert JointCrop(48, interpolation="bicubic").filter_of("x") == "bicubic"
    with pytest.raises(AttributeError):
        crop.size = 12
    assert pickle.loads(pickle.dumps(crop)) == crop


def test_make_params_checks_the_sizes_of_the_fields_naming_the_sample():
    crop = JointCrop(8, factors={"hr": 2})
    g = 0
    params = crop.make_params({"lr": (20, 30), "hr": (40, 60)}, g, "sample 7")
    assert isinstance(params, JointParams)
    with pytest.raises(ValueError, match=r"sample 7: field 'hr' is 41x60.*2 x 'lr'.*this "
                                         r"sample is damaged: one of its files declares another "
                                         r"size"):
        crop.make_params({"lr": (20, 30), "hr": (41, 60)}, g, "sample 7")
    # Not only factors=: a file whose header declares another size is the other cause.
    with pytest.raises(ValueError, match="sample 3: image fields 'a' .* and 'b' .* differ in "
                                         "size. Where other samples' fields agree, this sample "
                                         "is damaged.*fix or remove the sample.*factors="):
        JointCrop(8).make_params({"a": (20, 30), "b": (20, 31)}, g, "sample 3")
    with pytest.raises(ValueError, match="sample 1: 'a' is 5x30, smaller than the 8x8 crop"):
        JointCrop(8).make_params({"a": (5, 30)}, g, "sample 1")


def test_make_params_draws_every_position_and_orientation_from_the_generator():
    crop = JointCrop(4, hflip=0.5, vflip=0.5, rot90=True)
    seen_pos, seen_orient = set(), set()
    for seed in range(400):
        p = crop.make_params({"a": (6, 7)}, seed)
        assert p.out == (4, 4) and p.box.height == 4 and p.box.width == 4
        seen_pos.add((p.box.top, p.box.left))
        seen_orient.add((p.hflip, p.vflip, p.k))
        again = crop.make_params({"a": (6, 7)}, seed)
        assert again == p
    assert seen_pos == {(t, left) for t in range(3) for left in range(4)}
    assert seen_orient == set(ORIENTATIONS)
    centre = JointCrop(4, mode="center", hflip=0.0).make_params({"a": (9, 8)}, None)
    assert centre.box == Box(2, 2, 4, 4) and not centre.hflip


# --- pixels ---------------------------------------------------------------------------------

@pytest.mark.parametrize("s", [2, 3, 4])
@pytest.mark.parametrize("hflip, vflip, k", ORIENTATIONS)
def test_the_lr_patch_is_the_area_downscale_of_the_hr_patch(s, hflip, vflip, k):
    rng = np.random.default_rng(s * 100 + k)
    hr = rng.integers(0, 256, (3, 10 * s, 13 * s), dtype=np.uint8)
    lr = area_down(torch.from_numpy(hr), s)
    params = JointParams(Box(3, 5, 6, 6), (6, 6), hflip, vflip, k)
    hr_np = torch.from_numpy(hr).permute(1, 2, 0).numpy()
    lr_np = lr.permute(1, 2, 0).numpy()
    hr_patch = crop_pixels(hr_np, params, s, "bilinear")
    lr_patch = crop_pixels(lr_np, params, 1, "bilinear")
    assert hr_patch.shape == (3, 6 * s, 6 * s) and hr_patch.is_contiguous()
    assert torch.equal(area_down(hr_patch, s), lr_patch)
    # And the patch is the slice, flipped and turned as torch would.
    expected = torch.from_numpy(hr)[:, 3 * s:9 * s, 5 * s:11 * s]
    if hflip:
        expected = expected.flip(-1)
    if vflip:
        expected = expected.flip(-2)
    assert torch.equal(hr_patch, torch.rot90(expected, k, (-2, -1)))


@pytest.mark.slow
@pytest.mark.parametrize("s", [2, 3, 4])
def test_paired_png_records_stay_aligned_through_every_draw(s):
    """End to end from encoded PNGs (the HR decoded only over its crop's rows), over enough
    draws (fixed seeds) that every flip/rot90 combination occurs."""
    rng = np.random.default_rng(s)
    crop = JointCrop(5, hflip=0.5, vflip=0.5, rot90=True, factors={"hr": s})
    records = []
    for _ in range(3):
        hr = rng.integers(0, 256, (11 * s, 9 * s, 3), dtype=np.uint8)
        lr = area_down(torch.from_numpy(hr).permute(2, 0, 1), s).permute(1, 2, 0).numpy()
        records.append({"lr": png(lr), "hr": png(hr)})
    seen = set()
    for index in range(60):
        record = records[index % 3]
        seed = sample_seed(5, 0, index, JOINT_STREAM)
        out = joint_record(crop, record, images("lr", "hr"), seed, f"sample {index}")
        params = crop.make_params({"lr": (11, 9), "hr": (11 * s, 9 * s)},
                                  seed)
        seen.add((params.hflip, params.vflip, params.k))
        assert out["lr"].shape == (3, 5, 5) and out["hr"].shape == (3, 5 * s, 5 * s)
        assert torch.equal(area_down(out["hr"], s), out["lr"]), index
    assert seen == set(ORIENTATIONS)


@pytest.mark.parametrize("mode", ["random", "center", "resized"])
def test_jpeg_fields_crop_the_pixels_of_the_whole_decode(mode):
    """A JPEG field decodes only the region around its crop (fastpipe._jpeg), with a margin that
    makes it pixel for pixel the crop of the whole decode, for every chroma layout."""
    pytest.importorskip("fastpipe._jpeg", exc_type=ImportError)
    from fastpipe.data.decode.image import decode_rgb
    from tests.jpeg.test_region import JPEG_KINDS

    crop = JointCrop(9, mode=mode, hflip=0.5, vflip=0.5, rot90=True)
    for kind, make in sorted(JPEG_KINDS.items()):
        data = make()
        whole = decode_rgb(data)
        for index in range(12):
            seed = sample_seed(3, 0, index, JOINT_STREAM)
            got = joint_record(crop, {"image": data}, images("image"), seed, kind)["image"]
            params = crop.make_params({"image": whole.shape[:2]}, seed)
            expected = crop_pixels(whole, params, 1, "bilinear")
            assert torch.equal(got, expected), (kind, index)


def test_palette_and_16_bit_masks_keep_their_values_and_stay_aligned():
    rng = np.random.default_rng(0)
    labels8 = np.array([0, 3, 7, 255], np.uint8)
    labels16 = np.array([0, 1000, 40000, 65535], np.uint16)
    index = rng.integers(0, 4, (40, 50))
    palette_mask = Image.fromarray(labels8[index], "L").convert("P")
    palette_mask.putpalette(list(rng.integers(0, 256, 768, dtype=np.uint8)))
    out = io.BytesIO()
    palette_mask.save(out, format="PNG")
    assert Image.open(io.BytesIO(out.getvalue())).mode == "P"
    mask16 = Image.fromarray(labels16[index])
    out16 = io.BytesIO()
    mask16.save(out16, format="PNG")
    # An image whose red channel is the mask's label index, to check the alignment.
    image = np.zeros((40, 50, 3), np.uint8)
    image[..., 0] = index
    record = {"image": png(image), "mask": out.getvalue(), "depth": out16.getvalue()}
    crop = JointCrop(24, mode="resized", scale=(0.2, 1.0), hflip=0.5, vflip=0.5, rot90=True,
                     interpolation={"image": "nearest", "mask": "nearest", "depth": "nearest"})
    for seed in range(20):
        got = joint_record(crop, record, images("image", "mask", "depth"), seed, "sample")
        assert got["mask"].dtype == torch.uint8 and got["mask"].shape == (1, 24, 24)
        assert got["depth"].dtype == torch.uint16 and got["depth"].shape == (1, 24, 24)
        which = got["image"][0].long()
        assert torch.equal(got["mask"][0], torch.from_numpy(labels8)[which])
        depth = torch.from_numpy(labels16.astype(np.int32))[which]
        assert torch.equal(got["depth"][0].int(), depth)
        assert set(got["depth"].unique().tolist()) <= set(labels16.tolist())


def test_nearest_resize_picks_torchs_nearest_pixels():
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 9, (37, 41), dtype=np.uint8)
    for out in [(24, 24), (50, 13), (37, 41)]:
        params = JointParams(Box(3, 2, 30, 33), out, False, False, 0)
        got = crop_pixels(pixels, params, 1, "nearest")
        region = torch.from_numpy(pixels[3:33, 2:35]).float()[None, None]
        expected = F.interpolate(region, size=out, mode="nearest")[0].to(torch.uint8)
        assert torch.equal(got, expected)


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_resized_rgb_crops_match_torchs_antialiased_resize(interpolation):
    rng = np.random.default_rng(2)
    smooth = F.interpolate(torch.from_numpy(rng.random((1, 3, 8, 8), np.float32)) * 255,
                           size=(64, 64), mode="bilinear")[0]
    pixels = smooth.round().to(torch.uint8).permute(1, 2, 0).numpy()
    params = JointParams(Box(4, 6, 40, 50), (24, 24), False, False, 0)
    got = crop_pixels(pixels, params, 1, interpolation)
    region = torch.from_numpy(pixels[4:44, 6:56]).permute(2, 0, 1).float()[None]
    expected = F.interpolate(region, size=(24, 24), mode=interpolation, antialias=True)[0]
    assert got.dtype == torch.uint8 and got.shape == (3, 24, 24)
    assert (got.float() - expected).abs().max() <= 2


# --- boxes ----------------------------------------------------------------------------------

def torchvision_boxes(boxes, labels, canvas, params: JointParams):
    """The same geometry through torchvision v2: crop, resize, flips, rotate, sanitize."""
    b = tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=canvas)
    top, left, h, w = params.box
    b = TF.crop(b, top, left, h, w)
    if params.out != (h, w):
        b = TF.resize(b, list(params.out))
    if params.hflip:
        b = TF.horizontal_flip(b)
    if params.vflip:
        b = TF.vertical_flip(b)
    if params.k:
        b = TF.rotate(b, 90.0 * params.k, expand=True)
    out = v2.SanitizeBoundingBoxes(min_size=1)({"boxes": b, "labels": labels})
    return out["boxes"].as_subclass(torch.Tensor), out["labels"]


def random_boxes(rng, n, height, width):
    xy = rng.uniform(-5, [width + 5, height + 5], (n, 2))
    wh = rng.uniform(0.5, [width / 2, height / 2], (n, 2))
    return torch.from_numpy(np.concatenate([xy, xy + wh], 1).astype(np.float32))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["random", "center", "resized"])
def test_boxes_match_torchvision_v2_for_the_same_params(mode):
    rng = np.random.default_rng(3)
    crop = JointCrop(32, mode=mode, hflip=0.5, vflip=0.5, rot90=True,
                     scale=(0.1, 1.0) if mode == "resized" else (0.08, 1.0))
    canvas = (60, 80)
    checked = 0
    for seed in range(40):
        boxes = random_boxes(rng, 12, *canvas)
        labels = torch.arange(12)
        params = crop.make_params({"image": canvas}, seed)
        got, keep = move_boxes(boxes, params, canvas, "sample")
        want, want_labels = torchvision_boxes(boxes, labels, canvas, params)
        assert torch.equal(labels[keep], want_labels), (seed, params)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
        checked += int(keep.sum())
    assert checked > 50  # boxes were kept, and some dropped, across the draws


def test_boxes_of_a_records_pack_move_with_the_pixels(tmp_path):
    """H5Dataset(joint=...) on image + mask + boxes + labels: the boxes and labels are
    torchvision's for the draw the dataset made, the mask is the image's (nearest)."""
    pytest.importorskip("h5py")
    from fastpipe.data import H5Dataset
    from fastpipe.pack import pack

    rng = np.random.default_rng(4)
    samples = []
    for i in range(6):
        index = rng.integers(0, 5, (50, 70)).astype(np.uint8)
        image = np.repeat(index[..., None] * 40, 3, axis=2)
        samples.append({"image": png(image), "mask": png(index),
                        "boxes": random_boxes(rng, 5 + i, 50, 70).numpy(),
                        "labels": np.arange(5 + i, dtype=np.int64)})
    from fastpipe.data import ArrayField, ImageField

    fields = {"image": ImageField(), "mask": ImageField(),
              "boxes": ArrayField("float32", (None, 4)), "labels": ArrayField("int64", (None,))}
    pack(samples, tmp_path / "det.h5", progress=False, fields=fields)
    crop = JointCrop(32, mode="resized", scale=(0.2, 1.0), hflip=0.5, rot90=True,
                     interpolation={"image": "nearest", "mask": "nearest"},
                     boxes={"boxes": ("labels",)})
    ds = H5Dataset(tmp_path / "det.h5", joint=crop, seed=11)
    for i in range(6):
        got = ds[i]
        params = crop.make_params({"image": (50, 70), "mask": (50, 70)},
                                  sample_seed(11, 0, i, JOINT_STREAM))
        want, want_labels = torchvision_boxes(torch.from_numpy(samples[i]["boxes"]),
                                              torch.from_numpy(samples[i]["labels"]), (50, 70),
                                              params)
        torch.testing.assert_close(got["boxes"], want, rtol=0, atol=1e-4)
        assert torch.equal(got["labels"], want_labels)
        assert torch.equal(got["image"][0], got["mask"][0] * 40)
        assert got["mask"].shape == (1, 32, 32)


def test_box_fields_must_be_float_boxes():
    params = JointParams(Box(0, 0, 4, 4), (4, 4), False, False, 0)
    with pytest.raises(ValueError, match="float32"):
        move_boxes(torch.zeros(3, 4, dtype=torch.int64), params, (8, 8), "sample 2")
    with pytest.raises(ValueError, match=r"sample 2.*\(3, 5\)"):
        move_boxes(torch.zeros(3, 5), params, (8, 8), "sample 2")


# --- the hook -------------------------------------------------------------------------------

@pytest.fixture
def image_pack(tmp_path):
    pytest.importorskip("h5py")
    from fastpipe.pack import pack

    rng = np.random.default_rng(5)
    samples = [{"image": png(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)), "label": i}
               for i in range(4)]
    pack(samples, tmp_path / "rec.h5", progress=False)
    return tmp_path / "rec.h5"


def test_the_readers_refuse_what_a_joint_crop_cannot_compose_with(image_pack, tmp_path):
    from fastpipe import Recipe
    from fastpipe.data import H5Dataset, ImageDecoder
    from fastpipe.pack import pack

    crop = JointCrop(16)
    with pytest.raises(ValueError, match="joint= and recipe="):
        H5Dataset(image_pack, joint=crop, recipe=Recipe(size=16))
    with pytest.raises(ValueError, match="joint= and auto_augment="):
        H5Dataset(image_pack, joint=crop, auto_augment="ra")
    with pytest.raises(ValueError, match="joint= and decoder="):
        H5Dataset(image_pack, joint=crop, decoder=ImageDecoder(size=16))
    with pytest.raises(TypeError, match="JointCrop"):
        H5Dataset(image_pack, joint={"size": 16})
    with pytest.raises(ValueError, match="'mask'.*no such field"):
        H5Dataset(image_pack, joint=JointCrop(16, interpolation={"mask": "nearest"}))
    with pytest.raises(ValueError, match="'label'.*not an image"):
        H5Dataset(image_pack, joint=JointCrop(16, factors={"label": 2}))
    images = [np.zeros((8, 8, 3), np.uint8)] * 2
    pack([(im, 0) for im in images], tmp_path / "pairs.h5", progress=False)
    with pytest.raises(ValueError, match="an \\(image, label\\) pack; joint="):
        H5Dataset(tmp_path / "pairs.h5", joint=crop)


def test_the_hook_crops_picked_fields_and_runs_transform_after(image_pack):
    from fastpipe.data import H5Dataset

    seen = []

    def transform(record):
        seen.append(record[0].shape)
        return record

    ds = H5Dataset(image_pack, joint=JointCrop(16, hflip=0.0), seed=1, fields=["image", "label"],
                   transform=transform)
    image, label = ds[2]
    assert image.shape == (3, 16, 16) and label == 2 and seen == [(3, 16, 16)]
    full = H5Dataset(image_pack, fields=["image"])[2][0]
    params = JointCrop(16, hflip=0.0).make_params({"image": (30, 40)},
                                                  sample_seed(1, 0, 2, JOINT_STREAM))
    top, left, h, w = params.box
    assert torch.equal(image, full[:, top:top + h, left:left + w])


def test_tar_shards_take_the_joint_crop_too(tmp_path):
    import tarfile

    from fastpipe.data import TarDataset

    rng = np.random.default_rng(6)
    images = [rng.integers(0, 256, (20, 30, 3), dtype=np.uint8) for _ in range(3)]
    with tarfile.open(tmp_path / "000000.tar", "w") as tar:
        for k, image in enumerate(images):
            for name, data in ((f"{k:04d}.png", png(image)), (f"{k:04d}.cls", b"%d" % k)):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    crop = JointCrop(8, hflip=0.0)
    ds = TarDataset(tmp_path / "000000.tar", joint=crop, seed=2)
    for i in range(3):
        got = ds[i]
        seed = sample_seed(2, 0, i, JOINT_STREAM)
        top, left, h, w = crop.make_params({"png": (20, 30)}, seed).box
        assert got["cls"] == i
        assert torch.equal(got["png"], torch.from_numpy(images[i]).permute(2, 0, 1)
                           [:, top:top + h, left:left + w])


def test_a_packed_pair_of_the_wrong_sizes_is_refused_naming_the_sample(tmp_path):
    pytest.importorskip("h5py")
    from fastpipe.data import H5Dataset
    from fastpipe.pack import pack

    good = {"lr": png(np.zeros((10, 12, 3), np.uint8)), "hr": png(np.zeros((20, 24, 3), np.uint8))}
    bad = {"lr": png(np.zeros((10, 12, 3), np.uint8)), "hr": png(np.zeros((21, 24, 3), np.uint8))}
    pack([good, bad], tmp_path / "pairs.h5", progress=False)
    ds = H5Dataset(tmp_path / "pairs.h5", joint=JointCrop(4, factors={"hr": 2}))
    ds[0]
    with pytest.raises(ValueError, match=r"sample 1 of .*pairs\.h5 \(packed from .*\).*'hr' is "
                                         r"21x24.*= 20x24"):
        ds[1]


def test_a_mask_whose_header_fails_its_crc_is_a_damaged_file_not_a_factors_question():
    """A PNG header whose size was changed (its CRC no longer matching) is not read for the
    crop's plan: the decode names the damage, where the plan advised factors=."""
    from fastpipe.data import CorruptImageError

    image = png(np.zeros((20, 30, 3), np.uint8))
    mask = bytearray(png(np.zeros((20, 30), np.uint8)))
    mask[23] = 21  # the height's low byte: 20 -> 21, CRC unchanged
    crop = JointCrop(8)
    with pytest.raises(CorruptImageError, match=r"sample 4\['mask'\].*IHDR: CRC error"):
        joint_record(crop, {"image": image, "mask": bytes(mask)}, images("image", "mask"), 0,
                     "sample 4")
