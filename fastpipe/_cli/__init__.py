"""The ``fastpipe`` command. Each subcommand is a module in this package that defines

* ``HELP``: one line for ``fastpipe --help``;
* ``add_arguments(parser)``: its argparse arguments;
* ``run(args) -> int``: parses nothing, calls library functions, returns the exit code.

Modules are found automatically, so adding a subcommand touches no other file.
"""

from __future__ import annotations

import _imp
import _thread
import argparse
import contextlib
import importlib
import os
import pkgutil
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any


class CommandError(Exception):
    """A bad argument or a missing path: printed as one line, exit code 2."""


def _commands() -> dict[str, object]:
    found = {}
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            found[info.name] = importlib.import_module(f"{__name__}.{info.name}")
    return dict(sorted(found.items()))


def build_parser() -> argparse.ArgumentParser:
    from fastpipe._version import __version__

    parser = argparse.ArgumentParser(
        prog="fastpipe",
        description="Keep the GPU fed: measure, tune and pack PyTorch input pipelines.",
    )
    parser.add_argument("--version", action="version", version=f"fastpipe {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module in _commands().items():
        help_line = module.HELP  # type: ignore[attr-defined]
        command = sub.add_parser(name, help=help_line, description=help_line)
        module.add_arguments(command)  # type: ignore[attr-defined]
        command.set_defaults(_run=module.run)  # type: ignore[attr-defined]
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    command = "fastpipe"
    try:
        with _interrupt_until_stopped() as interrupts:
            # The imports (torch's among them); a Ctrl-C meanwhile ends the program at once.
            with interrupts.held(exit_now=argv is None):
                parser = build_parser()
            args = parser.parse_args(argv)
            command = f"fastpipe {args.command}"
            return int(args._run(args) or 0)
    except CommandError as error:
        print(f"{command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{command}: interrupted", file=sys.stderr)
        if argv is None:  # the program itself (the `fastpipe` command), not a call from Python
            _exit_at_once(130)
        return 130


def _exit_at_once(code: int) -> None:
    """Ends the process after Ctrl-C without the interpreter's teardown, which takes seconds
    once torch is loaded (measured: 3 s of a 3.5 s exit on a busy 2-core machine, after every
    handler had run). The exit handlers still run (files close, multiprocessing ends its
    workers, temporary folders go); only the clearing of modules and the last collection are
    skipped."""
    import atexit
    import os

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


# After a Ctrl-C, how often the command is interrupted again until it has stopped.
_REPEAT_SECONDS = 0.75


def _importing(frame: Any, libraries: tuple[str, ...] | None) -> bool:
    """Whether ``frame`` runs inside the import of a library (a lazy one: torchvision's, say),
    where a KeyboardInterrupt can land in importlib's own callbacks or in a compiled module's
    start-up (numpy's clears it; pybind11's can end the process). Not inside your own module
    (a factory module ``fastpipe profile`` imports, or one it imports): its top-level code may
    run for minutes (a dataset built over remote shards), and is interrupted like any other
    code of yours. Yours: a module whose file is outside ``libraries`` (the folders of
    :func:`_library_folders`; None: every module is a library's)."""
    module = None  # the outermost top-level code inside the innermost import
    verdict = None
    while frame is not None:
        code = frame.f_code
        if code.co_filename.startswith("<frozen importlib"):
            if (code.co_name == "_call_with_frames_removed"
                    and frame.f_locals.get("f") in _COMPILED_START_UPS):
                return True  # a compiled module's start-up, wherever the module lives
            if verdict is None:
                verdict = (module is None or libraries is None
                           or module.f_code.co_filename.startswith(("<", *libraries)))
        elif verdict is None and code.co_name == "<module>":
            module = frame
        frame = frame.f_back
    return bool(verdict)


# How importlib runs an extension module's own code (3.5 and later).
_COMPILED_START_UPS = (_imp.create_dynamic, _imp.exec_dynamic)


def _library_folders() -> tuple[str, ...] | None:
    """The folders modules are installed in: the standard library's, site-packages, the user's
    site-packages, fastpipe's own; None where they cannot be told."""
    try:
        import site
        import sysconfig

        folders = {sysconfig.get_paths().get(key) for key in ("stdlib", "platstdlib",
                                                              "purelib", "platlib")}
        folders.update(getattr(site, "getsitepackages", list)())
        folders.add(site.getusersitepackages())
        folders.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        return tuple(sorted({os.path.join(f, "") for folder in folders if folder
                             for f in (folder, os.path.realpath(folder))}))
    except Exception:  # noqa: BLE001 - an unusual site module: every import held, as before
        return None


class _Interrupts:
    """The command's Ctrl-C: a KeyboardInterrupt in the main thread, held while ``held()``
    runs (raised at its end) and while a library is imported (raised by the next repeat), and raised
    again every _REPEAT_SECONDS until the command has stopped (an interrupt raised inside a
    finalizer or a fork hook is lost: see :func:`_quiet_lost_interrupts`; one raised inside
    numpy's compiled start-up is cleared)."""

    def __init__(self, active: bool) -> None:
        self.active = active
        self.received, self.stopped = threading.Event(), threading.Event()
        self.holding = self.pending = self.exit_now = False
        self.pid = os.getpid()
        # Found now: the handler runs between any two bytecodes, an import's among them.
        self.libraries = _library_folders() if active else ()

    def handler(self, signum: int, frame: object) -> None:
        self.received.set()
        # Held only in the command's own process: a forked child (a worker started outside
        # deferred_interrupt) has no thread to raise it again later.
        if os.getpid() == self.pid and self.exit_now:
            # Nothing of the command's has run: no file, thread or process to end, and the
            # imports under way (torch's: seconds) need not finish first.
            os.write(2, b"fastpipe: interrupted\n")
            os._exit(130)
        if os.getpid() == self.pid and (self.holding or _importing(frame, self.libraries)):
            self.pending = True  # raised at the end of held(), or by the next repeat
            return
        raise KeyboardInterrupt

    # Read by the profiling runner, which may interrupt the main thread with a SIGINT of its own.
    handler.raises_keyboard_interrupt = True  # type: ignore[attr-defined]

    @contextlib.contextmanager
    def held(self, exit_now: bool = False) -> Iterator[None]:
        """Holds Ctrl-C while imports run: one raised inside a compiled module's start-up can
        be lost, or end the process in C++ (pybind11's terminate). ``exit_now``: a Ctrl-C ends
        the process with 130 instead (the program, before its command has started)."""
        self.holding, self.exit_now = self.active, self.active and exit_now
        try:
            yield
        finally:
            self.holding = self.exit_now = False
        if self.pending:
            raise KeyboardInterrupt

    def repeat(self) -> None:
        self.received.wait()
        while not self.stopped.wait(_REPEAT_SECONDS):
            _thread.interrupt_main()


@contextlib.contextmanager
def _interrupt_until_stopped() -> Iterator[_Interrupts]:
    """Makes one Ctrl-C stop the command even when its KeyboardInterrupt is lost (see
    :class:`_Interrupts`). Only in the main thread, and only where Python's own handler is in
    place (not under a caller's handler)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield _Interrupts(active=False)
        return
    interrupts = _Interrupts(active=True)
    watchdog = threading.Thread(target=interrupts.repeat, name="fastpipe-cli-interrupt",
                                daemon=True)
    signal.signal(signal.SIGINT, interrupts.handler)
    watchdog.start()
    try:
        with _quiet_lost_interrupts():
            yield interrupts
    finally:
        interrupts.stopped.set()
        interrupts.received.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        watchdog.join()


@contextlib.contextmanager
def _quiet_lost_interrupts() -> Iterator[None]:
    """Keeps a KeyboardInterrupt that Python cannot raise (one raised inside a finalizer: a
    ``weakref.finalize`` callback, a ``__del__``) from being printed as "Exception ignored":
    the command's repeat raises it again. Held there instead, it would leave a finalizer that
    waits (a join, a lock) impossible to interrupt. Every other unraisable error is passed
    on."""
    passed_on = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            passed_on(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = passed_on
