"""``fastpipe.ops.RandomErasing``: timm's RandomErasing class on fastpipe's erase kernel."""

from __future__ import annotations

import numbers

import torch

from fastpipe import _validate as check
from fastpipe.ops import _functional
from fastpipe.ops._params import CPU

_MODES = {"const": 0, "": 0, "rand": "rand", "pixel": "pixel"}
_STATE_VERSION = 1


class RandomErasing:
    """Random Erasing of a batch with timm's arguments, on fastpipe's kernels.

    The same semantics as timm 1.0's ``timm.data.RandomErasing`` (and the functional
    :func:`fastpipe.ops.random_erasing`, which this calls): each sample is erased with
    ``probability``, in ``count`` boxes (uniform in ``min_count..max_count``) of area
    ``uniform(min_area, max_area) * H * W / count`` and aspect ratio ``h / w`` log-uniform in
    ``(min_aspect, max_aspect)``, at a uniform position where it fits (ten attempts).

    Args:
        probability: probability that a sample is erased.
        min_area, max_area: erased fraction of the image area.
        min_aspect, max_aspect: aspect ratio ``h / w``; ``max_aspect`` defaults to
            ``1 / min_aspect``.
        mode: ``'const'`` (zeros: the mean colour after normalization), ``'rand'`` (one N(0, 1)
            colour per box and channel) or ``'pixel'`` (N(0, 1) noise per pixel); for uint8
            images the random values are uniform 0-255.
        min_count, max_count: boxes per erased sample; ``max_count`` defaults to ``min_count``.
        num_splits: with ``num_splits > 1`` the first ``N // num_splits`` samples (timm's clean
            split of AugMix training) are left alone.
        generator: a CPU ``torch.Generator`` for every draw; default: a new one seeded from
            torch's global generator when the eraser is built.
        inplace: erase the batch itself, as timm does (no autograd). Default: a new tensor.

    timm's ``device`` argument has no counterpart: values are made on the images' device.

    Call with ``(N, C, H, W)`` (or one ``(C, H, W)``) images, usually normalized floats, or with
    ``(images, targets)`` to use it as ``DataPrefetcher(batch_transform=...)``: the targets pass
    through.
    """

    def __init__(
        self,
        probability: float = 0.5,
        min_area: float = 0.02,
        max_area: float = 1 / 3,
        min_aspect: float = 0.3,
        max_aspect: float | None = None,
        mode: str = "const",
        min_count: int = 1,
        max_count: int | None = None,
        num_splits: int = 0,
        generator: torch.Generator | None = None,
        inplace: bool = False,
    ) -> None:
        op = "RandomErasing"
        if not isinstance(mode, str) or mode.lower() not in _MODES:
            raise ValueError(
                f"{op}: mode must be 'const', 'rand' or 'pixel' (timm's), got {mode!r}"
            )
        if not isinstance(min_aspect, numbers.Real) or not min_aspect > 0:
            raise ValueError(f"{op}: min_aspect must be a number > 0, got {min_aspect!r}")
        self.probability = probability
        self.min_area, self.max_area = min_area, max_area
        self.min_aspect = float(min_aspect)
        self.max_aspect = float(max_aspect or 1 / min_aspect)
        self.mode = mode.lower() or "const"
        self.min_count = min_count
        self.max_count = max_count or min_count
        self.num_splits = check.non_negative_int("num_splits", num_splits, where=op)
        _functional._check_generator(op, generator)
        if generator is None:
            seed = int(torch.randint(0, 2**62, (), device=CPU))
            generator = torch.Generator().manual_seed(seed)
        self.generator = generator
        self.inplace = bool(inplace)
        check.probability("probability", probability, where=op)
        if not all(isinstance(a, numbers.Real) for a in (min_area, max_area)) or not (
            0 <= min_area <= max_area <= 1
        ):
            raise ValueError(
                f"{op}: need 0 <= min_area <= max_area <= 1, got {min_area!r} and {max_area!r}"
            )
        # The other arguments are checked once, now, on a dummy batch (the draws are undone).
        state = self.generator.get_state()
        self.make_params(torch.zeros(1, 1, 1, 1, device=CPU))
        self.generator.set_state(state)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(probability={self.probability}, min_area={self.min_area}, "
            f"max_area={self.max_area}, min_aspect={self.min_aspect}, "
            f"max_aspect={self.max_aspect}, mode={self.mode!r}, min_count={self.min_count}, "
            f"max_count={self.max_count}, num_splits={self.num_splits})"
        )

    def make_params(self, images: torch.Tensor) -> dict[str, torch.Tensor | None]:
        """Draws the parameters for ``(N, C, H, W)`` images, on their device: ``boxes``
        ``(N, max_count, 4)`` int64 (top, left, bottom, right; empty when not erased), ``fill``
        (``(C,)``, or ``(N, max_count, C)`` for ``'rand'``) and ``seeds`` (``(N,)`` for
        ``'pixel'``, else None)."""
        boxes, fill, seeds = _functional.erasing_params(
            "RandomErasing",
            images,
            self.probability,
            (self.min_area, self.max_area),
            (self.min_aspect, self.max_aspect),
            _MODES[self.mode],
            self.min_count,
            self.max_count,
            self.generator,
        )
        if self.num_splits > 1:
            boxes[: images.shape[0] // self.num_splits] = 0  # the clean split stays as it is
        return {"boxes": boxes, "fill": fill, "seeds": seeds}

    def transform(self, images: torch.Tensor, params: dict[str, torch.Tensor | None]):
        """Erases ``images`` with ``params`` from :meth:`make_params`."""
        _functional.refuse_capture("RandomErasing", images)
        return _functional._apply(
            "RandomErasing",
            "erase",
            images,
            params["boxes"],
            params["fill"],
            params["seeds"],
            inplace=self.inplace,
        )

    def __call__(self, images: torch.Tensor, targets: torch.Tensor | None = None):
        single = isinstance(images, torch.Tensor) and images.dim() == 3
        batch = images.unsqueeze(0) if single else images
        out = self.transform(batch, self.make_params(batch))
        out = out.squeeze(0) if single else out
        return out if targets is None else (out, targets)

    def state_dict(self) -> dict[str, object]:
        """The generator state (see :class:`fastpipe.ops.Mixup`)."""
        return {
            "version": _STATE_VERSION,
            "fingerprint": repr(self),
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise ValueError(
                f"RandomErasing.load_state_dict: expected a state of version {_STATE_VERSION} "
                f"from RandomErasing.state_dict(), got {state!r:.200}"
            )
        if state.get("fingerprint") != repr(self):
            raise ValueError(
                "RandomErasing.load_state_dict: the state was saved by a differently configured "
                f"eraser ({state.get('fingerprint')}) and this one is {self!r}"
            )
        self.generator.set_state(state["generator"])
