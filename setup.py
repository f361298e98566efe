"""Builds fastpipe and its extensions fastpipe._C, fastpipe._resize, fastpipe._io, fastpipe._jpeg
and fastpipe._png.

The CPU kernels (fastpipe/csrc/*.cpp, fastpipe/csrc/cpu/*.cpp) are always built. The CUDA kernels
(fastpipe/csrc/cuda/*.cu, plain CUDA without torch headers so they compile in seconds) and their
torch glue (fastpipe/csrc/cuda/*.cpp) are added when torch is a CUDA build and nvcc is found
(CUDA_HOME, or nvcc on PATH), for TORCH_CUDA_ARCH_LIST when it is set, else for every architecture
of fastpipe/_cuda_archs.py's WANTED_ARCHS that this nvcc supports and the installed torch's
cpp_extension accepts (7.5 to 12.0, the newest also as PTX for newer GPUs; torch 2.4-2.6 stop at
9.0). The list is recorded in the extension, so that at run time the ops fall back
to their reference, with a warning, on a GPU the kernel images do not fit.

fastpipe._resize (fastpipe/csrc/image/resize.cpp, no torch headers, no libraries) resizes the CPU
image path's crops straight into (3, H, W) planes; it is built with fastpipe._C.

fastpipe._io (fastpipe/csrc/io/gather.cpp, no torch headers, no libraries) copies a batch's pieces
from files in one call without the GIL (the sources' reader engine); it is built with fastpipe._C.

fastpipe._jpeg (fastpipe/csrc/jpeg/region_decode.cpp, no torch headers) decodes only the crop of a
JPEG with libjpeg-turbo's own API; it is built when libjpeg-turbo's headers and library are found
(Debian: apt install libjpeg62-turbo-dev; Ubuntu: libjpeg-turbo8-dev; Fedora: libjpeg-turbo-devel;
elsewhere point CFLAGS/LDFLAGS at them). Without it the CPU image path decodes whole images with
simplejpeg, about 20% more decode time for a train crop.

fastpipe._png (fastpipe/csrc/png/png_decode.cpp, no torch headers) decodes PNGs to their stored
pixels, or only a band of rows, with zlib and libpng 1.6; it is built when libpng's headers and
library are found (Debian/Ubuntu: apt install libpng-dev; Fedora: libpng-devel). Without it PNGs
decode with PIL (fastpipe/data/decode/png.py).

Build against the installed torch:    pip install --no-build-isolation -e .
In place, for development:            python setup.py build_ext --inplace

Environment switches: FASTPIPE_NO_EXTENSION=1 skips all extensions (fastpipe then uses its
pure-PyTorch ops, torch's resize and whole-image decoding), FASTPIPE_NO_CUDA=1 builds the CPU
kernels only, FASTPIPE_NO_JPEG=1 skips fastpipe._jpeg, FASTPIPE_NO_PNG=1 skips fastpipe._png,
MAX_JOBS=N limits parallel compiles (ninja).
"""

import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sysconfig
import tempfile

from setuptools import Extension, setup

# Bits must match across the CPU kernels, the CUDA kernels and the PyTorch reference: no
# contraction of a * b + c into fused multiply-adds (see fastpipe/csrc/kernels.h).
CXX_FLAGS = ["-O3", "-g0", "-fopenmp", "-ffp-contract=off"]
NVCC_FLAGS = ["-O3", "--fmad=false"]


def _cuda_archs_module():
    """fastpipe/_cuda_archs.py, loaded by path: importing the package would import torch."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fastpipe", "_cuda_archs.py")
    spec = importlib.util.spec_from_file_location("_fastpipe_cuda_archs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _find_cuda_home():
    """The CUDA toolkit root: CUDA_HOME, CUDA_PATH, nvcc's real location, or /usr/local/cuda.

    A candidate counts only with bin/nvcc and include/cuda_runtime.h, so an nvcc wrapper script
    in /usr/local/bin does not make torch look for the CUDA headers in /usr/local/include.
    """
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    candidates.append("/usr/local/cuda")
    for root in candidates:
        if root and all(
            os.path.exists(os.path.join(root, *part))
            for part in (("bin", "nvcc"), ("include", "cuda_runtime.h"))
        ):
            return root
    return None


def _nvcc_release(cuda_home):
    """The toolkit's "major.minor" release from nvcc --version, or None."""
    try:
        out = subprocess.run(
            [os.path.join(cuda_home, "bin", "nvcc"), "--version"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"release (\d+)\.(\d+)", out)
    return f"{match.group(1)}.{match.group(2)}" if match else None


def _nvcc_archs(cuda_home):
    """The architectures this nvcc compiles for (from --list-gpu-arch, else from its release)."""
    archs = _cuda_archs_module()
    try:
        listing = subprocess.run(
            [os.path.join(cuda_home, "bin", "nvcc"), "--list-gpu-arch"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        listing = ""
    supported = archs.archs_of_nvcc_listing(listing)
    if not supported:
        release = _nvcc_release(cuda_home)
        if release is not None:
            supported = archs.archs_of_release(tuple(int(p) for p in release.split(".")))
    return supported


def _torch_accepts_arch(arch):
    """Whether the installed torch's cpp_extension builds for ``arch`` (torch 2.4-2.6 reject
    everything past 9.0a with "Unknown CUDA arch"), asked of its own check; None when that
    cannot be asked. torch's _get_cuda_arch_flags is private and setup.py cannot import
    fastpipe._compat (the package is not built yet), so the call lives here, behind a fallback."""
    try:
        from torch.utils import cpp_extension
    except ImportError:
        return None
    check = getattr(cpp_extension, "_get_cuda_arch_flags", None)
    if not callable(check):
        return None
    saved = os.environ.get("TORCH_CUDA_ARCH_LIST")
    os.environ["TORCH_CUDA_ARCH_LIST"] = arch
    try:
        check()
        return True
    except ValueError:
        return False
    except Exception:  # a changed private function: fall back to the release rule
        return None
    finally:
        if saved is None:
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = saved


def _torch_version():
    try:
        import torch
    except ImportError:
        return ""
    return torch.__version__


def _cuda_arch_list(cuda_home) -> str:
    """TORCH_CUDA_ARCH_LIST if set, else the default list for this nvcc and this torch (set in
    os.environ, where torch.utils.cpp_extension reads it)."""
    chosen = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if not chosen:
        archs = _cuda_archs_module()
        supported = _nvcc_archs(cuda_home)
        accepted = archs.archs_torch_accepts(
            archs.WANTED_ARCHS, _torch_accepts_arch, _torch_version()
        )
        chosen = archs.default_arch_list(supported, accepted)
        left_out = sorted(supported & set(archs.WANTED_ARCHS) - accepted, key=lambda a: float(a))
        if left_out:
            print(
                f"fastpipe: torch {_torch_version()} cannot build for {', '.join(left_out)} "
                "(its cpp_extension rejects them); left out of the list"
            )
        if not chosen:
            raise RuntimeError(
                f"fastpipe: the nvcc in {cuda_home} and torch {_torch_version()} share none of "
                "the GPU architectures 7.5 to 12.0; set TORCH_CUDA_ARCH_LIST (e.g. "
                "\"8.0;9.0+PTX\"), or FASTPIPE_NO_CUDA=1 to build the CPU kernels only"
            )
        os.environ["TORCH_CUDA_ARCH_LIST"] = chosen
    print(f"fastpipe: building the CUDA kernels for TORCH_CUDA_ARCH_LIST={chosen}")
    return chosen


def _with_cuda(torch, cuda_home) -> bool:
    """CUDA kernels need a CUDA torch and a toolkit of the same major version (as torch
    requires)."""
    if cuda_home is None or torch.version.cuda is None:
        return False
    release = _nvcc_release(cuda_home)
    if release is None or release.split(".")[0] != torch.version.cuda.split(".")[0]:
        print(
            f"fastpipe: building the CPU kernels only: the CUDA toolkit in {cuda_home} is "
            f"{release or 'unusable'}, torch was built with CUDA {torch.version.cuda}; set "
            "CUDA_HOME to a toolkit of the same major version to build the CUDA kernels"
        )
        return False
    return True


_LIBJPEG_PROBE = """
#include <stdio.h>
#include <jpeglib.h>
#if !defined(LIBJPEG_TURBO_VERSION_NUMBER) || LIBJPEG_TURBO_VERSION_NUMBER < 2001000
#error "fastpipe._jpeg needs libjpeg-turbo >= 2.1 (tested with 2.1.5)"
#endif
int main(void) {
    struct jpeg_decompress_struct cinfo;
    JDIMENSION x = 0, w = 1;
    jpeg_crop_scanline(&cinfo, &x, &w);
    return (int)jpeg_skip_scanlines(&cinfo, 0);
}
"""


def _libjpeg_turbo_found() -> bool:
    """True when a program using libjpeg-turbo's region API compiles and links here."""
    return _links(_LIBJPEG_PROBE, ["jpeg"])


def _jpeg_extension():
    """fastpipe._jpeg when libjpeg-turbo's headers are here, else None (with the reason printed)."""
    if os.environ.get("FASTPIPE_NO_JPEG") == "1":
        return None
    if not _libjpeg_turbo_found():
        print(
            "fastpipe: building without fastpipe._jpeg (crop-only JPEG decoding): libjpeg-turbo >= "
            "2.1 headers and library not found. Install them (Debian: libjpeg62-turbo-dev, Ubuntu: "
            "libjpeg-turbo8-dev, Fedora: libjpeg-turbo-devel) and reinstall; fastpipe works "
            "without it, decoding whole images with simplejpeg"
        )
        return None
    return Extension(
        "fastpipe._jpeg",
        [os.path.join("fastpipe", "csrc", "jpeg", "region_decode.cpp")],
        depends=[os.path.join("fastpipe", "csrc", "image", "resize_kernel.h"),
                 os.path.join("fastpipe", "csrc", "kernels.h")] + [
            os.path.join("fastpipe", "csrc", "jpeg", name)
            for name in ("decode_core.h", "huffman_decoder.h", "restart_segments.h",
                         "train_plan.h", "transcode.h")],
        libraries=["jpeg"],
        # -ffp-contract=off: decode_resize's resize computes fastpipe._resize's pixels, and
        # decode_train's crop arithmetic the Python path's (no fused multiply-adds in either).
        extra_compile_args=["-O3", "-g0", "-ffp-contract=off"],
    )


def _io_extension():
    # fastpipe._io: a batch's pieces copied from mapped files (pread where a file cannot be
    # mapped) without the GIL: the sources' reader engine.
    return Extension(
        "fastpipe._io",
        [os.path.join("fastpipe", "csrc", "io", "gather.cpp")],
        extra_compile_args=["-O3", "-g0"],
    )


def _resize_extension():
    # -ffp-contract=off: no fused multiply-adds, so every machine computes the same pixels.
    return Extension(
        "fastpipe._resize",
        [os.path.join("fastpipe", "csrc", "image", "resize.cpp")],
        depends=[os.path.join("fastpipe", "csrc", "image", "resize_kernel.h"),
                 os.path.join("fastpipe", "csrc", "kernels.h")],
        extra_compile_args=["-O3", "-g0", "-ffp-contract=off"],
    )


_LIBPNG_PROBE = """
#include <png.h>
#include <zlib.h>
#if PNG_LIBPNG_VER < 10600
#error "fastpipe._png needs libpng >= 1.6 (tested with 1.6.39)"
#endif
int main(void) {
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, 0, 0, 0);
    png_destroy_read_struct(&png, 0, 0);
    return (int)crc32(0L, 0, 0);
}
"""


# ISA-L's inflate (igzip) for fastpipe._png's own rows, about twice zlib's speed; zlib without it.
_ISAL_PROBE = """
#include <isa-l/igzip_lib.h>
int main(void) {
    struct inflate_state state;
    isal_inflate_init(&state);
    state.crc_flag = ISAL_ZLIB;
    return isal_inflate(&state) == ISAL_INVALID_WRAPPER ? 0 : 1;
}
"""


def _links(program: str, libraries: list[str]) -> bool:
    """True when the C ``program`` compiles and links here with ``libraries`` (CC, CFLAGS and
    LDFLAGS apply, as they do to the extensions)."""
    compiler = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "probe.c")
        with open(source, "w") as file:
            file.write(program)
        command = (compiler.split() + os.environ.get("CFLAGS", "").split()
                   + [source, "-o", os.path.join(tmp, "probe")]
                   + os.environ.get("LDFLAGS", "").split() + [f"-l{lib}" for lib in libraries])
        try:
            return subprocess.run(command, capture_output=True, timeout=120).returncode == 0
        except (OSError, subprocess.SubprocessError):
            return False


def _libpng_found() -> bool:
    """True when a program using libpng 1.6 and zlib compiles and links here."""
    return _links(_LIBPNG_PROBE, ["png", "z"])


def _isal_found() -> bool:
    """True when a program using ISA-L's inflate compiles and links here (FASTPIPE_NO_ISAL=1: as
    if not)."""
    return os.environ.get("FASTPIPE_NO_ISAL") != "1" and _links(_ISAL_PROBE, ["isal"])


def _png_extension():
    """fastpipe._png when libpng's headers are here, else None (with the reason printed)."""
    if os.environ.get("FASTPIPE_NO_PNG") == "1":
        return None
    if not _libpng_found():
        print(
            "fastpipe: building without fastpipe._png (libpng PNG decoding): libpng >= 1.6 "
            "headers and library not found. Install them (Debian/Ubuntu: libpng-dev, Fedora: "
            "libpng-devel) and reinstall; fastpipe works without it, decoding PNGs with PIL "
            "(16-bit colour PNGs then cannot keep their 16 bits)"
        )
        return None
    libraries, macros = ["png", "z"], []
    if _isal_found():
        libraries.append("isal")
        macros.append(("FASTPIPE_PNG_ISAL", "1"))
    else:
        print(
            "fastpipe: fastpipe._png inflates with zlib: ISA-L's headers and library not found "
            "(Debian/Ubuntu: libisal-dev, Fedora: isa-l-devel); with them its own PNG rows "
            "inflate about twice as fast"
        )
    return Extension(
        "fastpipe._png",
        [os.path.join("fastpipe", "csrc", "png", "png_decode.cpp")],
        depends=[os.path.join("fastpipe", "csrc", "png", h) for h in ("rows.h", "unfilter.h")],
        libraries=libraries,
        define_macros=macros,
        extra_compile_args=["-O3", "-g0"],
    )


# Extensions whose failed build leaves fastpipe working, and what it does without each.
_OPTIONAL_EXTENSIONS = {
    "fastpipe._jpeg": "whole JPEGs decode with simplejpeg",
    "fastpipe._png": "PNGs decode with PIL",
}

# Extensions on the full C API of one Python version, named with its ABI tag.
_VERSIONED_EXTENSIONS = ("_jpeg", "_resize", "_png", "_io")


def _build_extension_class():
    """torch's BuildExtension, naming fastpipe._C without the Python ABI tag (it is built on the
    stable ABI) and the plain CPython modules with it."""
    from setuptools.command.build_ext import build_ext as setuptools_build_ext
    from torch.utils import cpp_extension

    class BuildExtension(cpp_extension.BuildExtension):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, no_python_abi_suffix=True, **kwargs)

        def build_extension(self, ext):
            # The library-backed decoders are optional: a probe that compiled and linked a
            # program can still meet a library that a shared module cannot link (a static,
            # non-PIC libz, say). fastpipe then installs without that module, as when the probe
            # fails, instead of failing the whole install.
            if ext.name not in _OPTIONAL_EXTENSIONS:
                return super().build_extension(ext)
            try:
                return super().build_extension(ext)
            except Exception as error:  # noqa: BLE001 - any build failure of an optional module
                print(f"fastpipe: building without {ext.name}: its build failed ({error}); "
                      f"fastpipe works without it ({_OPTIONAL_EXTENSIONS[ext.name]})")
                return None

        def get_ext_filename(self, ext_name):
            # distutils passes the last part only
            if ext_name.split(".")[-1] in _VERSIONED_EXTENSIONS:
                return setuptools_build_ext.get_ext_filename(self, ext_name)
            return super().get_ext_filename(ext_name)

    return BuildExtension


def _sanitized(extensions):
    """With FASTPIPE_SANITIZE (e.g. ``address,undefined``), the plain CPython extensions
    (fastpipe._jpeg, fastpipe._resize) built with those sanitizers for the fuzz lane
    (fuzz/run.sh, docs/fuzzing.md), and fastpipe._C, torch's, left out; with
    FASTPIPE_LIBJPEG_PREFIX, fastpipe._jpeg links the libjpeg-turbo installed there (a sanitized
    one: fuzz/build_libjpeg.sh). Without it, the extensions as they are."""
    sanitizers = os.environ.get("FASTPIPE_SANITIZE", "").strip()
    if not sanitizers:
        return extensions
    flags = [f"-fsanitize={sanitizers}", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer",
             "-g", "-O1"]
    prefix = os.environ.get("FASTPIPE_LIBJPEG_PREFIX")
    kept = []
    for ext in extensions:
        name = ext.name.split(".")[-1]
        if name not in _VERSIONED_EXTENSIONS:
            continue
        ext.extra_compile_args = [a for a in ext.extra_compile_args if a not in ("-O3", "-g0")]
        ext.extra_compile_args += flags
        ext.extra_link_args = list(ext.extra_link_args or []) + [f"-fsanitize={sanitizers}"]
        if prefix and name == "_jpeg":
            ext.include_dirs = [os.path.join(prefix, "include")] + list(ext.include_dirs or [])
            ext.library_dirs = [os.path.join(prefix, "lib")]
            ext.runtime_library_dirs = [os.path.join(prefix, "lib")]
        kept.append(ext)
    return kept


def _extensions():
    if os.environ.get("FASTPIPE_NO_EXTENSION") == "1":
        return [], {}
    cuda_home = None if os.environ.get("FASTPIPE_NO_CUDA") == "1" else _find_cuda_home()
    if cuda_home is not None:
        # torch.utils.cpp_extension reads it once, when imported.
        os.environ["CUDA_HOME"] = cuda_home
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError as exc:
        raise RuntimeError(
            "fastpipe's extension builds against the installed torch, and torch is not importable. "
            "Install torch first, then run: pip install --no-build-isolation -e . "
            "(or set FASTPIPE_NO_EXTENSION=1 to install without the extension)"
        ) from exc

    here = os.path.dirname(os.path.abspath(__file__))
    csrc = os.path.join("fastpipe", "csrc")
    sources = sorted(
        glob.glob(os.path.join(csrc, "*.cpp")) + glob.glob(os.path.join(csrc, "cpu", "*.cpp"))
    )
    if not sources:
        return [], {}
    jpeg = _jpeg_extension()
    common = dict(
        include_dirs=[os.path.join(here, csrc)],
        extra_link_args=["-fopenmp"],
        define_macros=[("Py_LIMITED_API", "0x030A0000")],
        py_limited_api=True,
    )
    if _with_cuda(torch, cuda_home):
        arch_list = _cuda_arch_list(cuda_home)
        # Recorded for fastpipe.ops (ops_cuda.cpp's fastpipe_cuda_archs()); commas, since the
        # define passes through a shell; for g++ only, since nvcc splits -D values at commas.
        recorded = ",".join(e for e in re.split(r"[;,\s]+", arch_list) if e)
        cuda_sources = sorted(
            glob.glob(os.path.join(csrc, "cuda", "*.cpp"))
            + glob.glob(os.path.join(csrc, "cuda", "*.cu"))
        )
        ext = cpp_extension.CUDAExtension(
            "fastpipe._C",
            sources + cuda_sources,
            extra_compile_args={
                "cxx": CXX_FLAGS + [f"-DFASTPIPE_CUDA_ARCHS={recorded}"],
                "nvcc": NVCC_FLAGS,
            },
            **common,
        )
    else:
        ext = cpp_extension.CppExtension(
            "fastpipe._C", sources, extra_compile_args={"cxx": CXX_FLAGS}, **common
        )
    png = _png_extension()
    extensions = _sanitized([ext, _resize_extension(), _io_extension()]
                            + ([jpeg] if jpeg is not None else [])
                            + ([png] if png is not None else []))
    return extensions, {"build_ext": _build_extension_class()}


ext_modules, cmdclass = _extensions()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
