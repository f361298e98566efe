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


def test_doctor_reports_this_machine(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert f"torch {torch.__version__}" in out
    assert f"cores: {len(os.sched_getaffinity(0))} usable" in out
    assert "fastpipe will use:" in out and "  ops: " in out and "  DALILoader: " in out
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
