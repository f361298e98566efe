"""fastpipe._compat: every private API of another library fastpipe relies on, checked against
the installed versions. A failure here means a new torch, Python or DALI moved one: fix the
wrapper in fastpipe/_compat.py, not the callers."""

from __future__ import annotations

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
