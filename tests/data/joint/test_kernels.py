"""Joint geometry by role (fastpipe/data/joint/kernels.py): a role registered from this module,
outside fastpipe, moves with JointCrop's crops, resizes, flips and quarter turns; masks are never
interpolated; boxes in every format and on every canvas move alike; the readers pass their fields'
roles; refusals at construction."""

from __future__ import annotations

import importlib.util
import io
import itertools
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest
import torch
from PIL import Image as PILImage

from fastpipe._geometry import Box
from fastpipe.data import (
    ArrayField,
    BoundingBoxes,
    Image,
    ImageField,
    IntField,
    JointContext,
    JointCrop,
    KeptRows,
    Label,
    Mask,
    Role,
    fast_collate,
    register_joint_kernel,
    register_role,
)
from fastpipe.data.joint.crop import JOINT_STREAM
from fastpipe.data.joint.kernels import check_fields, joint_record, move_boxes
from fastpipe.data.sampling.seeds import sample_seed

ORIENTATIONS = list(itertools.product([False, True], [False, True], range(4)))


def png(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    PILImage.fromarray(array).save(out, format="PNG")
    return out.getvalue()


def palette_png(index: np.ndarray, values: np.ndarray) -> bytes:
    """A palette PNG whose pixels are the indices ``values[index]``."""
    image = PILImage.fromarray(values[index].astype(np.uint8), "L").convert("P")
    image.putpalette(list(np.random.default_rng(0).integers(0, 256, 768, dtype=np.uint8)))
    out = io.BytesIO()
    image.save(out, format="PNG")
    assert PILImage.open(io.BytesIO(out.getvalue())).mode == "P"
    return out.getvalue()


# --- a role registered from outside fastpipe --------------------------------------------------

@register_role
@dataclass(frozen=True)
class KeyPoints(Role):
    """``(N, 2)`` float ``(x, y)`` points, in pixels of the reference grid."""

    name: ClassVar[str] = "test-keypoints"

    def check(self, field):
        shape = getattr(field, "shape", ())
        if not (field.kind == "array" and field.dtype.startswith("float") and len(shape) == 2
                and shape[1] == 2):
            raise ValueError("KeyPoints holds float (N, 2) points")


@register_joint_kernel(KeyPoints)
def move_points(points, params, context):
    """Points move as the pixels do: shifted by the crop, scaled by the resize, mirrored by the
    flips, then turned counter-clockwise ``k`` times ((x, y) -> (y, width - x))."""
    points = torch.as_tensor(points)
    top, left, h, w = params.box
    oh, ow = params.out
    p = (points - torch.tensor([left, top], dtype=points.dtype)) \
        * torch.tensor([ow / w, oh / h], dtype=points.dtype)
    if params.hflip:
        p = torch.stack([ow - p[:, 0], p[:, 1]], 1)
    if params.vflip:
        p = torch.stack([p[:, 0], oh - p[:, 1]], 1)
    height, width = oh, ow
    for _ in range(params.k):
        p = torch.stack([p[:, 1], width - p[:, 0]], 1)
        height, width = width, height
    return p


POINTS = ArrayField("float32", (None, 2), role=KeyPoints())


def markers(rng, count, height, width):
    """A mask with ``count`` marked pixels (values 1..count, the rest 0) and the points at their
    centres."""
    flat = rng.choice(height * width, count, replace=False)
    rows, cols = np.divmod(flat, width)
    mask = np.zeros((height, width), np.uint8)
    mask[rows, cols] = np.arange(1, count + 1)
    return mask, torch.from_numpy(np.stack([cols + 0.5, rows + 0.5], 1).astype(np.float32))


@pytest.mark.parametrize("mode", ["random", "center"])
def test_keypoints_registered_outside_fastpipe_move_with_the_pixels(mode):
    """Independently of the kernel's algebra: each point marks the centre of a pixel of a mask;
    after the joint crop, a marker found at output pixel (i, j) has its point at (j+.5, i+.5),
    and a marker the crop left out has its point outside the output, for every flip and turn."""
    rng = np.random.default_rng(0)
    crop = JointCrop(12, mode=mode, hflip=0.5, vflip=0.5, rot90=True)
    fields = {"mask": ImageField(role=Mask()), "points": POINTS}
    check_fields(crop, fields, "test")
    seen = set()
    for seed in range(48):
        mask, points = markers(rng, 40, 30, 40)
        out = joint_record(crop, {"mask": png(mask), "points": points}, fields, seed, "sample")
        seen.add(crop.make_params({"mask": (30, 40)}, seed)[2:])
        got, moved = out["mask"][0], out["points"]
        assert moved.shape == (40, 2)
        for k in range(40):
            where = (got == k + 1).nonzero()
            x, y = moved[k].tolist()
            if len(where):
                i, j = where[0].tolist()
                assert (x, y) == (j + 0.5, i + 0.5), (seed, k)
            else:
                assert not (0 <= x < 12 and 0 <= y < 12), (seed, k)
    assert seen == set(ORIENTATIONS)


def test_keypoints_follow_the_boxes_kernels_math_through_resizes():
    """With mode='resized': a point is the centre of a small box around it, moved by fastpipe's
    boxes kernel (checked against torchvision v2 in test_joint.py)."""
    rng = np.random.default_rng(1)
    crop = JointCrop(24, mode="resized", scale=(0.1, 1.0), hflip=0.5, vflip=0.5, rot90=True)
    compared = 0
    for seed in range(40):
        params = crop.make_params({"image": (60, 80)}, seed)
        top, left, h, w = params.box
        points = torch.from_numpy(np.stack([rng.uniform(left + 2, left + w - 2, 16),
                                            rng.uniform(top + 2, top + h - 2, 16)],
                                           1).astype(np.float64))
        got = move_points(points, params, None)
        boxes, keep = move_boxes(torch.cat([points - 2, points + 2], 1), params, (60, 80), "t")
        assert keep.all()
        centres = (boxes[:, :2] + boxes[:, 2:]) / 2
        # move_boxes scales with float32 ratios: equal to float32 precision.
        torch.testing.assert_close(got, centres, rtol=0, atol=1e-5)
        compared += len(points)
    assert compared == 640


def test_keypoints_move_through_a_pack_and_their_role_is_stored(tmp_path):
    """A pack stores the registered role; H5Dataset(joint=) moves the points with the draw it
    makes per sample, with no change to fastpipe."""
    pytest.importorskip("h5py")
    from fastpipe.data import H5Dataset
    from fastpipe.pack import pack

    rng = np.random.default_rng(2)
    samples = [{"image": png(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)),
                "points": rng.uniform(0, 30, (5 + i, 2)).astype(np.float32)} for i in range(4)]
    pack(samples, tmp_path / "kp.h5", progress=False,
         fields={"image": ImageField(), "points": POINTS})
    crop = JointCrop(16, mode="resized", hflip=0.5, rot90=True)
    ds = H5Dataset(tmp_path / "kp.h5", joint=crop, seed=3)
    assert ds.fields["points"].role == KeyPoints()
    for i in range(4):
        params = crop.make_params({"image": (30, 40)}, sample_seed(3, 0, i, JOINT_STREAM))
        want = move_points(torch.from_numpy(samples[i]["points"]), params, None)
        assert torch.equal(ds[i]["points"], want)


def test_a_kernel_is_told_its_canvas_and_factor():
    """A role with a ``canvas`` setting lives on that field's grid: its kernel gets the draw
    scaled to it, and the canvas's size this sample."""

    @dataclass(frozen=True)
    class Probe(Role):
        canvas: str | None = None
        name: ClassVar[str] = "test-probe"

    seen = []

    def probe(value, params, context):
        seen.append((params, context))
        return value

    register_joint_kernel(Probe, probe)
    record = {"lr": png(np.zeros((10, 12, 3), np.uint8)),
              "hr": png(np.zeros((20, 24, 3), np.uint8)),
              "on_hr": torch.zeros(3), "on_ref": torch.zeros(3)}
    fields = {"lr": ImageField(), "hr": ImageField(),
              "on_hr": ArrayField("float32", (3,), role=Probe("hr")),
              "on_ref": ArrayField("float32", (3,), role=Probe())}
    crop = JointCrop(4, factors={"hr": 2}, hflip=0.0)
    out = joint_record(crop, record, fields, 5, "sample 9")
    assert out["hr"].shape == (3, 8, 8)
    (hr_params, hr), (ref_params, ref) = seen
    assert isinstance(hr, JointContext)
    assert (hr.name, hr.factor, hr.canvas) == ("on_hr", 2, (20, 24))
    assert (ref.factor, ref.canvas) == (1, (10, 12)) and ref.where == "sample 9['on_ref']"
    assert hr_params.box == Box(*(2 * v for v in ref_params.box)) and hr_params.out == (8, 8)
    with pytest.raises(ValueError, match="already has the joint kernel"):
        register_joint_kernel(Probe, lambda v, p, c: v)
    with pytest.raises(TypeError, match="Role subclass"):
        register_joint_kernel(Role, probe)
    with pytest.raises(ValueError, match="'on_hr' is on the canvas 'hr'.*not an image field"):
        check_fields(JointCrop(4), {"lr": ImageField(), "on_hr": fields["on_hr"]}, "test")


# --- masks ------------------------------------------------------------------------------------

LABELS = np.array([0, 3, 7, 255], np.uint8)


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_a_mask_is_never_interpolated_whatever_the_crops_filter(interpolation):
    """mode='resized' with a bilinear or bicubic default: the Mask field keeps its palette
    indices (nearest, as an image field given 'nearest'); the same file as an Image field is
    interpolated to values outside the palette (the check can fail)."""
    rng = np.random.default_rng(3)
    index = rng.integers(0, 4, (40, 50))
    mask = palette_png(index, LABELS)
    record = {"image": png(rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)), "mask": mask,
              "as_image": mask}
    fields = {"image": ImageField(), "mask": ImageField(role=Mask()), "as_image": ImageField()}
    crop = JointCrop(24, mode="resized", scale=(0.2, 1.0), hflip=0.5, rot90=True,
                     interpolation=interpolation)
    check_fields(crop, fields, "test")
    reference = JointCrop(24, mode="resized", scale=(0.2, 1.0), hflip=0.5, rot90=True,
                          interpolation={"mask": "nearest"})
    interpolated = False
    for seed in range(12):
        got = joint_record(crop, record, fields, seed, "sample")
        assert got["mask"].dtype == torch.uint8 and got["mask"].shape == (1, 24, 24)
        assert set(got["mask"].unique().tolist()) <= set(LABELS.tolist())
        old = joint_record(reference, record, {n: ImageField() for n in record}, seed, "sample")
        assert torch.equal(got["mask"], old["mask"])
        interpolated |= not set(got["as_image"].unique().tolist()) <= set(LABELS.tolist())
    assert interpolated
    with pytest.raises(ValueError, match="'mask' interpolation 'bilinear'.*never interpolated"):
        check_fields(JointCrop(24, interpolation={"mask": "bilinear"}), fields, "test")


def test_decoded_pixel_fields_crop_as_their_encoded_files():
    """An array field of decoded pixels with a pixel role crops, resizes and turns as the PNG of
    the same pixels; a 16-bit mask array keeps its values."""
    rng = np.random.default_rng(4)
    rgb = rng.integers(0, 256, (30, 36, 3), dtype=np.uint8)
    depth = rng.choice(np.array([0, 1000, 40000, 65535], np.uint16), (30, 36))
    encoded = {"image": png(rgb), "depth": png(depth)}
    encoded_fields = {"image": ImageField(), "depth": ImageField(role=Mask())}
    decoded = {"image": torch.from_numpy(rgb), "depth": torch.from_numpy(depth)}
    decoded_fields = {"image": ArrayField("uint8", (30, 36, 3), role=Image()),
                      "depth": ArrayField("uint16", (30, 36), role=Mask())}
    crop = JointCrop(16, mode="resized", hflip=0.5, vflip=0.5, rot90=True)
    for seed in range(10):
        a = joint_record(crop, encoded, encoded_fields, seed, "s")
        b = joint_record(crop, decoded, decoded_fields, seed, "s")
        assert torch.equal(a["image"], b["image"]) and torch.equal(a["depth"], b["depth"])
        assert b["depth"].dtype == torch.uint16 and b["depth"].shape == (1, 16, 16)
        assert set(b["depth"].unique().tolist()) <= {0, 1000, 40000, 65535}


# --- boxes ------------------------------------------------------------------------------------

def random_boxes(rng, n, height, width):
    xy = rng.uniform(-5, [width + 5, height + 5], (n, 2))
    wh = rng.uniform(0.5, [width / 2, height / 2], (n, 2))
    return torch.from_numpy(np.concatenate([xy, xy + wh], 1).astype(np.float32))


@pytest.mark.parametrize("box_format", ["xywh", "cxcywh"])
@pytest.mark.parametrize("mode", ["random", "center", "resized"])
def test_boxes_in_every_format_give_the_xyxy_result(box_format, mode):
    """Boxes converted to another format (by torchvision) come back in it, and equal the same
    boxes moved as xyxy; the same boxes (and labels) are dropped."""
    tv_ops = pytest.importorskip("torchvision.ops", exc_type=ImportError)
    rng = np.random.default_rng(5)
    image = png(np.zeros((60, 80, 3), np.uint8))
    crop = JointCrop(32, mode=mode, hflip=0.5, vflip=0.5, rot90=True,
                     boxes={"boxes": ("labels",)})
    xyxy_fields = {"image": ImageField(), "boxes": ArrayField("float32", (None, 4)),
                   "labels": ArrayField("int64", (None,))}
    fields = dict(xyxy_fields, boxes=ArrayField("float32", (None, 4),
                                                role=BoundingBoxes(box_format)))
    check_fields(crop, fields, "test")
    kept = 0
    for seed in range(30):
        boxes, labels = random_boxes(rng, 12, 60, 80), torch.arange(12)
        want = joint_record(crop, {"image": image, "boxes": boxes, "labels": labels},
                            xyxy_fields, seed, "s")
        record = {"image": image, "boxes": tv_ops.box_convert(boxes, "xyxy", box_format),
                  "labels": labels}
        got = joint_record(crop, record, fields, seed, "s")
        assert torch.equal(got["labels"], want["labels"]), seed
        assert got["boxes"].dtype == torch.float32
        torch.testing.assert_close(tv_ops.box_convert(got["boxes"], box_format, "xyxy"),
                                   want["boxes"], rtol=0, atol=1e-4)
        kept += len(got["labels"])
    assert 0 < kept < 30 * 12


@pytest.mark.parametrize("mode", ["random", "resized"])
def test_boxes_on_a_factor_2_canvas_move_with_its_crop(mode):
    """Boxes whose canvas is the HR field are in its pixels: they equal twice the same boxes on
    the LR (reference) grid, box for box where both are kept."""
    rng = np.random.default_rng(6)
    record = {"lr": png(np.zeros((20, 24, 3), np.uint8)),
              "hr": png(np.zeros((40, 48, 3), np.uint8))}
    fields = {"lr": ImageField(), "hr": ImageField(),
              "lr_boxes": ArrayField("float32", (None, 4), role=BoundingBoxes()),
              "hr_boxes": ArrayField("float32", (None, 4), role=BoundingBoxes(canvas="hr")),
              "lr_ids": ArrayField("int64", (None,)), "hr_ids": ArrayField("int64", (None,))}
    crop = JointCrop(8, mode=mode, factors={"hr": 2}, hflip=0.5, vflip=0.5, rot90=True,
                     boxes={"lr_boxes": ("lr_ids",), "hr_boxes": ("hr_ids",)})
    check_fields(crop, fields, "test")
    both = 0
    for seed in range(30):
        boxes = random_boxes(rng, 10, 20, 24)
        out = joint_record(crop, dict(record, lr_boxes=boxes, hr_boxes=boxes * 2,
                                      lr_ids=torch.arange(10), hr_ids=torch.arange(10)),
                           fields, seed, "s")
        assert set(out["lr_ids"].tolist()) <= set(out["hr_ids"].tolist())
        common = torch.isin(out["hr_ids"], out["lr_ids"])
        torch.testing.assert_close(out["hr_boxes"][common], out["lr_boxes"] * 2, rtol=0,
                                   atol=1e-4)
        both += len(out["lr_ids"])
    assert both > 30


def test_box_fields_must_be_named_with_their_per_box_fields_and_other_refusals():
    fields = {"image": ImageField(),
              "boxes": ArrayField("float32", (None, 4), role=BoundingBoxes()),
              "labels": ArrayField("int64", (None,)), "label": IntField(role=Label()),
              "ints": ArrayField("int64", (None, 4)), "points": POINTS}
    with pytest.raises(ValueError, match=r"'boxes' holds boxes; name it and its per-box fields in "
                                         r"JointCrop\(boxes=\{'boxes': \(...\)\}\)"):
        check_fields(JointCrop(8), fields, "ds")
    with pytest.raises(ValueError, match="boxes names 'ints', .*float \\(N, 4\\) boxes"):
        check_fields(JointCrop(8, boxes={"boxes": (), "ints": ()}), fields, "ds")
    with pytest.raises(ValueError, match=r"boxes names 'label', whose role Label\(\) does not "
                                         "move"):
        check_fields(JointCrop(8, boxes={"boxes": (), "label": ()}), fields, "ds")
    with pytest.raises(ValueError, match="per-box field 'points' of 'boxes' moves with the crop"):
        check_fields(JointCrop(8, boxes={"boxes": ("points",)}), fields, "ds")
    with pytest.raises(ValueError, match="boxes names 'image', an image field"):
        check_fields(JointCrop(8, boxes={"image": ()}), fields, "ds")
    with pytest.raises(ValueError, match="'points' \\(factors/interpolation\\), a field that is "
                                         "not an image"):
        check_fields(JointCrop(8, factors={"points": 2}, boxes={"boxes": ()}), fields, "ds")
    with pytest.raises(ValueError, match="needs an image field"):
        check_fields(JointCrop(8), {"points": POINTS}, "ds")
    with pytest.raises(ValueError, match="'boxes' is on the canvas 'hr'"):
        check_fields(JointCrop(8, boxes={"boxes": ()}),
                     {"image": ImageField(),
                      "boxes": ArrayField("float32", (None, 4), role=BoundingBoxes(canvas="hr"))},
                     "ds")
    check_fields(JointCrop(8, boxes={"boxes": ("labels",)}), fields, "ds")


def test_a_kernel_that_drops_rows_drops_them_from_the_per_row_fields():
    @dataclass(frozen=True)
    class Inside(Role):
        name: ClassVar[str] = "test-inside"

    @register_joint_kernel(Inside)
    def keep_inside(points, params, context):
        moved = move_points(points, params, context)
        keep = ((moved >= 0) & (moved < torch.tensor(params.out[::-1]))).all(1)
        return KeptRows(moved[keep], keep)

    record = {"image": png(np.zeros((20, 20, 3), np.uint8)),
              "points": torch.tensor([[1.0, 1.0], [15.0, 15.0], [2.0, 3.0]]),
              "scores": np.array([0.1, 0.2, 0.3], np.float32)}
    fields = {"image": ImageField(), "points": ArrayField("float32", (None, 2), role=Inside()),
              "scores": ArrayField("float32", (None,))}
    # The centre 16x16 crop starts at (2, 2): the first point leaves it.
    crop = JointCrop(16, mode="center", hflip=0.0, boxes={"points": ("scores",)})
    check_fields(crop, fields, "test")
    out = joint_record(crop, record, fields, 0, "s")
    assert out["points"].tolist() == [[13.0, 13.0], [0.0, 1.0]]
    assert out["scores"].tolist() == pytest.approx([0.2, 0.3])


# --- the readers ------------------------------------------------------------------------------

@pytest.fixture
def seg_pack(tmp_path):
    """A records pack of image + palette mask (role Mask) + label."""
    pytest.importorskip("h5py")
    from fastpipe.pack import pack

    rng = np.random.default_rng(7)
    samples, indices = [], []
    for i in range(4):
        index = rng.integers(0, 4, (30, 40))
        samples.append({"image": png(np.repeat(LABELS[index][..., None], 3, 2)),
                        "mask": palette_png(index, LABELS), "label": i})
        indices.append(LABELS[index])
    path = tmp_path / "seg.h5"
    pack(samples, path, progress=False, fields={"mask": ImageField(role=Mask())})
    return path, indices


def test_a_packed_mask_is_read_as_stored_and_cropped_by_its_role(seg_pack):
    from fastpipe import Recipe
    from fastpipe.data import H5Dataset

    path, indices = seg_pack
    whole = H5Dataset(path)
    assert whole.fields["mask"] == ImageField(role=Mask())
    for i in range(4):
        got = whole[i]
        assert got["mask"].dtype == torch.uint8 and got["mask"].shape == (1, 30, 40)
        assert torch.equal(got["mask"][0], torch.from_numpy(indices[i]))
        assert got["image"].shape == (3, 30, 40)  # the image field: RGB, as ever
    crop = JointCrop(16, mode="resized", scale=(0.3, 1.0), hflip=0.5, rot90=True)
    ds = H5Dataset(path, joint=crop, seed=1)
    for i in range(4):
        got = ds[i]
        assert set(got["mask"].unique().tolist()) <= set(LABELS.tolist())
        assert got["mask"].shape == (1, 16, 16)
    with pytest.raises(ValueError, match=r"\['mask'\] are Mask fields.*joint=JointCrop"):
        H5Dataset(path, recipe=Recipe(size=16))
    assert H5Dataset(path, recipe=Recipe(size=16), fields=["image", "label"])[0][0].shape == \
        (3, 16, 16)


def test_a_batch_never_takes_the_stored_rows_of_a_field_the_crop_moves(tmp_path):
    """Fixed-shape arrays are read straight into a batch block; a pixel array with the Image role
    is cropped per sample instead, so the batch holds the crops."""
    pytest.importorskip("h5py")
    from fastpipe.data import H5Dataset
    from fastpipe.pack import pack

    rng = np.random.default_rng(8)
    samples = [{"image": rng.integers(0, 256, (16, 16, 3), dtype=np.uint8), "label": i}
               for i in range(5)]
    pack(samples, tmp_path / "px.h5", progress=False,
         fields={"image": ArrayField("uint8", (16, 16, 3), role=Image())})
    ds = H5Dataset(tmp_path / "px.h5", joint=JointCrop(8, hflip=0.5), seed=2)
    batch = fast_collate(ds.__getitems__([3, 0, 4]))
    assert batch["image"].shape == (3, 3, 8, 8)
    for k, i in enumerate([3, 0, 4]):
        assert torch.equal(batch["image"][k], ds[i]["image"])
    plain = fast_collate(H5Dataset(tmp_path / "px.h5").__getitems__([3, 0]))
    assert plain["image"].shape == (2, 16, 16, 3)  # without a crop: the stored rows


def test_a_pack_naming_a_role_nobody_registered_says_which_and_what_to_import(tmp_path,
                                                                               monkeypatch):
    pytest.importorskip("h5py")
    from fastpipe.data import H5Dataset
    from fastpipe.data.format import roles as R
    from fastpipe.pack import pack

    samples = [{"points": np.zeros((3, 2), np.float32)} for _ in range(2)]
    pack(samples, tmp_path / "kp.h5", progress=False, fields={"points": POINTS})
    assert H5Dataset(tmp_path / "kp.h5").fields["points"].role == KeyPoints()
    monkeypatch.delitem(R._ROLES, KeyPoints.name)  # a process that did not import this module
    with pytest.raises(ValueError, match="unknown field role 'test-keypoints'.*import the module "
                                         "that defines and registers it"):
        H5Dataset(tmp_path / "kp.h5")


def test_paired_folders_give_a_folder_a_role(tmp_path):
    from fastpipe.data import PairedFolders

    rng = np.random.default_rng(9)
    (tmp_path / "images").mkdir()
    (tmp_path / "masks").mkdir()
    indices = []
    for i in range(3):
        index = rng.integers(0, 4, (24, 30))
        (tmp_path / "images" / f"{i}.png").write_bytes(png(rng.integers(0, 256, (24, 30, 3),
                                                                         dtype=np.uint8)))
        (tmp_path / "masks" / f"{i}.png").write_bytes(palette_png(index, LABELS))
        indices.append(LABELS[index])
    roots = {"image": tmp_path / "images", "mask": tmp_path / "masks"}
    whole = PairedFolders(roots, roles={"mask": Mask()})
    assert whole.fields == {"image": ImageField(), "mask": ImageField(role=Mask())}
    assert torch.equal(whole[1]["mask"][0], torch.from_numpy(indices[1]))
    crop = JointCrop(12, mode="resized", hflip=0.5)
    by_role = PairedFolders(roots, joint=crop, seed=4, roles={"mask": Mask()})
    by_filter = PairedFolders(roots, joint=JointCrop(12, mode="resized", hflip=0.5,
                                                     interpolation={"mask": "nearest"}), seed=4)
    for i in range(3):
        a, b = by_role[i], by_filter[i]
        assert torch.equal(a["mask"], b["mask"]) and torch.equal(a["image"], b["image"])
        assert set(a["mask"].unique().tolist()) <= set(LABELS.tolist())
    if importlib.util.find_spec("h5py") is not None:  # packed with its fields, roles kept
        from fastpipe.data import H5Dataset
        from fastpipe.pack import pack

        pack(by_role.pack_source(), tmp_path / "seg.h5", progress=False, fields=by_role.fields)
        packed = H5Dataset(tmp_path / "seg.h5", joint=crop, seed=4)
        assert packed.fields == by_role.fields
        for i in range(3):
            assert torch.equal(packed[i]["mask"], by_role[i]["mask"])
    with pytest.raises(ValueError, match="roles names 'depth', which is not in roots"):
        PairedFolders(roots, roles={"depth": Mask()})
    with pytest.raises(ValueError, match=r"roles\['mask'\].*float \(N, 4\) boxes"):
        PairedFolders(roots, roles={"mask": BoundingBoxes()})
    with pytest.raises(TypeError, match="roles must be a dict"):
        PairedFolders(roots, roles=[Mask()])
