"""``fastpipe.ops.Mixup``: timm's Mixup/CutMix batch mixer on fastpipe's kernels.

The random decisions are drawn first, on the CPU, from the mixer's own generator
(:meth:`Mixup.make_params`, as torchvision v2 transforms do); :meth:`Mixup.transform` then applies
them with the mixup and cutmix kernels, a deterministic function of the images and the parameters.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch

from fastpipe import _validate as check
from fastpipe.ops import _functional
from fastpipe.ops._params import CPU

_MODES = ("batch", "pair", "elem")
_STATE_VERSION = 1


def _beta(alpha: float, size: int, generator: torch.Generator) -> torch.Tensor:
    """``size`` draws of Beta(alpha, alpha) as float64, by the log-space method of
    ``_params.beta`` (never 0 / 0, for any alpha > 0)."""
    gammas = torch._standard_gamma(
        torch.full((2, size), alpha + 1.0, dtype=torch.float64, device=CPU), generator=generator
    )
    uniforms = 1.0 - torch.rand(2, size, dtype=torch.float64, device=CPU, generator=generator)
    log_draws = gammas.log() + uniforms.log() / alpha
    return torch.sigmoid(log_draws[0] - log_draws[1])


def _below(bounds: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One uniform integer in ``0..bound - 1`` per entry of the int64 ``bounds`` (all >= 1)."""
    u = torch.rand(bounds.shape, dtype=torch.float64, device=CPU, generator=generator)
    return torch.minimum((u * bounds).to(torch.int64), bounds - 1)


class Mixup:
    """Mixup and CutMix of a batch with its reverse, timm's ``Mixup`` with fastpipe's kernels.

    Called as ``images, targets = mixer(images, targets)``, the call signature of
    ``DataPrefetcher(batch_transform=...)``. Sample ``n`` is mixed with sample ``N - 1 - n``: with
    probability ``prob`` (per batch, per pair or per sample, by ``mode``) it is either blended,
    ``lam * x[n] + (1 - lam) * x[N - 1 - n]`` with ``lam ~ Beta(mixup_alpha, mixup_alpha)``, or
    gets a box of ``x[N - 1 - n]`` pasted in (CutMix, ``lam ~ Beta(cutmix_alpha, cutmix_alpha)``,
    box of timm's ``rand_bbox``, or ``rand_bbox_minmax`` with ``cutmix_minmax``), chosen with
    ``switch_prob`` when both alphas are > 0. Targets become label-smoothed one-hot vectors mixed
    with the same weights (``mixup_target``); a batch or sample left unmixed gets its smoothed
    one-hot target, as in timm.

    With the same ``lam``, box centres and choices, the images and targets equal timm 1.0's
    (tests/ops/test_mixup.py), except that ``lam`` is drawn from ``generator`` and not from NumPy,
    and that an odd batch is accepted (timm asserts): its middle sample is its own partner, mixed
    with itself (in ``'pair'`` mode it is left as it is).

    Args:
        mixup_alpha: Beta parameter of mixup; 0 turns mixup off.
        cutmix_alpha: Beta parameter of CutMix; 0 turns CutMix off.
        cutmix_minmax: ``(min, max)`` fractions of the image side: CutMix boxes with sides
            uniform in ``int(H * min)..int(H * max) - 1`` (and alike for the width) at a uniform
            position, as timm's; turns CutMix on (alpha 1.0) and always corrects ``lam``.
        prob: probability of mixing a batch (``'batch'``), a pair or a sample.
        switch_prob: probability of CutMix rather than mixup when both are on.
        mode: ``'batch'`` (one ``lam`` and box per batch), ``'pair'`` (per pair ``n``,
            ``N - 1 - n``) or ``'elem'`` (per sample).
        correct_lam: targets use ``1 - box area / (H * W)`` of the box clipped at the border.
        label_smoothing: ``s``: on-value ``1 - s + s / K``, off-value ``s / K``.
        num_classes: ``K``.
        generator: a CPU ``torch.Generator`` for every draw; default: a new one seeded from
            torch's global generator when the mixer is built (so ``torch.manual_seed`` before
            building reproduces it). Its state is :meth:`state_dict`'s.
        inplace: mix ``images`` itself, as timm does (no new batch; no autograd).

    Shapes: ``images`` ``(N, C, H, W)`` uint8, float32, float16 or bfloat16 on any device (uint8
    blends are rounded half to even, like timm's ``FastCollateMixup``); ``targets`` ``(N,)``
    class indices, or ``(N, K)`` float soft targets. Returns ``(N, C, H, W)`` like ``images`` and
    ``(N, K)`` float32 targets on the targets' device.

    Set ``mixup_enabled = False`` to stop mixing (timm's ``mixup_off_epoch``): the targets are
    then smoothed one-hot vectors and the images are returned as they are.
    """

    def __init__(
        self,
        mixup_alpha: float = 1.0,
        cutmix_alpha: float = 0.0,
        cutmix_minmax: Sequence[float] | None = None,
        prob: float = 1.0,
        switch_prob: float = 0.5,
        mode: str = "batch",
        correct_lam: bool = True,
        label_smoothing: float = 0.1,
        num_classes: int = 1000,
        generator: torch.Generator | None = None,
        inplace: bool = False,
    ) -> None:
        # An alpha of 0 turns that mix off.
        self.mixup_alpha = check.non_negative_float("mixup_alpha", mixup_alpha, where="Mixup")
        self.cutmix_alpha = check.non_negative_float("cutmix_alpha", cutmix_alpha, where="Mixup")
        if cutmix_minmax is not None:
            if (
                not isinstance(cutmix_minmax, Sequence)
                or len(cutmix_minmax) != 2
                or not all(isinstance(v, numbers.Real) for v in cutmix_minmax)
                or not 0 <= cutmix_minmax[0] < cutmix_minmax[1] <= 1
            ):
                raise ValueError(
                    "Mixup: cutmix_minmax must be None or a (min, max) pair of fractions with "
                    f"0 <= min < max <= 1, got {cutmix_minmax!r}"
                )
            cutmix_minmax = (float(cutmix_minmax[0]), float(cutmix_minmax[1]))
            self.cutmix_alpha = 1.0  # as timm: the box ignores lam, which only decides to mix
        self.cutmix_minmax = cutmix_minmax
        if self.mixup_alpha == 0 and self.cutmix_alpha == 0:
            raise ValueError(
                "Mixup: mixup_alpha and cutmix_alpha are both 0, so nothing would be mixed; set "
                "one of them > 0 (timm's defaults: mixup_alpha=0.8, cutmix_alpha=1.0)"
            )
        self.prob = check.probability("prob", prob, where="Mixup")
        self.switch_prob = check.probability("switch_prob", switch_prob, where="Mixup")
        if mode not in _MODES:
            raise ValueError(
                f"Mixup: mode must be one of {_MODES}, got {mode!r} (timm's 'half' mode belongs "
                "to its FastCollateMixup and has no equivalent here)"
            )
        self.mode = mode
        self.correct_lam = bool(correct_lam)
        if not isinstance(label_smoothing, numbers.Real) or not 0 <= label_smoothing < 1:
            raise ValueError(f"Mixup: label_smoothing must be in [0, 1), got {label_smoothing!r}")
        self.label_smoothing = float(label_smoothing)
        self.num_classes = check.positive_int("num_classes", num_classes, where="Mixup")
        _functional._check_generator("Mixup", generator)
        if generator is None:
            seed = int(torch.randint(0, 2**62, (), device=CPU))
            generator = torch.Generator().manual_seed(seed)
        self.generator = generator
        self.inplace = bool(inplace)
        self.mixup_enabled = True

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(mixup_alpha={self.mixup_alpha}, "
            f"cutmix_alpha={self.cutmix_alpha}, cutmix_minmax={self.cutmix_minmax}, "
            f"prob={self.prob}, switch_prob={self.switch_prob}, mode={self.mode!r}, "
            f"correct_lam={self.correct_lam}, label_smoothing={self.label_smoothing}, "
            f"num_classes={self.num_classes})"
        )

    # ---- random parameters ----

    def make_params(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """Draws the random parameters for a batch shaped like ``images``, on the CPU.

        Returns a dict of CPU tensors with one row per draw (1 in ``'batch'`` mode, ``N // 2`` in
        ``'pair'``, ``N`` in ``'elem'``): ``lam`` float64, the drawn weight (1.0 where not mixed;
        float32 values in ``'pair'``/``'elem'``, as timm); ``use_cutmix`` bool; ``centres``
        ``(M, 2)`` int64 ``(cy, cx)`` of the CutMix boxes (without ``cutmix_minmax``); ``boxes``
        ``(M, 4)`` int64 ``(top, left, bottom, right)``, empty where not CutMix; ``target_lam``
        float64, the weight of the targets (corrected by the box area with ``correct_lam`` or
        ``cutmix_minmax``).
        """
        _functional._check_images("Mixup", images, random_boxes=True)
        _functional.refuse_capture("Mixup", images)
        n, _, h, w = images.shape
        rows = {"batch": 1, "pair": n // 2, "elem": n}[self.mode]
        g = self.generator
        u = torch.rand(rows, 2, dtype=torch.float64, device=CPU, generator=g)
        applied = (u[:, 0] < self.prob) & self.mixup_enabled
        if self.mixup_alpha > 0 and self.cutmix_alpha > 0:
            use_cutmix = u[:, 1] < self.switch_prob
        else:
            use_cutmix = torch.full((rows,), self.cutmix_alpha > 0, device=CPU)
        lam = torch.ones(rows, dtype=torch.float64, device=CPU)
        if self.mixup_alpha > 0:
            lam = torch.where(use_cutmix, lam, _beta(self.mixup_alpha, rows, g))
        if self.cutmix_alpha > 0:
            lam = torch.where(use_cutmix, _beta(self.cutmix_alpha, rows, g), lam)
        if self.mode != "batch":
            lam = lam.to(torch.float32).to(torch.float64)  # timm keeps per-sample lam in float32
        lam = torch.where(applied, lam, torch.ones_like(lam))
        use_cutmix = use_cutmix & (lam != 1.0)
        centres, boxes = self._boxes(lam, h, w, g)
        boxes = boxes * use_cutmix.view(-1, 1)
        target_lam = lam
        if self.correct_lam or self.cutmix_minmax is not None:
            area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
            corrected = 1.0 - area.to(torch.float64) / float(h * w)
            target_lam = torch.where(use_cutmix, corrected, lam)
        if self.mode != "batch":
            target_lam = target_lam.to(torch.float32).to(torch.float64)
        return {
            "lam": lam,
            "use_cutmix": use_cutmix,
            "centres": centres,
            "boxes": boxes,
            "target_lam": target_lam,
        }

    def _boxes(
        self, lam: torch.Tensor, h: int, w: int, g: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = lam.shape[0]
        if self.cutmix_minmax is not None:
            # timm's rand_bbox_minmax: sides uniform in int(H * min)..int(H * max) - 1, the
            # top-left corner uniform where the box fits.
            lo, hi = self.cutmix_minmax
            low = torch.tensor([int(h * lo), int(w * lo)], device=CPU)
            high = torch.tensor([int(h * hi), int(w * hi)], device=CPU)
            if bool((high <= low).any()):
                raise ValueError(
                    f"Mixup: cutmix_minmax={self.cutmix_minmax} gives no box side for "
                    f"{h}x{w} images (int(side * min) must be < int(side * max)); widen it"
                )
            sides = low + _below((high - low).expand(rows, 2), g)
            corner = _below(torch.tensor([h, w], device=CPU) - sides + 1, g)
            centres = torch.zeros(rows, 2, dtype=torch.int64, device=CPU)
            return centres, torch.cat((corner, corner + sides), 1)
        # timm's rand_bbox: cut = int(side * sqrt(1 - lam)), from c - cut // 2 to
        # c + (cut + 1) // 2 around a centre uniform over the pixels, clipped. Per-sample lam
        # is float32 in timm, and so is that product.
        if self.mode == "batch":
            ratio = torch.sqrt(1.0 - lam)
            side = torch.tensor([h, w], dtype=torch.float64, device=CPU)
            cut = (side * ratio.view(-1, 1)).to(torch.int64)
        else:
            ratio = torch.sqrt(1.0 - lam.to(torch.float32))
            side = torch.tensor([h, w], dtype=torch.float32, device=CPU)
            cut = (side * ratio.view(-1, 1)).to(torch.int64)
        centres = torch.stack(
            (
                torch.randint(0, h, (rows,), device=CPU, generator=g),
                torch.randint(0, w, (rows,), device=CPU, generator=g),
            ),
            dim=1,
        )
        limit = torch.tensor([h, w], device=CPU)
        start = torch.clamp(centres - cut // 2, min=0)
        stop = torch.minimum(centres + (cut + 1) // 2, limit)
        return centres, torch.cat((start, stop), 1)

    # ---- applying them ----

    def transform(
        self, images: torch.Tensor, targets: torch.Tensor, params: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mixes ``images`` and ``targets`` with ``params`` from :meth:`make_params`."""
        _functional._check_mix_args(
            "Mixup", images, targets, 1.0, self.num_classes, self.label_smoothing, None
        )
        _functional.refuse_capture("Mixup", images)
        n = images.shape[0]
        lam, use_cutmix, boxes = params["lam"], params["use_cutmix"], params["boxes"]
        target_lam = params["target_lam"]
        if self.mode == "batch":
            if float(lam[0]) == 1.0:
                mixed = images
            elif bool(use_cutmix[0]):
                mixed = self._cutmix(images, boxes.expand(n, 4))
            else:
                mixed = self._mixup(images, lam.to(torch.float32).expand(n))
            soft = _functional._soft_targets(
                targets, self.num_classes, target_lam[0].to(torch.float32), self.label_smoothing
            )
            return mixed, soft
        if self.mode == "pair":
            # Pair (n, N - 1 - n) shares its draw; the middle sample of an odd batch is unmixed.
            middle = n - 2 * lam.shape[0]
            ones = torch.ones(middle, dtype=lam.dtype, device=CPU)
            lam = torch.cat((lam, ones, lam.flip(0)))
            target_lam = torch.cat((target_lam, ones, target_lam.flip(0)))
            use_cutmix = torch.cat(
                (use_cutmix, torch.zeros(middle, dtype=torch.bool, device=CPU), use_cutmix.flip(0))
            )
            unboxed = torch.zeros(middle, 4, dtype=boxes.dtype, device=CPU)
            boxes = torch.cat((boxes, unboxed, boxes.flip(0)))
        mixed = self._mix_per_sample(images, lam, use_cutmix, boxes)
        return mixed, self._per_sample_targets(targets, target_lam.to(torch.float32))

    def _mixup(self, images: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
        weights = _functional._to_device(lam.to(torch.float32).contiguous(), images.device)
        return _functional._apply("Mixup", "mixup", images, weights, inplace=self.inplace)

    def _cutmix(self, images: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        boxes = _functional._to_device(boxes.contiguous(), images.device)
        return _functional._apply("Mixup", "cutmix", images, boxes, inplace=self.inplace)

    def _mix_per_sample(
        self,
        images: torch.Tensor,
        lam: torch.Tensor,
        use_cutmix: torch.Tensor,
        boxes: torch.Tensor,
    ) -> torch.Tensor:
        blended = (lam != 1.0) & ~use_cutmix
        if not bool(use_cutmix.any()):
            return self._mixup(images, lam) if bool(blended.any()) else images
        if not bool(blended.any()):
            return self._cutmix(images, boxes)
        # Some samples blended, some with a box. The mixup kernel leaves a sample of weight 1 as
        # it is, and reads both samples of a pair before writing either; the boxes are then
        # pasted from the partners' pixels before mixing, copying only their area.
        n = images.shape[0]
        pastes = []
        for i, (top, left, bottom, right) in enumerate(boxes.tolist()):
            if bool(use_cutmix[i]) and bottom > top and right > left:
                rows, cols = slice(top, bottom), slice(left, right)
                source = images[n - 1 - i, :, rows, cols]
                pastes.append((i, rows, cols, source.clone() if self.inplace else source))
        mixed = self._mixup(images, torch.where(use_cutmix, torch.ones_like(lam), lam))
        for i, rows, cols, source in pastes:
            mixed[i, :, rows, cols] = source
        return mixed

    def _per_sample_targets(self, targets: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
        """timm's mixup_target with per-sample float32 weights ``lam`` (``(N,)``):
        ``y * lam + y.flip(0) * (1 - lam)``."""
        off = self.label_smoothing / self.num_classes
        if targets.dtype.is_floating_point:
            y = targets.to(torch.float32) * (1.0 - self.label_smoothing) + off
        else:
            y = torch.full(
                (targets.shape[0], self.num_classes), off, dtype=torch.float32,
                device=targets.device,
            )
            y = y.scatter_(1, targets.long().view(-1, 1), 1.0 - self.label_smoothing + off)
        weight = _functional._to_device(lam.view(-1, 1), targets.device)
        return y * weight + y.flip(0) * (1.0 - weight)

    def __call__(
        self, images: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mixes a batch: ``(N, C, H, W)`` images and ``(N,)`` or ``(N, K)`` targets ->
        ``(images, (N, K) float32 targets)``."""
        return self.transform(images, targets, self.make_params(images))

    # ---- resume ----

    def _fingerprint(self) -> str:
        return repr(self)

    def state_dict(self) -> dict[str, object]:
        """The generator state and ``mixup_enabled`` (plain Python values and a tensor)."""
        return {
            "version": _STATE_VERSION,
            "fingerprint": self._fingerprint(),
            "generator": self.generator.get_state(),
            "mixup_enabled": self.mixup_enabled,
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restores :meth:`state_dict`: the next batch is mixed as it would have been."""
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise ValueError(
                f"Mixup.load_state_dict: expected a state of version {_STATE_VERSION} from "
                f"Mixup.state_dict(), got {state!r:.200}"
            )
        if state.get("fingerprint") != self._fingerprint():
            raise ValueError(
                "Mixup.load_state_dict: the state was saved by a differently configured mixer "
                f"({state.get('fingerprint')}) and this one is {self._fingerprint()}; build the "
                "mixer with the same arguments"
            )
        self.generator.set_state(state["generator"])
        self.mixup_enabled = bool(state["mixup_enabled"])
