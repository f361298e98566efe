"""The background-thread contract of fastpipe._background.BackgroundIterator, one test per
clause."""

from __future__ import annotations

import _imp
import gc
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from fastpipe._background import BackgroundIterator

pytestmark = pytest.mark.timeout(60)


def _counting(n: int, produced: list[int]):
    for i in range(n):
        produced.append(i)
        yield i


def test_yields_every_item_in_order_including_none(no_thread_leak):
    items = [0, None, "a", None, 3]
    assert list(BackgroundIterator(iter(items), prefetch_depth=2)) == items


def test_queue_is_bounded_by_prefetch_depth(no_thread_leak):
    produced: list[int] = []
    it = BackgroundIterator(_counting(1000, produced), prefetch_depth=3)
    time.sleep(0.3)
    # prefetch_depth items queued, plus one taken from the source and waiting to be put.
    assert len(produced) <= 3 + 1
    assert next(it) == 0
    time.sleep(0.2)
    assert len(produced) <= 3 + 2
    it.close()


def test_close_stops_a_producer_blocked_on_a_full_queue(no_thread_leak):
    it = BackgroundIterator(iter(range(10**9)), prefetch_depth=1)
    time.sleep(0.1)
    assert it.alive
    started = time.monotonic()
    it.close()
    assert not it.alive
    assert time.monotonic() - started < 2.0
    with pytest.raises(StopIteration):
        next(it)
    it.close()  # idempotent


def test_a_close_while_another_thread_closes_waits_for_the_thread_as_that_one_does(
        no_thread_leak, recwarn):
    # The consumer's generator and the loader behind it may close one epoch at once (a state
    # loaded into a loader while its prefetcher reads): the second close waits like the first,
    # and neither warns of an item still being fetched.
    fetching = threading.Event()

    def source():
        yield 0
        fetching.set()
        time.sleep(0.5)  # an item that takes a while
        yield 1

    it = BackgroundIterator(source(), prefetch_depth=1)
    next(it)
    fetching.wait(5)
    first = threading.Thread(target=it.close)
    first.start()
    time.sleep(0.1)  # the first close is waiting for the item
    it.close()
    assert not it.alive
    first.join()
    assert not [w for w in recwarn if "still fetching" in str(w.message)]


def test_close_closes_the_source_generator(no_thread_leak):
    closed = threading.Event()

    def source():
        try:
            yield from range(10**9)
        finally:
            closed.set()

    it = BackgroundIterator(source(), prefetch_depth=2)
    next(it)
    it.close()
    assert closed.is_set()


def test_exception_reaches_consumer_at_its_position_as_the_same_object(no_thread_leak):
    error = KeyError("sample 2 is broken")

    def source():
        yield 0
        yield 1
        raise error

    it = BackgroundIterator(source(), prefetch_depth=4)
    assert next(it) == 0
    assert next(it) == 1
    with pytest.raises(KeyError) as caught:
        next(it)
    assert caught.value is error
    with pytest.raises(StopIteration):
        next(it)
    assert not it.alive


def test_early_break_and_garbage_collection_end_the_thread(no_thread_leak):
    for i in BackgroundIterator(iter(range(10**9)), prefetch_depth=2):
        if i == 5:
            break
    gc.collect()
    # no_thread_leak checks that the thread is gone.


def test_del_ends_the_thread():
    it = BackgroundIterator(iter(range(10**9)), prefetch_depth=2)
    thread = it._thread
    next(it)
    del it
    gc.collect()
    thread.join(5)
    assert not thread.is_alive()


def test_context_manager_closes(no_thread_leak):
    with BackgroundIterator(iter(range(100)), prefetch_depth=2) as it:
        assert next(it) == 0
    assert not it.alive


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_rejects_bad_prefetch_depth(bad):
    with pytest.raises(ValueError, match="prefetch_depth must be a positive int"):
        BackgroundIterator(iter([]), prefetch_depth=bad)


@pytest.mark.slow
def test_interpreter_exit_with_a_blocked_producer_is_prompt():
    script = textwrap.dedent(
        """
        from fastpipe._background import BackgroundIterator
        def source():
            try:
                yield from range(10**9)
            finally:
                print("source closed", flush=True)
        it = BackgroundIterator(source(), prefetch_depth=1)
        next(it)
        print("exiting", flush=True)
        """
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    # The producer is stopped and its source closed before the interpreter goes away.
    assert done.stdout.split() == ["exiting", "source", "closed"]
    assert time.monotonic() - started < 20


@pytest.mark.slow
def test_workers_forked_after_an_earlier_loader_exit_cleanly(sample_root):
    """fastpipe bench runs loaders one after another in one process. DataLoader workers forked
    while an earlier DataLoaderX's iterator was still known to the parent stopped that copy at
    their own exit and exited with code 1 ("DataLoader worker exited unexpectedly")."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "fastpipe", "bench", "--root", str(sample_root),
         "--variants", "dataloaderx,fast-cpu", "--seconds", "2", "--rounds", "1",
         "--no-progress"], capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "exited unexpectedly" not in done.stderr


def _inside_its_second_item() -> tuple[BackgroundIterator, threading.Event]:
    """An iterator whose producer has queued the first item and is inside the second, until the
    event returned is set."""
    release, fetching = threading.Event(), threading.Event()

    def source():
        yield 0
        fetching.set()
        release.wait(30)
        yield 1

    it = BackgroundIterator(source(), prefetch_depth=1)
    assert fetching.wait(5)
    return it, release


@pytest.fixture
def only_new_garbage():
    """The collections in the test find only what it made: the garbage earlier tests left (a
    DataLoader iterator whose finalizer waits up to 5 s for its workers) is collected first, and
    the rest of the suite's heap is frozen out of them."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.mark.usefixtures("only_new_garbage")
def test_garbage_collection_does_not_wait_out_the_item_being_fetched():
    # A consumer dropped while its producer waits on a slow item (a DataLoader polling workers a
    # Ctrl-C killed: 5 s) must not block the thread that drops it; the producer is told to stop
    # and ends after that item. close() itself still waits for it (the contract's 'stoppable').
    it, release = _inside_its_second_item()
    thread = it._thread
    assert next(it) == 0
    dropped = threading.Event()

    def drop():
        nonlocal it
        del it
        gc.collect()
        dropped.set()

    dropper = threading.Thread(target=drop)
    dropper.start()
    try:
        assert dropped.wait(5), "dropping the iterator waited for the item being fetched"
        assert thread.is_alive()  # still inside the item, as expected
    finally:
        release.set()
        dropper.join(30)
    thread.join(5)
    assert not thread.is_alive()


def test_a_close_while_ctrl_c_closes_the_consuming_generator_does_not_wait_out_the_item():
    # A Ctrl-C unwinding through a loop closes the generator that consumes the iterator
    # (fastpipe profile's epochs()): inside it, the exception being handled is GeneratorExit,
    # with the KeyboardInterrupt as its context. close() there must only signal the producer, as
    # under the KeyboardInterrupt itself: the producer may be waiting on DataLoader workers the
    # same Ctrl-C ended (5 s, torch's check), and the command must end within 2 s.
    def consume():
        try:
            # Not `yield from`: it would close the iterator itself, under the KeyboardInterrupt.
            for item in it:  # noqa: UP028
                yield item
        finally:
            it.close()

    it, release = _inside_its_second_item()
    batches = consume()
    assert next(batches) == 0
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            try:
                raise KeyboardInterrupt
            finally:
                batches.close()
        assert time.monotonic() - started < 2.0, "close() waited for the item being fetched"
    finally:
        release.set()
    it.thread.join(5)
    assert not it.thread.is_alive()


@pytest.mark.usefixtures("sigint_default")
def test_a_worker_forked_while_ctrl_c_is_held_ends_quietly_on_ctrl_c():
    """A terminal's Ctrl-C reaches the DataLoader workers too. One that gets it before torch's
    worker loop (while multiprocessing bootstraps it) must end with status 0, as the loop would:
    with a KeyboardInterrupt it ended with status 1 and a traceback, and torch's SIGCHLD handler
    then raised "DataLoader worker exited unexpectedly" in the training process in place of the
    user's KeyboardInterrupt."""
    import multiprocessing
    import os
    import signal

    from fastpipe._background import deferred_interrupt

    context = multiprocessing.get_context("fork")
    with deferred_interrupt():
        worker = context.Process(target=time.sleep, args=(30,))
        worker.start()
    try:
        time.sleep(0.3)  # the worker is in its target, as it would be in its bootstrap
        os.kill(worker.pid, signal.SIGINT)
        worker.join(5)
        assert worker.exitcode == 0
    finally:
        if worker.is_alive():
            worker.kill()
            worker.join()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # this process's own


@pytest.mark.usefixtures("sigint_default")
def test_ctrl_c_in_the_block_is_raised_at_once_before_any_fork_and_held_after_one():
    """deferred_interrupt() holds Ctrl-C only once a fork began (a KeyboardInterrupt inside a
    fork hook would be lost): a block that only waits, for persistent workers to resume say,
    stays interruptible."""
    import os
    import signal

    from fastpipe._background import deferred_interrupt

    reached = []
    with pytest.raises(KeyboardInterrupt):
        with deferred_interrupt():
            signal.raise_signal(signal.SIGINT)
            reached.append("after the signal")
    assert reached == []
    with pytest.raises(KeyboardInterrupt):
        with deferred_interrupt():
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
            signal.raise_signal(signal.SIGINT)
            reached.append("after the signal")
    assert reached == ["after the signal"]  # held to the block's end, then raised
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def _finalizers():
    """Ways a finalizer runs ``call``: a weakref.finalize's callback and an object's __del__."""
    import weakref

    def by_finalize(call):
        class Owner:
            pass
        owner = Owner()
        weakref.finalize(owner, lambda: call())
        del owner

    def by_del(call):
        class Owner:
            def __del__(self):
                call()
        Owner()

    return by_finalize, by_del


def test_the_command_keeps_an_interrupt_lost_in_a_finalizer_quiet():
    """A KeyboardInterrupt raised inside a finalizer cannot propagate: Python prints it as
    "Exception ignored" (a Ctrl-C of `fastpipe profile` did, landing in one) and loses it. The
    command keeps it quiet (its repeat raises it again) and passes every other such error
    on."""
    from fastpipe._cli import _interrupt_until_stopped

    def raising(kind):
        def call():
            raise kind()
        return call

    seen = []

    def recorder(unraisable):
        seen.append(type(unraisable.exc_value))

    before, sys.unraisablehook = sys.unraisablehook, recorder
    try:
        with _interrupt_until_stopped() as interrupts:
            assert interrupts.active
            for finalizing in _finalizers():
                finalizing(raising(KeyboardInterrupt))
                finalizing(raising(ValueError))
        assert seen == [ValueError, ValueError]
        assert sys.unraisablehook is recorder  # given back as the command ends
        _finalizers()[0](raising(KeyboardInterrupt))
        assert seen == [ValueError, ValueError, KeyboardInterrupt]
    finally:
        sys.unraisablehook = before


def test_the_command_holds_ctrl_c_during_its_imports():
    """A KeyboardInterrupt raised inside numpy's compiled start-up is cleared there (the command
    then ran on): the `fastpipe` command holds Ctrl-C while it imports, raises it after, and
    `import fastpipe` itself imports no torch."""
    import signal

    from fastpipe._cli import _Interrupts

    interrupts = _Interrupts(active=True)
    sigchld = signal.getsignal(signal.SIGCHLD)  # the handler resets it, as the command exits
    try:
        with pytest.raises(KeyboardInterrupt):
            with interrupts.held():
                interrupts.handler(signal.SIGINT, None)
                held = True
    finally:
        signal.signal(signal.SIGCHLD, sigchld)
    assert held and interrupts.received.is_set()
    # Inside an import (importlib's frames on the stack) it is held too, for the next repeat.
    later = _Interrupts(active=True)
    inside = compile("handler(2, sys._getframe())", "<frozen importlib._bootstrap>", "eval")
    try:
        eval(inside, {"handler": later.handler, "sys": sys})
    finally:
        signal.signal(signal.SIGCHLD, sigchld)
    assert later.pending
    # Anywhere else it is raised at once.
    elsewhere = _Interrupts(active=True)
    try:
        with pytest.raises(KeyboardInterrupt):
            elsewhere.handler(signal.SIGINT, sys._getframe())
    finally:
        signal.signal(signal.SIGCHLD, sigchld)
    assert not elsewhere.pending and elsewhere.received.is_set()
    done = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import sys, fastpipe, fastpipe._cli
        assert "torch" not in sys.modules and "numpy" not in sys.modules, "imported at once"
        print(fastpipe.DataLoaderX.__module__, "torch" in sys.modules)
        """)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["fastpipe.loader", "True"]


def test_the_command_raises_ctrl_c_in_its_user_s_module_and_holds_it_in_a_library_s(tmp_path):
    """`fastpipe profile file.py:make` imports the user's module: a Ctrl-C while its top-level
    code runs (building a dataset, for minutes) is raised at once, where it was held until the
    module ended. The same module counted as a library's is held, and so is a compiled
    module's start-up wherever the module lives."""
    import importlib.util
    import signal

    from fastpipe._cli import _Interrupts

    (tmp_path / "factory.py").write_text("import sys\nhandler(2, sys._getframe())\nran_on = 1\n")

    def run_module(interrupts):
        spec = importlib.util.spec_from_file_location("fastpipe_test_factory",
                                                      tmp_path / "factory.py")
        module = importlib.util.module_from_spec(spec)
        module.handler = interrupts.handler
        spec.loader.exec_module(module)  # importlib's frames around the module's code
        return module

    sigchld = signal.getsignal(signal.SIGCHLD)  # the handler resets it, as the command exits
    try:
        users = _Interrupts(active=True)
        assert not str(tmp_path).startswith(users.libraries)
        with pytest.raises(KeyboardInterrupt):
            run_module(users)
        assert not users.pending
        library = _Interrupts(active=True)
        library.libraries = (os.path.join(str(tmp_path), ""),)
        assert run_module(library).ran_on == 1 and library.pending
        # importlib running an extension module's start-up (which here runs the user's code).
        compiled = _Interrupts(active=True)
        start_up = {}
        exec(compile("def _call_with_frames_removed(f, *args):\n    return args[0]()\n",
                     "<frozen importlib._bootstrap>", "exec"), start_up)
        users_code = compile("handler(2, sys._getframe())", str(tmp_path / "factory.py"), "exec")
        try:
            start_up["_call_with_frames_removed"](
                _imp.exec_dynamic,
                lambda: exec(users_code, {"handler": compiled.handler, "sys": sys}))
        except KeyboardInterrupt:
            pytest.fail("raised inside a compiled module's start-up")
        assert compiled.pending
    finally:
        signal.signal(signal.SIGCHLD, sigchld)
