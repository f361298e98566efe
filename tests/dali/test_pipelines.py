"""image_pipeline driven directly, the GPU graph as far as it goes without a GPU, device
selection."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from fastpipe import Recipe
from tests.helpers.dali import (
    DALI_MISSING,
    JpegBytes,
    graph_ops,
    graph_output_devices,
    image_files,
)

pytest.importorskip("nvidia.dali", reason=DALI_MISSING, exc_type=ImportError)

from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy  # noqa: E402

import fastpipe.dali.pipelines as pipelines  # noqa: E402
from fastpipe.dali import DALILoader, EncodedSource, dali_device_id, image_pipeline  # noqa: E402
from fastpipe.dali.loader import _to_torch  # noqa: E402
from fastpipe.dali.pipelines import build_pipeline  # noqa: E402

pytestmark = [pytest.mark.dali, pytest.mark.timeout(60)]


def epoch_labels(iterator) -> tuple[list[int], list[int]]:
    labels, sizes = [], []
    for (batch,) in iterator:
        labels.extend(batch["labels"].tolist())
        sizes.append(len(batch["labels"]))
    return labels, sizes


@pytest.mark.parametrize("shuffle", [False, True])
def test_file_reader_pipeline_with_dalis_iterator_gives_exact_epochs(index_list, shuffle):
    # The documented standalone recipe: pad_last_batch in the pipeline + PARTIAL in the iterator.
    pipe = image_pipeline(index_list, batch_size=10, size=32, device="cpu", seed=1, shuffle=shuffle,
                          num_workers=1)
    iterator = DALIGenericIterator(
        [pipe], ["images", "labels"], reader_name="Reader",
        last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=True,
    )
    try:
        for _ in range(2):
            labels, sizes = epoch_labels(iterator)
            assert sizes == [10, 10, 10, 10, 8]
            assert sorted(labels) == list(range(48))
            assert (labels != sorted(labels)) == shuffle
    finally:
        del iterator
        pipe._shutdown()


def test_folder_source_labels_follow_sorted_class_folders(sample_root):
    pipe = image_pipeline(sample_root, batch_size=12, train=False, size=32, device="cpu",
                          num_workers=1)
    try:
        pipe.build()
        images, labels = pipe.run()
        # Sorted files: class_00 first, so the first 12 images are all class 0.
        assert [int(x) for x in np.array(labels.as_tensor())] == [0] * 12
        assert images.as_tensor().shape() == [12, 3, 32, 32]
    finally:
        pipe._shutdown()


def test_encoded_source_pipeline_partial_batches_and_new_epochs(sample_root):
    source = EncodedSource(JpegBytes(image_files(sample_root)), batch_size=20, shuffle=True, seed=5)
    pipe = image_pipeline(source, batch_size=20, size=32, device="cpu", num_workers=1)
    iterator = DALIGenericIterator([pipe], ["images", "labels"], auto_reset=True)
    try:
        first, sizes = epoch_labels(iterator)
        second, _ = epoch_labels(iterator)
    finally:
        del iterator
        pipe._shutdown()
    assert sizes == [20, 20, 8]
    assert sorted(first) == sorted(second) == list(range(48)) and first != second
    assert first == source.indices(0).tolist() and second == source.indices(1).tolist()


def test_encoded_dataset_is_wrapped_with_the_pipeline_shard_arguments(sample_root):
    pipe = image_pipeline(
        JpegBytes(image_files(sample_root)), batch_size=30, train=False, size=32, device="cpu",
        rank=1, world_size=2, num_workers=1,
    )
    try:
        pipe.build()
        _, labels = pipe.run()
        assert [int(x) for x in np.array(labels.as_tensor())] == list(range(1, 48, 2))
    finally:
        pipe._shutdown()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.uint8])
def test_copying_conversion_matches_the_zero_copy_one(sample_root, dtype):
    # The copy is what GPU batches go through (feed_ndarray); on the CPU it must give what the
    # zero-copy path gives.
    pipe = image_pipeline(sample_root, batch_size=4, train=False, size=32, device="cpu",
                          dtype=dtype, num_workers=1)
    try:
        pipe.build()
        images, labels = pipe.run()
        cpu = torch.device("cpu")
        for output, expected_dtype in ((images, dtype), (labels, torch.int64)):
            copied = _to_torch(output, cpu, zero_copy=False)
            assert copied.dtype == expected_dtype
            assert torch.equal(copied, _to_torch(output, cpu, zero_copy=True))
    finally:
        pipe._shutdown()


# ---- the GPU path, without a GPU -----------------------------------------------------------


GPU_IMAGE_OPS = {"Resize", "ColorTwist", "CropMirrorNormalize", "Erase", "Slice"}


@pytest.mark.parametrize("train", [True, False])
def test_gpu_graph_decodes_mixed_keeps_images_and_labels_on_gpu_and_serializes(sample_root, train):
    """Proves the GPU graph is well formed: ``device="mixed"`` decode, every image op after it
    on the GPU, both outputs on the GPU, and DALI accepts every argument of those ops (the
    serializer checks them against the operator schemas). It does not prove it runs."""
    recipe = Recipe(train=True, color_jitter=0.4, cutout_holes=1) if train else Recipe(
        train=False)
    pipe = build_pipeline(
        sample_root, recipe=recipe, batch_size=8, num_workers=2, device_id=None,
        decode_device="mixed",
    )
    ops = graph_ops(pipe)
    decoder = "ImageRandomCrop" if train else "Image"
    assert (decoder, "mixed") in ops
    assert all(device == "gpu" for name, device in ops if name in GPU_IMAGE_OPS)
    # Eval: the resize and the centre crop sizes come from the image header, on the CPU.
    assert {name for name, _ in ops} >= (
        {"Resize", "CropMirrorNormalize"}
        | ({"ColorTwist", "Erase"} if train else {"Slice", "PeekImageShape"}))
    assert graph_output_devices(pipe) == ["gpu", "gpu"]
    serialized = pipe.serialize()
    assert b"device_memory_padding" in serialized and b"mixed" in serialized


def _decoder_arguments(pipe, decoder: str) -> dict[str, int]:
    """The memory paddings the graph's decoder was given (from its operator spec, as DALI
    serializes it)."""
    pipe._build_graph()
    for op in pipe._ops:
        if type(op._op).__name__ == decoder:
            found = re.findall(r"(device_memory_padding|host_memory_padding): (\d+)", str(op.spec))
            return {name: int(value) for name, value in found}
    raise AssertionError(f"no {decoder} in {graph_ops(pipe)}")


@pytest.mark.parametrize(
    "num_workers, device_padding, host_padding",
    [(1, 211025920, 70272256), (2, 105512960, 35136128), (4, 52756480, 17568064),
     (16, 16 * 2**20, 8 * 2**20)],  # the floor: DALI's own defaults
)
@pytest.mark.parametrize("train", [True, False])
def test_gpu_decoder_memory_is_a_budget_shared_by_the_dali_threads(
    sample_root, num_workers, device_padding, host_padding, train
):
    # DALI reserves device_memory_padding once and host_memory_padding twice per thread.
    pipe = build_pipeline(
        sample_root, recipe=Recipe(train=train), batch_size=8, num_workers=num_workers,
        device_id=None, decode_device="mixed",
    )
    padding = _decoder_arguments(pipe, "ImageRandomCrop" if train else "Image")
    assert padding == {"device_memory_padding": device_padding,
                       "host_memory_padding": host_padding}
    total_device = num_workers * padding["device_memory_padding"]
    total_host = 2 * num_workers * padding["host_memory_padding"]
    assert total_device <= max(211025920, num_workers * 16 * 2**20)
    assert total_host <= max(140544512, num_workers * 2 * 8 * 2**20)
    pipe.serialize()  # DALI accepts the values


def test_cpu_decoder_gets_no_gpu_memory_padding(sample_root):
    pipe = build_pipeline(sample_root, recipe=Recipe(train=True), batch_size=8, num_workers=2,
                          device_id=None, decode_device="cpu")
    assert _decoder_arguments(pipe, "ImageRandomCrop") == {}


def test_whole_image_decode_then_gpu_random_crop_when_crop_decode_is_off(sample_root):
    """crop_decode=False, the workaround of NVIDIA/nvImageCodec#55: a plain mixed decode, then
    fn.random_resized_crop on the GPU; no fused random-crop decode in the graph."""
    recipe = Recipe(train=True, color_jitter=0.4, cutout_holes=1)
    pipe = build_pipeline(sample_root, recipe=recipe, batch_size=8, num_workers=2,
                          device_id=None, decode_device="mixed", crop_decode=False)
    ops = graph_ops(pipe)
    assert ("Image", "mixed") in ops and ("RandomResizedCrop", "gpu") in ops
    assert "ImageRandomCrop" not in {name for name, _ in ops}
    assert "Resize" not in {name for name, _ in ops}  # random_resized_crop resizes
    assert all(device == "gpu" for name, device in ops if name in GPU_IMAGE_OPS)
    assert graph_output_devices(pipe) == ["gpu", "gpu"]
    assert b"RandomResizedCrop" in pipe.serialize()
    eval_pipe = build_pipeline(sample_root, recipe=Recipe(train=False), batch_size=8,
                               num_workers=2, device_id=None, decode_device="mixed",
                               crop_decode=False)
    assert {name for name, _ in graph_ops(eval_pipe)} == {
        name for name, _ in graph_ops(build_pipeline(
            sample_root, recipe=Recipe(train=False), batch_size=8, num_workers=2,
            device_id=None, decode_device="mixed"))}


def test_crop_decode_off_runs_on_the_cpu_through_every_entry_point(sample_root):
    from fastpipe.factory import image_loader

    loader = DALILoader(sample_root, batch_size=8, size=32, device="cpu", seed=3,
                        crop_decode=False)
    assert ("RandomResizedCrop", "cpu") in graph_ops(loader._new_pipeline(lambda: None))
    with loader:
        images, labels = next(iter(loader))
    assert images.shape == (8, 3, 32, 32) and images.dtype == torch.float32
    assert 0.0 <= float(images.min()) and float(images.max()) <= 1.0
    assert labels.shape == (8,)
    pipe = image_pipeline(sample_root, batch_size=4, size=32, device="cpu", crop_decode=False)
    assert "ImageRandomCrop" not in {name for name, _ in graph_ops(pipe)}
    factory = image_loader(sample_root, 8, train=True, size=32, backend="dali", device="cpu",
                           crop_decode=False)
    try:
        assert factory.crop_decode is False
    finally:
        factory.close()
    with pytest.raises(TypeError, match="crop_decode must be True or False"):
        DALILoader(sample_root, batch_size=8, device="cpu", crop_decode="no")
    with pytest.warns(RuntimeWarning, match="crop_decode=False applies to the DALI backend"):
        image_loader(sample_root, 8, train=True, size=32, backend="cpu", device="cpu",
                     crop_decode=False)


def test_image_loader_defaults_to_the_whole_image_decode_on_dali(sample_root, recwarn):
    """image_loader's DALI backend decodes whole images unless crop_decode=True is asked for:
    the fused random-crop decode may fail on the GPU (NVIDIA/nvImageCodec#55)."""
    from fastpipe.factory import image_loader

    loader = image_loader(sample_root, 8, train=True, size=32, backend="dali", device="cpu")
    try:
        assert loader.crop_decode is False
        names = {name for name, _ in graph_ops(loader._new_pipeline(lambda: None))}
        assert "ImageRandomCrop" not in names and "RandomResizedCrop" in names
    finally:
        loader.close()
    asked = image_loader(sample_root, 8, train=True, size=32, backend="dali", device="cpu",
                         crop_decode=True)
    try:
        assert asked.crop_decode is True
        assert "ImageRandomCrop" in {name for name, _ in graph_ops(
            asked._new_pipeline(lambda: None))}
    finally:
        asked.close()
    # The CPU backend's default says nothing; asking it for either is a warning.
    image_loader(sample_root, 8, train=True, size=32, backend="cpu", device="cpu").close()
    assert not [w for w in recwarn if "crop_decode" in str(w.message)]
    with pytest.warns(RuntimeWarning, match="crop_decode=True applies to the DALI backend"):
        image_loader(sample_root, 8, train=True, size=32, backend="cpu", device="cpu",
                     crop_decode=True).close()


def test_cpu_graph_has_no_gpu_operator(sample_root):
    pipe = build_pipeline(
        sample_root, recipe=Recipe(train=True, cutout_holes=1), batch_size=8,
        num_workers=2, device_id=None, decode_device="cpu",
    )
    assert {device for _, device in graph_ops(pipe)} == {"cpu"}
    assert graph_output_devices(pipe) == ["cpu", "cpu"]


@pytest.fixture
def fake_cuda(monkeypatch):
    """A recording stand-in for a machine with CUDA: torch says yes, DALI sees ``count`` GPUs."""
    state = {"count": 2, "current": 1}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: state["current"])
    monkeypatch.setattr(pipelines, "_dali_cuda_device_count", lambda: state["count"])
    return state


def test_device_resolution_with_a_gpu_stand_in(fake_cuda):
    assert dali_device_id(None) == 1  # torch's current device
    assert dali_device_id("gpu") == dali_device_id("cuda") == 1
    assert (dali_device_id("cuda:0") == dali_device_id(0)
            == dali_device_id(torch.device("cuda", 0)) == 0)
    assert dali_device_id("cpu") is None and dali_device_id(torch.device("cpu")) is None
    with pytest.raises(ValueError, match="DALI sees 2 GPU"):
        dali_device_id("cuda:2")


def test_device_resolution_when_torch_sees_a_gpu_but_dali_does_not(fake_cuda):
    fake_cuda["count"] = 0
    with pytest.warns(RuntimeWarning, match="DALI does not"):
        assert dali_device_id(None) is None
    with pytest.raises(RuntimeError, match="nvidia-dali-cuda120"):
        dali_device_id("cuda")


def test_loader_on_a_gpu_stand_in_builds_a_mixed_pipeline_for_that_device(index_list, fake_cuda):
    loader = DALILoader(index_list, batch_size=8, device="cuda", size=64)
    assert loader.device == torch.device("cuda", 1)
    pipe = loader._new_pipeline(lambda: None)
    assert pipe.device_id == 1
    assert ("ImageRandomCrop", "mixed") in graph_ops(pipe)
    assert graph_output_devices(pipe) == ["gpu", "gpu"]


def test_device_resolution_on_this_machine():
    assert dali_device_id(None) is None  # no GPU here: DALI's CPU mode
    with pytest.raises(RuntimeError, match="torch sees no CUDA device"):
        dali_device_id("gpu")
    with pytest.raises(ValueError, match="device must be"):
        dali_device_id("cuda:x")
    with pytest.raises(TypeError):
        dali_device_id(1.5)


def test_pipeline_argument_checks(sample_root):
    with pytest.raises(ValueError, match="set shuffle and sharding on the EncodedSource"):
        image_pipeline(EncodedSource(JpegBytes(image_files(sample_root)[:4]), batch_size=2),
                       batch_size=2, shuffle=True)
    with pytest.raises(ValueError, match="more than batch_size"):
        image_pipeline(EncodedSource(JpegBytes(image_files(sample_root)[:4]), batch_size=4),
                       batch_size=2, train=False)
    with pytest.raises(TypeError, match="source must be"):
        image_pipeline(42, batch_size=2)
    with pytest.raises(ValueError, match="root= applies"):
        image_pipeline(sample_root, batch_size=2, root=sample_root)


@pytest.mark.parametrize(
    "local_rank, current, count, expected, warns",
    [
        ("1", 0, 2, 1, True),  # torchrun rank 1, script never called set_device
        ("1", 1, 2, 1, False),  # the script chose its device
        ("1", 0, 1, 0, False),  # one visible GPU per process: LOCAL_RANK does not number it
        ("0", 0, 2, 0, False),
        (None, 0, 2, 0, False),
    ],
)
def test_device_follows_local_rank_when_the_script_did_not_choose_one(
    fake_cuda, monkeypatch, local_rank, current, count, expected, warns
):
    fake_cuda.update(count=count, current=current)
    if local_rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    for device in (None, "cuda"):
        if warns:
            with pytest.warns(RuntimeWarning, match=r"torch.cuda.set_device\(1\)"):
                assert dali_device_id(device) == expected
        else:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("error")
                assert dali_device_id(device) == expected
    assert dali_device_id("cuda:0") == 0  # an explicit index is never overridden


# ---- the GPU hand-off, with recording stand-ins --------------------------------------------


class RecordingDense:
    """A DALI TensorGPU stand-in: records the copy DALI is asked to make."""

    def __init__(self, tensor: torch.Tensor, log: list) -> None:
        self.tensor, self.log = tensor, log
        self.dtype = type("DALIDataType", (),
                          {"name": {torch.uint8: "UINT8"}.get(tensor.dtype, "INT64")})

    def shape(self):
        return list(self.tensor.shape)

    def copy_to_external(self, ptr, cuda_stream=None, non_blocking=False):
        self.log.append(("copy", ptr.value, cuda_stream.value, non_blocking))


class RecordingOutput:
    def __init__(self, dense: RecordingDense) -> None:
        self.dense = dense

    def as_tensor(self):
        return self.dense


class RecordingPipe:
    """share_outputs/release_outputs/schedule_run of a DALI pipeline with the dynamic executor."""

    exec_dynamic = True

    def __init__(self, log: list) -> None:
        self.log = log

    def share_outputs(self, cuda_stream=None):
        self.log.append(("share_outputs", cuda_stream))
        images = torch.zeros(2, 3, 4, 4, dtype=torch.uint8)
        return [RecordingOutput(RecordingDense(images, self.log)),
                RecordingOutput(RecordingDense(torch.zeros(2, dtype=torch.int64), self.log))]

    def release_outputs(self):
        self.log.append(("release_outputs",))

    def schedule_run(self):
        self.log.append(("schedule_run",))


def test_gpu_outputs_are_copied_on_torchs_current_stream_without_a_host_sync(monkeypatch):
    """On the GPU, DALI's outputs are shared bound to torch's current stream of the loader's
    device (``share_outputs(cuda_stream=...)``) and copied, non-blocking, on that stream into
    tensors of torch's allocator (so ``record_stream`` works on them), before DALI gets its
    buffers back. The old code shared without a stream, which synchronises the host."""
    import collections

    from fastpipe.dali.loader import _Runtime, _Tag

    log: list = []
    streams = {}

    class Stream:
        def __init__(self, handle):
            self.cuda_stream = handle

    def current_stream(device=None):
        return streams.setdefault(device, Stream(1000 + len(streams)))

    def no_sync(*args, **kwargs):
        raise AssertionError("the hand-off must not synchronise the host")

    real_empty = torch.empty
    allocated = []

    def empty(*shape, dtype=None, device=None):
        allocated.append(torch.device(device))
        out = real_empty(*shape, dtype=dtype)  # CPU memory standing in for the GPU's
        log.append(("allocate", out.data_ptr()))
        return out

    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    monkeypatch.setattr(torch.cuda, "synchronize", no_sync)
    monkeypatch.setattr(torch.cuda.Stream, "synchronize", no_sync, raising=False)
    monkeypatch.setattr(torch.cuda.Event, "synchronize", no_sync, raising=False)
    monkeypatch.setattr(torch, "empty", empty)

    class Feeder:
        generation = 1
        in_flight = collections.deque([_Tag(1, 0, 0, np.arange(2))])

    device = torch.device("cuda", 1)
    runtime = _Runtime(RecordingPipe(log), Feeder(), device)
    tag, images, labels = runtime.next_batch()
    monkeypatch.undo()
    stream = streams[device]
    assert list(streams) == [device], "the stream of the loader's device, not the default one"
    assert log[0] == ("share_outputs", stream), "outputs bound to torch's current stream"
    copies = [entry for entry in log if entry[0] == "copy"]
    assert [(ptr, handle, blocking) for _, ptr, handle, blocking in copies] == [
        (images.data_ptr(), stream.cuda_stream, True),
        (labels.data_ptr(), stream.cuda_stream, True),
    ], "non-blocking copies on that stream into the returned tensors"
    assert allocated == [device, device]
    assert log.index(("release_outputs",)) > log.index(copies[-1])
    assert images.shape == (2, 3, 4, 4) and labels.shape == (2,)
    runtime.pipe = None  # nothing to shut down


class LegacyRecordingPipe(RecordingPipe):
    """The same calls of a pipeline on DALI's legacy (non-dynamic) executor."""

    exec_dynamic = False


def test_legacy_executor_outputs_are_copied_before_dali_gets_its_buffers_back(monkeypatch):
    """Without the dynamic executor the outputs are not bound to a stream: release_outputs hands
    DALI its buffers back at once, so the copies must have run by then. They run on a stream of
    the loader's own, which is waited for (the copies only, not the step's work queued on the
    current stream), and the copies are recorded on the current stream, which reads them. The
    old code queued them, non-blocking, on the busy current stream and released at once."""
    import collections
    import contextlib

    from fastpipe.dali.loader import _Runtime, _Tag

    log: list = []

    class Stream:
        made = 0

        def __init__(self, device=None, handle=None):
            if handle is None:
                Stream.made += 1
                handle = 2000 + Stream.made
            self.cuda_stream, self.device = handle, device

        def synchronize(self):
            log.append(("sync", self.cuda_stream))

    current = Stream(handle=1000)
    active = [current]

    @contextlib.contextmanager
    def use(stream):
        active.append(stream)
        try:
            yield
        finally:
            active.pop()

    real_empty = torch.empty

    def empty(*shape, dtype=None, device=None):
        out = real_empty(*shape, dtype=dtype)  # CPU memory standing in for the GPU's
        log.append(("allocate", out.data_ptr(), active[-1].cuda_stream))
        return out

    def record_stream(tensor, stream):
        log.append(("record", tensor.data_ptr(), stream.cuda_stream))

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: active[-1])
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "stream", use)
    monkeypatch.setattr(torch.Tensor, "record_stream", record_stream)
    monkeypatch.setattr(torch, "empty", empty)

    class Feeder:
        generation = 1
        in_flight = collections.deque([_Tag(1, 0, 0, np.arange(2)), _Tag(1, 1, 0, np.arange(2))])

    runtime = _Runtime(LegacyRecordingPipe(log), Feeder(), torch.device("cuda", 0))
    batches = [runtime.next_batch() for _ in range(2)]
    monkeypatch.undo()
    assert Stream.made == 1, "one copy stream per loader, not one per batch"
    side = 2001
    released = [i for i, entry in enumerate(log) if entry == ("release_outputs",)]
    for batch, release in zip(batches, released):
        _, images, labels = batch
        ptrs = {images.data_ptr(), labels.data_ptr()}
        copies = [i for i, e in enumerate(log[:release]) if e[0] == "copy" and e[1] in ptrs]
        assert [log[i][2] for i in copies] == [side, side], "copied on the loader's stream"
        assert {e[2] for e in log if e[0] == "allocate" and e[1] in ptrs} == {side}
        syncs = [i for i, e in enumerate(log[:release]) if e == ("sync", side)]
        assert syncs and max(copies) < syncs[-1], "the copies waited for before the release"
        assert {(e[1], e[2]) for e in log if e[0] == "record"} >= {(p, 1000) for p in ptrs}
    assert ("sync", 1000) not in log, "the step's stream is never waited for"
    runtime.pipe = None  # nothing to shut down
