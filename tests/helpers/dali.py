"""Helpers for the DALI tests: the skip when DALI is missing, native thread counts, index-labelled
list files, graph inspection.

Imports nothing of DALI (nor fastpipe.dali) at import time.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import time
from pathlib import Path

import numpy as np

DALI_MISSING = "DALI does not import here: pip install 'fastpipe[dali]' (nvidia-dali-cuda130)"
"""The reason a test module needing DALI skips with. Each such module starts with
``pytest.importorskip("nvidia.dali", reason=DALI_MISSING, exc_type=ImportError)`` before it imports
DALI or fastpipe.dali, so that a machine without DALI (or with one that does not import) still
collects every other test: the cuda lane runs on such machines."""


def dali_installed() -> bool:
    """Whether nvidia.dali can be found, without importing it (False where looking raises)."""
    try:
        return importlib.util.find_spec("nvidia.dali") is not None
    except (ImportError, ValueError):
        return False


def native_threads() -> int:
    """Threads of this process as the OS sees them: DALI's C++ workers included."""
    return len(os.listdir("/proc/self/task"))


def wait_native_threads(expected: int, timeout: float = 10.0) -> int:
    """Waits until the native thread count is at most ``expected``; returns the last count."""
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        count = native_threads()
        if count <= expected or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


def image_files(root: Path) -> list[Path]:
    return sorted(root.glob("*/*.jpg"))


def write_index_list(path: Path, files: list[Path]) -> Path:
    """A list file whose label for line ``i`` is ``i``: every label names its sample."""
    path.write_text("".join(f"{f} {i}\n" for i, f in enumerate(files)))
    return path


class JpegBytes:
    """An in-memory encoded dataset: ``encoded(i)`` gives JPEG ``i`` and the label ``i``."""

    def __init__(self, files: list[Path]) -> None:
        self.blobs = [np.frombuffer(f.read_bytes(), dtype=np.uint8) for f in files]

    def __len__(self) -> int:
        return len(self.blobs)

    def encoded(self, index: int) -> tuple[np.ndarray, int]:
        return self.blobs[index], index


def graph_ops(pipe) -> list[tuple[str, str]]:
    """(operator class, device) of every operator in a DALI pipeline's graph, without building it.

    Uses DALI's private graph attributes; that is the only way to look at a GPU graph on a
    machine where the pipeline cannot be built.
    """
    pipe._build_graph()
    return [(type(op._op).__name__, op._op.device) for op in pipe._ops]


def graph_output_devices(pipe) -> list[str]:
    pipe._build_graph()
    return [node.device for node in pipe._graph_outputs]


def ddp_worker(rank: int, world_size: int, init_file: str, list_file: str, out_dir: str) -> None:
    """One rank of the DDP test: two epochs of a DALILoader under a gloo process group."""
    import torch
    import torch.distributed as dist

    from fastpipe.dali import DALILoader

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size)
    try:
        loader = DALILoader(
            list_file, batch_size=5, train=False, shuffle=True, size=32, num_workers=1,
            device="cpu", seed=3,
        )
        epochs = []
        for _ in range(2):
            epochs.append(torch.cat([labels for _, labels in loader]).tolist())
        # Every rank must run the same number of steps, or DDP's all-reduce would hang.
        steps = torch.tensor([len(loader)])
        dist.all_reduce(steps)
        loader.close()
        # Resume mid-epoch on every rank: each rank saves and restores its own position.
        kwargs = {"batch_size": 5, "size": 32, "num_workers": 1, "device": "cpu", "seed": 3,
                  "color_jitter": 0.3}
        with DALILoader(list_file, **kwargs) as first:
            iterator = iter(first)
            next(iterator), next(iterator)
            state = first.state_dict()
            expected = list(iterator) + list(first)
        with DALILoader(list_file, **kwargs) as restored:
            restored.load_state_dict(state)
            got = list(restored) + list(restored)
        resumed = len(got) == len(expected) and all(
            torch.equal(a, b) and torch.equal(x, y) for (a, x), (b, y) in zip(got, expected)
        )
        result = {
            "shard": [loader.rank, loader.world_size], "len": len(loader),
            "total_steps": int(steps), "epochs": epochs, "resumed": resumed,
            "resumed_labels": torch.cat([labels for _, labels in got]).tolist(),
        }
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()



RESUME_SCRIPT = """
import sys, torch
from fastpipe.dali import DALILoader
source, state_file, out_file, kwargs = sys.argv[1], sys.argv[2], sys.argv[3], eval(sys.argv[4])
with DALILoader(source, **kwargs) as loader:
    loader.load_state_dict(torch.load(state_file, weights_only=True))
    batches = [(images.clone(), labels.clone()) for images, labels in loader]
    batches += [(images.clone(), labels.clone()) for images, labels in loader]
torch.save(batches, out_file)
"""


def restore_in_fresh_process(source, state, kwargs: dict, tmp_path: Path, name: str) -> list:
    """Saves ``state``, restores it in a new Python process into ``DALILoader(source,
    **kwargs)``, and returns what that loader yields: the rest of the epoch, then one more.

    ``kwargs`` must be a literal (``repr`` round-trips it, torch dtypes excepted).
    """
    import subprocess
    import sys

    import torch

    state_file, out_file = tmp_path / f"{name}.state", tmp_path / f"{name}.batches"
    torch.save(state, state_file)
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", RESUME_SCRIPT, str(source), str(state_file), str(out_file),
         repr(kwargs)],
        cwd=root, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(out_file, weights_only=True)
