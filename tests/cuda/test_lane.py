"""The cuda lane itself: its tests skip cleanly without a GPU, and fail the run when
FASTPIPE_REQUIRE_CUDA=1 (so a GPU run cannot pass by skipping). How the lane is collected is in
test_lane_collection.py.

Run in a subprocess on this very file's probe, so the outcome is pytest's own report.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve()


@pytest.mark.cuda
def test_probe_runs_on_a_gpu():
    assert torch.cuda.is_available()
    assert torch.zeros(1, device="cuda").add(1).item() == 1


def _run_probe(require: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "FASTPIPE_REQUIRE_CUDA"}
    if require:
        env["FASTPIPE_REQUIRE_CUDA"] = "1"
    command = [sys.executable, "-m", "pytest", f"{HERE}::test_probe_runs_on_a_gpu", "-q", "-rs",
               "-p", "no:cacheprovider"]
    return subprocess.run(command, capture_output=True, text=True, cwd=HERE.parents[2],
                          env=env, timeout=120)


@pytest.mark.timeout(150)
@pytest.mark.slow
def test_cuda_tests_skip_without_a_gpu_and_fail_when_one_is_required():
    plain, required = _run_probe(False), _run_probe(True)
    if torch.cuda.is_available():
        assert plain.returncode == 0 and "1 passed" in plain.stdout, plain.stdout
        assert required.returncode == 0 and "1 passed" in required.stdout, required.stdout
        return
    assert plain.returncode == 0 and "1 skipped" in plain.stdout, plain.stdout
    assert "no CUDA GPU" in plain.stdout
    # Reported at set-up (an error, before any fixture touches CUDA): the run fails either way.
    assert required.returncode == 1 and "1 error" in required.stdout, required.stdout
    assert "FASTPIPE_REQUIRE_CUDA=1 requires one" in required.stdout


# --- the lane's own code, checked on the CPU ---------------------------------------------------

def _segfault() -> None:
    import ctypes

    ctypes.string_at(0)  # reads address 0: SIGSEGV, as a crashing native decoder would


def _decoder_error() -> None:
    raise RuntimeError("nvImageCodec: INTERNAL_ERROR")


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_a_crash_of_the_train_decode_fails_its_test_naming_nvimagecodec_55():
    from tests.cuda.test_dali import NVIMAGECODEC_55, run_isolated

    with pytest.raises(pytest.fail.Exception, match=r"(?s)died with signal 11.*nvImageCodec#55"):
        run_isolated(_segfault, (), "train epochs", NVIMAGECODEC_55)
    with pytest.raises(pytest.fail.Exception,
                       match=r"(?s)raised:.*INTERNAL_ERROR.*crop_decode=False"):
        run_isolated(_decoder_error, (), "train epochs", NVIMAGECODEC_55)
    run_isolated(int, (), "nothing", NVIMAGECODEC_55)  # a clean run passes


def test_the_mixed_decode_check_fails_when_the_gpu_gave_the_cpus_pixels():
    """A "mixed" decode without a GPU decoder (nvImageCodec without nvJPEG) runs on the CPU and
    gives libjpeg-turbo's exact pixels: the lane's check must fail then, and pass for a GPU
    decode's small differences."""
    from tests.cuda.test_dali import compare_decodes

    g = torch.Generator().manual_seed(0)
    cpu = torch.randint(0, 256, (6, 3, 16, 16), dtype=torch.uint8, generator=g)
    with pytest.raises(AssertionError, match="ran on the CPU"):
        compare_decodes(cpu.clone(), cpu)
    gpu = (cpu.int() + torch.randint(-2, 3, cpu.shape, generator=g)).clamp(0, 255).to(torch.uint8)
    assert "images differing at all: 6 of 6" in compare_decodes(gpu, cpu)
    with pytest.raises(AssertionError, match="mean"):
        compare_decodes((cpu.int() + 40).clamp(0, 255).to(torch.uint8), cpu)


def _loader_uses(path: Path) -> tuple[set[str], set[str]]:
    """The keywords passed to DALILoader(...) in a lane file (with those of the dicts it unpacks
    into the call, ``**common``) and the attributes read on the names ``with DALILoader(...) as``
    binds."""
    import ast

    tree = ast.parse(path.read_text())
    dicts: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and getattr(node.value.func, "id", None) == "dict"):
            for target in node.targets:
                if isinstance(target, ast.Name):  # every dict of that name counts
                    dicts.setdefault(target.id, set()).update(
                        k.arg for k in node.value.keywords if k.arg)
    keywords: set[str] = set()
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "DALILoader":
            for k in node.keywords:
                if k.arg:
                    keywords.add(k.arg)
                elif isinstance(k.value, ast.Name):
                    keywords |= dicts.get(k.value.id, set())
        if isinstance(node, ast.withitem) and isinstance(node.context_expr, ast.Call):
            if (getattr(node.context_expr.func, "id", None) == "DALILoader"
                    and isinstance(node.optional_vars, ast.Name)):
                bound.add(node.optional_vars.id)
    attributes = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                  and isinstance(node.value, ast.Name) and node.value.id in bound}
    return keywords, attributes


@pytest.mark.slow
def test_the_lanes_dali_tests_use_the_current_dali_loader_names(sample_root):
    """The GPU tests cannot run here, but their arguments can be checked: every keyword they
    pass to DALILoader is one of its parameters, and every attribute they read exists on a
    loader (a renamed one fails on the GPU before checking anything)."""
    import inspect

    pytest.importorskip("nvidia.dali", reason="DALI does not import", exc_type=ImportError)
    from fastpipe.dali import DALILoader

    parameters = set(inspect.signature(DALILoader).parameters)
    with DALILoader(sample_root, batch_size=4, device="cpu") as loader:
        for path in sorted(HERE.parent.glob("test_*.py")):
            keywords, attributes = _loader_uses(path)
            assert keywords <= parameters, (path.name, sorted(keywords - parameters))
            missing = sorted(a for a in attributes if not hasattr(loader, a))
            assert not missing, (path.name, missing)
