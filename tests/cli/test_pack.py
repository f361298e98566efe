"""`fastpipe pack` and `fastpipe verify` errors: each message names the command's flags, never the
Python spelling of the option (``overwrite=True``) the library's message uses."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("h5py", exc_type=ImportError)

from fastpipe._cli import main  # noqa: E402
from fastpipe._hardware import usable_cores  # noqa: E402

pytestmark = pytest.mark.hdf5

PYTHON_SPELLING = re.compile(r"[a-z_]=[\w('(]")  # overwrite=True, size=(H, W), merge='copy'


def error_of(argv: list[str], capsys, code: int = 2) -> str:
    assert main(argv) == code
    err = capsys.readouterr().err
    assert err.startswith(f"fastpipe {argv[0]}: error: ") and err.count("\n") == 1, err
    assert PYTHON_SPELLING.search(err) is None, err
    return err


@pytest.mark.parametrize(("flags", "message"), [
    (["--part", "3/2"], "--part I/N needs 0 <= I < N, got (3, 2)"),
    (["--part", "half"], "--part must look like I/N"),
    (["--storage", "array", "--max-side", "100"],
     "--max-side applies to bytes storage; for array storage pass --size HxW"),
    (["--size", "10x10"], "--size applies to array storage; for bytes storage pass --max-side N"),
    (["--storage", "array", "--size", "tall"], "--size must look like HxW"),
    (["--storage", "array", "--size", "0x10"], "--size must be positive"),
    (["--format", "lmdb", "--merge", "virtual"],
     "LMDB has no virtual datasets: use --merge copy (the default for LMDB)"),
])
def test_pack_option_errors_name_the_flags(flags, message, sample_root, tmp_path, capsys):
    err = error_of(["pack", str(sample_root), str(tmp_path / "o.h5"), *flags, "--quiet"], capsys)
    assert message in err


def test_pack_refuses_an_existing_output_naming_overwrite(sample_root, tmp_path, capsys):
    out = tmp_path / "o.h5"
    out.write_bytes(b"x")
    err = error_of(["pack", str(sample_root), str(out), "--quiet"], capsys)
    assert f"{out} already exists; pass --overwrite or choose another output" in err


def test_pack_failures_name_the_flags(sample_root, tmp_path, capsys):
    # The sample photos differ in size: array storage needs one shape.
    err = error_of(["pack", str(sample_root), str(tmp_path / "a.h5"), "--storage", "array",
                    "--quiet"], capsys, code=1)
    assert "array storage needs one shape" in err and "pass --size HxW to resize" in err
    assert main(["pack", str(sample_root), str(tmp_path / "p0.h5"), "--part", "0/2",
                 "--quiet"]) == 0
    assert main(["pack", str(sample_root), str(tmp_path / "whole.h5"), "--quiet"]) == 0
    capsys.readouterr()
    err = error_of(["pack", "--merge-only", str(tmp_path / "m.h5"), str(tmp_path / "p0.h5"),
                    str(tmp_path / "whole.h5"), "--quiet"], capsys, code=1)
    assert "some packs were made with --part I/N and some were not" in err
    err = error_of(["pack", "--merge-only", str(tmp_path / "m.h5"), str(tmp_path / "p0.h5"),
                    "--quiet"], capsys, code=1)
    assert "parts 1/2 are missing" in err


@pytest.mark.parametrize(("argv", "message"), [
    (["pack", "SRC"], "expected SOURCE OUTPUT, got 1 paths (to combine packs use --merge-only"),
    (["pack", "--merge-only", "OUT"], "--merge-only needs OUTPUT and at least one PACK"),
    (["pack", "--merge-only", "OUT", "A", "--part", "0/2", "--workers", "2"],
     "--workers, --part do not apply to --merge-only"),
    (["pack", "/no/such/dir", "OUT"], "pack source /no/such/dir does not exist"),
    (["verify", "/no/such/pack.h5"], "no such file: /no/such/pack.h5"),
    (["verify", "/", "--sample", "0"], "--sample must be >= 1, got 0"),
])
def test_argument_errors(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert message in error_of(argv, capsys)


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--workers", "0", "argument --workers: expected an integer >= 1, got 0"),
    ("--shard-size", "0", "argument --shard-size: expected an integer >= 1, got 0"),
    ("--max-side", "-5", "argument --max-side: expected an integer >= 1, got -5"),
    ("--quality", "101", "argument --quality: expected a JPEG quality in 1..100, got 101"),
])
def test_bad_numbers_are_refused_by_the_parser(flag, value, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["pack", "SRC", "OUT", flag, value])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_pack_workers_default_to_the_usable_cores(sample_root, tmp_path, capsys):
    assert main(["pack", str(sample_root), str(tmp_path / "o.h5"), "--json", "--quiet"]) == 0
    # One shard per worker at least (48 inputs, far below the shard size).
    assert f'"shards": {min(usable_cores(), 48)}' in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["pack", "--help"])
    assert f"{usable_cores()} here" in capsys.readouterr().out


@pytest.mark.slow  # two fresh Python processes
@pytest.mark.timeout(180)
def test_pack_and_verify_into_a_pipe_write_no_bars(sample_root, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = tmp_path / "piped.h5"
    for argv in (["pack", str(sample_root), str(out), "--workers", "1"], ["verify", str(out)]):
        done = subprocess.run([sys.executable, "-m", "fastpipe", *argv], cwd=root, env=env,
                              capture_output=True, text=True, timeout=170)
        assert done.returncode == 0, done.stderr
        # A log or a pipe gets plain lines (tests/test_progress.py), never a bar's redraws.
        assert "\r" not in done.stderr and "it/s" not in done.stderr, done.stderr


@pytest.mark.parametrize("command", ["pack", "verify"])
def test_no_progress_is_the_flag_and_quiet_its_alias(command):
    import argparse

    from fastpipe._cli import pack, verify

    module = {"pack": pack, "verify": verify}[command]
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    for flag in ("--no-progress", "--quiet"):
        assert parser.parse_args(["a", "b", flag] if command == "pack" else ["a", flag]
                                 ).no_progress is True
    assert "--no-progress" in parser.format_help()


@pytest.mark.parametrize("make", ["empty folder", "class folders without images",
                                  "empty list file"])
def test_a_source_with_nothing_to_pack_is_an_input_error(make, tmp_path, capsys):
    # Exit code 2, as for a bad argument or a missing path (docs/packing.md, "Exit codes").
    source = tmp_path / "src"
    if make == "empty list file":
        source = tmp_path / "files.txt"
        source.write_text("# nothing listed\n")
    else:
        source.mkdir()
        if make == "class folders without images":
            (source / "cats").mkdir()
            (source / "cats" / "notes.txt").write_text("no image here")
    err = error_of(["pack", str(source), str(tmp_path / "o.h5"), "--quiet"], capsys)
    assert str(source) in err
    assert not (tmp_path / "o.h5").exists() and not (tmp_path / "o.h5.shards").exists()


@pytest.mark.parametrize("flags", [[], ["--max-side", "64"]])
def test_skipped_inputs_name_the_file_not_a_buffer(flags, sample_root, tmp_path, capsys):
    from tests.helpers.pack import make_corrupt_folder

    make_corrupt_folder(sample_root, tmp_path / "src")
    assert main(["pack", str(tmp_path / "src"), str(tmp_path / "o.h5"), "--quiet", "--workers",
                 "1", *flags]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "not_an_image.jpg:" in line)
    assert "BytesIO" not in out and " at 0x" not in out, out
    assert line.strip().startswith("class_01/not_an_image.jpg: corrupt image: cannot decode")
    assert "class_01/not_an_image.jpg: not a format Pillow recognises" in line


def test_ctrl_c_says_the_rerun_resumes_the_finished_shards(sample_root, tmp_path, capsys,
                                                          monkeypatch):
    from fastpipe.pack import _workers

    load, calls = _workers._load, []

    def interrupted_at_the_third_shard(job, task, index, local, name):
        calls.append(index)
        if index == 13:  # shards of 6 inputs: two are finished, the third is being packed
            raise KeyboardInterrupt
        return load(job, task, index, local, name)

    monkeypatch.setattr(_workers, "_load", interrupted_at_the_third_shard)
    argv = ["pack", str(sample_root), str(tmp_path / "o.h5"), "--workers", "1",
            "--shard-size", "6", "--quiet"]
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert "fastpipe pack: 2 of 8 shards are written in " in err, err
    assert "run the same command again to resume" in err and err.endswith("interrupted\n")
    monkeypatch.setattr(_workers, "_load", load)
    assert main(argv) == 0
    assert "6 resumed" not in (out := capsys.readouterr().out) and "2 resumed" in out, out


def test_ctrl_c_before_any_shard_is_finished_says_the_rerun_starts_over(tmp_path):
    from fastpipe.pack import pack
    from tests.helpers.pack import ArrayDataset

    class Interrupted(ArrayDataset):
        def __getitem__(self, index):
            if index == 2:
                raise KeyboardInterrupt
            return super().__getitem__(index)

    with pytest.raises(KeyboardInterrupt, match="none of the 3 shards was finished; a rerun "
                                                "starts over"):
        pack(Interrupted(n=18), tmp_path / "d.h5", storage="array", shard_size=6,
             progress=False)


def test_ctrl_c_of_a_dataset_pack_says_how_to_resume(tmp_path):
    from fastpipe.pack import pack
    from tests.helpers.pack import ArrayDataset

    class Interrupted(ArrayDataset):
        stop_at: int | None = 14

        def __getitem__(self, index):
            if index == self.stop_at:
                raise KeyboardInterrupt
            return super().__getitem__(index)

    source = Interrupted(n=18)
    with pytest.raises(KeyboardInterrupt, match=r"2 of 3 shards are written in .*; call pack "
                                                r"again with resume=True \(and the same "
                                                r"dataset\) to resume"):
        pack(source, tmp_path / "d.h5", storage="array", shard_size=6, progress=False)
    source.stop_at = None
    report = pack(source, tmp_path / "d.h5", storage="array", shard_size=6, progress=False,
                  resume=True)
    assert report.resumed_shards == 2 and report.count == 18


def test_a_virtual_pack_says_in_its_last_line_that_its_folder_travels_with_it(
        sample_root, tmp_path, capsys):
    out = tmp_path / "train.h5"
    assert main(["pack", str(sample_root), str(out), "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"packed 48 of 48 inputs into {out} (hdf5, bytes storage")
    assert re.fullmatch(r"train\.h5 is a file plus a folder: its samples are in the part files "
                        r"under train\.h5\.shards/ \(\d+\.\d MiB\) beside it, which must stay "
                        r"next to it \(move or copy them together\); --merge copy writes one "
                        r"self-contained file instead", lines[-1]), lines[-1]
    # One file: nothing to add.
    assert main(["pack", str(sample_root), str(tmp_path / "one.h5"), "--merge", "copy",
                 "--quiet"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1
    assert not (tmp_path / "one.h5.shards").exists()


def test_a_merge_of_parts_names_every_folder_it_reads(sample_root, tmp_path, capsys):
    for part in ("0/2", "1/2"):
        name = f"p{part[0]}.h5"
        assert main(["pack", str(sample_root), str(tmp_path / name), "--part", part,
                     "--quiet"]) == 0
    capsys.readouterr()
    assert main(["pack", "--merge-only", str(tmp_path / "m.h5"), str(tmp_path / "p0.h5"),
                 str(tmp_path / "p1.h5"), "--quiet"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("m.h5 is a file plus folders: its samples are in the part files "
                           "under p0.h5.shards/ and p1.h5.shards/ (")


def test_verify_names_the_missing_part_folder_and_the_flag(sample_root, tmp_path, capsys):
    out = tmp_path / "train.h5"
    assert main(["pack", str(sample_root), str(out), "--quiet"]) == 0
    (tmp_path / "train.h5.shards").rename(tmp_path / "elsewhere")
    capsys.readouterr()
    assert main(["verify", str(out), "--quiet"]) == 1
    text = capsys.readouterr().out
    assert f"the folder {tmp_path / 'train.h5.shards'}" in text
    assert "--merge copy" in text and PYTHON_SPELLING.search(text) is None, text
