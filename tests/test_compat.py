"""fastpipe._compat: every private API of another library fastpipe relies on, checked against
the installed versions. A failure here means a new torch, Python or DALI moved one: fix the
wrapper in fastpipe/_compat.py, not the callers."""

from __future__ import annotations

import collections
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

from fastpipe import _compat


def test_the_hook_before_thread_join_exists():
    assert callable(getattr(threading, "_register_atexit", None)), (
        "threading._register_atexit is gone: BackgroundIterator threads blocked on a full queue "
        "would hang interpreter exit"
    )


@pytest.mark.slow
def test_register_before_thread_join_runs_before_threads_are_joined():
    # A non-daemon thread that only ends when the callback tells it to: if the callback ran
    # after the join (plain atexit), the interpreter would hang and the timeout would fire.
    code = textwrap.dedent("""
        import threading
        from fastpipe._compat import register_before_thread_join
        stop = threading.Event()
        threading.Thread(target=stop.wait).start()
        assert register_before_thread_join(stop.set)
        print("registered")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "registered"


def test_shutdown_dataloader_workers_stops_the_worker_processes():
    loader = torch.utils.data.DataLoader(list(range(8)), batch_size=2, num_workers=1)
    iterator = iter(loader)
    next(iterator)
    workers = list(iterator._workers)
    assert workers and all(w.is_alive() for w in workers)
    assert _compat.shutdown_dataloader_workers(iterator), (
        "DataLoader iterators lost _shutdown_workers: DataLoaderX would leave workers to gc"
    )
    assert not any(w.is_alive() for w in workers)
    assert not _compat.shutdown_dataloader_workers(iter(torch.utils.data.DataLoader([1])))


def test_shutdown_dali_pipeline_joins_its_threads():
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import fn, pipeline_def

    @pipeline_def(batch_size=2, num_threads=2, device_id=None)
    def constant():
        return fn.random.uniform(range=[0.0, 1.0], shape=[2])

    pipe = constant()
    pipe.build()
    pipe.run()
    assert callable(getattr(pipe, "_shutdown", None)), (
        "DALI's Pipeline lost _shutdown: DALILoader.close() could not join DALI's threads"
    )
    assert _compat.shutdown_dali_pipeline(pipe)
    assert not _compat.shutdown_dali_pipeline(object())


def test_dispatch_has_kernel_sees_registered_kernels():
    assert _compat.dispatch_has_kernel("aten::add.Tensor", "CPU")
    assert not _compat.dispatch_has_kernel("aten::add.Tensor", "FPGA")


def test_standard_gamma_takes_a_generator():
    concentration = torch.full((4,), 2.0, dtype=torch.float64)
    first = _compat.standard_gamma(concentration, torch.Generator().manual_seed(0))
    again = _compat.standard_gamma(concentration, torch.Generator().manual_seed(0))
    assert torch.equal(first, again) and bool((first > 0).all())
    draws = _compat.standard_gamma(torch.full((20000,), 2.0, dtype=torch.float64),
                                   torch.Generator().manual_seed(1))
    assert abs(float(draws.mean()) - 2.0) < 0.05  # Gamma(2, 1) has mean 2


def test_new_shared_storage_is_in_shared_memory():
    tensor = _compat.new_shared_storage(12, torch.uint8)
    assert tensor is not None, (
        "TypedStorage._new_shared moved: fast_collate falls back to a copy per batch"
    )
    assert tensor.numel() == 12 and tensor.dtype == torch.uint8
    assert tensor.is_shared()


_Pair = collections.namedtuple("_Pair", ["image", "label"])


class _OwnDict(dict):
    """A dict subclass of the user's own: torch's pytree does not walk into it."""


def _nested_batch() -> dict:
    return {
        "pair": _Pair(torch.zeros(2), [torch.ones(1), "name"]),
        "ordered": collections.OrderedDict(b=torch.full((1,), 2.0), a=3),
        "queue": collections.deque([torch.full((1,), 4.0)], maxlen=5),
        "counts": collections.defaultdict(int, n=torch.full((1,), 5.0)),
        "own": _OwnDict(x=torch.full((1,), 6.0)),
        "empty": (),
        "none": None,
    }


def test_torch_pytree_has_the_functions_the_wrappers_call():
    assert _compat._torch_pytree() is not None, (
        "torch.utils._pytree lost tree_leaves or tree_map_only: DataPrefetcher and profile "
        "fall back to walking the standard containers only"
    )


def test_tree_leaves_and_the_fallback_agree_with_torch():
    from torch.utils import _pytree

    batch = _nested_batch()
    expected = _pytree.tree_leaves(batch)
    assert [type(leaf) for leaf in _compat.tree_leaves(batch)] == [type(x) for x in expected]
    fallback = _compat._walked_leaves(batch)
    assert len(fallback) == len(expected)
    assert all(a is b for a, b in zip(fallback, expected, strict=True))


def test_tree_map_only_and_the_fallback_rebuild_the_structure_as_torch_does():
    from torch.utils import _pytree

    batch = _nested_batch()
    expected = _pytree.tree_map_only(torch.Tensor, lambda t: t + 10, batch)
    for got in (_compat.tree_map_only(torch.Tensor, lambda t: t + 10, batch),
                _compat._walked_map_only(torch.Tensor, lambda t: t + 10, batch)):
        assert type(got["pair"]) is _Pair and got["pair"].label[1] == "name"
        assert type(got["ordered"]) is collections.OrderedDict
        assert list(got["ordered"]) == ["b", "a"]
        assert got["queue"].maxlen == 5
        assert got["counts"].default_factory is int
        assert got["own"] is batch["own"]  # a leaf, and not a tensor: left as it is
        assert got["none"] is None and got["empty"] == ()
        leaves = _pytree.tree_leaves(got)
        assert len(leaves) == len(_pytree.tree_leaves(expected))
        for a, b in zip(leaves, _pytree.tree_leaves(expected), strict=True):
            assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a is b


class _PreparedLoader:
    """Stands in for accelerate's DataLoaderShard: what the wrappers touch of it."""

    def __init__(self, gradient_state) -> None:
        self.gradient_state = gradient_state
        self.end_of_dataloader = False


@pytest.mark.parametrize("private", [True, False], ids=["private", "fallback"])
def test_accelerate_dataloader_wrappers_add_and_remove_the_loader(private, monkeypatch):
    pytest.importorskip("accelerate")
    from accelerate.state import GradientState

    for name in ("_add_dataloader", "_remove_dataloader"):
        assert callable(getattr(GradientState, name, None)), (
            f"accelerate's GradientState lost {name}: DataPrefetcher falls back to assigning "
            "dataloader_references"
        )
        if not private:
            monkeypatch.delattr(GradientState, name)
    state = GradientState()
    before = list(state.dataloader_references)
    loader = _PreparedLoader(state)
    assert _compat.accelerate_add_dataloader(loader) is private
    assert state.active_dataloader is loader and state.in_dataloader
    assert _compat.accelerate_remove_dataloader(loader) is private
    assert state.dataloader_references == before


def test_auto_augment_with_fast_ops_routes_each_op_through_the_hook():
    """The private hook exists on every v2 policy fastpipe subclasses, the subclass calls the
    fast op for each op torchvision applies, falls back to torchvision's when it returns None,
    and pickles."""
    import pickle

    from torchvision.transforms import v2

    from fastpipe._compat import auto_augment_with_fast_ops

    seen = []

    def fast_op(image, transform_id, magnitude):
        seen.append(transform_id)
        return image if transform_id == "Identity" else None

    for base in (v2.AugMix, v2.AutoAugment, v2.RandAugment, v2.TrivialAugmentWide):
        assert callable(getattr(base, "_apply_image_or_video_transform", None)), base
    cls = auto_augment_with_fast_ops(v2.RandAugment, fast_op, __name__)
    image = torch.randint(0, 256, (3, 16, 16), dtype=torch.uint8)
    torch.manual_seed(0)
    ours = cls(num_ops=3)(image)
    torch.manual_seed(0)
    theirs = v2.RandAugment(num_ops=3)(image)
    assert len(seen) == 3 and torch.equal(ours, theirs)
    globals()["FastRandAugment"] = cls
    try:
        assert type(pickle.loads(pickle.dumps(cls(num_ops=1)))) is cls
    finally:
        del globals()["FastRandAugment"]


def test_s3fs_has_the_call_s3_request_wraps():
    import inspect

    s3fs = pytest.importorskip("s3fs")
    assert inspect.iscoroutinefunction(s3fs.S3FileSystem._call_s3)
    params = inspect.signature(s3fs.S3FileSystem._call_s3).parameters
    assert "method" in params and any(p.kind is p.VAR_KEYWORD for p in params.values())


def test_s3_request_names_s3fs_when_the_call_is_missing():
    pytest.importorskip("s3fs")
    with pytest.raises(RuntimeError, match="S3FileSystem._call_s3"):
        _compat.s3_request(object(), "get_object", Bucket="b", Key="k")


_LOST_TRANSFER = textwrap.dedent("""
    import os, socket, sys, time
    from multiprocessing import resource_sharer
    from fastpipe import _compat

    if sys.argv[1] == "quiet":
        assert _compat.quiet_lost_descriptor_transfers()
        assert _compat.quiet_lost_descriptor_transfers()  # twice: one hook
    r, w = os.pipe()
    shared = resource_sharer.DupFd(r)  # this process's resource sharer thread serves it
    # A receiver that goes away in the handshake (a main process ended by Ctrl-C).
    receiver = socket.socket(socket.AF_UNIX)
    receiver.connect(shared._id[0])
    receiver.close()
    time.sleep(1.0)
    sys.excepthook(ValueError, ValueError("another error"), None)  # still printed
""")


@pytest.mark.parametrize("how", ["quiet", "as Python does"])
def test_a_descriptor_transfer_whose_receiver_is_gone_prints_nothing(how):
    done = subprocess.run([sys.executable, "-c", _LOST_TRANSFER, how], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "ValueError: another error" in done.stderr
    lost = "Traceback" in done.stderr and "_serve" in done.stderr
    assert lost == (how == "as Python does"), done.stderr
