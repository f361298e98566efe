"""A mutational fuzz driver over fastpipe's native entry points (docs/fuzzing.md).

Each execution takes a seed of the corpus, mutates it (bytes, markers, frame fields, restart
intervals, fill bytes, splices) and calls one target with arguments drawn around the image's
size (narrow crops and image edges included). A target returns normally or raises what its
contract allows (ValueError for data it refuses; RuntimeError for a resize box the caller got
wrong); anything else is a finding: another exception, a mismatch of two decoders of the same
data, an execution over ``--timeout`` seconds, or, in a sanitizer build, the sanitizer's report
(which ends the process: the input is in FINDINGS/current.bin then).

    python -m fuzz.harness CORPUS [--seconds 120] [--lib DIR] [--findings DIR] [--seed 0]
    python -m fuzz.harness CORPUS --targets python  # the Python layers (packs, images, sources)
    python -m fuzz.harness --replay FILE ...      # every native target on the files, unmutated

A target is a function ``(data, rng) -> None`` registered with ``@target("name")``: adding one
(another decoder) is a function here. ``--targets`` takes names or groups: ``native`` (the
default: fastpipe._jpeg, _resize and _png, run under the sanitizers), ``packs`` (the pack readers
of fuzz/packs.py: damaged packs opened, read and verified), ``images`` (fuzz/images.py: the PNG
paths around fastpipe._png, against Pillow), ``sources`` (fuzz/sources.py: tar shards and their
indexes against tarfile, users' plain HDF5 files against h5py), and ``python``, the last three
together: pure Python over h5py, lmdb, tarfile, Pillow and the installed extensions, run without
the sanitizer preload. Each execution picks one of the groups asked for, then one of its
targets, so that a group of many targets does not crowd out the others.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import importlib.util
import json
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from fuzz import KnownIssue, PeakMemory

# The pixel budget the fuzzed calls pass: far below the default, so that mutated frame sizes
# decode in milliseconds under the sanitizers; the budget check itself is what they exercise.
FUZZ_MAX_PIXELS = 1 << 22
# fastpipe.data.decode.png.MAX_DEFLATE_RATIO (a test keeps them equal), not imported: the native
# targets run under the sanitizers without fastpipe's Python layers (and torch) loaded.
MAX_DEFLATE_RATIO = 1032

TARGETS: dict[str, Callable[[bytes, np.random.Generator], None]] = {}
# The seeds a target is fed (a test of a seed's bytes); a target not named here takes any seed.
SEEDS: dict[str, Callable[[bytes], bool]] = {}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
jpeg = resize = png = None


class Finding(Exception):
    """A result no input may give (a mismatch between two decoders of the same data)."""


def target(name: str, seeds: bytes | None = None):
    """Registers ``(data, rng) -> None`` as target ``name``, fed the seeds that start with
    ``seeds`` (all when None)."""
    def register(function):
        TARGETS[name] = function
        if seeds is not None:
            SEEDS[name] = lambda data: data.startswith(seeds)
        return function
    return register


def load(lib: Path | None) -> None:
    """fastpipe._jpeg, _resize and _png: from ``lib`` (a sanitizer build's folder holding
    fastpipe/_jpeg*.so), else the installed ones."""
    global jpeg, resize, png
    if lib is None:
        import fastpipe._jpeg as jpeg_module
        import fastpipe._png as png_module
        import fastpipe._resize as resize_module
        jpeg, resize, png = jpeg_module, resize_module, png_module
        return
    loaded = {}
    for name in ("_jpeg", "_resize", "_png"):
        path = next((lib / "fastpipe").glob(f"{name}.*.so"))
        spec = importlib.util.spec_from_file_location(f"fastpipe.{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        loaded[name] = module
    jpeg, resize, png = loaded["_jpeg"], loaded["_resize"], loaded["_png"]


def frame_size(data: bytes) -> tuple[int, int]:
    """(height, width) of the first frame header, or a small guess (the call then refuses)."""
    at = 2
    while at + 9 <= len(data):
        if data[at] != 0xFF:
            break
        marker = data[at + 1]
        if marker == 0xFF:
            at += 1
            continue
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height, width = data[at + 5] << 8 | data[at + 6], data[at + 7] << 8 | data[at + 8]
            return max(1, height), max(1, width)
        if marker == 0xDA:
            break
        at += 2 + (data[at + 2] << 8 | data[at + 3])
    return 16, 16


def _span(rng: np.random.Generator, full: int) -> tuple[int, int]:
    """(start, length) within ``full``: narrow spans (1-3 pixels) and spans at the edges often."""
    full = max(full, 1)
    pick = rng.integers(6)
    if pick == 0:
        length = int(rng.integers(1, 4))
    elif pick == 1:
        length = full
    else:
        length = int(rng.integers(1, full + 1))
    length = min(length, full)
    where = rng.integers(4)
    if where == 0:
        start = 0
    elif where == 1:
        start = full - length
    else:
        start = int(rng.integers(0, full - length + 1))
    if rng.integers(20) == 0:  # now and then a box outside the image
        start += int(rng.integers(1, 9))
    return start, length


def _region(data: bytes, rng: np.random.Generator) -> tuple[int, tuple[int, int, int, int], bool]:
    height, width = frame_size(data)
    k = int(rng.choice([1, 1, 2, 4, 8]))
    dh, dw = -(-height // k), -(-width // k)
    top, h = _span(rng, dh)
    left, w = _span(rng, dw)
    return k, (top, left, h, w), bool(rng.integers(2))


def _pixels(result, h: int, w: int) -> np.ndarray:
    pixels, stride, column = result
    rows = np.frombuffer(pixels, np.uint8, count=h * stride).reshape(h, stride // 3, 3)
    return rows[:, column:column + w]


@target("decode_region")
def _decode_region(data: bytes, rng: np.random.Generator) -> None:
    k, box, fast = _region(data, rng)
    try:
        jpeg.decode_region(data, k, *box, fast, FUZZ_MAX_PIXELS)
    except ValueError:
        pass


@target("huffman_vs_libjpeg")
def _huffman_vs_libjpeg(data: bytes, rng: np.random.Generator) -> None:
    """fastpipe's Huffman decoder and libjpeg-turbo's give the same pixels or the same refusal."""
    k, box, fast = _region(data, rng)
    outcomes = []
    for enabled in (True, False):
        before, _ = jpeg._huffman(enabled)
        try:
            outcomes.append(_pixels(jpeg.decode_region(data, k, *box, fast, FUZZ_MAX_PIXELS),
                                    box[2], box[3]).copy())
        except ValueError:
            outcomes.append(None)
        finally:
            jpeg._huffman(before)
    ours, theirs = outcomes
    # fastpipe's may refuse what libjpeg's decodes (non-standard FF FF 00 stuffing: the caller
    # then decodes whole with libjpeg's), never the other way, and never give other pixels.
    if (ours is not None and theirs is None) or (
            ours is not None and not np.array_equal(ours, theirs)):
        raise Finding(f"Huffman decoders differ at 1/{k}, box {box}, fast_upsample={fast}: "
                      f"fastpipe's {'refused' if ours is None else 'decoded'}, libjpeg's "
                      f"{'refused' if theirs is None else 'decoded'}")


@target("decode_resize")
def _decode_resize(data: bytes, rng: np.random.Generator) -> None:
    k, box, fast = _region(data, rng)
    oh, ow = int(rng.integers(1, 40)), int(rng.integers(1, 40))
    out = np.empty((3, oh, ow), np.uint8)
    try:
        jpeg.decode_resize(data, k, box, fast, (0, 0), (box[2], box[3]), out, (0, 0), (oh, ow),
                           bool(rng.integers(2)), int(rng.integers(2)), FUZZ_MAX_PIXELS)
    except (ValueError, RuntimeError):
        pass


def _extreme(rng: np.random.Generator) -> float:
    return float(rng.choice([0.0, 1e-300, 1e-3, 0.08, 0.5, 1.0, 4 / 3, 1e3, 1e300, np.inf,
                             -1.0, np.nan]))


@target("decode_train")
def _decode_train(data: bytes, rng: np.random.Generator) -> None:
    oh, ow = int(rng.integers(1, 40)), int(rng.integers(1, 40))
    out = np.empty((3, oh, ow), np.uint8)
    if rng.integers(4) == 0:
        scale = sorted((_extreme(rng), _extreme(rng)))
        ratio = sorted((_extreme(rng), _extreme(rng)))
    else:
        scale, ratio = (0.08, 1.0), (0.75, 4 / 3)
    gap = float(rng.choice([1.0, 2.0, np.inf]))
    try:
        jpeg.decode_train(data, int(rng.integers(1 << 62)), out, tuple(scale), tuple(ratio), 0.5,
                          gap, bool(rng.integers(2)), int(rng.integers(2)), FUZZ_MAX_PIXELS)
    except (ValueError, RuntimeError):
        pass


@target("train_plan")
def _train_plan(data: bytes, rng: np.random.Generator) -> None:
    height, width = frame_size(data)
    scale, ratio = sorted((_extreme(rng), _extreme(rng))), sorted((_extreme(rng), _extreme(rng)))
    try:
        jpeg._train_plan(height, width, int(rng.integers(1 << 62)),
                         (int(rng.integers(1, 1 << 24)), int(rng.integers(1, 1 << 24))),
                         tuple(scale), tuple(ratio), 0.5, 1.0)
    except ValueError:
        pass


@target("transcode")
def _transcode(data: bytes, rng: np.random.Generator) -> None:
    try:
        rewritten = jpeg.transcode(data, FUZZ_MAX_PIXELS)
    except ValueError:
        return
    k, box, fast = _region(rewritten, rng)
    try:  # the restart-segment assembly of decode_region
        jpeg.decode_region(rewritten, k, *box, fast, FUZZ_MAX_PIXELS)
    except ValueError:
        pass


@target("resize")
def _resize(data: bytes, rng: np.random.Generator) -> None:
    """fastpipe._resize on pixels made of the input's bytes, with boxes drawn around them."""
    h, w = int(rng.integers(1, 24)), int(rng.integers(1, 24))
    pixels = np.resize(np.frombuffer(data, np.uint8), (h, w, 3))
    fh, fw = h + int(rng.integers(0, 3)), w + int(rng.integers(0, 3))
    oh, ow = int(rng.integers(1, 30)), int(rng.integers(1, 30))
    out = np.empty((3, oh, ow), np.uint8)
    at = (int(rng.integers(0, fh - h + 1)), int(rng.integers(0, fw - w + 1)))
    size = (oh + int(rng.integers(0, 4)), ow + int(rng.integers(0, 4)))
    try:
        resize.resize(pixels, at, (fh, fw), out, (int(rng.integers(0, 2)), int(rng.integers(0, 2))),
                      size, bool(rng.integers(2)), int(rng.integers(2)))
    except (ValueError, RuntimeError):
        pass


# Channels of each PNG colour type (IHDR) and the bit depths it may have, as
# fastpipe/data/decode/png.py reads them (a test keeps the depths equal).
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
_PNG_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}


@target("png_decode", seeds=PNG_SIGNATURE)
def _png_decode(data: bytes, rng: np.random.Generator) -> None:
    """fastpipe._png on a band of rows (or all), with the output sized from the IHDR as
    fastpipe.data.decode.png sizes it: fastpipe's own decoder for 8/16-bit files that are not
    interlaced (seekable ones from their segment), libpng for the rest. A file too short for
    the image data its header declares is refused there before anything is allocated, so it is
    not decoded here either; the output's allocation is traced against the file's length."""
    if len(data) < 33 or data[:8] != PNG_SIGNATURE:
        return
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    depth, color_type = data[24], data[25]
    if color_type not in _PNG_CHANNELS or height == 0 or width == 0:
        return
    if depth not in _PNG_DEPTHS[color_type]:  # refused before sizing: 0 would size nothing below
        return
    if -(-height * width * _PNG_CHANNELS[color_type] * depth // 8) > MAX_DEFLATE_RATIO * len(data):
        return
    if height * width > FUZZ_MAX_PIXELS:
        try:  # the budget check itself, before any allocation
            png.decode(data, bytearray(0), height, width, 1, 1, 0, 1, FUZZ_MAX_PIXELS)
        except ValueError:
            pass
        return
    channels, sample = _PNG_CHANNELS[color_type], 2 if depth == 16 else 1
    top, rows = _span(rng, height)
    top, rows = min(top, height - 1), max(1, min(rows, height - min(top, height - 1)))
    if rng.integers(4) == 0:
        top, rows = 0, height
    with PeakMemory() as peak:
        out = bytearray(rows * width * channels * sample)
        try:
            png.decode(data, out, height, width, channels, sample, top, top + rows,
                       FUZZ_MAX_PIXELS, bool(rng.integers(2)))  # a seekable file's index, or not
        except ValueError:
            pass
    bound = 8 * MAX_DEFLATE_RATIO * len(data) + (1 << 20)
    if peak.bytes > bound:
        raise Finding(f"the decode of a {len(data)}-byte file allocated {peak.bytes} bytes, past "
                      f"{bound}")


# --- mutations -----------------------------------------------------------------------------

def _fix_png_crcs(data: bytearray) -> bytearray:
    """Every chunk's CRC recomputed, so that a mutation reaches the inflate and the filters
    instead of stopping at a CRC check."""
    import zlib

    pos = 8
    while pos + 12 <= len(data):
        length = int.from_bytes(data[pos:pos + 4], "big")
        end = pos + 8 + length
        if end + 4 > len(data):
            break
        data[end:end + 4] = (zlib.crc32(bytes(data[pos + 4:end])) & 0xFFFFFFFF).to_bytes(4, "big")
        pos = end + 4
    return data


def _markers(data: bytearray) -> list[int]:
    return [i for i in range(len(data) - 1) if data[i] == 0xFF and data[i + 1] not in (0, 0xFF)]


def mutate(data: bytes, corpus: list[bytes], rng: np.random.Generator) -> bytes:
    out = bytearray(data)
    for _ in range(int(rng.integers(1, 5))):
        if not out:
            out = bytearray(b"\xff\xd8\xff\xd9")
        n = len(out)
        kind = int(rng.integers(12))
        at = int(rng.integers(n))
        if kind == 0:
            out[at] ^= 1 << int(rng.integers(8))
        elif kind == 1:
            out[at] = int(rng.choice([0, 0xFF, 0x7F, 0x80, 1, int(rng.integers(256))]))
        elif kind == 2:
            out[at:at] = rng.integers(0, 256, int(rng.integers(1, 16)), dtype=np.uint8).tobytes()
        elif kind == 3:
            del out[at:at + int(rng.integers(1, 64))]
        elif kind == 4:
            end = min(n, at + int(rng.integers(1, 256)))
            out[int(rng.integers(n)):0] = out[at:end]
        elif kind == 5:  # splice another seed's tail
            other = corpus[int(rng.integers(len(corpus)))]
            cut = int(rng.integers(len(other)))
            out = out[:at] + bytearray(other[cut:])
        elif kind == 6:  # a 16-bit field after a marker: lengths, frame sizes, restart intervals
            markers = _markers(out)
            if markers:
                m = markers[int(rng.integers(len(markers)))] + 2 + 2 * int(rng.integers(5))
                if m + 2 <= n:
                    value = int(rng.choice([0, 1, 2, 3, 8, 255, 256, 0x7FFF, 0xFFFF,
                                            int(rng.integers(1 << 16))]))
                    out[m:m + 2] = value.to_bytes(2, "big")
        elif kind == 7:  # fill bytes, stuffing and markers inside the entropy data
            out[at:at] = bytes(rng.choice([b"\xff" * int(rng.integers(1, 300)), b"\xff\x00",
                                           b"\xff\xff\x00", b"\xff\xd0", b"\xff\xd7",
                                           b"\xff\xd9", b"\xff\xdc\x00\x04\x00\x01"]))
        elif kind == 8:
            del out[at:]
        elif kind == 9:  # sampling factors and component counts of the frame header
            markers = [m for m in _markers(out) if 0xC0 <= out[m + 1] <= 0xC2]
            if markers and markers[0] + 19 < n:
                m = markers[0] + 11 + 3 * int(rng.integers(3))
                out[m] = int(rng.choice([0x11, 0x12, 0x21, 0x22, 0x41, 0x14, 0x42, 0x24, 0x31,
                                         0x44, 0x00, int(rng.integers(256))]))
        elif kind == 10:
            end = min(n, at + int(rng.integers(1, 64)))
            chunk = out[at:end]
            del out[at:end]
            where = int(rng.integers(len(out) + 1))
            out[where:where] = chunk
        else:  # the end-of-image marker back, so that the region paths take the file
            if out[-2:] != b"\xff\xd9" and out[:8] != PNG_SIGNATURE:
                out += b"\xff\xd9"
    if out[:8] == PNG_SIGNATURE and rng.integers(3):
        out = _fix_png_crcs(out)
    elif out[257:262] == b"ustar" and rng.integers(3):
        from fuzz.sources import fix_checksums

        out = fix_checksums(out)  # tar headers: damage reaches the fields behind the checksum
    return bytes(out)


# --- driver --------------------------------------------------------------------------------

def _save(findings: Path, name: str, data: bytes, note: str) -> None:
    findings.mkdir(parents=True, exist_ok=True)
    (findings / f"{name}.bin").write_bytes(data)
    (findings / f"{name}.txt").write_text(note + "\n")


@contextmanager
def _alarm_ends_the_process() -> Iterator[None]:
    """Inside, SIGALRM (armed per execution with setitimer) ends the process with every
    thread's traceback, the execution's input left in FINDINGS/current.bin: faulthandler's C
    handler dumps them, even inside a native call that holds the GIL, then the default action
    ends the process. A timer, not faulthandler.dump_traceback_later: its watchdog is a thread
    started per execution, and that thread's first free of raw memory races PeakMemory's
    tracemalloc.start() and stop() (a SEGV in tracemalloc_free)."""
    # The caller's alarm (pytest-timeout's, in the tests) is put back as it would have run on.
    left, _ = signal.setitimer(signal.ITIMER_REAL, 0)
    began = time.monotonic()
    previous = signal.signal(signal.SIGALRM, signal.SIG_DFL)
    faulthandler.register(signal.SIGALRM, all_threads=True, chain=True)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.unregister(signal.SIGALRM)
        signal.signal(signal.SIGALRM, previous)
        if left:
            signal.setitimer(signal.ITIMER_REAL, max(left - (time.monotonic() - began), 1e-3))


def run(corpus_dir: Path, seconds: float, findings: Path, seed: int, timeout: float,
        groups: list[list[str]]) -> int:
    corpus = [p.read_bytes() for p in sorted(corpus_dir.glob("*")) if p.is_file()]
    if not corpus:
        raise SystemExit(f"no seeds in {corpus_dir}: run python -m fuzz.corpus first")
    findings.mkdir(parents=True, exist_ok=True)
    current = findings / "current.bin"
    rng = np.random.default_rng(seed)
    counts: Counter[str] = Counter()
    slowest: list[tuple[float, str]] = []
    known: Counter[str] = Counter()
    found = 0
    start = time.monotonic()
    fed = {name: [d for d in corpus if SEEDS.get(name, bool)(d)] or corpus
           for group in groups for name in group}
    with _alarm_ends_the_process():
        while time.monotonic() - start < seconds:
            group = groups[int(rng.integers(len(groups)))]
            name = group[int(rng.integers(len(group)))]
            base = fed[name][int(rng.integers(len(fed[name])))]
            data = base if rng.integers(10) == 0 else mutate(base, corpus, rng)
            call_seed = int(rng.integers(1 << 62))
            current.write_bytes(data)
            (findings / "current.txt").write_text(f"target {name}, argument seed {call_seed}\n")
            signal.setitimer(signal.ITIMER_REAL, timeout)
            began = time.perf_counter()
            try:
                TARGETS[name](data, np.random.default_rng(call_seed))
            except KnownIssue as exc:
                kind = str(exc).split(" [", 1)[0]
                if not known[kind]:
                    print(f"KNOWN {kind} (first: {str(exc)[len(kind):][:300].strip()})", flush=True)
                known[kind] += 1
            except Exception as exc:  # noqa: BLE001 - anything a target's contract does not allow
                found += 1
                _save(findings, f"{name}-{found}", data,
                      f"target {name}, argument seed {call_seed}: {type(exc).__name__}: {exc}")
                print(f"FINDING {name}: {type(exc).__name__}: {exc}", flush=True)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            took = time.perf_counter() - began
            slowest = sorted(slowest + [(took, name)], reverse=True)[:5]
            counts[name] += 1
    current.unlink(missing_ok=True)
    (findings / "current.txt").unlink(missing_ok=True)
    summary = {"executions": sum(counts.values()), "seconds": round(time.monotonic() - start, 1),
               "seeds": len(corpus), "per_target": dict(counts), "findings": found,
               "known": dict(known), "slowest_s": [[round(t, 3), n] for t, n in slowest]}
    print(json.dumps(summary))
    return 1 if found else 0


def _sweep(data: bytes) -> None:
    """Every narrow crop (1-3 columns) at every column, at every scale, both upsamplings."""
    height, width = frame_size(data)
    for k in (1, 2, 4, 8):
        dh, dw = -(-height // k), -(-width // k)
        for fast in (True, False):
            for w in (1, 2, 3):
                for left in range(0, max(dw - w + 1, 1)):
                    try:
                        jpeg.decode_region(data, k, 0, left, min(dh, 4), w, fast, FUZZ_MAX_PIXELS)
                    except ValueError:
                        pass


def replay(files: list[Path], names: list[str], seeds: list[int], sweep: bool = True) -> int:
    """Targets on each file as it is (arguments from fixed seeds) and the narrow-crop sweep."""
    bad = 0
    for path in files:
        data = path.read_bytes()
        if sweep:
            _sweep(data)
        for name in names:
            for call_seed in seeds:
                try:
                    TARGETS[name](data, np.random.default_rng(call_seed))
                except Exception as exc:  # noqa: BLE001
                    bad += 1
                    print(f"FINDING {path.name} {name} seed {call_seed}: {exc}", flush=True)
    print(json.dumps({"replayed": len(files), "findings": bad}))
    return 1 if bad else 0


# The groups of Python targets (no sanitizer preload), each a module with TARGETS (and SEEDS);
# importing one loads numpy only.
PYTHON_GROUPS = {"packs": "fuzz.packs", "images": "fuzz.images", "sources": "fuzz.sources"}


def _python_groups() -> dict[str, list[str]]:
    """Registers every Python target (the groups' modules' TARGETS and SEEDS), with the pixel
    budget of the fuzzed calls for the images they decode; their names by group."""
    import fastpipe.data.decode.budget as decode

    decode.MAX_IMAGE_PIXELS = FUZZ_MAX_PIXELS
    out = {}
    for group, name in PYTHON_GROUPS.items():
        module = importlib.import_module(name)
        TARGETS.update(module.TARGETS)
        SEEDS.update(getattr(module, "SEEDS", {}))
        out[group] = list(module.TARGETS)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", type=Path, nargs="?")
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--lib", type=Path, help="a sanitizer build's folder (fuzz/.build/lib)")
    parser.add_argument("--findings", type=Path, default=Path("fuzz/findings"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=10.0,
                        help="seconds one execution may take before it counts as a hang")
    parser.add_argument("--targets", default="native",
                        help="comma-separated names or groups (native, packs, images, sources, "
                             f"python), of: {', '.join(TARGETS)}, and the targets of "
                             f"{', '.join(PYTHON_GROUPS.values())}")
    parser.add_argument("--replay", type=Path, nargs="+")
    parser.add_argument("--call-seed", type=int,
                        help="with --replay: this argument seed only (a finding's .txt names it)")
    args = parser.parse_args(argv)
    load(args.lib)
    native = list(TARGETS)
    wanted = [t for t in args.targets.split(",") if t]
    asked = [g for t in wanted for g in ((*PYTHON_GROUPS,) if t == "python" else (t,))]
    for group in asked:
        if group in PYTHON_GROUPS:
            try:  # a group that would test nothing here (fastpipe._png not built) fails the run
                getattr(importlib.import_module(PYTHON_GROUPS[group]), "require", lambda: None)()
            except RuntimeError as exc:
                raise SystemExit(f"fuzz: the {group} targets cannot run: {exc}") from exc
    python = _python_groups() if set(asked) - {"native", *native} else {}
    groups = [native if t == "native" else python.get(t, [t]) for t in asked]
    unknown = {name for group in groups for name in group} - set(TARGETS)
    if unknown:
        parser.error(f"unknown targets {sorted(unknown)}; known: {sorted(TARGETS)}")
    in_python = {name for group in groups for name in group} - set(native)
    if in_python & set(python.get("packs", ())):
        if args.corpus is None:
            parser.error("the pack targets build their packs from a corpus: give its folder")
        from fuzz import packs

        packs.set_corpus([p.read_bytes() for p in sorted(args.corpus.glob("*")) if p.is_file()])
    if args.replay:
        seeds = list(range(8)) if args.call_seed is None else [args.call_seed]
        targets = [name for group in groups for name in group]
        sys.exit(replay(args.replay, targets, seeds, sweep=not in_python))
    if args.corpus is None:
        parser.error("give a corpus folder (python -m fuzz.corpus OUT writes one) or --replay")
    sys.exit(run(args.corpus, args.seconds, args.findings, args.seed, args.timeout, groups))


if __name__ == "__main__":
    main()
