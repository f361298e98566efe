"""A user's virtual dataset whose source is a hyperslab (part of the source dataset mapped):
checked at open like a source mapped whole, and refused naming the source file and dataset where
HDF5 would read the fill value (a dataset gone, a selection past a shrunk source) or garbage (a
source of another rank), never read as zeros or as an error naming only the virtual file."""

from __future__ import annotations

import numpy as np
import pytest

h5py = pytest.importorskip("h5py", exc_type=ImportError)

from fastpipe.data import PackFormatError  # noqa: E402
from fastpipe.data.sources.h5 import H5Source  # noqa: E402


@pytest.fixture
def virtual(tmp_path):
    """v.h5's 'x': rows 2 to 5 of a.h5's 10-value 'x', and all of b.h5's 2-value 'x'."""
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f["x"] = np.arange(10, dtype=np.float32)
    with h5py.File(tmp_path / "b.h5", "w") as f:
        f["x"] = np.array([100, 101], np.float32)
    layout = h5py.VirtualLayout(shape=(6,), dtype=np.float32)
    layout[0:4] = h5py.VirtualSource("a.h5", "x", shape=(10,))[2:6]
    layout[4:6] = h5py.VirtualSource("b.h5", "x", shape=(2,))
    with h5py.File(tmp_path / "v.h5", "w") as f:
        f.create_virtual_dataset("x", layout, fillvalue=-1)
    return tmp_path


def _values(path) -> list[float]:
    source = H5Source(path / "v.h5")
    return [float(source.read(i)["x"]) for i in range(len(source))]


def test_a_hyperslab_source_reads_as_h5py_reads_it(virtual):
    assert _values(virtual) == [2, 3, 4, 5, 100, 101]
    with h5py.File(virtual / "a.h5", "w") as f:  # grown: the selection still lies inside
        f["x"] = np.arange(20, dtype=np.float32)
    assert _values(virtual) == [2, 3, 4, 5, 100, 101]


@pytest.mark.parametrize("replaced, reason", [
    ({"y": np.arange(10, dtype=np.float32)}, r"no dataset 'x'"),
    ({"x": np.arange(4, dtype=np.float32)},
     r"'x' is \(4,\) where the mapped selection reaches \(6,\)"),
    ({"x": np.arange(20, dtype=np.float32).reshape(10, 2)},
     r"'x' is \(10, 2\) where the mapped selection has 1 dimension"),
], ids=["dataset gone", "shrunk", "another rank"])
def test_a_hyperslab_source_that_changed_is_refused_naming_it(virtual, replaced, reason):
    """Before: a dataset gone read as the fill value, a shrunk one as an error naming only
    v.h5 at the first row past it (h5py reads zeros there), another rank as garbage."""
    with h5py.File(virtual / "a.h5", "w") as f:
        for name, values in replaced.items():
            f[name] = values
    with pytest.raises(PackFormatError, match=rf"v\.h5: the virtual dataset '/x' maps source "
                                              rf"files that changed .*a\.h5 \({reason}"):
        H5Source(virtual / "v.h5")
