"""``fastpipe doctor``: what this environment offers fastpipe, and what fastpipe will use.

:func:`environment_report` gathers it (every optional part is probed lazily and guarded: a
missing or broken one is reported, never raised); :func:`format_report` makes one screen of it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import subprocess
from typing import Any

# GPUs with NVJPG hardware JPEG decoders, which DALI's mixed decoder uses (hw_decoder_load):
# A100 and A30 (8.0), H100/H200/GH200 (9.0), B200/B300/GB200 (10.x). Judged from the name, as
# neither torch nor DALI reports the engine.
_HW_DECODER_NAMES = ("A100", "A30", "A800", "H100", "H200", "H800", "H20", "GH200", "B200",
                     "B300", "GB200", "GB300")


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _hardware_jpeg_decoder(name: str) -> bool:
    tokens = re.split(r"[\s\-_]+", name.upper())  # "NVIDIA A100-SXM4-80GB": A100, not A10
    return any(model in tokens for model in _HW_DECODER_NAMES)


def _release(text: str | None) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(match[1]), int(match[2])) if match else None


def _driver_version() -> str | None:
    """The NVIDIA kernel driver's version ("580.65.06"), from /proc or nvidia-smi; None when
    there is no NVIDIA driver."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            found = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+\.\d+(?:\.\d+)?)", f.read())
        if found:
            return found[1]
    except OSError:
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.strip().splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else None


def _nvcc_release() -> str | None:
    """The CUDA release of the nvcc a rebuild would use (CUDA_HOME's, else PATH's)."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    nvcc = os.path.join(home, "bin", "nvcc") if home else None
    if nvcc is None or not os.path.exists(nvcc):
        nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    try:
        done = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"release (\d+\.\d+)", done.stdout)
    return found[1] if found else None


def _driver(torch_cuda: str | None) -> dict[str, Any]:
    """The driver's version against the floor of torch's CUDA major (cu130 needs >= 580)."""
    from fastpipe import _cuda_archs

    version = _driver_version()
    floor = _cuda_archs.driver_floor(torch_cuda)
    info: dict[str, Any] = {"version": version,
                            "floor": None if floor is None else f"{floor[0]}.{floor[1]:02d}",
                            "ok": None, "problem": None}
    parsed = _release(version)
    if floor is not None and parsed is not None:
        info["ok"] = parsed >= floor
        if not info["ok"]:
            info["problem"] = (
                f"driver {version} is older than {floor[0]}, the oldest that runs torch built "
                f"with CUDA {torch_cuda}: update the driver, or install a torch built for an "
                "older CUDA (and the matching DALI wheel)")
    return info


def _rebuild_hint(capability: tuple[int, int], release: str | None) -> str:
    """How to get fastpipe's kernels onto a GPU they do not fit; never an arch the CUDA at hand
    cannot build (7.0 with CUDA 13)."""
    from fastpipe import _cuda_archs

    arch = f"{capability[0]}.{capability[1]}"
    parsed = _release(release)
    if parsed is not None and not _cuda_archs.release_builds(capability, parsed):
        return (f"CUDA {release} cannot build for compute capability {arch}: no rebuild helps "
                "with this toolkit; the ops run their pure-PyTorch reference on this GPU")
    return (f'rebuild with TORCH_CUDA_ARCH_LIST="{arch}" pip install --no-build-isolation -e . '
            "(docs/gpu.md)")


def _gpus(torch: Any, archs: str | None, release: str | None = None) -> list[dict[str, Any]]:
    from fastpipe import _cuda_archs

    gpus = []
    if not torch.cuda.is_available():
        return gpus
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        capability = (props.major, props.minor)
        fits = None if archs is None else _cuda_archs.kernel_image_fits(capability, archs)
        gpus.append({
            "index": index,
            "name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "memory_gib": round(props.total_memory / 2**30, 1),
            "kernels_fit": fits,
            "rebuild": None if fits is not False else _rebuild_hint(capability, release),
            "hardware_jpeg_decoder": _hardware_jpeg_decoder(props.name),
        })
    return gpus


def _extension() -> dict[str, Any]:
    from fastpipe.ops import _extension

    devices = {device for _, device in _extension.KERNELS}
    return {
        "built": _extension.LOADED,
        "problem": _extension._LOAD_PROBLEM or None,
        "cpu_kernels": "cpu" in devices,
        "cuda_kernels": "cuda" in devices,
        "cuda_archs": _extension.CUDA_ARCHS,
    }


def _module_state(name: str) -> dict[str, Any]:
    if importlib.util.find_spec(name) is None:
        return {"built": False, "problem": "not built"}
    try:
        importlib.import_module(name)
    except (ImportError, OSError) as exc:
        return {"built": False, "problem": f"failed to load: {exc}"}
    return {"built": True, "problem": None}


def _png_state() -> dict[str, Any]:
    """fastpipe._png's state, and what inflates its own rows ("isa-l" or "zlib")."""
    state = _module_state("fastpipe._png")
    state["inflate"] = None
    if state["built"]:
        state["inflate"] = getattr(importlib.import_module("fastpipe._png"), "INFLATE", "zlib")
    return state


def _dali() -> dict[str, Any]:
    version = _version("nvidia-dali-cuda130") or _version("nvidia-dali-cuda120")
    info: dict[str, Any] = {"version": version, "package": None, "gpus_seen": None,
                            "nvimgcodec": None, "problem": None}
    if version is None:
        info["problem"] = "not installed: pip install 'fastpipe[dali]'"
        return info
    info["package"] = "nvidia-dali-cuda130" if _version("nvidia-dali-cuda130") else (
        "nvidia-dali-cuda120")
    try:
        from nvidia.dali import backend
    except Exception as exc:  # noqa: BLE001 - a broken install is a finding, not a crash
        info["problem"] = f"failed to import: {exc}"
        return info
    for key, call in (("gpus_seen", "GetCUDADeviceCount"), ("nvimgcodec", "GetNvimgcodecVersion")):
        try:
            value = int(getattr(backend, call)())
        except Exception:  # noqa: BLE001 - without a driver DALI may refuse: nothing to report
            continue
        info[key] = value if value >= 0 else None
    if info["nvimgcodec"] is not None:
        code = info["nvimgcodec"]
        info["nvimgcodec"] = f"{code // 1000}.{code % 1000 // 100}.{code % 100}"
    return info


# Where nvImageCodec's nvJPEG extension looks for libnvjpeg, relative to the nvimgcodec package
# (its RUNPATH: the nvidia-nvjpeg wheel's folder), then as the system's loader finds it.
_NVJPEG_WHEEL_DIRS = ("cu{major}/lib", "nvjpeg/lib")
_NVJPEG_SYSTEM_DIRS = ("/usr/local/cuda/lib64",)


def _nvjpeg_candidates(major: int, package_dir: str | None) -> list[str]:
    """The libnvjpeg files nvImageCodec would try, in order; a bare name last (the system's)."""
    name = f"libnvjpeg.so.{major}"
    dirs = [os.path.join(package_dir, "..", d.format(major=major))
            for d in _NVJPEG_WHEEL_DIRS] if package_dir else []
    dirs += [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    dirs += list(_NVJPEG_SYSTEM_DIRS)
    found = [os.path.normpath(os.path.join(d, name)) for d in dirs]
    return [path for path in found if os.path.exists(path)] + [name]


def _nvjpeg_version(path: str) -> str:
    """Loads libnvjpeg (it needs no GPU) and asks its version, as nvImageCodec does; raises
    OSError when either fails."""
    import ctypes

    library = ctypes.CDLL(path)
    parts = []
    for prop in (0, 1, 2):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
        value = ctypes.c_int(-1)
        status = library.nvjpegGetProperty(prop, ctypes.byref(value))
        if status != 0:
            raise OSError(f"nvjpegGetProperty returned status {status}")
        parts.append(str(value.value))
    return ".".join(parts)


def nvjpeg_state() -> dict[str, Any]:
    """Whether nvImageCodec, DALI's decoder library, can load nvJPEG, its GPU JPEG decoder.

    Without it nvImageCodec registers no GPU decoder ("[nvjpeg-ext] Failed to load nvJPEG") and
    DALI's "mixed" decode runs on the CPU without saying so. Looked up where nvImageCodec looks,
    loaded and asked its version (no GPU needed), without importing nvImageCodec.
    """
    info: dict[str, Any] = {"nvimgcodec": None, "loads": None, "library": None,
                            "version": None, "problem": None}
    for major in (13, 12):
        version = _version(f"nvidia-nvimgcodec-cu{major}")
        if version is not None:
            break
    if version is None:
        info["problem"] = "nvImageCodec (DALI's decoder library) is not installed"
        return info
    info["nvimgcodec"] = version
    try:
        spec = importlib.util.find_spec("nvidia.nvimgcodec")
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    failures = []
    for path in _nvjpeg_candidates(major, locations[0] if locations else None):
        try:
            info["version"] = _nvjpeg_version(path)
        except (OSError, AttributeError) as exc:
            if os.path.sep in path:  # a file that is there but does not load
                failures.append(f"{path}: {exc}")
            continue
        info.update(loads=True, library=path)
        return info
    wheel = "nvidia-nvjpeg" if major == 13 else f"nvidia-nvjpeg-cu{major}"
    info["loads"] = False
    info["problem"] = (
        f"nvImageCodec {version} finds no loadable libnvjpeg.so.{major}"
        + (f" ({'; '.join(failures)})" if failures else "")
        + f", so it registers no GPU JPEG decoder and DALI's mixed decode runs on the CPU: "
        f"pip install {wheel} (torch's CUDA wheels do not ship it)")
    return info


def _gpu_decode(report: dict[str, Any]) -> dict[str, Any]:
    """GPU decode's parts: nvImageCodec (its version), each GPU decoder and why it cannot run
    here, and whether a GPU has the hardware JPEG engine nvImageCodec uses first."""
    from fastpipe.gpu_decode import available_backends

    nvimgcodec = None
    for major in (13, 12):
        nvimgcodec = _version(f"nvidia-nvimgcodec-cu{major}")
        if nvimgcodec is not None:
            break
    return {"nvimgcodec": nvimgcodec, "backends": available_backends(),
            "hardware_jpeg_decoder": any(g["hardware_jpeg_decoder"] for g in report["gpus"])}


def _gpu_decode_pick(report: dict[str, Any]) -> str:
    """What image_loader(decode='gpu') / DataPrefetcher decode with here."""
    info, nvjpeg = report["gpu_decode"], report["nvjpeg"]
    backends = info["backends"]
    if backends["nvimgcodec"] is None:
        engine = ("its hardware JPEG engine first" if info["hardware_jpeg_decoder"]
                  else "no hardware JPEG engine on this GPU")
        if nvjpeg["loads"] is False:
            return (f"nvImageCodec {info['nvimgcodec']} on the GPU, but it cannot load nvJPEG: "
                    "every JPEG would be decoded on the CPU (pip install nvidia-nvjpeg)")
        return f"nvImageCodec {info['nvimgcodec']} on the GPU ({engine}), nvJPEG"
    if backends["torchvision"] is None:
        return ("torchvision's decode_jpeg on the GPU (JPEGs only, whole images: nvImageCodec "
                f"{backends['nvimgcodec']})")
    return ("unavailable (" + "; ".join(f"{k}: {v}" for k, v in backends.items())
            + "): decode='gpu' is refused, decode='auto' picks the CPU path")


def _picks(torch: Any, report: dict[str, Any]) -> dict[str, str]:
    """What fastpipe will use by default here."""
    ext, gpus, dali = report["extension"], report["gpus"], report["dali"]
    cuda = torch.cuda.is_available()
    if cuda and ext["cuda_kernels"] and all(g["kernels_fit"] is not False for g in gpus):
        ops = "compiled CUDA kernels on the GPU, compiled CPU kernels on the CPU"
    elif cuda and ext["cuda_kernels"]:
        hints = sorted({g["rebuild"] for g in gpus if g["rebuild"]})
        ops = ("the pure-PyTorch reference on the GPU (fastpipe._C's kernel images do not fit "
               f"it: {'; '.join(hints)})")
    elif ext["cpu_kernels"]:
        ops = "compiled CPU kernels" + (
            "; the pure-PyTorch reference on the GPU (built without CUDA)" if cuda else "")
    else:
        ops = "the pure-PyTorch reference (fastpipe._C is not built)"
    if cuda:
        prefetcher = "CUDA: a side stream copies and normalizes the next batch"
    else:
        prefetcher = "CPU: a background thread prepares the next batch"
    if dali["version"] is None:
        dali_pick = "not installed"
    elif cuda and dali["gpus_seen"] and report["nvjpeg"]["loads"] is False:
        dali_pick = ("GPU, but the mixed decode runs on the CPU (nvImageCodec cannot load "
                     "nvJPEG; see the nvJPEG line)")
    elif cuda and dali["gpus_seen"]:
        dali_pick = "GPU: mixed decode (nvJPEG)"
    elif cuda:
        dali_pick = "CPU mode (DALI sees no GPU: install the DALI wheel of torch's CUDA major)"
    else:
        dali_pick = "CPU mode"
    decode = ("crop-only JPEG decoding (libjpeg-turbo region decode)" if report["jpeg_region"]
              ["built"] else "whole-image JPEG decoding (simplejpeg; fastpipe._jpeg is not built)")
    png = report["png"]
    if not png["built"]:
        png_pick = "PIL (fastpipe._png is not built: install libpng-dev and rebuild)"
    elif png["inflate"] == "isa-l":
        png_pick = "fastpipe's own rows, inflated by ISA-L"
    else:
        png_pick = ("fastpipe's own rows, inflated by zlib (install libisal-dev and rebuild: "
                    "about twice the inflate speed)")
    gpu_decode = _gpu_decode_pick(report)
    if not cuda:
        auto = "the CPU path (no CUDA device: GPU decode and DALI need one)"
    else:
        auto = ("measured when the loader is built, among the CPU path"
                + (", GPU decode" if not gpu_decode.startswith("unavailable") else "")
                + (", DALI" if dali_pick.startswith("GPU") else "") + "; the choice is said")
    default = ("DALI, mixed decode on the GPU (backend='auto' with DALI installed)"
               if dali_pick.startswith("GPU") else "the fast CPU path: its workers decode")
    return {"ops": ops, "DataPrefetcher": prefetcher, "DALILoader": dali_pick,
            "CPU image path": decode, "PNG decoding": png_pick,
            "GPU decode (decode='gpu')": gpu_decode,
            "image_loader()": default, "image_loader(decode='auto')": auto}


def environment_report() -> dict[str, Any]:
    """Versions, GPUs, the built parts and what fastpipe will pick, as a JSON-ready dict."""
    import torch

    from fastpipe._hardware import usable_cores
    from fastpipe._version import __version__

    ext = _extension()
    release = _nvcc_release() or torch.version.cuda
    report: dict[str, Any] = {
        "fastpipe": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torchvision": _version("torchvision"),
        "cuda_available": torch.cuda.is_available(),
        "driver": _driver(torch.version.cuda),
        "nvcc": _nvcc_release(),
        "gpus": _gpus(torch, ext["cuda_archs"], release),
        "extension": ext,
        "jpeg_region": _module_state("fastpipe._jpeg"),
        "resize": _module_state("fastpipe._resize"),
        "png": _png_state(),
        "dali": _dali(),
        "nvjpeg": nvjpeg_state(),
        "pynvml": importlib.util.find_spec("pynvml") is not None,
        "gpu_decode": None,
        "cores": usable_cores(),
        "logical_cpus": os.cpu_count(),
    }
    report["gpu_decode"] = _gpu_decode(report)
    report["picks"] = _picks(torch, report)
    return report


def _yes(flag: bool | None, unknown: str = "unknown") -> str:
    return unknown if flag is None else ("yes" if flag else "no")


def format_report(report: dict[str, Any]) -> str:
    """One screen of :func:`environment_report`."""
    ext, dali = report["extension"], report["dali"]
    lines = [
        f"fastpipe {report['fastpipe']}, Python {report['python']}, {report['platform']}",
        f"torch {report['torch']} (CUDA {report['torch_cuda'] or 'none: CPU build'}), "
        f"torchvision {report['torchvision'] or 'not installed'}",
        f"cores: {report['cores']} usable of {report['logical_cpus']}",
    ]
    driver = report["driver"]
    if driver["version"] is None:
        lines.append("NVIDIA driver: none found" + (
            f" (torch's CUDA {report['torch_cuda']} needs >= {driver['floor']})"
            if driver["floor"] else ""))
    else:
        floor = f"; torch's CUDA {report['torch_cuda']} needs >= {driver['floor']}" if driver[
            "floor"] else ""
        verdict = {True: " (ok)", False: f" (TOO OLD: {driver['problem']})", None: ""}
        lines.append(f"NVIDIA driver: {driver['version']}{floor}{verdict[driver['ok']]}")
    lines.append(f"nvcc: {report['nvcc'] or 'not found'}")
    lines.append("")
    if not report["gpus"]:
        lines.append("GPUs: none visible to torch")
    for gpu in report["gpus"]:
        lines.append(f"GPU {gpu['index']}: {gpu['name']}, compute capability {gpu['capability']}, "
                     f"{gpu['memory_gib']} GiB")
        lines.append(f"  fastpipe CUDA kernels for it: {_yes(gpu['kernels_fit'])}; "
                     f"hardware JPEG decoder: {_yes(gpu['hardware_jpeg_decoder'])}")
        if gpu.get("rebuild"):
            lines.append(f"  {gpu['rebuild']}")
    built = "built" if ext["built"] else f"not usable ({ext['problem']})"
    kernels = ", ".join(d for d, ok in (("CPU", ext["cpu_kernels"]), ("CUDA", ext["cuda_kernels"]))
                        if ok) or "none"
    lines += [
        "",
        f"fastpipe._C: {built}; kernels: {kernels}; CUDA architectures: "
        f"{ext['cuda_archs'] or '-'}",
        f"fastpipe._jpeg (libjpeg-turbo region decode): "
        f"{'built' if report['jpeg_region']['built'] else report['jpeg_region']['problem']}",
        f"fastpipe._resize: "
        f"{'built' if report['resize']['built'] else report['resize']['problem']}",
        "fastpipe._png (PNG rows; libpng): " + (
            f"built, inflate: {report['png']['inflate']}" if report["png"]["built"]
            else report["png"]["problem"]),
    ]
    if dali["version"] is None:
        lines.append(f"DALI: {dali['problem']}")
    else:
        seen = dali["gpus_seen"]
        lines.append(f"DALI {dali['version']} ({dali['package']}): sees "
                     f"{'?' if seen is None else seen} GPU(s); nvImageCodec "
                     f"{dali['nvimgcodec'] or 'unknown'}"
                     + (f"; {dali['problem']}" if dali["problem"] else ""))
    nvjpeg = report["nvjpeg"]
    if nvjpeg["loads"]:
        lines.append(f"nvJPEG for nvImageCodec {nvjpeg['nvimgcodec']}: libnvjpeg "
                     f"{nvjpeg['version']} loads ({nvjpeg['library']}): the mixed decode can "
                     "decode on the GPU")
    elif nvjpeg["nvimgcodec"] is not None:
        lines.append(f"nvJPEG: NOT LOADED: {nvjpeg['problem']}")
    gpu_decode = report["gpu_decode"]
    lines.append("nvImageCodec (GPU decode): " + (
        f"{gpu_decode['nvimgcodec']}" if gpu_decode["nvimgcodec"] else
        "not installed: pip install 'fastpipe[gpu-decode]'")
        + "; hardware JPEG engine: " + _yes(gpu_decode["hardware_jpeg_decoder"] or None,
                                            "no GPU" if not report["gpus"] else "no"))
    lines += ["", "fastpipe will use:"]
    lines += [f"  {part}: {choice}" for part, choice in report["picks"].items()]
    return "\n".join(lines)
