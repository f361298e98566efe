"""The cuda lane's collection: whole on a machine where DALI, h5py, lmdb or torchvision do not
import, and found by the offline GPU script.

Run in subprocesses collecting the whole tree, so the outcome is pytest's own report.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()
TESTS = HERE.parents[1]


# A sitecustomize.py that makes the named packages fail to import, as where they are not installed
# (or are installed without what they need): put first on PYTHONPATH, it runs before pytest.
_HIDE = """
import sys


class _Hide:
    def find_spec(self, name, path=None, target=None):
        if any(name == hidden or name.startswith(hidden + ".") for hidden in {names!r}):
            raise ImportError(f"{{name}} is hidden by test_lane_collection.py", name=name)
        return None


sys.meta_path.insert(0, _Hide())
"""


# What a GPU machine may lack; the tests' other imports are fastpipe's own dependencies.
OPTIONAL = ("nvidia.dali", "h5py", "lmdb", "torchvision")


def _collect_lane(folder: Path, hide: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """`pytest --collect-only -m cuda tests` (what the offline GPU script runs), from the repository
    root, with ``hide`` failing to import."""
    # A GPU box without DALI runs the lane without CI's demand that DALI import.
    env = {k: v for k, v in os.environ.items() if k != "FASTPIPE_REQUIRE_DALI"}
    if hide:
        folder.mkdir()
        (folder / "sitecustomize.py").write_text(_HIDE.format(names=hide))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder),
                                                          os.environ.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-rs", "-m", "cuda",
               "-p", "no:cacheprovider", "tests"]
    return subprocess.run(command, capture_output=True, text=True, cwd=TESTS.parent, env=env,
                          timeout=240)


def _node_ids(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stdout.splitlines() if "::" in line]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_lane_is_collected_whole_where_optional_packages_do_not_import(tmp_path):
    """A missing DALI (or h5py, lmdb, torchvision: a bare GPU machine may lack any of them) never
    stops the collection: every cuda test is still collected (a GPU test needing DALI says so when
    it runs), and the modules that need DALI skip with the reason."""
    plain = _collect_lane(tmp_path / "plain")
    hidden = _collect_lane(tmp_path / "hidden", OPTIONAL)
    assert plain.returncode == 0, plain.stdout[-3000:] + plain.stderr[-3000:]
    assert hidden.returncode == 0, hidden.stdout[-3000:] + hidden.stderr[-3000:]
    lane = _node_ids(hidden)
    assert lane == _node_ids(plain)
    # The kit (scripts/gpu-kit.sh) runs the lane as `pytest -m cuda tests/cuda`: every cuda test
    # must live there.
    assert all(node.startswith("tests/cuda/") for node in lane), [
        node for node in lane if not node.startswith("tests/cuda/")]
    files = {node.split("::")[0] for node in lane}
    # Every module of the lane has cuda tests, but these two, which test the lane on the CPU.
    assert {f"tests/cuda/{f.name}" for f in HERE.parent.glob("test_*.py")} <= files | {
        f"tests/cuda/{HERE.name}", "tests/cuda/test_gpu_kit.py"}
    assert "tests/dali/test_loader.py" in hidden.stdout and "DALI does not import" in hidden.stdout


def test_no_top_level_test_cuda_file_narrows_the_offline_scripts_lane():
    """The offline GPU script (.gpu/run.sh from prepare.sh, docs/gpu.md) runs `pytest -m cuda` on
    `ls tests/test_cuda_*.py`, or on the whole tree when there is no such file: one file of that
    name at the top would become the whole lane. The GPU tests are in tests/cuda/, and a test of
    fastpipe/_cuda_archs.py lives in tests/ops/ for that reason."""
    assert sorted(p.name for p in TESTS.glob("test_cuda_*.py")) == []
