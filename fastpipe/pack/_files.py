"""File housekeeping for packing: refusing to clobber, installing atomically, cleaning up."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any


def check_output(output: Path, overwrite: bool) -> None:
    if output.exists() and not overwrite:
        raise FileExistsError(f"{output} already exists; pass overwrite=True or choose another "
                              "output")
    if not output.parent.exists():
        raise FileNotFoundError(f"the folder of the output, {output.parent}, does not exist")


def install(tmp: Path, output: Path) -> None:
    """Renames a finished ``tmp`` over ``output``, flushed first so a crash never leaves a
    renamed but unwritten file."""
    if tmp.is_file():
        fsync(tmp)
    if output.is_dir():
        shutil.rmtree(output)
    os.replace(tmp, output)
    fsync(output.parent)


def fsync(path: Path) -> None:
    """Flushes a file (or a folder's entries) to disk, so a rename never installs unwritten data."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on folders
        pass
    finally:
        os.close(fd)


def remove_old_shards(root: Path, keep: Path | None) -> None:
    """After the new output is installed: earlier runs' shard folders (and the flat part files of
    older fastpipe versions) in ``root``, which no output uses any more."""
    if not root.is_dir():
        return
    for path in root.iterdir():
        if keep is not None and path == keep:
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    if keep is None:
        shutil.rmtree(root, ignore_errors=True)


def size_on_disk(output: Path, meta: dict[str, Any] | None = None) -> int:
    """Bytes of the output plus the part files a virtual output maps."""
    if output.is_file():
        total = output.stat().st_size
    else:
        total = sum(p.stat().st_size for p in output.rglob("*") if p.is_file())
    for file in {p["file"] for p in (meta or {}).get("parts") or []}:
        part = output.parent / file
        if part.exists():
            total += part.stat().st_size
    return total


def progress_bar(progress: bool, total: int, initial: int, desc: str, unit: str):
    from fastpipe._progress import progress_bar as bar

    return bar(progress, total=total, initial=initial, desc=desc, unit=unit,
               dynamic_ncols=True, smoothing=0.05, mininterval=0.5)
