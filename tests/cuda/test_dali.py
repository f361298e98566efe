"""cuda lane: DALILoader with device="cuda" (mixed decode: nvJPEG on the GPU).

- The GPU output against DALI's CPU mode for the same files, seed and eval transforms. The
  decoders differ (nvJPEG, or the A100/H100 hardware decoder, against libjpeg-turbo: IDCT and
  chroma upsampling round differently), so the check is a tolerance, in uint8 levels: a mean
  absolute difference of at most 2.0 per image and at most 1% of pixels off by more than 24.
  The labels, the order and the shapes must be identical. It needs nvJPEG loadable by
  nvImageCodec (``fastpipe doctor``'s nvJPEG line), and some difference: without a GPU decoder
  DALI's "mixed" decode quietly decodes on the CPU, libjpeg-turbo's exact pixels. The failure
  message prints the measured differences: send them back (docs/gpu.md).
- Every sample exactly once per epoch, batches on the GPU, reshuffled per epoch; with the fused
  random-crop decode and with ``crop_decode=False`` (whole-image decode + GPU random crop), each
  in its own process, so a decoder crash (NVIDIA/nvImageCodec#55) fails that test by name.
- DDP sharding with two processes on one GPU (gloo; NCCL refuses two ranks on one GPU).
- uint8 output through DataPrefetcher (the GPU-resident path) normalizes like DALI itself.

Skipped without a GPU or DALI; FASTPIPE_REQUIRE_CUDA=1 makes that a failure.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from tests.helpers.cuda import require_cuda_part

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(600)]

MEAN_ABS_LIMIT = 2.0
FAR_LEVELS, FAR_SHARE = 24, 0.01


@pytest.fixture(autouse=True)
def dali_on_gpu():
    try:
        from fastpipe.dali.pipelines import _dali_cuda_device_count
    except ImportError as error:
        require_cuda_part(False, f"DALI is not installed ({error}): pip install 'fastpipe[dali]'")
        return
    require_cuda_part(_dali_cuda_device_count() > 0, "DALI sees no GPU (wrong CUDA major?)")


def _list_file(sample_root: Path, path: Path) -> Path:
    files = sorted(sample_root.glob("*/*.jpg"))
    path.write_text("".join(f"{f} {i}\n" for i, f in enumerate(files)))
    return path


def _epoch(loader) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = [], []
    for x, y in loader:
        assert x.device == loader.device and y.device == loader.device
        images.append(x.cpu())
        labels.append(y.cpu())
    return torch.cat(images), torch.cat(labels)


def compare_decodes(gpu_images: torch.Tensor, cpu_images: torch.Tensor) -> str:
    """The GPU decode against the CPU decode of the same files: within the decoder tolerance,
    and not identical (identical pixels mean the "mixed" decode ran on the CPU: nvImageCodec
    registered no GPU decoder). Returns the report line; raises AssertionError with it."""
    assert gpu_images.shape == cpu_images.shape and gpu_images.dtype == torch.uint8
    diff = (gpu_images.int() - cpu_images.int()).abs().float()
    per_image = diff.flatten(1).mean(1)
    far = (diff > FAR_LEVELS).float().flatten(1).mean(1)
    report = (
        f"mean |GPU - CPU| per image: max {per_image.max():.3f}, median {per_image.median():.3f}; "
        f"share of pixels off by more than {FAR_LEVELS}: max {far.max():.4f}; "
        f"images differing at all: {int((per_image > 0).sum())} of {len(per_image)}"
    )
    print(report)
    assert per_image.max() <= MEAN_ABS_LIMIT, report
    assert far.max() <= FAR_SHARE, report
    assert per_image.max() > 0, (
        "the mixed decode gave libjpeg-turbo's exact pixels for every image: it ran on the CPU "
        f"(nvImageCodec registered no GPU JPEG decoder; see `fastpipe doctor`). {report}")
    return report


def test_mixed_decode_matches_the_cpu_mode_within_the_decoder_tolerance(sample_root, tmp_path):
    from fastpipe._doctor import nvjpeg_state
    from fastpipe.dali import DALILoader

    nvjpeg = nvjpeg_state()
    require_cuda_part(bool(nvjpeg["loads"]),
                      f"no GPU JPEG decoder for DALI's mixed decode: {nvjpeg['problem']}")
    list_file = _list_file(sample_root, tmp_path / "list.txt")
    common = dict(batch_size=8, train=False, shuffle=False, size=96, seed=5,
                  dtype=torch.uint8, channels_last=False, num_workers=2)
    with DALILoader(list_file, device="cuda", **common) as gpu_loader:
        assert gpu_loader.device.type == "cuda"
        gpu_images, gpu_labels = _epoch(gpu_loader)
    with DALILoader(list_file, device="cpu", **common) as cpu_loader:
        cpu_images, cpu_labels = _epoch(cpu_loader)
    assert torch.equal(gpu_labels, cpu_labels)
    compare_decodes(gpu_images, cpu_images)


NVIMAGECODEC_55 = (
    "DALI's fused GPU random-crop decode (decoders.image_random_crop, device='mixed') failed: "
    "NVIDIA/nvImageCodec#55 reports exactly this with nvImageCodec 0.9 (pinned by DALI 2.4): "
    "INTERNAL_ERROR or a segfault. Workaround: DALILoader(..., crop_decode=False) / "
    "image_loader(..., crop_decode=False) decodes whole images and crops them on the GPU; "
    "please report the GPU, the driver and `pip show nvidia-nvimgcodec-cu13` with this log"
)


def _train_epochs(list_file: str, crop_decode: bool, out: str) -> None:
    """Three train epochs of a GPU DALILoader; the labels of each written to ``out``."""
    from fastpipe.dali import DALILoader

    count = len(Path(list_file).read_text().splitlines())
    with DALILoader(list_file, batch_size=7, train=True, size=64, device="cuda", seed=1,
                    crop_decode=crop_decode) as loader:
        orders = []
        for _ in range(3):
            images, labels = _epoch(loader)
            assert images.shape == (count, 3, 64, 64) and images.dtype == torch.float32
            orders.append(labels.tolist())
    Path(out).write_text(json.dumps(orders))


def run_isolated(target, args: tuple, what: str, hint: str, timeout: float = 300) -> None:
    """Runs ``target(*args)`` in a fresh (spawned) process, so that a crash in a native library
    (a segfault in the decoder) fails this test, with ``hint`` naming the known report, instead
    of killing the whole lane. An exception in the process fails it the same way."""
    context = mp.get_context("spawn")
    errors = context.SimpleQueue()
    process = context.Process(target=_report_errors, args=(target, args, errors))
    process.start()
    process.join(timeout)
    if process.is_alive():
        process.kill()
        process.join()
        pytest.fail(f"{what} did not finish in {timeout:.0f} s. {hint}", pytrace=False)
    error = None if errors.empty() else errors.get()
    if process.exitcode != 0 or error is not None:
        how = (f"died with signal {-process.exitcode}" if process.exitcode < 0
               else f"raised:\n{error}" if error else f"exited with {process.exitcode}")
        pytest.fail(f"{what} {how}\n{hint}", pytrace=False)


def _report_errors(target, args: tuple, errors) -> None:
    import traceback

    try:
        target(*args)
    except BaseException:  # every failure goes back to the test, with its traceback
        errors.put(traceback.format_exc())
        raise SystemExit(1) from None


@pytest.mark.parametrize("crop_decode", [True, False])
def test_every_sample_once_per_epoch_on_the_gpu(sample_root, tmp_path, crop_decode):
    """Train epochs with the fused random-crop decode (the default) and with its workaround
    (whole-image decode + GPU random crop), each in its own process: a crash of the fused decode
    (NVIDIA/nvImageCodec#55) fails this test with the report's name, not the lane."""
    list_file = _list_file(sample_root, tmp_path / "list.txt")
    count = len(list_file.read_text().splitlines())
    out = tmp_path / "orders.json"
    hint = NVIMAGECODEC_55 if crop_decode else "(the whole-image decode: not nvImageCodec#55)"
    run_isolated(_train_epochs, (str(list_file), crop_decode, str(out)),
                 f"train epochs with crop_decode={crop_decode}", hint)
    orders = json.loads(out.read_text())
    for labels in orders:
        assert sorted(labels) == list(range(count))
    assert orders[0] != orders[1] != orders[2], "the epochs were not reshuffled"


def test_uint8_output_through_the_prefetcher_normalizes_like_dali(sample_root, tmp_path):
    from fastpipe import DataPrefetcher
    from fastpipe.dali import DALILoader

    list_file = _list_file(sample_root, tmp_path / "list.txt")
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    common = dict(batch_size=8, train=False, shuffle=False, size=64, seed=2, device="cuda")
    with DALILoader(list_file, dtype=torch.float32, mean=mean, std=std, **common) as floats:
        expected, _ = _epoch(floats)
    with DALILoader(list_file, dtype=torch.uint8, **common) as raw:
        prefetcher = DataPrefetcher(raw, device="cuda", mean=mean, std=std)
        got = torch.cat([x.cpu() for x, _ in prefetcher])
    # DALI normalizes in its own float order: equal to a float32 rounding step.
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def _ddp_rank(rank: int, world_size: int, init_file: str, list_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    from fastpipe.dali import DALILoader

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size)
    try:
        torch.cuda.set_device(0)  # one GPU: both ranks share it
        with DALILoader(list_file, batch_size=5, train=True, size=48, device="cuda:0",
                        seed=3) as loader:
            epochs = []
            for _ in range(2):
                labels = []
                for images, y in loader:
                    assert images.is_cuda and images.device.index == 0
                    labels += y.cpu().tolist()
                epochs.append(labels)
            result = {"shard": [loader.rank, loader.world_size], "epochs": epochs}
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def test_ddp_two_processes_on_one_gpu_get_disjoint_covering_shards(sample_root, tmp_path):
    list_file = _list_file(sample_root, tmp_path / "list.txt")
    count = len(list_file.read_text().splitlines())
    mp.spawn(_ddp_rank, args=(2, str(tmp_path / "init"), str(list_file), str(tmp_path)),
             nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["shard"] for r in ranks] == [[0, 2], [1, 2]]
    for epoch in range(2):
        shards = [r["epochs"][epoch] for r in ranks]
        assert not set(shards[0]) & set(shards[1])
        assert sorted(shards[0] + shards[1]) == list(range(count))
