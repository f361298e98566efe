"""GPU architectures of the CUDA kernels: the build's choice and the run-time fallback (on the CPU).

setup.py chooses the architectures by what nvcc supports (TORCH_CUDA_ARCH_LIST overrides) and
records them in fastpipe._C; at run time a GPU the kernel images do not fit makes the ops fall
back to their reference with a warning, instead of failing with "no kernel image is available".
The GPU is a fake capability here; the real one is checked by the cuda lane
(tests/cuda/test_ops.py).
"""

from __future__ import annotations

import runpy
import stat
import warnings
from pathlib import Path

import pytest
import setuptools
import torch

from fastpipe import _cuda_archs, ops
from fastpipe.ops import _extension

SETUP = Path(__file__).resolve().parents[2] / "setup.py"
NVCC_13_LISTING = (
    "compute_75\ncompute_80\ncompute_86\ncompute_87\ncompute_88\ncompute_89\ncompute_90\n"
    "compute_100\ncompute_110\ncompute_103\ncompute_120\ncompute_121\n"
)
NEW_LIST = "7.5;8.0;8.6;8.9;9.0;10.0;11.0;12.0+PTX"


def test_nvcc_13_gets_turing_to_blackwell_with_ptx_for_newer_gpus():
    supported = _cuda_archs.archs_of_nvcc_listing(NVCC_13_LISTING)
    assert _cuda_archs.default_arch_list(supported) == NEW_LIST


def test_older_nvcc_gets_only_the_architectures_it_knows():
    assert _cuda_archs.default_arch_list(_cuda_archs.archs_of_release((12, 4))) == (
        "7.5;8.0;8.6;8.9;9.0+PTX"
    )
    assert _cuda_archs.default_arch_list(_cuda_archs.archs_of_release((12, 8))) == (
        "7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX"
    )
    assert _cuda_archs.default_arch_list(set()) == ""


@pytest.mark.parametrize(
    "capability, arch_list, fits",
    [
        ((7, 5), "8.0;9.0", False),  # T4 with the old build: "no kernel image"
        ((12, 0), "8.0;9.0", False),  # RTX 50 with the old build, no PTX
        ((7, 5), NEW_LIST, True),
        ((8, 7), NEW_LIST, True),  # Orin: the 8.6 cubin runs on 8.7
        ((10, 3), NEW_LIST, True),  # B300: the 10.0 cubin
        ((12, 1), NEW_LIST, True),  # DGX Spark: the 12.0 cubin
        ((13, 0), NEW_LIST, True),  # newer than the list: the 12.0 PTX
        ((7, 0), NEW_LIST, False),  # V100: older than every entry
        ((13, 0), "8.0,9.0+PTX", True),  # the recorded (comma) form
        ((9, 0), "9.0a", True),
        ((10, 0), "9.0a", False),  # arch-specific code runs on its own architecture only
        ((12, 0), "10.0+PTX", True),
        ((9, 0), "Ampere", None),  # a named list: unknown
    ],
)
def test_kernel_image_fits_follows_cuda_binary_compatibility(capability, arch_list, fits):
    assert _cuda_archs.kernel_image_fits(capability, arch_list) is fits


@pytest.fixture
def fake_gpu(monkeypatch):
    """An extension with CUDA kernels and a GPU of a chosen capability (no GPU is touched)."""
    kernels = {(name, device) for name in _extension.OP_NAMES for device in ("cpu", "cuda")}
    monkeypatch.setattr(_extension, "KERNELS", frozenset(kernels))
    monkeypatch.setattr(_extension, "_warned", False)
    capability = {"value": (9, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability["value"])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    _extension._cuda_kernels_fit.cache_clear()
    yield capability
    _extension._cuda_kernels_fit.cache_clear()


def test_ops_fall_back_on_a_gpu_the_kernel_images_do_not_fit(fake_gpu, monkeypatch):
    monkeypatch.setattr(_extension, "CUDA_ARCHS", "8.0,9.0")
    fake_gpu["value"] = (7, 5)
    assert not _extension.has_kernel("normalize", torch.device("cuda", 0))
    assert not ops.extension_available("cuda")
    assert _extension.has_kernel("normalize", torch.device("cpu"))
    with pytest.warns(RuntimeWarning, match=r"built for 8\.0,9\.0.*capability 7\.5.*"
                      r'TORCH_CUDA_ARCH_LIST="7\.5"'):
        _extension.warn_fallback("normalize", torch.device("cuda", 0))


def test_ops_use_the_kernels_on_a_gpu_they_fit(fake_gpu, monkeypatch):
    monkeypatch.setattr(_extension, "CUDA_ARCHS", NEW_LIST.replace(";", ","))
    for capability in ((7, 5), (9, 0), (12, 1), (13, 0)):
        fake_gpu["value"] = capability
        _extension._cuda_kernels_fit.cache_clear()
        assert _extension.has_kernel("normalize", torch.device("cuda", 0)), capability
        assert ops.extension_available("cuda")


def test_without_a_gpu_cuda_availability_says_whether_the_kernels_were_built(fake_gpu,
                                                                             monkeypatch):
    monkeypatch.setattr(_extension, "CUDA_ARCHS", "8.0,9.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert ops.extension_available("cuda")


def test_a_build_that_does_not_record_its_archs_is_trusted(fake_gpu, monkeypatch):
    monkeypatch.setattr(_extension, "CUDA_ARCHS", None)
    fake_gpu["value"] = (7, 5)
    assert _extension.has_kernel("normalize", torch.device("cuda", 0))


def test_the_built_extension_records_its_cuda_archs():
    if not any(device == "cuda" for _, device in _extension.KERNELS):
        pytest.skip("fastpipe._C has no CUDA kernels here (CPU-only torch or no nvcc)")
    assert _extension.CUDA_ARCHS, "fastpipe._C does not record its archs: rebuild it"
    assert _cuda_archs.parse_arch_list(_extension.CUDA_ARCHS) is not None


# --- setup.py's choice, with a stand-in nvcc -------------------------------------------------

def _fake_cuda_home(tmp_path: Path, listing: str | None, release: str) -> Path:
    """A toolkit whose nvcc prints ``listing`` for --list-gpu-arch (fails when None)."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "cuda_runtime.h").write_text("")
    nvcc = tmp_path / "bin" / "nvcc"
    list_branch = f"printf '{listing}'; exit 0" if listing is not None else "exit 1"
    nvcc.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "--list-gpu-arch" ]; then {list_branch}; fi\n'
        f'echo "Cuda compilation tools, release {release}, V{release}.0"\n'
    )
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IEXEC)
    return tmp_path


@pytest.fixture
def setup_py(monkeypatch):
    """setup.py's functions, without building anything."""
    monkeypatch.setenv("FASTPIPE_NO_EXTENSION", "1")
    monkeypatch.setattr(setuptools, "setup", lambda **kwargs: None)
    # Empty counts as unset; monkeypatch restores whatever was there (the choice is set in it).
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return runpy.run_path(str(SETUP))


def test_setup_builds_every_architecture_nvcc_lists(setup_py, tmp_path, capsys):
    home = _fake_cuda_home(tmp_path, NVCC_13_LISTING.replace("\n", "\\n"), "13.0")
    assert setup_py["_cuda_arch_list"](str(home)) == NEW_LIST
    assert f"TORCH_CUDA_ARCH_LIST={NEW_LIST}" in capsys.readouterr().out


def test_setup_falls_back_to_the_release_when_nvcc_cannot_list(setup_py, tmp_path):
    home = _fake_cuda_home(tmp_path, None, "12.4")
    assert setup_py["_cuda_arch_list"](str(home)) == "7.5;8.0;8.6;8.9;9.0+PTX"


def test_torch_cuda_arch_list_overrides_the_choice(setup_py, tmp_path, monkeypatch):
    home = _fake_cuda_home(tmp_path, NVCC_13_LISTING.replace("\n", "\\n"), "13.0")
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.6")
    assert setup_py["_cuda_arch_list"](str(home)) == "8.6"


# torch 2.6's cpp_extension: what it accepts in TORCH_CUDA_ARCH_LIST (nothing past 9.0a).
_TORCH_2_6_ARCHS = ("3.5", "3.7", "5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2", "7.5",
                    "8.0", "8.6", "8.7", "8.9", "9.0", "9.0a")


def _torch_2_6_arch_flags(cflags=None):
    """Stands in for torch 2.6's cpp_extension._get_cuda_arch_flags: the same check."""
    import os

    for arch in os.environ["TORCH_CUDA_ARCH_LIST"].split(";"):
        if arch.removesuffix("+PTX") not in _TORCH_2_6_ARCHS:
            raise ValueError(f"Unknown CUDA arch ({arch}) or GPU not supported")
    return []


def test_setup_keeps_only_the_archs_an_older_torch_accepts(setup_py, tmp_path, monkeypatch,
                                                           capsys):
    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "_get_cuda_arch_flags", _torch_2_6_arch_flags)
    monkeypatch.setattr(torch, "__version__", "2.6.0+cu126")
    home = _fake_cuda_home(tmp_path, NVCC_13_LISTING.replace("\n", "\\n"), "12.9")
    chosen = setup_py["_cuda_arch_list"](str(home))
    assert chosen == "7.5;8.0;8.6;8.9;9.0+PTX"
    _torch_2_6_arch_flags()  # the list set for the build passes torch 2.6's check
    assert "cannot build for 10.0, 11.0, 12.0" in capsys.readouterr().out


@pytest.mark.parametrize("version, expected", [("2.5.1+cu124", "7.5;8.0;8.6;8.9;9.0+PTX"),
                                               ("2.14.1+cu130", NEW_LIST)])
def test_setup_falls_back_to_the_torch_release_when_its_check_is_missing(
    setup_py, tmp_path, monkeypatch, version, expected
):
    from torch.utils import cpp_extension

    monkeypatch.delattr(cpp_extension, "_get_cuda_arch_flags")
    monkeypatch.setattr(torch, "__version__", version)
    home = _fake_cuda_home(tmp_path, NVCC_13_LISTING.replace("\n", "\\n"), "13.0")
    assert setup_py["_cuda_arch_list"](str(home)) == expected


def test_the_installed_torch_is_asked_and_its_environment_left_alone(setup_py, monkeypatch):
    import os

    accepts = setup_py["_torch_accepts_arch"]
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "7.5")
    assert accepts("9.0") is True
    assert accepts("4.2") is False  # no torch knows it
    assert os.environ["TORCH_CUDA_ARCH_LIST"] == "7.5"
    accepted = _cuda_archs.archs_torch_accepts(_cuda_archs.WANTED_ARCHS, accepts, torch.__version__)
    release = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    if release >= (2, 14):  # the project's torch: 7.5 to 12.0 (checked on 2.14.1)
        assert accepted == set(_cuda_archs.WANTED_ARCHS)
    elif release < (2, 7):
        assert "10.0" not in accepted and "9.0" in accepted


@pytest.mark.parametrize("name", ("fastpipe._png", "fastpipe._jpeg"))
def test_a_failed_build_of_an_optional_decoder_leaves_the_install_going(setup_py, monkeypatch,
                                                                        capsys, name):
    """A GPU machine's bundle once had a static, non-PIC libz: the probe linked a program, the
    shared fastpipe._png did not, and the whole install failed with it."""
    from setuptools import Distribution, Extension
    from setuptools.errors import LinkError
    from torch.utils import cpp_extension

    def fails(self, ext):
        raise LinkError("relocation R_X86_64_PC32 against symbol `z_errmsg'")

    monkeypatch.setattr(cpp_extension.BuildExtension, "build_extension", fails)
    command = setup_py["_build_extension_class"]()(Distribution())
    command.build_extension(Extension(name, ["x.cpp"]))
    out = capsys.readouterr().out
    assert f"building without {name}: its build failed" in out and "z_errmsg" in out
    with pytest.raises(LinkError):  # the ops' extension is not optional
        command.build_extension(Extension("fastpipe._C", ["x.cpp"]))
