"""fastpipe/gpu_decode/_backends.py on the CPU: the decoder libraries' own code paths, not the
recording stand-in.

nvImageCodec: its code streams (whole images, and regions as sub code streams) and decode
parameters are built against the real nvImageCodec wheel (it imports without a GPU; only its
Decoder needs libcuda), and the batch orchestration (one decode call per batch, the decoded
images passed back as the next batch's buffers, a slot keeping its buffer when its image is not
decoded, the kept bytes, the stream handed over) against a fake ``nvimgcodec.Decoder`` that
records each call. torchvision: ``TorchvisionBackend`` on the CPU (decode_jpeg decodes there
too): regions cut from the whole decode, what is not a JPEG left to the caller, and a batch with
one image it refuses decoded image by image.
"""

from __future__ import annotations

import io
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from fastpipe.gpu_decode import _backends
from fastpipe.gpu_decode._backends import NvImageCodecBackend, Request, TorchvisionBackend

CPU = torch.device("cpu", 0)  # an index, as a CUDA device has: nvImageCodec's device_id


def _jpeg(height: int, width: int, seed: int) -> np.ndarray:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    return np.frombuffer(out.getvalue(), dtype=np.uint8).copy()  # writable, as a batch's bytes


def _png(height: int, width: int) -> np.ndarray:
    out = io.BytesIO()
    Image.fromarray(np.zeros((height, width, 3), np.uint8)).save(out, "PNG")
    return np.frombuffer(out.getvalue(), dtype=np.uint8).copy()


# ------------------------------------------------------------------------------- nvImageCodec


@pytest.fixture
def nvimgcodec():
    return pytest.importorskip("nvidia.nvimgcodec", exc_type=ImportError)


class FakeImage(np.ndarray):
    """An nvImageCodec Image standing in: its pixels (torch.as_tensor reads them) and the
    ``capacity`` of its buffer, which grows and never shrinks, as nvImageCodec's does."""

    capacity = 0


class FakeDecoder:
    """nvimgcodec.Decoder standing in: records each decode call; decodes each code stream into
    the image passed for it (``images=``: the same object back, its buffer grown if needed) or a
    new one; ``refuse`` (a set of slots) comes back None, as an image nvImageCodec cannot decode
    on the GPU."""

    made: list[FakeDecoder] = []

    def __init__(self, **kwargs) -> None:
        self.options = kwargs
        self.calls: list[dict] = []
        self.refuse: set[int] = set()
        FakeDecoder.made.append(self)

    def decode(self, srcs, *, images=None, params=None, cuda_stream=0):
        assert images is None or len(images) == len(srcs), "one image to reuse per code stream"
        self.calls.append({"srcs": list(srcs), "images": images, "params": params,
                           "cuda_stream": cuda_stream})
        out = []
        for k, src in enumerate(srcs):
            if k in self.refuse:
                out.append(None)
                continue
            region = src.view.region if src.view is not None else None
            shape = ((region.end[0] - region.start[0], region.end[1] - region.start[1], 3)
                     if region is not None and region.ndim else (src.height, src.width, 3))
            image = np.full(shape, k, np.uint8).view(FakeImage)
            image.capacity = max(image.nbytes, images[k].capacity if images else 0)
            out.append(image)
            if images is not None:  # decoded into the buffer given: the same Image comes back
                images[k].capacity = image.capacity
                out[-1] = images[k]
        return out


@pytest.fixture
def backend(nvimgcodec, monkeypatch):
    FakeDecoder.made = []
    monkeypatch.setattr(nvimgcodec, "Decoder", FakeDecoder)
    return NvImageCodecBackend(CPU, hardware=True, fancy_upsampling=False)


def test_the_code_streams_are_the_whole_image_or_its_region(nvimgcodec, backend):
    data = _jpeg(40, 60, 0)
    whole, region = backend._code_streams([Request(data, (0, 0, 40, 60), (40, 60)),
                                           Request(data, (2, 3, 10, 30), (40, 60))])
    assert isinstance(whole, nvimgcodec.CodeStream) and whole.codec_name == "jpeg"
    assert (whole.height, whole.width) == (40, 60)
    view = region.view.region
    assert view.start == (2, 3) and view.end == (12, 33)  # (top, left) to (bottom, right)
    assert whole.view is None or not whole.view.region.ndim


def test_the_decode_parameters_are_the_cpu_paths(nvimgcodec, backend):
    params = backend._params()
    assert isinstance(params, nvimgcodec.DecodeParams)
    assert params.apply_exif_orientation is False  # the CPU path does not apply it
    assert params.color_spec == nvimgcodec.ColorSpec.SRGB
    assert params.sample_format == nvimgcodec.SampleFormat.I_RGB
    assert params.allow_any_depth is False


def test_the_decoder_is_opened_with_the_engines_and_the_upsampling(nvimgcodec, monkeypatch):
    monkeypatch.setattr(nvimgcodec, "Decoder", FakeDecoder)
    FakeDecoder.made = []
    NvImageCodecBackend(CPU, hardware=True, fancy_upsampling=True)
    NvImageCodecBackend(CPU, hardware=False, fancy_upsampling=False)
    first, second = FakeDecoder.made
    kinds = [[b.backend_kind for b in d.options["backends"]] for d in (first, second)]
    engine = [nvimgcodec.BackendKind.GPU_ONLY, nvimgcodec.BackendKind.HYBRID_CPU_GPU]
    assert kinds == [[nvimgcodec.BackendKind.HW_GPU_ONLY, *engine], engine]
    assert first.options["options"] == ":fancy_upsampling=1"
    assert second.options["options"] == ":fancy_upsampling=0"
    assert first.options["device_id"] == 0


def _requests(count: int, size: tuple[int, int] = (40, 60)) -> list[Request]:
    return [Request(_jpeg(*size, k), (1, 2, 10 + k, 20 + k), size) for k in range(count)]


def test_one_call_per_batch_and_the_decoded_images_are_the_next_batchs_buffers(backend):
    decoder = FakeDecoder.made[0]
    first = backend.decode(_requests(4), SimpleNamespace(cuda_stream=1234))
    assert [tuple(t.shape) for t in first] == [(10 + k, 20 + k, 3) for k in range(4)]
    assert int(first[2][0, 0, 0]) == 2  # each slot's own pixels
    kept = list(backend._kept)
    backend.decode(_requests(4), None)
    backend.decode(_requests(5), None)  # more images than buffers: no reuse this time
    backend.decode(_requests(3), None)  # fewer: the first three buffers
    calls = decoder.calls
    assert len(calls) == 4 and all(len(c["srcs"]) == n for c, n in zip(calls, (4, 4, 5, 3)))
    assert calls[0]["images"] is None
    assert all(a is b for a, b in zip(calls[1]["images"], kept))
    assert calls[2]["images"] is None and len(calls[3]["images"]) == 3
    assert [c["cuda_stream"] for c in calls] == [1234, 0, 0, 0]  # a torch stream's handle
    assert all(c["params"] is backend._decode_params for c in calls)


def test_a_slot_whose_image_is_not_decoded_keeps_its_buffer(backend):
    decoder = FakeDecoder.made[0]
    backend.decode(_requests(3), None)
    before = list(backend._kept)
    decoder.refuse = {1}
    out = backend.decode(_requests(3), None)
    assert out[1] is None and out[0] is not None and out[2] is not None
    assert backend._kept[1] is before[1], "slot 1 keeps its buffer for the next batch"
    assert len(backend._kept) == 3
    decoder.refuse = set()
    backend.decode(_requests(3), None)
    assert all(a is b for a, b in zip(decoder.calls[-1]["images"], before))


def test_the_kept_bytes_are_the_buffers_capacity_and_release_lets_them_go(backend):
    backend.decode(_requests(2, (40, 60)), None)
    small = backend.kept_bytes()
    assert small == sum(image.capacity for image in backend._kept) == 10 * 20 * 3 + 11 * 21 * 3
    backend.decode([Request(_jpeg(40, 60, 9), (0, 0, 40, 60), (40, 60))] * 2, None)
    assert backend.kept_bytes() == 2 * 40 * 60 * 3  # grown for the larger images
    backend.decode(_requests(2), None)
    assert backend.kept_bytes() == 2 * 40 * 60 * 3  # and not shrunk
    backend.release()
    assert backend.kept_bytes() == 0
    backend.close()
    assert backend._decoder is None and backend._kept == []


def test_the_stream_handle_of_a_torch_stream():
    assert _backends._stream_handle(None) == 0
    assert _backends._stream_handle(SimpleNamespace(cuda_stream=77)) == 77
    assert _backends._stream_handle(SimpleNamespace(cuda_stream=None)) == 0


# ---------------------------------------------------------------------------------- torchvision


@pytest.fixture
def torchvision_backend():
    pytest.importorskip("torchvision", exc_type=ImportError)
    return TorchvisionBackend(torch.device("cpu"))


def _decoded(data: np.ndarray) -> torch.Tensor:
    with Image.open(io.BytesIO(data.tobytes())) as image:
        return torch.from_numpy(np.array(image.convert("RGB")))


def test_torchvision_cuts_each_region_from_the_whole_decode(torchvision_backend):
    from torchvision.io import ImageReadMode, decode_jpeg

    jpegs = [_jpeg(40, 60, 1), _jpeg(33, 21, 2)]
    requests = [Request(jpegs[0], (0, 0, 40, 60), (40, 60)),
                Request(jpegs[1], (5, 4, 12, 9), (33, 21))]
    out = torchvision_backend.decode(requests, None)
    for data, request, image in zip(jpegs, requests, out):
        top, left, height, width = request.region
        whole = decode_jpeg(torch.from_numpy(data.copy()), mode=ImageReadMode.RGB).permute(1, 2, 0)
        assert image.shape == (height, width, 3)
        assert torch.equal(image, whole[top:top + height, left:left + width])
    assert (out[0].float() - _decoded(jpegs[0]).float()).abs().mean() < 2  # a JPEG decode


def test_torchvision_leaves_what_is_not_a_jpeg_and_retries_a_refused_batch_one_by_one(
        torchvision_backend):
    good, png = _jpeg(20, 30, 3), _png(8, 8)
    cut = good[:60].copy()  # a JPEG that does not decode
    requests = [Request(good, (0, 0, 20, 30), (20, 30)), Request(png, (0, 0, 8, 8), (8, 8)),
                Request(cut, (0, 0, 20, 30), (20, 30)), Request(good, (2, 2, 5, 5), (20, 30))]
    with pytest.raises(RuntimeError):  # one image it refuses fails torchvision's whole batch
        torchvision_backend._decode([torch.from_numpy(good.copy()), torch.from_numpy(cut)])
    out = torchvision_backend.decode(requests, None)
    assert out[1] is None, "a PNG is left to the CPU decoder"
    assert out[2] is None, "the JPEG it refuses comes back None, alone"
    assert out[0].shape == (20, 30, 3) and torch.equal(out[3], out[0][2:7, 2:7])
    assert torchvision_backend.kept_bytes() == 0
