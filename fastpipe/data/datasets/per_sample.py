"""``auto_augment`` on the CPU path: the recipe's policy run on uint8 tensors, and the
per-sample steps the datasets share.

Policies run on the uint8 ``(3, H, W)`` tensor after the fused decode/crop/resize/flip:
torchvision's reference-script names (``ra``, ``ta_wide``, ``augmix``, ``imagenet``) are
torchvision.transforms.v2's own modules; timm's ``rand-m9-mstd0.5-inc1`` strings are timm's
RandAugment policy (op set, magnitude scale, magnitude noise, per-op probability), implemented
here on torchvision.transforms.v2.functional's tensor ops. The names are parsed once, by
:class:`fastpipe.recipe.Policy`. All draw from torch's default generator, which the datasets
reseed per sample (fastpipe.data.sampling.seeds). torchvision is imported on first use.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fastpipe._compat import auto_augment_with_fast_ops
from fastpipe._constants import DEFAULT_INTERPOLATION
from fastpipe._seed import checked_seed, draw_seed
from fastpipe.recipe import Policy, Recipe

__all__ = ["PerSample", "TimmRandAugment", "auto_augment_transform", "check_transform"]


def auto_augment_transform(
    policy: Policy | str | None, interpolation: str = "bilinear"
) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The policy (a :class:`~fastpipe.recipe.Policy`, or a name to parse) as a callable on a
    uint8 ``(3, H, W)`` tensor, or None for None."""
    if not isinstance(policy, Policy):
        policy = Policy.parse(policy)
    if policy is None:
        return None
    mode = _torchvision_mode(interpolation)
    if policy.kind == "timm_rand":
        return TimmRandAugment.from_policy(policy, interpolation=mode)
    from torchvision.transforms import v2

    if policy.kind == "ra":
        return _fast_class('FastRandAugment')(interpolation=mode)
    if policy.kind == "ta_wide":
        return _fast_class('FastTrivialAugmentWide')(interpolation=mode)
    if policy.kind == "augmix":
        return _fast_class('FastAugMix')(interpolation=mode)
    return _fast_class('FastAutoAugment')(v2.AutoAugmentPolicy.IMAGENET, interpolation=mode)


def _sharpness(image: torch.Tensor, factor: float) -> torch.Tensor:
    """torchvision's ``adjust_sharpness`` on uint8, equal pixel for pixel and faster (timed in
    docs/cpu-path.md, "Augmentation"): its float32 3x3 convolution rounded equals the exact
    ``(8 neighbours + 5 * centre) / 13`` rounded (a multiple of 1/13 is never within float32
    error of a half), computed here from integer sums of shifted views; the blend is
    torchvision's own float32 arithmetic."""
    wide = image.to(torch.int16)
    sums = 5 * wide[..., 1:-1, 1:-1]
    for dy in (0, 1, 2):
        for dx in (0, 1, 2):
            if (dy, dx) != (1, 1):
                sums += wide[..., dy:dy + wide.shape[-2] - 2, dx:dx + wide.shape[-1] - 2]
    blurred = torch.floor(sums.to(torch.float32) / 13 + 0.5)
    output = image.to(torch.float32, copy=True)
    view = output[..., 1:-1, 1:-1]
    view.add_(blurred.sub_(view), alpha=(1.0 - factor))
    return output.clamp_(0, 255).to(torch.uint8)


def _solarize(image: torch.Tensor, threshold: float) -> torch.Tensor:
    """torchvision's ``solarize`` on uint8 (values >= threshold inverted) through a 256-entry
    table, equal pixel for pixel and several times faster than its ``torch.where``."""
    table = np.arange(256, dtype=np.uint8)
    # torch compares a uint8 tensor with a Python float in float32, the threshold rounded to it.
    start = max(0, math.ceil(float(np.float32(threshold))))
    table[start:] = 255 - table[start:]
    return torch.from_numpy(table[image.numpy()])


def _fast_apply(image: Any, transform_id: str, magnitude: float) -> torch.Tensor | None:
    """The op through :func:`_sharpness` / :func:`_solarize` where they apply, else None."""
    if type(image) is not torch.Tensor or image.dtype != torch.uint8 or image.ndim < 3:
        return None
    if transform_id == "Sharpness" and image.shape[-1] > 2 and image.shape[-2] > 2:
        return _sharpness(image, 1.0 + magnitude)
    if transform_id == "Solarize" and 255 * magnitude <= 255:
        return _solarize(image, 255 * magnitude)
    return None


_FAST_POLICIES = ("FastAugMix", "FastAutoAugment", "FastRandAugment", "FastTrivialAugmentWide")


def __getattr__(name: str) -> Any:
    """torchvision's v2 policies with faster uint8 Sharpness and Solarize (same draws, same
    pixels), made on first use so importing this module does not import torchvision; at module
    level so that datasets holding them pickle (spawned DataLoader workers)."""
    if name not in _FAST_POLICIES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from torchvision.transforms import v2

    for base in (v2.AugMix, v2.AutoAugment, v2.RandAugment, v2.TrivialAugmentWide):
        globals()["Fast" + base.__name__] = auto_augment_with_fast_ops(base, _fast_apply,
                                                                       __name__)
    return globals()[name]


def _fast_class(name: str) -> type:
    return globals().get(name) or __getattr__(name)


def _torchvision_mode(interpolation: str) -> Any:
    from torchvision.transforms import InterpolationMode

    return InterpolationMode(interpolation)


# timm's level scale and fill (its create_transform fills with the ImageNet mean in 0-255).
_LEVEL_DENOM = 10.0
_FILL = [124, 116, 104]
_RAND_TRANSFORMS = ("AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize",
                    "SolarizeAdd", "Color", "Contrast", "Brightness", "Sharpness", "ShearX",
                    "ShearY", "TranslateXRel", "TranslateYRel")
_INCREASING = {"Posterize": "PosterizeIncreasing", "Solarize": "SolarizeIncreasing",
               "Color": "ColorIncreasing", "Contrast": "ContrastIncreasing",
               "Brightness": "BrightnessIncreasing", "Sharpness": "SharpnessIncreasing"}


def _negated(value: float) -> float:
    """timm's ``_randomly_negate``."""
    return -value if float(torch.rand(())) > 0.5 else value


class TimmRandAugment:
    """timm's RandAugment (``timm.data.auto_augment.rand_augment_transform``) on uint8 tensors.

    Each image: ``num_layers`` ops chosen uniformly with replacement from timm's op set (the
    "increasing" set with ``inc1``); each applied with probability ``prob`` at magnitude
    ``magnitude`` (0-10 scale), perturbed by ``N(0, magnitude_std)`` (uniform in
    ``[0, magnitude]`` when ``magnitude_std`` is infinite), clipped to ``[0, magnitude_max]``;
    op arguments from the magnitude as in timm's ``LEVEL_TO_ARG``. The ops are
    torchvision.transforms.v2.functional's tensor ops, so pixels differ from timm's PIL ones by
    rounding (the policy and its randomness are timm's); geometric ops fill with timm's ImageNet
    mean and use the dataset's ``interpolation``.
    """

    def __init__(self, magnitude: float = 10.0, num_layers: int = 2, magnitude_std: float = 0.0,
                 magnitude_max: float | None = None, increasing: bool = False, prob: float = 0.5,
                 interpolation: Any = "bilinear") -> None:
        self.magnitude = float(magnitude)
        self.num_layers = int(num_layers)
        self.magnitude_std = float(magnitude_std)
        self.magnitude_max = magnitude_max
        self.increasing = bool(increasing)
        self.prob = float(prob)
        self.interpolation = interpolation
        names = _RAND_TRANSFORMS
        if self.increasing:
            names = tuple(_INCREASING.get(n, n) for n in names)
        self.ops = names

    @classmethod
    def from_policy(cls, policy: Policy, interpolation: Any = "bilinear") -> TimmRandAugment:
        """timm's RandAugment with the settings of a parsed ``"rand-..."`` policy."""
        return cls(magnitude=policy.magnitude, num_layers=policy.num_ops,
                   magnitude_std=policy.magnitude_std, magnitude_max=policy.magnitude_max,
                   increasing=policy.increasing, prob=policy.prob, interpolation=interpolation)

    @classmethod
    def from_string(cls, config: str, interpolation: Any = "bilinear") -> TimmRandAugment:
        """Parses timm's ``rand-m9-n2-mstd0.5-mmax10-inc1-p0.5`` (see
        :class:`fastpipe.recipe.Policy`); any other name raises ValueError."""
        policy = Policy.parse(config)
        if policy is None or policy.kind != "timm_rand":
            raise ValueError(f"{config!r} is not timm's RandAugment string ('rand-...')")
        return cls.from_policy(policy, interpolation)

    def __repr__(self) -> str:
        return (f"TimmRandAugment(m={self.magnitude}, n={self.num_layers}, "
                f"mstd={self.magnitude_std}, mmax={self.magnitude_max}, "
                f"inc={int(self.increasing)}, "
                f"p={self.prob})")

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        choices = torch.randint(len(self.ops), (self.num_layers,)).tolist()
        for choice in choices:
            if self.prob < 1.0 and float(torch.rand(())) > self.prob:
                continue
            magnitude = self.magnitude
            if self.magnitude_std == math.inf:
                magnitude = float(torch.rand(())) * magnitude
            elif self.magnitude_std > 0:
                magnitude = magnitude + self.magnitude_std * float(torch.randn(()))
            upper = self.magnitude_max or _LEVEL_DENOM
            magnitude = max(0.0, min(magnitude, upper))
            image = self._apply(self.ops[choice], image, magnitude)
        return image

    def _apply(self, name: str, image: torch.Tensor, magnitude: float) -> torch.Tensor:
        from torchvision.transforms.v2 import functional as F

        level = magnitude / _LEVEL_DENOM
        geometry = {"interpolation": self.interpolation, "fill": _FILL}
        if name == "AutoContrast":
            return F.autocontrast(image)
        if name == "Equalize":
            return F.equalize(image)
        if name == "Invert":
            return F.invert(image)
        if name == "Rotate":
            return F.rotate(image, _negated(level * 30.0), **geometry)
        if name.startswith("Posterize"):
            bits = int(level * 4)
            bits = 4 - bits if name == "PosterizeIncreasing" else bits
            return image if bits >= 8 else F.posterize(image, bits)
        if name.startswith("Solarize") and name != "SolarizeAdd":
            threshold = min(256, int(level * 256))
            threshold = 256 - threshold if name == "SolarizeIncreasing" else threshold
            return image if threshold > 255 else _solarize(image, threshold)
        if name == "SolarizeAdd":
            add = min(128, int(level * 110))
            added = (image.to(torch.int16) + add).clamp_(max=255).to(torch.uint8)
            return torch.where(image < 128, added, image)
        if name.startswith(("Color", "Contrast", "Brightness", "Sharpness")):
            if name.endswith("Increasing"):
                factor = 1.0 + _negated(level * 0.9)
            else:
                factor = level * 1.8 + 0.1
            fast = _fast_apply(image, "Sharpness", factor - 1.0) if "Sharp" in name else None
            if fast is not None:
                return fast
            adjust = {"Color": F.adjust_saturation, "Contrast": F.adjust_contrast,
                      "Brightness": F.adjust_brightness, "Sharpness": F.adjust_sharpness}
            return adjust[name.removesuffix("Increasing")](image, factor)
        if name in ("ShearX", "ShearY"):
            angle = math.degrees(math.atan(_negated(level * 0.3)))
            shear = [angle, 0.0] if name == "ShearX" else [0.0, angle]
            return F.affine(image, angle=0.0, translate=[0, 0], scale=1.0, shear=shear,
                            center=[0, 0], **geometry)
        # TranslateXRel / TranslateYRel: up to 45% of the side.
        side = image.shape[-1] if name == "TranslateXRel" else image.shape[-2]
        pixels = int(round(_negated(level * 0.45) * side))
        translate = [pixels, 0] if name == "TranslateXRel" else [0, pixels]
        return F.affine(image, angle=0.0, translate=translate, scale=1.0, shear=[0.0, 0.0],
                        **geometry)


# Classes whose presence marks a PIL pipeline (timm's create_transform, torchvision v1 input
# conversions): they cannot take the uint8 tensor the fused path hands over.
_PIL_ONLY = ("ToTensor", "PILToTensor", "ToPILImage", "ToNumpy", "MaybeToTensor",
             "MaybePILToTensor")


def _parts(transform: Any) -> list[Any]:
    """``transform`` and, recursively, what a Compose-like object holds in ``.transforms``."""
    found, stack = [], [transform]
    while stack:
        item = stack.pop()
        found.append(item)
        inner = getattr(item, "transforms", None)
        if isinstance(inner, (list, tuple)):
            stack.extend(inner)
    return found


def check_transform(transform: Any, owner: str) -> None:
    """Refuses what cannot run on a uint8 ``(3, H, W)`` tensor: not callable, or a PIL pipeline
    (e.g. what ``timm.data.create_loader`` assigns to ``dataset.transform``)."""
    if transform is None:
        return
    if not callable(transform):
        raise TypeError(f"{owner}: transform must be callable on a uint8 (3, H, W) tensor or None, "
                        f"got {type(transform).__name__}")
    for part in _parts(transform):
        kind = type(part)
        if kind.__module__.split(".")[0] == "timm" or kind.__name__ in _PIL_ONLY:
            raise TypeError(
                f"{owner} decodes, crops, resizes and flips in one step and hands its transform a "
                f"uint8 (3, H, W) tensor, but the transform given is a PIL pipeline (it holds "
                f"{kind.__module__}.{kind.__name__}; timm.data.create_loader and create_transform "
                "build such pipelines). Spell the recipe with fastpipe's arguments instead: "
                "size=, scale=, ratio=, hflip=, interpolation=, auto_augment= (e.g. "
                "'rand-m9-mstd0.5-inc1' or 'ra') and transform= (torchvision.transforms.v2 ops "
                "on uint8 tensors); normalize and erase on the device (DataPrefetcher(mean=, "
                "std=), fastpipe.ops). Set dataset.transform = None to clear it."
            )


class PerSample:
    """Per-sample steps after the decode, shared by ImageFolder and the pack datasets:
    ``auto_augment`` then ``transform``, with every draw a pure function of
    ``(seed, epoch, index)`` (fastpipe.data.sampling.seeds)."""

    seed: int
    epoch: int

    def _init_per_sample(self, transform: Any, recipe: Recipe | None, seed: int | None,
                         auto_augment: str | None = None,
                         interpolation: Any = DEFAULT_INTERPOLATION) -> None:
        """The recipe's per-sample part (refused here when the CPU path cannot run it), or,
        for a dataset that applies no recipe (a decoder of the user's, a full decode), only
        ``auto_augment``, whose geometric ops resize with ``interpolation``."""
        if recipe is not None:
            recipe.check("cpu")
            policy, interpolation = recipe.policy, recipe.interpolation
        else:
            policy = Policy.parse(auto_augment)
        seed = checked_seed(seed, where=type(self).__name__)
        self.seed = draw_seed() if seed is None else seed
        self._seed_drawn = seed is None  # a loader's saved state may give it back (resume)
        self.epoch = 0
        self.recipe = recipe
        self.auto_augment = None if policy is None else policy.name
        self._policy = auto_augment_transform(policy, interpolation)
        self.transform = transform

    @property
    def transform(self) -> Any:
        """Callable on the uint8 ``(3, H, W)`` tensor after the decode (and auto_augment), or None.
        Assigning it later takes effect; a PIL pipeline is refused with a TypeError."""
        return self._transform

    @transform.setter
    def transform(self, value: Any) -> None:
        check_transform(value, type(self).__name__)
        self._transform = value

    def set_epoch(self, epoch: int) -> None:
        """The epoch of the draws of indices that do not carry their own (a plain int rather than
        a :class:`~fastpipe.data.SampleIndex`). DataLoader workers hold a copy of the
        dataset: with ``persistent_workers=True`` they only see a new epoch through
        SampleIndex, which fastpipe's samplers yield."""
        self.epoch = int(epoch)

    def _epoch_of(self, index: Any) -> int:
        return getattr(index, "epoch", self.epoch)

    def _needs_fork(self) -> bool:
        return self._policy is not None or self._transform is not None

    def _augmented(self, image: torch.Tensor) -> torch.Tensor:
        """auto_augment then transform; the caller holds the per-sample generator fork."""
        if self._policy is not None:
            image = self._policy(image)
        if self._transform is not None:
            image = self._transform(image)
        return image
