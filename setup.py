"""Builds fastpipe and its extension fastpipe._C.

C++ CPU kernels (fastpipe/csrc/*.cpp, fastpipe/csrc/cpu/*.cpp) are always built; CUDA kernels
(fastpipe/csrc/cuda/*.cu) are added when nvcc is found and torch is a CUDA build. Build against the
installed torch with ``pip install --no-build-isolation -e .``. Set FASTPIPE_NO_EXTENSION=1 to skip
the extension (fastpipe then falls back to its pure-PyTorch ops).
"""

import glob
import os
import shutil

from setuptools import setup


def _extensions():
    if os.environ.get("FASTPIPE_NO_EXTENSION") == "1":
        return [], {}
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
    sources = sorted(glob.glob(os.path.join(csrc, "*.cpp")) + glob.glob(os.path.join(csrc, "cpu", "*.cpp")))
    if not sources:
        return [], {}
    cuda_sources = sorted(glob.glob(os.path.join(csrc, "cuda", "*.cu")))
    with_cuda = bool(cuda_sources) and torch.version.cuda is not None and (
        cpp_extension.CUDA_HOME is not None or shutil.which("nvcc") is not None
    )
    if os.environ.get("FASTPIPE_NO_CUDA") == "1":
        with_cuda = False
    cxx = ["-O3", "-std=c++17", "-fopenmp"]
    define_macros = [("Py_LIMITED_API", "0x030A0000")]
    if with_cuda:
        ext = cpp_extension.CUDAExtension(
            "fastpipe._C",
            sources + cuda_sources,
            include_dirs=[os.path.join(here, csrc)],
            extra_compile_args={"cxx": cxx + ["-DFASTPIPE_WITH_CUDA"], "nvcc": ["-O3", "-DFASTPIPE_WITH_CUDA"]},
            extra_link_args=["-fopenmp"],
            define_macros=define_macros,
            py_limited_api=True,
        )
    else:
        ext = cpp_extension.CppExtension(
            "fastpipe._C",
            sources,
            include_dirs=[os.path.join(here, csrc)],
            extra_compile_args={"cxx": cxx},
            extra_link_args=["-fopenmp"],
            define_macros=define_macros,
            py_limited_api=True,
        )
    return [ext], {"build_ext": cpp_extension.BuildExtension.with_options(no_python_abi_suffix=True)}


ext_modules, cmdclass = _extensions()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
