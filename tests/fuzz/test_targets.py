"""The fuzz lane's Python targets (fuzz/images.py, fuzz/sources.py): they find nothing on fixed
argument seeds (what the lane's bounded run draws at random), and each finds the defect it is
there for when one is planted (a target that cannot fail checks nothing)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tarfile
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("h5py", exc_type=ImportError)

from fastpipe.data import PackFormatError  # noqa: E402
from fuzz import images, sources  # noqa: E402
from fuzz.corpus import png_seeds, tar_seeds  # noqa: E402


@pytest.fixture(scope="module")
def pngs() -> list[bytes]:
    return [data for name, data in sorted(png_seeds().items())
            if not name.startswith("seekable")][::3]


@pytest.fixture(scope="module")
def tars(pngs) -> list[bytes]:
    return list(tar_seeds(pngs[:3]).values())


def _run(function, inputs: list[bytes], seeds: range) -> list[str]:
    findings = []
    for call_seed in seeds:
        data = inputs[call_seed % len(inputs)]
        try:
            function(data, np.random.default_rng(call_seed))
        except (images.Finding, sources.Finding) as exc:
            findings.append(f"seed {call_seed}: {exc}")
    return findings


def test_the_png_paths_find_nothing_on_the_seeds(pngs):
    assert not _run(images.png_paths, pngs, range(len(pngs)))


def test_the_source_targets_find_nothing_on_fixed_seeds(tars, pngs):
    assert not _run(sources.tar_shard, tars, range(30))
    assert not _run(sources.hdf5_plain, pngs, range(30))


def _damaged(png: bytes) -> bytes:
    """``png`` with a byte of its first IDAT's data changed (its CRC no longer matching)."""
    data = bytearray(png)
    data[data.index(b"IDAT") + 8] ^= 0x01
    return bytes(data)


def test_the_png_paths_find_pillow_asked_behind_a_damage_verdict(monkeypatch):
    """The old fallback (Pillow decoding what fastpipe._png called damaged) is a finding."""
    pytest.importorskip("fastpipe._png")
    from PIL import Image

    from fastpipe.data.decode import png

    buffer = io.BytesIO()
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(buffer, format="PNG")
    raw = b"".join(b"\0" + bytes(48) for _ in range(16)) + bytes(64)
    stored = zlib.compress(raw, 0)  # Pillow stops after the last row: it decodes the damage
    good = buffer.getvalue()
    start = good.index(b"IDAT") - 4
    end = good.index(b"IEND") - 4
    good = (good[:start] + len(stored).to_bytes(4, "big") + b"IDAT" + stored
            + zlib.crc32(b"IDAT" + stored).to_bytes(4, "big") + good[end:])
    damaged = bytearray(good)
    damaged[start + 8 + 2 + 5 + 20] ^= 0x01
    images.png_paths(good, np.random.default_rng(0))
    images.png_paths(bytes(damaged), np.random.default_rng(0))  # refused: nothing to find

    def old(data, source, header, rows, seekable=False):
        try:
            return png._decode_native(data, header, rows, seekable), None
        except ValueError as exc:
            return None, exc

    monkeypatch.setattr(png, "_judged", old)
    with pytest.raises(images.Finding, match="calls the file damaged"):
        images.png_paths(bytes(damaged), np.random.default_rng(0))


def _headers(shard: bytes) -> list[bytes]:
    """The 512-byte blocks of a seed that are headers (the magic at its place)."""
    return [shard[at:at + 512] for at in range(0, len(shard) - 511, 512)
            if shard[at + 257:at + 262] == b"ustar"]


def test_the_tar_seeds_hold_each_format_s_long_names(pngs):
    """Each seed exercises what its format is for: GNU long-name headers (type L), pax
    extended headers (type x) for names past 100 bytes and for non-ASCII names, a ustar name
    split into a prefix (byte 345 on) and a name, an extended header holding only a float mtime
    before each member (as webdataset writes)."""
    seeds = tar_seeds(pngs[:3])
    assert any(h[156:157] == b"L" for h in _headers(seeds["tar-gnu-long"]))
    for name in ("tar-pax", "tar-pax-long"):
        records = b"".join(seeds[name][at + 512:at + 1024] for at in range(
            0, len(seeds[name]) - 511, 512) if seeds[name][at + 156:at + 157] == b"x"
            and seeds[name][at + 257:at + 262] == b"ustar")
        assert b" path=" in records, name
    assert "\u00e9".encode() in seeds["tar-pax"]
    ustar = _headers(seeds["tar-ustar"])
    assert all(h[257:265] == b"ustar\x0000" for h in ustar)
    assert all(h[345] and h[156:157] == b"0" for h in ustar)
    with tarfile.open(fileobj=io.BytesIO(seeds["tar-ustar"])) as tar:
        names = tar.getnames()
    assert all(len(n.encode()) > 100 and "/" in n for n in names)
    with tarfile.open(fileobj=io.BytesIO(seeds["tar-pax-times"])) as tar:
        assert all(m.pax_headers == {"mtime": "1700000000.25"} for m in tar)


def test_the_tar_target_finds_another_members_bytes(tars, monkeypatch):
    from fastpipe.data.sources import tar

    scan = tar._scan

    def swapped(shard, name=None):
        """Samples 0 and 1 read each other's members (a field's bytes of the other sample)."""
        index = scan(shard, name)
        first, second = (np.flatnonzero(index["sample"] == k) for k in (0, 1))
        if len(first) == len(second) and len(first):
            for key in ("offset", "size"):
                index[key][first], index[key][second] = (index[key][second].copy(),
                                                          index[key][first].copy())
        return index

    monkeypatch.setattr(tar, "_scan", swapped)
    with pytest.raises(sources.Finding, match="differs from tarfile's bytes|tarfile's is"):
        for call_seed in range(30):  # a draw that scans afresh
            sources.tar_shard(tars[0], np.random.default_rng(call_seed))


def _members_shard(path: Path, names: list[str]) -> None:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for k, name in enumerate(names):
            body = str(k).encode()
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))


def test_the_tar_target_takes_a_repeated_field_that_is_not_read(tmp_path):
    # Sample 0 has no "bin", so TarSource reads cls and txt; sample 1's two "bin" members are
    # not read (the lane found this where tarfile's view refused the whole shard).
    shard = tmp_path / "s.tar"
    _members_shard(shard, ["0.cls", "0.txt", "1.bin", "1.cls", "1.txt", "1.bin"])
    assert sources._mismatch(sources._read_tar(shard), sources._tarfile_view(shard)) is None


def test_the_tar_target_finds_a_repeated_field_read(tmp_path, monkeypatch):
    from fastpipe.data.sources import tar

    shard = tmp_path / "s.tar"
    _members_shard(shard, ["0.cls", "0.txt", "1.cls", "1.txt", "1.txt"])
    with pytest.raises(PackFormatError, match="several 'txt' members"):
        sources._read_tar(shard)
    scan = tar._scan

    def last_dropped(shard, name=None):
        """The second txt member of sample 1 left out of the index (read as if single)."""
        index = scan(shard, name)
        keep = np.arange(len(index["sample"])) != len(index["sample"]) - 1
        for key in ("sample", "field", "offset", "size", "chain"):
            index[key] = index[key][keep]
        return index

    monkeypatch.setattr(tar, "_scan", last_dropped)
    shard.with_name(shard.name + tar.INDEX_SUFFIX).unlink(missing_ok=True)
    wrong = sources._mismatch(sources._read_tar(shard), sources._tarfile_view(shard))
    assert wrong is not None and "several members" in wrong


@pytest.mark.parametrize("plant", ["prefix dropped", "any checksum taken"])
def test_the_tar_target_finds_plain_headers_read_otherwise_than_tarfile_reads_them(
        tars, monkeypatch, plant):
    from fastpipe.data.sources import tarheaders

    if plant == "prefix dropped":
        headers = tarheaders.plain_headers

        def without_prefixes(path, size):
            found = headers(path, size)
            if found is not None:
                found.names = [n and n.rsplit("/", 1)[-1] for n in found.names]
            return found

        monkeypatch.setattr(tarheaders, "plain_headers", without_prefixes)
    else:
        monkeypatch.setattr(tarheaders, "_fields_plain", lambda raw: True)
    with pytest.raises(sources.Finding, match="plain headers"):
        for call_seed in range(60):
            sources.tar_shard(tars[call_seed % len(tars)], np.random.default_rng(call_seed))


def test_the_hdf5_target_finds_rows_that_differ_from_h5pys(monkeypatch):
    from fastpipe.data.sources.h5 import H5Source

    read = H5Source._read_batch

    def off_by_one(self, indices, names, blocks):
        return read(self, np.minimum(np.asarray(indices) + 1, len(self) - 1), names, blocks)

    monkeypatch.setattr(H5Source, "_read_batch", off_by_one)
    with pytest.raises(sources.Finding, match="differs from h5py's rows"):
        for call_seed in range(30):
            sources.hdf5_plain(bytes(range(256)), np.random.default_rng(call_seed))


def _declaring(height: int, width: int, depth: int = 8, color_type: int = 6) -> bytes:
    """A short PNG (RGBA by default) whose header declares ``height`` x ``width`` (its stream
    far shorter than the bytes the pixels need)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return (len(body).to_bytes(4, "big") + kind + body
                + zlib.crc32(kind + body).to_bytes(4, "big"))

    header = height.to_bytes(4, "big")
    ihdr = width.to_bytes(4, "big") + header + bytes([depth, color_type, 0, 0, 0])
    return (images.PNG_SIGNATURE + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64))
            + chunk(b"IEND", b""))


def test_the_png_paths_find_a_decode_whose_memory_the_file_does_not_bound(monkeypatch):
    """png_paths traces the decodes' allocations against the file's length: with the check of
    the length against the declared size taken away, a short file declaring 4 MP is a finding."""
    pytest.importorskip("fastpipe._png")
    from fastpipe.data.decode import budget, png

    data = _declaring(2048, 2048)  # 16 MiB of RGBA from about 70 bytes, inside the fuzz budget
    monkeypatch.setattr(budget, "MAX_IMAGE_PIXELS", 1 << 22)
    images.png_paths(data, np.random.default_rng(0))  # refused from its length: nothing found
    monkeypatch.setattr(png, "_checked_header", lambda data, source: png._read_header(data))
    with pytest.raises(images.Finding, match="allocated"):
        images.png_paths(data, np.random.default_rng(0))


def test_the_native_png_target_sizes_its_output_as_the_decoder_does():
    """png_decode allocates the output fastpipe.data.decode.png would: none for a file too short
    for the image its header declares (refused from its length there), so its memory is bounded
    by the file's length as png_paths' is."""
    pytest.importorskip("fastpipe._png")
    import tracemalloc

    from fastpipe.data.decode import png
    from fuzz import harness

    harness.load(None)
    assert harness.MAX_DEFLATE_RATIO == png.MAX_DEFLATE_RATIO
    assert harness._PNG_DEPTHS == png._DEPTHS
    # A bit depth of 0 (no colour type has it) makes the declared data 0 bytes: the decoder
    # refuses the header before sizing anything (the fuzz lane's CI run found the target did not).
    for data in (_declaring(2048, 2048), _declaring(776, 4352, depth=0, color_type=0)):
        tracemalloc.start()
        try:
            for call_seed in range(8):
                harness.TARGETS["png_decode"](data, np.random.default_rng(call_seed))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 8 * png.MAX_DEFLATE_RATIO * len(data) + (1 << 20)


def test_the_png_paths_refuse_to_run_without_fastpipe_png(monkeypatch, tmp_path):
    """Without fastpipe._png, png_paths would compare Pillow with itself and find nothing: the
    target and the driver fail, naming the missing module, instead of passing on nothing."""
    from fastpipe.data.decode import budget, png
    from fuzz import harness

    seed = next(data for _, data in sorted(png_seeds().items()))
    monkeypatch.setattr(png, "_native_decode", None)
    monkeypatch.setattr(budget, "MAX_IMAGE_PIXELS", budget.MAX_IMAGE_PIXELS)
    with pytest.raises(RuntimeError, match=r"fastpipe\._png is not built"):
        images.png_paths(seed, np.random.default_rng(0))
    (tmp_path / "seed.png").write_bytes(seed)
    with pytest.raises(SystemExit, match=r"fastpipe\._png is not built"):
        harness.main([str(tmp_path), "--targets", "images", "--seconds", "1",
                      "--findings", str(tmp_path / "findings")])


def test_the_hdf5_target_finds_a_hyperslab_source_that_no_longer_holds_its_rows(monkeypatch):
    """With the check of sources mapped in part taken away (as it was: hyperslabs were left to
    HDF5, which reads its fill value past a shrunk source), the draws that replace such a source
    by a smaller file are findings. The seeds are two such draws of 600."""
    import h5py

    from fastpipe.data.sources import _hdf5

    for call_seed in (438, 550):
        sources.hdf5_plain(bytes(range(256)), np.random.default_rng(call_seed))
    problem = _hdf5._source_problem

    def whole_only(source, shape):
        if source.src_space.get_select_type() != h5py.h5s.SEL_ALL:
            return None
        return problem(source, shape)

    monkeypatch.setattr(_hdf5, "_source_problem", whole_only)
    for call_seed in (438, 550):
        with pytest.raises(sources.Finding, match="no longer holds what it maps"):
            sources.hdf5_plain(bytes(range(256)), np.random.default_rng(call_seed))



def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_no_thread_runs_beside_a_target(monkeypatch, tmp_path, pngs):
    """The memory-bounded targets start and stop tracemalloc, which swaps Python's raw
    allocator with no lock against a thread freeing through it without the GIL: a thread of
    the driver's beside the target (faulthandler's watchdog was one, started per execution) is
    a crash in tracemalloc_free, as CI's fuzz lane had. During an execution the process runs
    the threads it ran before the driver started, no more."""
    from fuzz import harness

    harness.load(None)
    seen = []
    monkeypatch.setitem(harness.TARGETS, "threads", lambda data, rng: seen.append(_threads()))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "0.png").write_bytes(pngs[0])
    before, handler = _threads(), signal.getsignal(signal.SIGALRM)
    assert harness.run(corpus, 0.3, tmp_path / "findings", 0, 10.0, [["threads"]]) == 0
    assert seen and set(seen) == {before}
    assert signal.getsignal(signal.SIGALRM) is handler  # the caller's alarm as it was


_HANG = """
import sys, time
from pathlib import Path
from fuzz import harness
harness.TARGETS["sleeps"] = lambda data, rng: time.sleep(30)
harness.run(Path(sys.argv[1]), 60, Path(sys.argv[2]), 0, 0.5, [["sleeps"]])
"""


def test_an_execution_past_its_timeout_ends_the_run_with_its_traceback_and_input(tmp_path,
                                                                                  pngs):
    """A hang is a finding: the process ends within about the timeout, printing where each
    thread was, with the input and the target's name left in the findings folder."""
    corpus, findings = tmp_path / "corpus", tmp_path / "findings"
    corpus.mkdir()
    (corpus / "0.png").write_bytes(pngs[0])
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _HANG, str(corpus), str(findings)],
                          capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == -signal.SIGALRM, done.stderr
    assert time.monotonic() - began < 20
    assert "time.sleep" in done.stderr or "<lambda>" in done.stderr, done.stderr
    assert (findings / "current.txt").read_text().startswith("target sleeps")
    assert (findings / "current.bin").stat().st_size > 0
