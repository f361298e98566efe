"""image_loader(decode=...): the GPU decode option of the factory, on a machine without a GPU
(the refusals, decode="auto"'s choice and its reason, and the GPU path's wiring through the
recording stand-in of the decoder library)."""

from __future__ import annotations

import warnings

import pytest
import torch

from fastpipe import factory
from fastpipe.data.collate.encoded import EncodedBatch
from fastpipe.factory import image_loader
from fastpipe.gpu_decode import GpuDecodeUnavailable
from tests.helpers.gpu_decode import use_stand_in


def test_decode_gpu_without_a_cuda_device_names_the_device_and_the_fix(sample_root):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    with pytest.raises(ValueError, match=r"decode='gpu'.*CUDA device.*cpu \(no CUDA device "
                                         r"here\).*decode='cpu', or decode='auto'"):
        image_loader(sample_root, 8, train=True, decode="gpu")


def test_decode_gpu_without_a_gpu_decoder_names_the_extra(sample_root, monkeypatch):
    import fastpipe.gpu_decode as gpu_decode

    monkeypatch.setattr(factory, "resolve_device", lambda device, where: torch.device("cuda", 0))
    monkeypatch.setattr(gpu_decode, "available_backends",
                        lambda: {"nvimgcodec": "not installed", "torchvision": "CPU build"})
    with pytest.raises(GpuDecodeUnavailable, match=r"pip install 'fastpipe\[gpu-decode\]'"):
        image_loader(sample_root, 8, train=True, decode="gpu")


@pytest.mark.parametrize("kwargs, message", [
    ({"decode": "auto", "backend": "cpu"}, "picks the backend as well"),
    ({"decode": "cpu", "backend": "dali"}, "decodes inside DALI"),
    ({"decode": "gpu", "backend": "dali"}, "decodes inside DALI"),
    ({"decode": "tpu"}, "decode must be one of"),
])
def test_contradictions_are_refused(sample_root, kwargs, message):
    with pytest.raises(ValueError, match=message):
        image_loader(sample_root, 8, train=True, device="cpu", **kwargs)


def test_decode_auto_without_a_gpu_picks_the_cpu_path_and_says_why(sample_root, no_thread_leak):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    with pytest.warns(UserWarning, match=r"decode='auto'.*decode='cpu'.*only decode that can "
                                         r"run here.*needs a CUDA device"):
        loader = image_loader(sample_root, 8, train=True, size=32, decode="auto", num_workers=0)
    assert loader.decode_choice.decode == "cpu" and loader.decode_choice.rates == {}
    images, labels = next(iter(loader))
    assert images.shape == (8, 3, 32, 32) and images.dtype == torch.float32
    loader.close()


def test_decode_gpu_builds_the_cpu_path_with_encoded_batches_the_prefetcher_decodes(
        sample_root, monkeypatch, no_thread_leak):
    """The wiring, with the device check lifted and the stand-in decoding on the CPU."""
    stand_in = use_stand_in(monkeypatch)
    monkeypatch.setattr(factory, "_check_decode", lambda backend, o: None)
    options = dict(train=True, size=32, device="cpu", num_workers=2, seed=5, shuffle=False)
    loader = image_loader(sample_root, 8, decode="gpu", **options)
    reference = image_loader(sample_root, 8, decode="cpu", **options)
    assert loader.dataset.decode == "gpu" and reference.dataset.decode == "cpu"
    batch = next(iter(loader.loader))
    assert isinstance(batch[0], EncodedBatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = [tuple(t.clone() for t in b) for b in loader]
    want = [tuple(t.clone() for t in b) for b in reference]
    assert len(got) == len(want) == 6
    for (images, labels), (ref_images, ref_labels) in zip(got, want):
        assert images.shape == ref_images.shape == (8, 3, 32, 32)
        assert images.dtype == torch.float32 and torch.equal(labels, ref_labels)
    assert len(stand_in.opened) == 1 and stand_in.opened[0].log[0][0] == "decode"
    loader.close()
    reference.close()
    assert stand_in.opened[0].closed
