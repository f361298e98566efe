"""``image_loader``'s CPU batches: byte for byte what they were, on any x86-64 CPU.

Two kinds of guarantee, checked separately because only one of them holds across CPU types:

* **Pixels made with integer arithmetic** (decode, crop, resize, flip: fastpipe's own code) are
  the same on every CPU, so their batch checksums are stored
  (``tests/stored/image_loader_checksums.json``) and compared on whatever machine runs the test.
* **auto_augment** runs torchvision's v2 policies (with fastpipe's faster uint8 Sharpness and
  Solarize), in float32 through torch, whose results depend on the CPU:

  - the geometric ops (Rotate, ShearX/Y, TranslateX/Y) build their sampling grid in
    ``torchvision.transforms.v2.functional._geometry._affine_grid`` with a ``bmm`` that torch
    hands to MKL's ``cblas_sgemm`` (``SGEMM(T,N,2,H*W,3)``). MKL picks its kernels at run time:
    AVX-512 ones on an Intel CPU with AVX-512, AVX2 ones elsewhere (AMD EPYC, even with
    AVX-512), and they round the 3-term dot product differently in the last bit. A sampling
    coordinate that sits on a nearest-neighbour boundary (an integer shear or translation puts
    many there) then takes the neighbouring pixel. ``MKL_CBWR=COMPATIBLE`` (or
    ``MKL_ENABLE_INSTRUCTIONS=AVX2``) on the Intel machine gives the AMD machine's pixels.
  - Color (``adjust_saturation``) and torchvision's Sharpness blend in ATen's vectorized
    kernels, which round differently under ``ATEN_CPU_CAPABILITY=default`` than under
    ``avx2``/``avx512``.

  So for the policies the test checks what a user relies on, on the machine that runs it: the
  batch before the policy against the stored checksums (machine-independent), the fast policy
  against torchvision's own policy class run on the same pixels with the same per-sample draws,
  and the same batches whatever the workers. docs/resume.md says what this means across machines.

Regenerate the checksums (only for an intended change of the pixels, saying why in the
commit)::

    python tests/test_factory_checksums.py --write
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TypeAlias

import pytest
import torch

STORED = Path(__file__).parent / "stored" / "image_loader_checksums.json"
ROOT = Path(__file__).resolve().parents[1]

# name -> image_loader keyword arguments without auto_augment: decode and resize in integer
# arithmetic, the same on every CPU (the float outputs are checked against normalizing these below).
CONFIGS: dict[str, dict] = {
    "train-224": dict(train=True, size=224, seed=0),
    "eval-224": dict(train=False, size=224, seed=0),
    "train-160x224": dict(train=True, size=(160, 224), seed=1),
    "eval-160x224": dict(train=False, size=(160, 224), seed=1),
    "eval-224x160-bicubic": dict(train=False, size=(224, 160), interpolation="bicubic",
                                 crop_pct=0.95, seed=2),
    "train-options": dict(train=True, size=96, scale=(0.25, 1.0), ratio=(0.5, 2.0), hflip=1.0,
                          interpolation="bicubic", seed=3),
    "train-processes-64": dict(train=True, size=64, seed=4, worker_method="process"),
    "train-rank1-of-2": dict(train=True, size=64, seed=5, rank=1, world_size=2, drop_last=True),
    "pack-train-64": dict(train=True, size=64, seed=6, pack=True),
    "pack-eval-112x80": dict(train=False, size=(112, 80), seed=7, pack=True),
}
# name -> (the config whose pixels the policy starts from, auto_augment, torchvision's class)
POLICIES: dict[str, tuple[str, str, str]] = {
    "train-ra-processes": ("train-processes-64", "ra", "RandAugment"),
    "train-augmix-processes": ("train-processes-64", "augmix", "AugMix"),
    "pack-train-ta_wide": ("pack-train-64", "ta_wide", "TrivialAugmentWide"),
    "pack-train-imagenet": ("pack-train-64", "imagenet", "AutoAugment"),
}
EPOCHS = 2
BATCH_SIZE = 16
Epochs: TypeAlias = list[list[tuple[torch.Tensor, torch.Tensor]]]


def _sample_root(base: Path) -> Path:
    from fastpipe.data import sample_images

    return sample_images(base / "images", num_images=48, num_classes=4)


def _file_checksums(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()[:16]
            for p in sorted(root.rglob("*.jpg"))}


def _loader(root: Path, options: dict, **extra):
    from fastpipe import image_loader

    options = dict(options)
    if options.pop("pack", False):
        root = _packed(root)
    kwargs = dict(backend="cpu", device="cpu", num_workers=2, dtype=torch.uint8, mean=None,
                  std=None)
    kwargs.update(options)
    kwargs.update(extra)
    return image_loader(root, BATCH_SIZE, **kwargs)


def _packed(root: Path) -> Path:
    """The sample set as an HDF5 bytes pack beside it (made once)."""
    from fastpipe.pack import pack

    output = root.parent / "images.h5"
    if not output.exists():
        pack(root, output, progress=False)
    return output


def _batch_checksum(images: torch.Tensor, labels: torch.Tensor) -> str:
    digest = hashlib.sha256()
    digest.update(str((tuple(images.shape), str(images.dtype))).encode())
    digest.update(images.contiguous().numpy().tobytes())
    digest.update(labels.numpy().tobytes())
    return digest.hexdigest()[:16]


def _epochs(loader) -> Epochs:
    try:
        return [[(images.clone(), labels.clone()) for images, labels in loader]
                for _ in range(EPOCHS)]
    finally:
        loader.close()


def _checksums(root: Path, options: dict) -> list[list[str]]:
    epochs = _epochs(_loader(root, options))
    return [[_batch_checksum(*batch) for batch in epoch] for epoch in epochs]


def _policy_batches(root: Path, name: str, **extra) -> Epochs:
    """The batches of policy ``name`` through fastpipe's ``auto_augment``."""
    base, policy, _ = POLICIES[name]
    return _epochs(_loader(root, CONFIGS[base], auto_augment=policy, **extra))


def _torchvision_batches(root: Path, name: str) -> Epochs:
    """The same loader without ``auto_augment``, running torchvision's own policy class as its
    ``transform``: the dataset calls it on the same pixels under the same per-sample generator
    (seed, epoch, index) it gives the policy, so its draws are the policy's draws."""
    from torchvision.transforms import InterpolationMode, v2

    base, _, class_name = POLICIES[name]
    options = CONFIGS[base]
    mode = InterpolationMode(options.get("interpolation", "bilinear"))
    args = (v2.AutoAugmentPolicy.IMAGENET,) if class_name == "AutoAugment" else ()
    loader = _loader(root, options)
    loader.dataset.transform = getattr(v2, class_name)(*args, interpolation=mode)
    return _epochs(loader)


def _differences(got, expected) -> list[str]:
    """Where two runs' batches differ, one line per differing batch (empty: identical)."""
    lines = []
    for epoch, (ours, theirs) in enumerate(zip(got, expected, strict=True)):
        for index, ((images, labels), (ref_images, ref_labels)) in enumerate(
                zip(ours, theirs, strict=True)):
            if torch.equal(images, ref_images) and torch.equal(labels, ref_labels):
                continue
            if images.shape != ref_images.shape or not torch.equal(labels, ref_labels):
                lines.append(f"epoch {epoch} batch {index}: shapes {tuple(images.shape)} / "
                             f"{tuple(ref_images.shape)} or labels differ")
                continue
            delta = (images.int() - ref_images.int()).abs()
            lines.append(f"epoch {epoch} batch {index}: {int((delta > 0).sum())} values differ, "
                         f"up to {int(delta.max())}")
    return lines


@pytest.fixture(scope="module")
def stored() -> dict:
    return json.loads(STORED.read_text())


@pytest.fixture(scope="module")
def checksum_root(tmp_path_factory, stored) -> Path:
    root = _sample_root(tmp_path_factory.mktemp("checksums"))
    files = _file_checksums(root)
    if files != stored["files"]:
        changed = sorted(k for k in files if files[k] != stored["files"].get(k))
        pytest.fail(
            f"the sample set's JPEG bytes differ from those the checksums were made from "
            f"({len(changed)} files, e.g. {changed[:3]}): this PIL encodes differently. The "
            "pixel checksums below cannot be compared; regenerate them at a commit known to be "
            "right (python tests/test_factory_checksums.py --write)", pytrace=False)
    return root


def test_stored_configs_are_those_tested(stored):
    assert sorted(stored["batches"]) == sorted(CONFIGS)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.slow
def test_cpu_batches_are_those_stored(checksum_root, stored, name, no_thread_leak):
    assert _checksums(checksum_root, CONFIGS[name]) == stored["batches"][name]


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.slow
def test_fast_policies_give_torchvisions_pixels(checksum_root, name, no_thread_leak):
    """The policy's input is the stored config's (checked above); its output, on this machine,
    is torchvision's own policy's for the same draws."""
    differences = _differences(_policy_batches(checksum_root, name),
                               _torchvision_batches(checksum_root, name))
    assert not differences, differences


@pytest.mark.parametrize("name", ["train-ra-processes", "pack-train-ta_wide"])
@pytest.mark.slow
def test_policy_batches_do_not_depend_on_the_workers(checksum_root, name, no_thread_leak):
    processes = _policy_batches(checksum_root, name, num_workers=2, worker_method="process")
    for workers in (dict(num_workers=0), dict(num_workers=2, worker_method="thread"),
                    dict(num_workers=1, worker_method="process")):
        differences = _differences(_policy_batches(checksum_root, name, **workers), processes)
        assert not differences, (workers, differences)


def _off_by_one_solarize(image: torch.Tensor, threshold: float) -> torch.Tensor:
    from torchvision.transforms.v2 import functional as F

    return F.solarize(image, threshold + 1)


def _rounded_down_sharpness(image: torch.Tensor, factor: float) -> torch.Tensor:
    from torchvision.transforms.v2 import functional as F

    out = F.adjust_sharpness(image, factor)
    return torch.where(out > 0, out - 1, out)


@pytest.mark.parametrize("fast_op", [("_solarize", _off_by_one_solarize),
                                     ("_sharpness", _rounded_down_sharpness)],
                         ids=["solarize", "sharpness"])
@pytest.mark.slow
def test_the_policy_check_fails_when_a_fast_op_changes_pixels(checksum_root, monkeypatch,
                                                              fast_op):
    """The comparison above catches a fast op whose pixels drift from torchvision's (Solarize's
    threshold one level up, Sharpness one level down), in main-process loading where the patch
    holds."""
    from fastpipe.data.datasets import per_sample as _augment

    name = "pack-train-ta_wide"
    expected = _torchvision_batches(checksum_root, name)
    assert not _differences(_policy_batches(checksum_root, name, num_workers=0), expected)
    monkeypatch.setattr(_augment, *fast_op)
    assert _differences(_policy_batches(checksum_root, name, num_workers=0), expected)


def test_float_batches_normalize_the_stored_pixels(checksum_root, no_thread_leak):
    from fastpipe import IMAGENET_MEAN, IMAGENET_STD
    from fastpipe.ops import normalize

    options = CONFIGS["train-224"]
    pixels = _loader(checksum_root, options)
    floats = _loader(checksum_root, options, dtype=torch.float16, mean=IMAGENET_MEAN,
                     std=IMAGENET_STD, channels_last=True)
    try:
        for (raw, labels), (images, float_labels) in zip(pixels, floats, strict=True):
            expected = normalize(raw, IMAGENET_MEAN, IMAGENET_STD, dtype=torch.float16,
                                 channels_last=True)
            assert torch.equal(images, expected) and torch.equal(labels, float_labels)
            assert images.is_contiguous(memory_format=torch.channels_last)
    finally:
        pixels.close()
        floats.close()


# Each run: the variable and the capability torch must report under it (None: not checked).
_CPU_SETTINGS = [
    ({}, None),
    ({"ATEN_CPU_CAPABILITY": "default"}, "DEFAULT"),
    ({"ATEN_CPU_CAPABILITY": "avx2"}, "AVX2"),
    # On an Intel CPU with AVX-512, MKL's AVX2 kernels in place of its own (elsewhere a no-op).
    ({"MKL_ENABLE_INSTRUCTIONS": "AVX2"}, None),
]


@pytest.mark.slow
@pytest.mark.parametrize("setting", _CPU_SETTINGS, ids=lambda s: ",".join(
    f"{k}={v}" for k, v in s[0].items()) or "own")
def test_green_under_every_cpu_capability(setting, tmp_path):
    """This module's checks, in a fresh interpreter under each kernel choice torch and MKL can
    make on this machine: the stored checksums must hold under all of them, and the policy checks
    compare against torchvision under the same choice."""
    variables, capability = setting
    if capability == "AVX2" and torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        pytest.skip("this CPU has no AVX2")
    env = {k: v for k, v in os.environ.items()
           if k not in ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR")}
    env.update(variables)
    if capability is not None:
        reported = subprocess.run(
            [sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
            env=env, capture_output=True, text=True, check=True).stdout.strip()
        assert reported == capability
    run = subprocess.run(
        [sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider",
         "--basetemp", str(tmp_path / "run"),
         "-k", "not green_under_every_cpu_capability and not fails_when"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]


def _write() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as base:
        root = _sample_root(Path(base))
        data = {"files": _file_checksums(root),
                "batches": {name: _checksums(root, CONFIGS[name]) for name in sorted(CONFIGS)}}
    STORED.parent.mkdir(exist_ok=True)
    STORED.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {STORED}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_factory_checksums.py --write")
    _write()
