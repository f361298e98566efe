"""fastpipe's decoders over public conformance suites (tests/conformance/data/, README.md there):
PngSuite, libpng's test images (its crash reproducers included) and libjpeg-turbo's.

Pillow is the reference. For every file:

- Pillow decodes it: ``decode_rgb`` gives ``np.array(Image.open(f).convert("RGB"))`` exactly;
  for a PNG, ``decode_png`` gives the stored values Pillow gives (``np.array(image)``; 16-bit
  colour compared through its high bytes, which is what Pillow keeps) and a band of rows equal
  to those rows of the whole.
- Pillow refuses it: both raise ``CorruptImageError`` naming the file, with a reason rather than
  Pillow's ``<_io.BytesIO object at 0x...>``.
- The files where fastpipe departs from Pillow by design (``DEPARTURES``) give the outcome
  listed there instead: damage Pillow decodes through is refused with fastpipe._png's reason,
  palette indices past the palette have no colour for ``decode_rgb``, and malformed ancillary
  chunks (whose CRCs hold) are ignored, as libpng ignores them.
- No crash, no hang, no unbounded memory: each suite is decoded in a child process (this module
  run as ``python -m tests.conformance.test_suites SUITE``) with a time limit; a crash names the
  file it was decoding.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.cpu_path import built_module

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[2]
SUITES = ("pngsuite", "libpng", "libjpeg-turbo")
SUFFIXES = (".png", ".jpg")
SECONDS_PER_SUITE = 300
SECONDS_PER_FILE = 10.0
# Peak resident memory a suite's decodes may add to the child's after its imports.
MEMORY_GROWTH = 1 << 30


def _files(suite: str) -> list[str]:
    return sorted(str(p.relative_to(DATA)) for p in (DATA / suite).rglob("*")
                  if p.suffix.lower() in SUFFIXES)


FILES = [f for suite in SUITES for f in _files(suite)]


# Where fastpipe departs from Pillow by design (docs/cpu-path.md, "PNG"): per file, what each
# of decode_rgb and decode_png gives instead, "equal" (Pillow's pixels), "decoded" (where Pillow
# refuses) or the words its CorruptImageError must hold.
_PAST_PALETTE = "palette index"  # the PNG specification's error; Pillow and libpng make it black
DEPARTURES = {
    # Damage fastpipe._png finds and Pillow decodes through (it checks no IDAT CRC, and stops
    # reading at the last row).
    "pngsuite/xcsn0g01.png": {"rgb": "IDAT: CRC error", "png": "IDAT: CRC error"},
    "libpng/contrib/testpngs/crashers/badcrc.png": {"rgb": "IDAT: CRC error",
                                                    "png": "IDAT: CRC error"},
    "libpng/contrib/testpngs/crashers/huge_IDAT.png": {"rgb": "truncated file",
                                                       "png": "truncated file"},
    # Empty cHRM, gAMA, ... chunks with valid CRCs: their contents change no pixel.
    "libpng/contrib/testpngs/crashers/empty_ancillary_chunks.png": {"rgb": "decoded",
                                                                    "png": "decoded"},
    **{f"libpng/contrib/testpngs/badpal/{name}.png": {"rgb": _PAST_PALETTE, "png": "equal"}
       for name in ("regression-palette-8", "small-palette-1", "small-palette-2",
                    "small-palette-4", "small-palette-8", "test-palette-1", "test-palette-2",
                    "test-palette-4", "test-palette-8")},
}


# ------------------------------------------------------------------------------ the child side


def _error(exc: BaseException) -> dict:
    return {"error": type(exc).__name__, "message": str(exc),
            "corrupt": type(exc).__name__ in ("CorruptImageError", "ImageTooLargeError")}


def _pillow(data: bytes) -> tuple[np.ndarray | None, np.ndarray | None, dict | None]:
    """Pillow's RGB pixels and stored values (``np.array(image)``, 1-bit as 0/255), or its
    error."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(data)) as image:
                image.load()
                stored = np.array(image.convert("L") if image.mode == "1" else image)
                return np.array(image.convert("RGB")), stored, None
    except Exception as exc:  # noqa: BLE001 - the reference's verdict, whatever its type
        return None, None, _error(exc)


def _same_png_values(ours: np.ndarray, stored: np.ndarray) -> bool:
    """decode_png's values against Pillow's: equal, or (16-bit colour, which Pillow reduces to 8
    bits, 16-bit grey+alpha to RGBA) equal through the high byte."""
    if ours.dtype == np.uint16 and stored.dtype == np.uint8:
        high = (ours >> 8).astype(np.uint8)
        if ours.ndim == 3 and ours.shape[2] == 2 and stored.ndim == 3 and stored.shape[2] == 4:
            stored = stored[..., [0, 3]]
        return high.shape == stored.shape and np.array_equal(high, stored)
    same_kind = ours.shape == stored.shape and ours.dtype == stored.dtype
    return same_kind and np.array_equal(ours, stored)


def _check(path: Path) -> dict:
    from fastpipe.data import decode_rgb
    from fastpipe.data.decode.png import decode_png

    data = path.read_bytes()
    name = path.name
    rgb, stored, refused = _pillow(data)
    record: dict = {"pillow": refused}
    try:
        ours = decode_rgb(data, name)
        record["rgb"] = "equal" if rgb is not None and np.array_equal(ours, rgb) else (
            f"decoded {ours.shape} where Pillow "
            + ("refuses" if rgb is None else f"gives {rgb.shape}: differs"))
    except Exception as exc:  # noqa: BLE001 - recorded, judged by the test
        record["rgb"] = _error(exc)
    if path.suffix.lower() == ".png":
        try:
            values = decode_png(data, name)
            if stored is None:
                record["png"] = f"decoded {values.shape} {values.dtype} where Pillow refuses"
            elif not _same_png_values(values, stored):
                record["png"] = f"{values.shape} {values.dtype} differ from Pillow's " \
                                f"{stored.shape} {stored.dtype}"
            else:
                record["png"] = "equal"
                height = values.shape[0]
                if height >= 3:
                    band = (height // 3, height // 2 + 1)
                    rows = decode_png(data, name, rows=band)
                    record["band"] = "equal" if np.array_equal(rows, values[band[0]:band[1]]) \
                        else f"rows {band} differ from those rows of the whole"
        except Exception as exc:  # noqa: BLE001 - recorded, judged by the test
            record["png"] = _error(exc)
    return record


def _child(suite: str) -> None:
    """Decodes every file of ``suite``: a ``START`` line before each (so a crash names its file),
    then one JSON record; the peak memory at the end."""
    import fastpipe.data  # noqa: F401 - the imports' memory is the baseline
    import fastpipe.data.decode.png  # noqa: F401

    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    for name in _files(suite):
        print("START", name, flush=True)
        start = time.perf_counter()
        record = _check(DATA / name)
        record.update(file=name, seconds=time.perf_counter() - start)
        print("RECORD", json.dumps(record), flush=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print("MEMORY", json.dumps({"baseline": baseline, "peak": peak}), flush=True)


# ----------------------------------------------------------------------------- the test side


class SuiteRun:
    """One child's run over a suite: the records by file, its peak memory, and how it ended."""

    def __init__(self, suite: str) -> None:
        self.records: dict[str, dict] = {}
        self.memory: dict | None = None
        self.failure: str | None = None
        started: str | None = None
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        try:
            run = subprocess.run([sys.executable, "-m", "tests.conformance.test_suites", suite],
                                 cwd=ROOT, env=env, capture_output=True, text=True,
                                 timeout=SECONDS_PER_SUITE)
            output, code = run.stdout, run.returncode
        except subprocess.TimeoutExpired as exc:
            output, code = (exc.stdout or b"").decode(errors="replace"), None
        for line in output.splitlines():
            kind, _, rest = line.partition(" ")
            if kind == "START":
                started = rest
            elif kind == "RECORD":
                record = json.loads(rest)
                self.records[record["file"]] = record
                started = None
            elif kind == "MEMORY":
                self.memory = json.loads(rest)
        if code is None:
            self.failure = f"hung: no end after {SECONDS_PER_SUITE} s, decoding {started}"
        elif code != 0:
            self.failure = (f"the child ended with status {code} while decoding {started}: "
                            f"{run.stderr[-2000:]}")


@pytest.fixture(scope="module")
def suite_runs() -> dict[str, SuiteRun]:
    return {}


def _record(suite_runs: dict[str, SuiteRun], name: str) -> dict:
    suite = name.split("/")[0]
    if suite not in suite_runs:
        suite_runs[suite] = SuiteRun(suite)
    run = suite_runs[suite]
    record = run.records.get(name)
    if record is None:
        pytest.fail(f"{name}: no result ({run.failure or 'the child skipped it'})", pytrace=False)
    assert record["seconds"] < SECONDS_PER_FILE, f"{name} took {record['seconds']:.1f} s"
    return record


def _assert_clear_refusal(result, name: str, decoder: str) -> None:
    assert isinstance(result, dict), f"{decoder} gave pixels ({result}) where Pillow refuses"
    message = result["message"]
    assert result["corrupt"], f"{decoder} raised {result['error']}: {message}"
    assert name.rsplit("/", 1)[-1] in message, f"{decoder}'s error names no file: {message}"
    assert "object at 0x" not in message, f"{decoder}'s error quotes an object: {message}"


def _assert_departure(result, expected: str, name: str, decoder: str) -> None:
    if expected == "equal":
        assert result == "equal", result
    elif expected == "decoded":
        assert isinstance(result, str) and result.startswith("decoded"), result
    else:
        _assert_clear_refusal(result, name, decoder)
        assert expected in result["message"], result["message"]


@pytest.mark.slow
@pytest.mark.parametrize("name", FILES)
def test_decode_rgb_gives_pillows_pixels_or_a_clear_error(suite_runs, name):
    record = _record(suite_runs, name)
    if name in DEPARTURES and importlib.util.find_spec("fastpipe._png") is not None:
        _assert_departure(record["rgb"], DEPARTURES[name]["rgb"], name, "decode_rgb")
    elif record["pillow"] is None:
        assert record["rgb"] == "equal", record["rgb"]
    else:
        _assert_clear_refusal(record["rgb"], name, "decode_rgb")


@pytest.mark.slow
@pytest.mark.parametrize("name", [f for f in FILES if f.endswith(".png")])
def test_decode_png_gives_pillows_values_or_a_clear_error(suite_runs, name):
    # Without fastpipe._png, 16-bit colour PNGs are refused by design (Pillow would reduce them).
    built_module("fastpipe._png", "install libpng's headers and reinstall fastpipe",
                 "FASTPIPE_REQUIRE_PNG")
    record = _record(suite_runs, name)
    if name in DEPARTURES:
        _assert_departure(record["png"], DEPARTURES[name]["png"], name, "decode_png")
    elif record["pillow"] is None:
        assert record["png"] == "equal", record["png"]
        assert record.get("band", "equal") == "equal", record["band"]
    else:
        _assert_clear_refusal(record["png"], name, "decode_png")


@pytest.mark.slow
@pytest.mark.parametrize("suite", SUITES)
def test_a_suite_decodes_without_crash_hang_or_memory_growth(suite_runs, suite):
    if suite not in suite_runs:
        suite_runs[suite] = SuiteRun(suite)
    run = suite_runs[suite]
    assert run.failure is None, run.failure
    assert sorted(run.records) == _files(suite)
    assert run.memory is not None
    growth = run.memory["peak"] - run.memory["baseline"]
    assert growth < MEMORY_GROWTH, f"{suite}: decoding grew the peak memory by {growth} bytes"


def test_the_suites_are_here():
    """The copies this module reads (a clean clone has them; /work/shared need not exist)."""
    for suite in SUITES:
        assert len(_files(suite)) >= 10, suite
        assert any((DATA / suite).glob("LICENSE*")), f"{suite} without its licence"


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in SUITES:
        sys.exit(f"usage: python -m tests.conformance.test_suites {{{','.join(SUITES)}}}")
    _child(sys.argv[1])
