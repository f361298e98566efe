"""Joint geometry: one draw of crop, flips and rot90 applied to several fields of a sample.

torchvision.transforms.v2 is the model: a transform's randomness is drawn once
(:meth:`JointCrop.make_params`) apart from the kernels that apply it to each field, found by the
field's role (fastpipe.data.joint.kernels: ``register_joint_kernel``), so an image, its mask,
its boxes, or a low- and a high-resolution image of one scene all move together. The draw for
sample ``i`` of epoch ``e`` comes from a generator seeded by ``(seed, e, i)``
(fastpipe.data.sampling.seeds), as every per-sample draw of fastpipe: the same crops on any number
of process or thread workers and after a resume.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from fastpipe import _geometry as geometry
from fastpipe import _validate as check
from fastpipe._constants import DEFAULT_HFLIP, DEFAULT_INTERPOLATION, DEFAULT_RATIO, DEFAULT_SCALE
from fastpipe.data.sampling.seeds import reseeded

__all__ = ["JOINT_STREAM", "JointCrop", "JointParams"]

# The sample_seed stream of the joint draw (0: a dataset's decoder crop, 1: auto_augment and
# transform), so the joint draw never replays those numbers.
JOINT_STREAM = 2

MODES = ("random", "center", "resized")
FILTERS = ("nearest", "bilinear", "bicubic")
# Uniform numbers one draw consumes: the train crop's (fastpipe._geometry), vflip, rot90.
_UNIFORMS = geometry.UNIFORMS_PER_CROP + 2


class JointParams(NamedTuple):
    """One draw of a :class:`JointCrop` for one sample, on the reference grid (the fields of
    factor 1): the crop ``box``, the size ``out`` the crop has after the resize of ``"resized"``
    (the box's own size otherwise), the flips, and ``k``, the number of ``torch.rot90`` turns
    (counter-clockwise, dims ``(H, W)``) applied after the flips. A joint kernel
    (:func:`~fastpipe.data.register_joint_kernel`) receives it on its field's own grid: ``box``
    and ``out`` times the field's factor."""

    box: geometry.Box
    out: tuple[int, int]
    hflip: bool
    vflip: bool
    k: int


@dataclass(frozen=True)
class JointCrop:
    """The same random crop, flips and rot90 on every field of a sample that has a place on the
    image: its image and mask fields, its boxes, and any role with a registered kernel.

    Fields are recognised by their role (:mod:`fastpipe.data.format.roles`), never by their name:
    :class:`~fastpipe.data.Image` and :class:`~fastpipe.data.Mask` fields are pixels (their sizes,
    read from the encoded headers, set the draw), :class:`~fastpipe.data.BoundingBoxes` fields
    move with them, and a role registered from outside fastpipe moves with its own kernel
    (:func:`~fastpipe.data.register_joint_kernel`). Fields of other roles come back as they are.

    Args:
        size: the output size on the reference grid, an int (square) or ``(height, width)``.
        mode: ``"random"`` a crop of ``size`` at a uniform position (no resize; BasicSR's
            ``paired_random_crop``), ``"center"`` the centre crop of ``size`` (torchvision's
            ``CenterCrop``), ``"resized"`` torchvision's ``RandomResizedCrop`` (``scale``,
            ``ratio``) resized to ``size``. An image smaller than ``size`` is an error naming the
            sample for ``"random"`` and ``"center"``.
        scale, ratio: the area and aspect ranges of ``"resized"`` (torchvision's).
        hflip, vflip: the probabilities of a left-right and an up-down flip.
        rot90: turn by ``k * 90`` degrees, ``k`` uniform in 0..3 (``torch.rot90(x, k, (-2, -1))``:
            counter-clockwise), after the flips; with both flips this draws each of the 8
            symmetries of the square. Needs a square ``size``, so the samples of a batch keep
            one shape.
        factors: each field's size relative to the reference grid, an int >= 1
            (``{"hr": 2}``: ``hr`` is twice the size of the other fields). Fields not named have
            factor 1 and are the reference grid; a sample whose fields are not exactly these
            multiples is an error naming it. The crop of a field of factor ``s`` is the
            reference crop times ``s``: the ``lr`` patch at ``(top, left, h, w)`` is the ``hr``
            patch at ``(top*s, left*s, h*s, w*s)``.
        interpolation: the resize filter of image fields (``"bilinear"``, ``"bicubic"``), or a
            dict of filters per field (``{"mask": "nearest"}``), others ``"bilinear"``. A
            :class:`~fastpipe.data.Mask` field is always resized by nearest neighbour, whatever
            this says, and keeps its stored channels, dtype and values (a palette PNG's indices,
            16-bit values): ``"resized"`` picks source pixel ``floor(i * in / out)``, as torch's
            ``"nearest"``; an :class:`~fastpipe.data.Image` field given ``"nearest"`` is kept as
            stored the same way (a mask packed before roles). Other image fields are decoded to
            uint8 RGB ``(3, H, W)``, as everywhere in fastpipe.
        boxes: the box fields and the per-box fields that go with them
            (``{"boxes": ("labels",)}``). Every :class:`~fastpipe.data.BoundingBoxes` field of the
            record is named here (``{"boxes": ()}`` when nothing goes with it), so that no
            per-box field is left misaligned; a plain float ``(N, 4)`` array field named here is
            taken as ``BoundingBoxes("xyxy")`` on the reference grid. Boxes move with the pixels
            (crop: shifted and clipped; resize: scaled; flips; rot90) in their own format and on
            their canvas, and a box left with a side or an area below 1 pixel is dropped with
            its rows of the per-box fields, as torchvision v2's
            ``SanitizeBoundingBoxes(min_size=1)`` drops it. Every mode supports boxes. A
            registered role whose kernel drops rows (returns ``KeptRows``) takes its per-row
            fields here too.

    Randomness comes from :meth:`make_params`, a function of a seed; datasets
    (``H5Dataset(joint=...)``, :class:`~fastpipe.data.PairedFolders`) seed it per sample. The
    CPU path only: DALI does not run joint crops (see the dense-recipes page).
    """

    size: int | tuple[int, int]
    mode: str = "random"
    scale: tuple[float, float] = DEFAULT_SCALE
    ratio: tuple[float, float] = DEFAULT_RATIO
    hflip: float = DEFAULT_HFLIP
    vflip: float = 0.0
    rot90: bool = False
    factors: Mapping[str, int] | None = None
    interpolation: str | Mapping[str, str] = DEFAULT_INTERPOLATION
    boxes: Mapping[str, Sequence[str]] | None = None
    _filters: dict[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        where = "JointCrop"
        put = object.__setattr__
        put(self, "size", check.size_pair("size", self.size, where=where))
        put(self, "mode", check.choice("mode", self.mode, MODES, where=where))
        scale = check.pair("scale", self.scale, where=where)
        if scale[1] > 1:
            raise ValueError(f"{where}: scale is a range of area fractions in (0, 1], got "
                             f"{self.scale!r}")
        put(self, "scale", scale)
        put(self, "ratio", check.pair("ratio", self.ratio, where=where))
        if self.mode != "resized" and (scale != DEFAULT_SCALE or self.ratio != DEFAULT_RATIO):
            raise ValueError(f"{where}: scale and ratio are the ranges of mode='resized'; "
                             f"mode={self.mode!r} crops exactly size={self.size}")
        put(self, "hflip", check.probability("hflip", self.hflip, where=where))
        put(self, "vflip", check.probability("vflip", self.vflip, where=where))
        if not isinstance(self.rot90, bool):
            raise check.ArgumentTypeError(
                f"{where}: rot90 must be True or False (k uniform in 0..3 when True), got "
                f"{self.rot90!r}")
        if self.rot90 and self.size[0] != self.size[1]:
            raise ValueError(f"{where}: rot90=True turns a {self.size[0]}x{self.size[1]} crop "
                             "into a differently shaped one, so a batch would not stack; pass a "
                             "square size")
        put(self, "factors", _factors(self.factors, where))
        put(self, "boxes", _boxes(self.boxes, where))
        filters, default = _filters(self.interpolation, where)
        put(self, "interpolation", default if not filters else dict(filters))
        put(self, "_filters", filters)
        put(self, "_default_filter", default)
        named = set(self.factors) | set(filters)
        for box, per_box in self.boxes.items():
            if box in named:
                raise ValueError(f"{where}: {box!r} is a box field and an image field (named in "
                                 "factors or interpolation); boxes live on the reference grid")
            for name in per_box:
                if name in named or name in self.boxes:
                    raise ValueError(f"{where}: per-box field {name!r} of {box!r} is also an "
                                     "image or a box field")

    def filter_of(self, name: str) -> str:
        """The resize filter of image field ``name``."""
        return self._filters.get(name, self._default_filter)

    def factor_of(self, name: str) -> int:
        """Field ``name``'s size relative to the reference grid."""
        return self.factors.get(name, 1)

    def make_params(self, sizes: Mapping[str, tuple[int, int]], seed: int | None = None,
                    where: str = "the sample") -> JointParams:
        """One draw for one sample whose image fields have ``sizes`` (``{name: (h, w)}``): a pure
        function of ``seed`` (datasets pass ``sample_seed(seed, epoch, index, JOINT_STREAM)``);
        ``seed=None`` draws from torch's global generator, as torchvision's transforms do.

        The fields of factor 1 must share one size, the reference grid; a field of factor ``s``
        must be exactly ``s`` times it, else a ValueError naming ``where``. Draws
        ``torch.rand(25, dtype=float64)`` from a generator seeded ``seed``: the crop's numbers as
        fastpipe._geometry draws a train crop (position from numbers 20 and 21), then hflip
        (22), vflip (23) and rot90 (24)."""
        reference = None
        for name, hw in sizes.items():
            if self.factor_of(name) == 1:
                if reference is None:
                    reference = (name, tuple(hw))
                elif tuple(hw) != reference[1]:
                    raise ValueError(
                        f"{where}: image fields {reference[0]!r} ({_hw(reference[1])}) and "
                        f"{name!r} ({_hw(hw)}) differ in size. Where other samples' fields "
                        f"agree, this sample is damaged: {_DAMAGED}; where the fields are of "
                        "different resolutions in every sample, name the larger ones in "
                        "factors= (fields of one size share the crop)")
        if reference is None:
            raise ValueError(f"{where}: no image field of factor 1 among {list(sizes)}")
        ref_name, (height, width) = reference
        for name, hw in sizes.items():
            s = self.factor_of(name)
            if s != 1 and tuple(hw) != (height * s, width * s):
                raise ValueError(
                    f"{where}: field {name!r} is {_hw(hw)}, but factors gives it {s} x "
                    f"{ref_name!r} ({_hw((height, width))}) = {_hw((height * s, width * s))}; "
                    f"this sample is damaged: {_DAMAGED}, or a downscale rounded the size")
        generator = None if seed is None else reseeded(seed)
        u = torch.rand(_UNIFORMS, dtype=torch.float64, generator=generator).tolist()
        out_h, out_w = self.size
        if self.mode == "resized":
            box = geometry.random_resized_crop_box(height, width, u, self.scale, self.ratio)
        else:
            if height < out_h or width < out_w:
                raise ValueError(
                    f"{where}: {ref_name!r} is {_hw((height, width))}, smaller than the "
                    f"{_hw(self.size)} crop of mode={self.mode!r}; pick a smaller size, or "
                    "mode='resized'")
            if self.mode == "center":
                box = geometry.centre_box(height, width, self.size)
            else:
                box = geometry.Box(int(u[20] * (height - out_h + 1)),
                                   int(u[21] * (width - out_w + 1)), out_h, out_w)
        k = min(int(u[24] * 4), 3) if self.rot90 else 0
        return JointParams(box, (out_h, out_w), u[22] < self.hflip, u[23] < self.vflip, k)


# What a sample whose fields' sizes disagree holds: the sizes come from the files' headers.
_DAMAGED = ("one of its files declares another size than its pair's (a damaged header, or an "
            "image and a mask that do not belong together): fix or remove the sample")


def _hw(hw: Sequence[int]) -> str:
    return f"{hw[0]}x{hw[1]}"


def _factors(value: Any, where: str) -> dict[str, int]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise check.ArgumentTypeError(f"{where}: factors must be a dict of field name -> int "
                                      f"(e.g. {{'hr': 2}}), got {value!r}")
    out = {}
    for name, s in value.items():
        if not isinstance(name, str):
            raise check.ArgumentTypeError(f"{where}: factors keys are field names, got {name!r}")
        if isinstance(s, numbers.Real) and not isinstance(s, (bool, numbers.Integral)) \
                and math.isfinite(s) and s == int(s):
            s = int(s)
        out[name] = check.positive_int(f"factors[{name!r}]", s, where=where)
    return out


def _boxes(value: Any, where: str) -> dict[str, tuple[str, ...]]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise check.ArgumentTypeError(
            f"{where}: boxes must be a dict of box field -> names of its per-box fields (e.g. "
            f"{{'boxes': ('labels',)}}), got {value!r}")
    out = {}
    for name, per_box in value.items():
        if isinstance(per_box, str) or not isinstance(per_box, Sequence) or not all(
                isinstance(p, str) for p in per_box):
            raise check.ArgumentTypeError(
                f"{where}: boxes[{name!r}] must be a tuple of field names (the per-box fields "
                f"dropped with a box), got {per_box!r}")
        out[str(name)] = tuple(per_box)
    return out


def _filters(value: Any, where: str) -> tuple[dict[str, str], str]:
    def one(name: str, f: Any, options: Sequence[str]) -> str:
        text = getattr(f, "value", f)  # torchvision's InterpolationMode
        if not isinstance(text, str) or text.lower() not in options:
            raise ValueError(f"{where}: {name} must be one of {', '.join(map(repr, options))}; "
                             f"got {f!r}")
        return text.lower()

    if isinstance(value, Mapping):
        return {str(n): one(f"interpolation[{n!r}]", f, FILTERS) for n, f in value.items()}, \
            DEFAULT_INTERPOLATION
    # One filter for every image field; "nearest" for all would be a mask-only dataset.
    return {}, one("interpolation", value, FILTERS)
