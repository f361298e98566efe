"""DALI decoding JPEG bytes straight out of a fastpipe pack (real DALI CPU mode, real h5py)."""

from __future__ import annotations

import pytest
import torch

from fastpipe.data import H5Dataset
from fastpipe.pack import pack
from tests.helpers.dali import DALI_MISSING

pytest.importorskip("nvidia.dali", reason=DALI_MISSING, exc_type=ImportError)

from fastpipe.dali import DALILoader  # noqa: E402

pytestmark = [pytest.mark.dali, pytest.mark.hdf5, pytest.mark.timeout(120)]

SIZE = 48


@pytest.fixture(scope="module")
def packs(sample_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("packs")
    made = {}
    for merge in ("virtual", "copy"):
        made[merge] = out / f"sample-{merge}.h5"
        pack(sample_root, made[merge], storage="bytes", num_workers=2, merge=merge, progress=False)
    made["array"] = out / "sample-array.h5"
    pack(sample_root, made["array"], storage="array", size=(32, 32), progress=False)
    made["lmdb"] = out / "sample.lmdb"
    pack(sample_root, made["lmdb"], storage="bytes", progress=False)
    return made


def _eval_epoch(source) -> tuple[torch.Tensor, torch.Tensor]:
    with DALILoader(source, batch_size=10, train=False, size=SIZE, shuffle=False, device="cpu",
                    seed=0) as loader:
        batches = list(loader)
    return torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])


@pytest.mark.parametrize("kind", ["virtual", "copy", "lmdb"])
@pytest.mark.slow
def test_pack_gives_the_same_eval_batches_as_the_folder_it_was_packed_from(kind, packs,
                                                                           sample_root):
    assert len(H5Dataset(packs["copy"])) == 48
    folder_images, folder_labels = _eval_epoch(sample_root)
    pack_images, pack_labels = _eval_epoch(packs[kind])
    assert pack_images.shape == (48, 3, SIZE, SIZE)
    assert torch.equal(pack_labels, folder_labels)
    # Same bytes, same decoder, same ops: the outputs are identical.
    assert torch.equal(pack_images, folder_images)


def test_train_epochs_over_a_pack_see_every_sample_once(packs):
    dataset = H5Dataset(packs["copy"])
    expected = torch.bincount(torch.as_tensor(dataset.targets), minlength=4)
    with DALILoader(packs["copy"], batch_size=7, train=True, size=SIZE, device="cpu",
                    seed=1) as loader:
        assert len(loader) == 7
        for _ in range(2):
            labels = torch.cat([labels for _, labels in loader])
            assert torch.equal(torch.bincount(labels, minlength=4), expected)


def test_array_pack_is_refused_with_the_fix(packs):
    with pytest.raises(ValueError, match="storage='bytes'"):
        DALILoader(packs["array"], batch_size=4, device="cpu")
