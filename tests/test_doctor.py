"""fastpipe doctor: the real environment here (no GPU), and stand-in GPUs for the GPU lines."""

from __future__ import annotations

import importlib.util
import json
import os
from types import SimpleNamespace

import pytest
import torch

from fastpipe import _doctor
from fastpipe._cli import main
from fastpipe.ops import _extension

REAL_NVJPEG = _doctor.nvjpeg_state


def test_doctor_reports_this_machine(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert f"torch {torch.__version__}" in out
    assert f"cores: {len(os.sched_getaffinity(0))} usable" in out
    assert "fastpipe will use:" in out and "  ops: " in out and "  DALILoader: " in out
    assert "  PNG decoding: " in out and "fastpipe._png (PNG rows; libpng): " in out
    if not torch.cuda.is_available():
        assert "GPUs: none visible to torch" in out
        assert "DataPrefetcher: CPU: a background thread" in out
    if _extension.CUDA_ARCHS:
        assert f"CUDA architectures: {_extension.CUDA_ARCHS}" in out


def test_doctor_json_holds_the_same_findings(capsys):
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["torch"] == torch.__version__ and report["torch_cuda"] == torch.version.cuda
    assert report["cuda_available"] == torch.cuda.is_available()
    assert report["extension"]["built"] == _extension.LOADED
    assert report["extension"]["cuda_archs"] == _extension.CUDA_ARCHS
    jpeg_built = importlib.util.find_spec("fastpipe._jpeg") is not None
    assert report["jpeg_region"]["built"] == jpeg_built
    assert ("crop-only" in report["picks"]["CPU image path"]) == jpeg_built
    png = importlib.util.find_spec("fastpipe._png")
    assert report["png"]["built"] == (png is not None)
    if png is not None:
        inflate = importlib.import_module("fastpipe._png").INFLATE
        assert report["png"]["inflate"] == inflate
        assert inflate in report["picks"]["PNG decoding"].lower()
    assert report["cores"] == len(os.sched_getaffinity(0))
    dali = importlib.util.find_spec("nvidia.dali") is not None
    assert (report["dali"]["version"] is not None) == dali
    if dali and not torch.cuda.is_available():
        assert report["dali"]["gpus_seen"] == 0 and report["picks"]["DALILoader"] == "CPU mode"


@pytest.fixture
def fake_gpu(monkeypatch):
    """torch sees one GPU of a chosen model (nothing touches a real one)."""
    gpu = {"name": "NVIDIA A100-SXM4-80GB", "capability": (8, 0)}

    def properties(index):
        major, minor = gpu["capability"]
        return SimpleNamespace(name=gpu["name"], major=major, minor=minor,
                               total_memory=80 * 2**30)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    monkeypatch.setattr(_doctor, "_extension", lambda: {
        "built": True, "problem": None, "cpu_kernels": True, "cuda_kernels": True,
        "cuda_archs": "8.0,9.0"})
    monkeypatch.setattr(_doctor, "_dali", lambda: {
        "version": "2.4.0", "package": "nvidia-dali-cuda130", "gpus_seen": 1,
        "nvimgcodec": "0.9.0", "problem": None})
    monkeypatch.setattr(_doctor, "nvjpeg_state", lambda: {
        "nvimgcodec": "0.9.0.20", "loads": True, "version": "13.3.2", "problem": None,
        "library": "/site-packages/nvidia/cu13/lib/libnvjpeg.so.13"})
    return gpu


def test_doctor_on_a_gpu_the_kernels_fit(fake_gpu):
    report = _doctor.environment_report()
    (gpu,) = report["gpus"]
    assert gpu["capability"] == "8.0" and gpu["kernels_fit"] is True
    assert gpu["hardware_jpeg_decoder"] is True
    assert report["picks"]["ops"].startswith("compiled CUDA kernels")
    assert report["picks"]["DALILoader"] == "GPU: mixed decode (nvJPEG)"
    text = _doctor.format_report(report)
    assert "GPU 0: NVIDIA A100-SXM4-80GB, compute capability 8.0, 80.0 GiB" in text
    assert "fastpipe CUDA kernels for it: yes; hardware JPEG decoder: yes" in text


def test_doctor_on_a_gpu_the_kernels_do_not_fit(fake_gpu):
    fake_gpu.update(name="Tesla T4", capability=(7, 5))
    report = _doctor.environment_report()
    (gpu,) = report["gpus"]
    assert gpu["kernels_fit"] is False and gpu["hardware_jpeg_decoder"] is False
    assert "pure-PyTorch reference on the GPU" in report["picks"]["ops"]
    assert "TORCH_CUDA_ARCH_LIST" in report["picks"]["ops"]
    assert "fastpipe CUDA kernels for it: no" in _doctor.format_report(report)


def test_doctor_without_dali_names_the_extra(monkeypatch):
    monkeypatch.setattr(_doctor, "_version", lambda distribution: None)
    report = _doctor.environment_report()
    assert report["dali"]["version"] is None
    assert report["picks"]["DALILoader"] == "not installed"
    assert "DALI: not installed: pip install 'fastpipe[dali]'" in _doctor.format_report(report)


@pytest.mark.parametrize(("name", "hardware"), [
    ("NVIDIA H100 80GB HBM3", True), ("NVIDIA A30", True), ("NVIDIA B200", True),
    ("NVIDIA GeForce RTX 4090", False), ("NVIDIA L4", False), ("NVIDIA A10", False),
    ("NVIDIA A100-PCIE-40GB", True), ("NVIDIA RTX A6000", False), ("NVIDIA RTX A3000", False),
])
def test_hardware_jpeg_decoder_by_gpu_model(name, hardware):
    assert _doctor._hardware_jpeg_decoder(name) is hardware


def test_doctor_is_listed_with_its_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["doctor", "--help"])
    assert exit_info.value.code == 0
    assert "--json" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "doctor" in capsys.readouterr().out


def test_doctor_never_suggests_an_arch_the_cuda_at_hand_cannot_build(fake_gpu, monkeypatch):
    # A V100 (7.0) with CUDA 13: nvcc 13 dropped Volta, so no TORCH_CUDA_ARCH_LIST="7.0".
    fake_gpu.update(name="Tesla V100-SXM2-32GB", capability=(7, 0))
    monkeypatch.setattr(_doctor, "_nvcc_release", lambda: "13.0")
    report = _doctor.environment_report()
    (gpu,) = report["gpus"]
    assert gpu["kernels_fit"] is False
    assert "CUDA 13.0 cannot build for compute capability 7.0" in gpu["rebuild"]
    assert 'TORCH_CUDA_ARCH_LIST="7.0"' not in _doctor.format_report(report)
    assert 'TORCH_CUDA_ARCH_LIST="7.0"' not in report["picks"]["ops"]
    # A GPU nvcc can build for gets the line that works.
    fake_gpu.update(name="Tesla T4", capability=(7, 5))
    report = _doctor.environment_report()
    assert 'TORCH_CUDA_ARCH_LIST="7.5"' in report["gpus"][0]["rebuild"]
    assert 'TORCH_CUDA_ARCH_LIST="7.5"' in _doctor.format_report(report)


def test_fallback_warning_never_suggests_an_arch_torchs_cuda_cannot_build(monkeypatch):
    monkeypatch.setattr(_extension, "KERNELS", frozenset({("normalize", "cuda")}))
    monkeypatch.setattr(_extension, "LOADED", True)
    monkeypatch.setattr(_extension, "_warned", False)
    monkeypatch.setattr(_extension, "CUDA_ARCHS", "7.5,8.0")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (7, 0))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    with pytest.warns(RuntimeWarning, match="CUDA 13.0 .*cannot build for 7.0") as record:
        _extension.warn_fallback("normalize", torch.device("cuda", 0))
    assert "TORCH_CUDA_ARCH_LIST" not in str(record[0].message)


@pytest.mark.parametrize(("proc", "version", "torch_cuda", "ok", "floor"), [
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 07:09:13 UTC 2025",
     "580.65.06", "13.0", True, "580.00"),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  575.57.08  Release Build",
     "575.57.08", "13.0", False, "580.00"),
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 UTC 2024",
     "550.54.15", "12.4", True, "525.60"),
])
def test_doctor_reports_the_driver_against_the_floor_of_torchs_cuda(
    monkeypatch, proc, version, torch_cuda, ok, floor
):
    import builtins
    import io

    real_open = builtins.open

    def fake_open(path, *args, **kwargs):
        if path == "/proc/driver/nvidia/version":
            return io.StringIO(proc)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(torch.version, "cuda", torch_cuda)
    report = _doctor.environment_report()
    driver = report["driver"]
    assert driver["version"] == version
    assert driver["floor"] == floor and driver["ok"] is ok
    text = _doctor.format_report(report)
    assert f"NVIDIA driver: {driver['version']}; torch's CUDA {torch_cuda} needs >= {floor}" in text
    if not ok:
        assert "TOO OLD" in text and "older than 580" in text


def test_doctor_without_a_driver_says_so(monkeypatch):
    monkeypatch.setattr(_doctor, "_driver_version", lambda: None)
    report = _doctor.environment_report()
    assert report["driver"]["version"] is None and report["driver"]["ok"] is None
    assert "NVIDIA driver: none found" in _doctor.format_report(report)


# --- nvJPEG, without which DALI's mixed decode runs on the CPU ---------------------------------


def _wheel_nvjpeg() -> str | None:
    """The libnvjpeg of the nvidia-nvjpeg wheel beside nvImageCodec, if both are here."""
    spec = importlib.util.find_spec("nvidia.nvimgcodec") if importlib.util.find_spec(
        "nvidia") else None
    if spec is None:
        return None
    package = list(spec.submodule_search_locations)[0]
    path = os.path.normpath(os.path.join(package, "..", "cu13", "lib", "libnvjpeg.so.13"))
    return path if os.path.exists(path) else None


def test_doctor_says_whether_nvimagecodec_can_load_nvjpeg(capsys):
    report = _doctor.environment_report()
    nvjpeg = report["nvjpeg"]
    installed = _doctor._version("nvidia-nvimgcodec-cu13") or _doctor._version(
        "nvidia-nvimgcodec-cu12")
    assert nvjpeg["nvimgcodec"] == installed
    wheel = _wheel_nvjpeg()
    if wheel is not None:  # this venv: nvidia-nvjpeg beside nvidia-nvimgcodec-cu13
        assert nvjpeg["loads"] is True and nvjpeg["library"] == wheel
        assert nvjpeg["version"].startswith("13.")
        assert f"loads ({wheel})" in _doctor.format_report(report)
    assert main(["doctor", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["nvjpeg"]["loads"] == nvjpeg["loads"]


@pytest.fixture
def no_nvjpeg(monkeypatch, tmp_path):
    """nvImageCodec is installed (version 0.9.0.20) and nvJPEG is not where it looks (after
    fake_gpu, which stands in for the whole check)."""
    monkeypatch.setattr(_doctor, "nvjpeg_state", REAL_NVJPEG)
    monkeypatch.setattr(_doctor, "_version", lambda d: "0.9.0.20" if "nvimgcodec-cu13" in d
                        else ("2.4.0" if "dali-cuda130" in d else None))
    monkeypatch.setattr(_doctor, "_nvjpeg_candidates",
                        lambda major, package: [str(tmp_path / "nothing" / "libnvjpeg.so.13"),
                                                "libnvjpeg-not-a-library.so.13"])
    return tmp_path


def test_without_nvjpeg_the_doctor_says_the_mixed_decode_runs_on_the_cpu(fake_gpu,
                                                                          no_nvjpeg):
    report = _doctor.environment_report()
    assert report["nvjpeg"]["loads"] is False
    assert "pip install nvidia-nvjpeg" in report["nvjpeg"]["problem"]
    assert "mixed decode runs on the CPU" in report["picks"]["DALILoader"]
    text = _doctor.format_report(report)
    assert "nvJPEG: NOT LOADED: nvImageCodec 0.9.0.20 finds no loadable libnvjpeg.so.13" in text


def test_a_libnvjpeg_that_does_not_load_is_named(monkeypatch, no_nvjpeg):
    broken = no_nvjpeg / "libnvjpeg.so.13"
    broken.write_bytes(b"not an ELF file")
    monkeypatch.setattr(_doctor, "_nvjpeg_candidates",
                        lambda major, package: [str(broken), "libnvjpeg-not-a-library.so.13"])
    nvjpeg = _doctor.nvjpeg_state()
    assert nvjpeg["loads"] is False and str(broken) in nvjpeg["problem"]


def test_the_candidates_follow_nvimagecodecs_search_order(monkeypatch, tmp_path):
    package = tmp_path / "nvidia" / "nvimgcodec"
    wheel = tmp_path / "nvidia" / "cu13" / "lib"
    extra = tmp_path / "extra"
    for folder in (package, wheel, extra):
        folder.mkdir(parents=True)
    for folder in (wheel, extra):
        (folder / "libnvjpeg.so.13").write_bytes(b"")
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{tmp_path / 'missing'}:{extra}")
    assert _doctor._nvjpeg_candidates(13, str(package)) == [
        str(wheel / "libnvjpeg.so.13"), str(extra / "libnvjpeg.so.13"), "libnvjpeg.so.13"]


# ------------------------------------------------------------------------------- GPU decode


def test_doctor_reports_gpu_decode_and_which_decode_each_loader_uses_here(capsys):
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    nvimgcodec = importlib.util.find_spec("nvidia.nvimgcodec") is not None
    assert (report["gpu_decode"]["nvimgcodec"] is not None) == nvimgcodec
    assert set(report["gpu_decode"]["backends"]) == {"nvimgcodec", "torchvision"}
    picks = report["picks"]
    assert {"GPU decode (decode='gpu')", "image_loader()", "image_loader(decode='auto')"} <= set(
        picks)
    if not torch.cuda.is_available():
        assert picks["GPU decode (decode='gpu')"].startswith("unavailable (nvimgcodec: ")
        assert "decode='gpu' is refused" in picks["GPU decode (decode='gpu')"]
        assert picks["image_loader(decode='auto')"].startswith("the CPU path (no CUDA device")
        assert main(["doctor"]) == 0
        assert "nvImageCodec (GPU decode): " in capsys.readouterr().out


@pytest.mark.parametrize("backends, nvjpeg_loads, pick", [
    ({"nvimgcodec": None, "torchvision": None}, True,
     "nvImageCodec 0.9.0.20 on the GPU (its hardware JPEG engine first), nvJPEG"),
    ({"nvimgcodec": None, "torchvision": None}, False, "cannot load nvJPEG: every JPEG would be "
                                                       "decoded on the CPU"),
    ({"nvimgcodec": "not installed: pip install 'fastpipe[gpu-decode]'", "torchvision": None},
     True, "torchvision's decode_jpeg on the GPU"),
])
def test_doctor_on_a_gpu_says_what_gpu_decode_decodes_with(fake_gpu, monkeypatch, backends,
                                                           nvjpeg_loads, pick):
    import fastpipe.gpu_decode as gpu_decode

    monkeypatch.setattr(gpu_decode, "available_backends", lambda: backends)
    monkeypatch.setattr(_doctor, "_version",
                        lambda name: "0.9.0.20" if "nvimgcodec" in name else None)
    state = {"nvimgcodec": "0.9.0.20", "loads": nvjpeg_loads, "version": "13.3.2",
             "problem": None, "library": "libnvjpeg.so.13"}
    monkeypatch.setattr(_doctor, "nvjpeg_state", lambda: state)
    report = _doctor.environment_report()
    assert pick in report["picks"]["GPU decode (decode='gpu')"]
    assert report["gpu_decode"]["hardware_jpeg_decoder"] is True
    assert "GPU decode" in report["picks"]["image_loader(decode='auto')"]
    assert "hardware JPEG engine: yes" in _doctor.format_report(report)
