"""``Recipe``: what happens to an image between its file and the training step, on every backend.

One frozen object, checked once, holds the settings of the image path: the geometry (``train``:
a random resized crop of ``scale`` and ``ratio`` and a horizontal flip of probability
``hflip``; eval: a resize by ``crop_pct`` and a centre crop), the output ``size`` and the resize
filter (``interpolation``), the per-sample augmentation (``auto_augment``, ``color_jitter``,
``cutout_holes``/``cutout_size``) and the batch the training step receives (``mean``, ``std``,
``dtype``, ``channels_last``). ``image_loader`` builds one; the CPU decoder and datasets and the
DALI pipeline and loader take one (their keyword arguments build the same object). Each backend
translates it and :meth:`Recipe.check` is the one place that refuses what a backend cannot
honour. Randomness is not a setting of the recipe: loaders and datasets take ``seed``, with the
policy of ``fastpipe._seed``.

The geometry itself is :mod:`fastpipe._geometry`'s, shared by the CPU decoder (and its C++ train
plan) and DALI's eval graph, so both backends crop the same rectangle in eval. It is drawn once
per sample (a crop box and a flip, from the sample's seed) and then applied, so several image
fields of one sample (a low- and a high-resolution pair, an image and its mask) can take the same
draw at their own scale and filter: the place where joint geometry lands.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from fastpipe import _geometry as geometry
from fastpipe import _validate as check
from fastpipe._constants import (
    DEFAULT_CROP_PCT,
    DEFAULT_CUTOUT_SIZE,
    DEFAULT_HFLIP,
    DEFAULT_INTERPOLATION,
    DEFAULT_RATIO,
    DEFAULT_SCALE,
    DEFAULT_SIZE,
)
from fastpipe._geometry import eval_resize_to

__all__ = ["INTERPOLATIONS", "POLICIES", "Draw", "Policy", "Recipe"]

INTERPOLATIONS = ("bilinear", "bicubic")
# Each filter's number in the compiled resizes (fastpipe._resize, fastpipe.ops.resize_crops).
RESIZE_FILTERS = {name: number for number, name in enumerate(INTERPOLATIONS)}
# torchvision's reference-script names; timm's RandAugment strings ("rand-m9-mstd0.5") besides.
POLICIES = ("ra", "ta_wide", "augmix", "imagenet")
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.uint8)
# Bounds of the geometry settings, so that no crop or resize size computed from them overflows
# (fastpipe/csrc/jpeg/train_plan.h refuses the same ranges): an output side of at most a JPEG's
# largest, aspect ratios within 1000:1, and eval resizes of at most 100x the output.
MAX_SIDE = 65535
RATIO_RANGE = (1e-3, 1e3)
MIN_CROP_PCT = 0.01
_TIMM_SECTIONS = ("m", "n", "mstd", "mmax", "inc", "p")
_TIMM_ONLY = ("augmix", "original", "originalr", "v0", "v0r", "3a", "trivialaugment")


def _accepted_policies() -> str:
    return (f"{', '.join(repr(p) for p in POLICIES)}, or timm's RandAugment string "
            f"'rand-<sections>' with sections m<int> n<int> mstd<float> mmax<int> inc<0|1> "
            f"p<float> (e.g. 'rand-m9-mstd0.5-inc1')")


@dataclass(frozen=True)
class Policy:
    """An ``auto_augment`` name, parsed once: what the policy is, whatever runs it.

    ``kind`` is one of torchvision's reference-script names (``"ra"``: RandAugment with 2 ops at
    magnitude 9 of 31 bins; ``"ta_wide"``: TrivialAugmentWide; ``"augmix"``: AugMix;
    ``"imagenet"``: AutoAugment's ImageNet policy) or ``"timm_rand"``, timm's RandAugment
    (``rand-m9-n2-mstd0.5-mmax10-inc1-p0.5``) with timm's defaults for absent sections: magnitude
    10 on timm's 0-10 scale, 2 ops, no magnitude noise, the original (partly decreasing) op
    ranges, each op applied with probability 0.5.
    """

    name: str
    kind: str
    magnitude: float = 10.0
    num_ops: int = 2
    magnitude_std: float = 0.0
    magnitude_max: int | None = None
    increasing: bool = False
    prob: float = 0.5

    @classmethod
    def parse(cls, name: Any) -> Policy | None:
        """``None`` for ``None``; a ValueError naming what is accepted for any other name."""
        if name is None:
            return None
        if not isinstance(name, str):
            raise TypeError(f"auto_augment must be a policy name (str) or None, got "
                            f"{type(name).__name__}; accepted: {_accepted_policies()}")
        if name in POLICIES:
            return cls(name, name)
        base = name.split("-")[0]
        if base == "rand":
            return cls._parse_timm(name)
        if base in _TIMM_ONLY:
            raise ValueError(
                f"auto_augment={name!r}: timm's {base!r} policies are not implemented (they are "
                "PIL-based in timm); for AutoAugment's ImageNet policy use 'imagenet'. "
                f"Accepted: {_accepted_policies()}"
            )
        raise ValueError(f"unknown auto_augment policy {name!r}; accepted: {_accepted_policies()}")

    @classmethod
    def _parse_timm(cls, name: str) -> Policy:
        values: dict[str, Any] = {}
        for section in name.split("-")[1:]:
            match = re.fullmatch(r"([a-z]+)(\d.*)", section)
            key = match.group(1) if match else section
            if match is None or key not in _TIMM_SECTIONS:
                raise ValueError(
                    f"auto_augment={name!r}: section {section!r} is not supported (timm's "
                    f"transform sets 't...' included); accepted: {_accepted_policies()}"
                )
            try:
                number = float(match.group(2))
            except ValueError:
                raise ValueError(
                    f"auto_augment={name!r}: section {section!r} has no valid number") from None
            if key in ("m", "n", "mmax", "inc") and number != int(number):
                raise ValueError(f"auto_augment={name!r}: section {section!r} takes an int")
            if key == "m":
                values["magnitude"] = number
            elif key == "n":
                values["num_ops"] = int(number)
            elif key == "mstd":
                # timm: a magnitude noise above 100 means a uniform draw in [0, magnitude].
                values["magnitude_std"] = math.inf if number > 100 else number
            elif key == "mmax":
                values["magnitude_max"] = int(number)
            elif key == "inc":
                values["increasing"] = bool(int(number))
            else:
                values["prob"] = number
        return cls(name, "timm_rand", **values)


class Draw(NamedTuple):
    """One sample's geometry, drawn by :meth:`Recipe.draw` from the image's size: the crop
    ``box`` in full-size pixels, the size the whole image is resized to first (eval; None in
    train, where the box is resized to the output size) and the horizontal ``flip``."""

    box: geometry.Box
    resize: tuple[int, int] | None
    flip: bool


@dataclass(frozen=True)
class Recipe:
    """What happens to an image, from its file to the batch the training step receives.

    Building one checks every value (ValueError or TypeError naming the setting and the fix) and
    normalizes the spellings: ``size`` becomes ``(height, width)``; ``interpolation`` a name
    (torchvision's ``InterpolationMode`` is taken); ``auto_augment`` stays the name given, its
    parsed form is :attr:`policy`; ``color_jitter`` becomes ``(brightness, contrast, saturation,
    hue)`` or None.

    Geometry. ``train=True``: a crop drawn like torchvision's ``RandomResizedCrop(size, scale,
    ratio)``, flipped horizontally with probability ``hflip``. ``train=False``: for a square
    ``size``, the shorter side resized to ``size / crop_pct`` (256 for 224) and the centre crop
    of ``size``; for ``(height, width)``, each side resized to ``side / crop_pct`` and the centre
    crop (timm's ``crop_mode="squash"``). Both backends crop the same rectangle in eval.

    Augmentation (train only): ``auto_augment`` (``"ra"``, ``"ta_wide"``, ``"augmix"``,
    ``"imagenet"``, or timm's ``"rand-m9-mstd0.5-inc1"`` style), ``color_jitter`` and cutout
    (``cutout_holes`` square holes of ``cutout_size`` pixels).

    The batch: ``mean``/``std`` per channel in the 0-1 scale (None for both: floats in 0-1),
    ``dtype`` (``torch.float32``, ``float16``, ``bfloat16``, or ``torch.uint8`` for raw pixels
    without mean/std), ``channels_last`` strides.

    Which backend honours what is :meth:`check`'s table; datasets apply the per-sample part and
    leave the batch part to the loader that collates their samples.
    """

    train: bool = True
    size: int | tuple[int, int] = DEFAULT_SIZE
    scale: tuple[float, float] = DEFAULT_SCALE
    ratio: tuple[float, float] = DEFAULT_RATIO
    hflip: float = DEFAULT_HFLIP
    crop_pct: float = DEFAULT_CROP_PCT
    interpolation: str = DEFAULT_INTERPOLATION
    auto_augment: str | None = None
    color_jitter: float | tuple[float, ...] | None = None
    cutout_holes: int = 0
    cutout_size: int = DEFAULT_CUTOUT_SIZE
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    dtype: torch.dtype = torch.float32
    channels_last: bool = False
    policy: Policy | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.train, bool):
            raise check.ArgumentTypeError(f"train must be True or False, got {self.train!r}")
        self._set("size", check.size_pair("size", self.size))
        if max(self.size) > MAX_SIDE:
            raise ValueError(f"size sides must be at most {MAX_SIDE} pixels (a JPEG's largest), "
                             f"got {self.size}")
        self._set("scale", check.pair("scale", self.scale))
        if self.scale[1] > 1:
            raise ValueError(f"scale is a fraction of the image area, at most 1; got {self.scale}")
        self._set("ratio", check.pair("ratio", self.ratio))
        if not (RATIO_RANGE[0] <= self.ratio[0] and self.ratio[1] <= RATIO_RANGE[1]):
            raise ValueError(f"ratio (width:height) must lie in [{RATIO_RANGE[0]}, "
                             f"{RATIO_RANGE[1]}]; got {self.ratio}")
        self._set("hflip", check.probability("hflip", self.hflip))
        crop_pct = check.probability("crop_pct", self.crop_pct)
        if crop_pct < MIN_CROP_PCT:
            raise ValueError(f"crop_pct must be in [{MIN_CROP_PCT}, 1] (0.875 crops 224 from 256), "
                             f"got {crop_pct}")
        self._set("crop_pct", crop_pct)
        self._set("interpolation", _interpolation(self.interpolation))
        self._set("policy", Policy.parse(self.auto_augment))
        self._set("color_jitter", _color_jitter(self.color_jitter))
        self._set("cutout_holes", check.non_negative_int("cutout_holes", self.cutout_holes))
        self._set("cutout_size", check.positive_int("cutout_size", self.cutout_size))
        if not self.train:
            augments = (("auto_augment", self.auto_augment, None),
                        ("color_jitter", self.color_jitter, None),
                        ("cutout_holes", self.cutout_holes, 0))
            for name, value, unset in augments:
                if value != unset:
                    raise ValueError(
                        f"{name}={value!r} with train=False: augmentation is for training; pass "
                        f"{name}={unset!r} for evaluation (or train=True)"
                    )
        self._check_batch()

    def _check_batch(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be torch.float32, torch.float16, torch.bfloat16 or "
                             f"torch.uint8, got {self.dtype!r}")
        if (self.mean is None) != (self.std is None):
            raise ValueError("pass both mean and std to normalize, or neither (floats in 0-1)")
        if self.mean is not None:
            if self.dtype == torch.uint8:
                raise ValueError(
                    "dtype=torch.uint8 gives raw 0-255 pixels, which mean/std would turn into "
                    "floats: pass mean=None, std=None, or a float dtype (and normalize on the "
                    "device with fastpipe.ops.normalize or DataPrefetcher(mean=, std=))"
                )
            mean, std = _floats("mean", self.mean), _floats("std", self.std)
            if len(mean) != 3 or len(std) != 3:
                raise ValueError(
                    f"mean and std need 3 values each (RGB, 0-1 scale), got {mean}, {std}")
            if not all(math.isfinite(v) for v in mean + std) or min(std) <= 0:
                raise ValueError(f"mean must be finite and std positive, got {mean}, {std}")
            self._set("mean", mean)
            self._set("std", std)
        if not isinstance(self.channels_last, bool):
            raise check.ArgumentTypeError(
                f"channels_last must be True or False, got {self.channels_last!r}")

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    # ------------------------------------------------------------------------- derived values

    @property
    def square(self) -> bool:
        """Whether the output is square (eval then keeps the aspect ratio: shorter-side resize)."""
        return self.size[0] == self.size[1]

    @property
    def resize_to(self) -> int | tuple[int, int]:
        """Eval: what the image is resized to before the centre crop, as torchvision's ``Resize``
        argument (an int: the shorter side; a pair: each side)."""
        return eval_resize_to(self.size, self.crop_pct)

    def draw(self, height: int, width: int, uniforms: Sequence[float] | None = None) -> Draw:
        """The geometry of one ``height x width`` image: train, a crop drawn like torchvision's
        ``RandomResizedCrop`` and a flip, from ``uniforms`` (the
        :data:`~fastpipe._geometry.UNIFORMS_PER_CROP` numbers in [0, 1) of
        ``fastpipe._geometry.draw_uniforms``, from the sample's generator); eval, the resize and
        the centre crop (nothing drawn: ``uniforms`` unused). A pure function of its arguments,
        the one draw of every path: the CPU decoder crops this box, and the GPU decode receives
        it with the sample's bytes."""
        if self.train:
            if uniforms is None or len(uniforms) < geometry.UNIFORMS_PER_CROP:
                raise ValueError(f"Recipe.draw in train mode needs the "
                                 f"{geometry.UNIFORMS_PER_CROP} uniforms of "
                                 "fastpipe._geometry.draw_uniforms(generator)")
            box = geometry.random_resized_crop_box(height, width, list(uniforms), self.scale,
                                                   self.ratio)
            return Draw(box, None, uniforms[geometry.FLIP_UNIFORM] < self.hflip)
        resize = geometry.eval_resize(height, width, self.resize_to)
        return Draw(geometry.centre_box(resize[0], resize[1], self.size), resize, False)

    def replace(self, **changes: Any) -> Recipe:
        """This recipe with ``changes``, checked again."""
        return dataclasses.replace(self, **changes)

    def per_sample(self) -> Recipe:
        """The part a dataset applies to each sample: this recipe with the batch settings at
        raw uint8 pixels (``mean``/``std`` None, ``channels_last`` off)."""
        return self.replace(mean=None, std=None, dtype=torch.uint8, channels_last=False)

    # --------------------------------------------------------------------------- the backends

    def check(self, backend: str) -> None:
        """Raises ValueError naming the first setting ``backend`` cannot honour, and the fix.

        ``"cpu"``: fastpipe's CPU path (ImageDecoder, the datasets, and DataPrefetcher for the
        batch part) runs everything but ``color_jitter`` and cutout, which DALI pipelines run.
        ``"gpu"``: the CPU path's datasets with ``decode="gpu"`` (DataPrefetcher decodes on the
        GPU) run its geometry and batch part, not ``auto_augment``, which needs the decoded
        pixels in the dataset.
        ``"dali"``: DALI runs everything but AugMix, timm's RandAugment options it has no
        counterpart for (magnitude noise ``mstd``, ``mmax``, a per-op probability below 1),
        and ``bfloat16`` output.
        """
        problem = _refusal(self, backend)
        if problem is not None:
            raise ValueError(problem)

    @classmethod
    def resolve(cls, recipe: Recipe | None, owner: Callable[..., Any], where: str,
                **keywords: Any) -> Recipe:
        """``recipe``, or the recipe ``keywords`` spell (the image keywords of ``owner``, whose
        signature gives their defaults). A keyword away from its default next to a ``recipe``
        that says otherwise is refused: one of the two would be silently dropped."""
        if recipe is None:
            return cls(**keywords)
        if not isinstance(recipe, Recipe):
            raise TypeError(f"{where}: recipe must be a fastpipe.Recipe or None, got "
                            f"{type(recipe).__name__}")
        defaults = inspect.signature(owner).parameters
        for name, value in keywords.items():
            default = defaults[name].default
            if not _same(value, default) and recipe.replace(**{name: value}) != recipe:
                raise ValueError(
                    f"{where}: got recipe= and {name}={value!r}; pass the image settings either "
                    f"as a Recipe or as keywords, not both (recipe.replace({name}=...) changes "
                    "one setting of a recipe)"
                )
        return recipe


def _same(value: Any, default: Any) -> bool:
    try:
        return bool(value == default)
    except Exception:  # noqa: BLE001 - a value that cannot be compared is not the default
        return False


def _floats(name: str, value: Any) -> tuple[float, ...]:
    """Per-channel numbers as floats: a sequence or a tensor of real numbers (no bools)."""
    if isinstance(value, torch.Tensor):
        value = value.flatten().tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or any(
            isinstance(v, bool) or not isinstance(v, (int, float)) for v in value):
        raise check.ArgumentTypeError(
            f"{name} must be a sequence of 3 numbers (RGB, 0-1 scale), got {value!r}")
    return tuple(float(v) for v in value)


def _interpolation(value: Any) -> str:
    """``"bilinear"`` or ``"bicubic"`` from a string or a torchvision ``InterpolationMode``."""
    name = getattr(value, "value", value)
    if isinstance(name, str) and name.lower() in INTERPOLATIONS:
        return name.lower()
    raise ValueError(
        f"interpolation must be one of {', '.join(repr(n) for n in INTERPOLATIONS)} (or "
        f"torchvision's InterpolationMode.BILINEAR / BICUBIC), got {value!r}"
    )


def _color_jitter(value: Any) -> tuple[float, float, float, float] | None:
    """torchvision ColorJitter's strengths as (brightness, contrast, saturation, hue), or None
    when there is none."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise check.ArgumentTypeError(f"color_jitter must be a strength or a tuple, got {value}")
    if isinstance(value, (int, float)):
        values = [float(value)] * 3
    else:
        values = [float(v) for v in value]
    if len(values) == 3:
        values.append(0.0)
    if len(values) != 4 or min(values) < 0 or values[3] > 0.5 or not all(
            math.isfinite(v) for v in values):
        raise ValueError(
            "color_jitter must be a strength, or (brightness, contrast, saturation[, hue]) with "
            f"values >= 0 and hue <= 0.5, like torchvision's ColorJitter; got {value!r}"
        )
    return tuple(values) if any(values) else None  # type: ignore[return-value]


_CPU_PATH = ("the fast CPU path (backend='cpu', fastpipe.data's datasets)")


def _refusal(recipe: Recipe, backend: str) -> str | None:
    """Why ``backend`` cannot run ``recipe``, with the fix; None when it can."""
    check.choice("backend", backend, ("cpu", "gpu", "dali"))
    if backend == "gpu" and recipe.policy is not None:
        return (f"auto_augment={recipe.auto_augment!r} runs on decoded pixels in the dataset, "
                "and decode='gpu' decodes in DataPrefetcher: pass decode='cpu' to augment on "
                "the CPU path, or run augmentation on the device (a batch_transform)")
    if backend in ("cpu", "gpu"):
        if recipe.color_jitter is not None:
            return (f"color_jitter={recipe.color_jitter!r} runs in DALI pipelines only; on "
                    f"{_CPU_PATH} pass transform=torchvision.transforms.v2.ColorJitter(...) to "
                    "the dataset, or use backend='dali'")
        if recipe.cutout_holes:
            return (f"cutout_holes={recipe.cutout_holes} runs in DALI pipelines only; on "
                    f"{_CPU_PATH} cut out on the device: fastpipe.ops.cutout or "
                    "fastpipe.ops.RandomErasing on the batch (e.g. in DataPrefetcher's "
                    "batch_transform), or use backend='dali'")
        return None
    if recipe.dtype == torch.bfloat16:
        return ("backend='dali' cannot output torch.bfloat16: DALI writes float32, float16 or "
                "uint8. Pass dtype=torch.float16 (or float32) and convert on the device, or use "
                "the fast CPU path (backend='cpu')")
    policy = recipe.policy
    if policy is None:
        return None
    name = repr(policy.name)
    if policy.kind == "augmix":
        return (f"auto_augment={name}: AugMix is not in nvidia.dali.auto_aug; run it on "
                f"{_CPU_PATH}")
    if policy.kind != "timm_rand":
        return None
    if policy.magnitude != int(policy.magnitude) or not 0 <= policy.magnitude <= 10:
        return f"auto_augment={name}: on DALI m must be an int in 0-10 (timm's scale)"
    if policy.magnitude_std != 0:
        return (f"auto_augment={name}: DALI's RandAugment applies a fixed magnitude and has no "
                "per-operation magnitude noise (timm's mstd); drop 'mstd' (or write mstd0) to "
                f"run it in DALI, or use {_CPU_PATH}")
    if policy.magnitude_max is not None:
        return (f"auto_augment={name}: DALI's RandAugment takes m (0-10), n and inc of timm's "
                f"options, not 'mmax{policy.magnitude_max}'; drop it or use {_CPU_PATH}")
    if policy.prob != 1:
        return (f"auto_augment={name}: timm applies each chosen op with probability "
                f"{policy.prob:g} (p0.5 unless the string says otherwise), but DALI's RandAugment "
                "applies every chosen op: add '-p1' to the string to run the same policy on "
                f"both backends, or use {_CPU_PATH}")
    return None
