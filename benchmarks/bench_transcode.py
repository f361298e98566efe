"""Transcoded JPEGs (``pack(transcode=True)``): train-crop decode time per image, by image size.

For every file of an image set, the original bytes and ``fastpipe._jpeg.transcode(bytes)`` go
through the same ``ImageDecoder(train=True, size=224)`` with the same per-sample random crop
(decode at DCT scale + crop + resize, one core). Each image size class is timed in interleaved
rounds (``_harness.interleaved``), and the median per-image time is reported with the size
overhead of the transcoded files.

    python -m benchmarks.bench_transcode                      # the three sets of bench_cpu_path
    python -m benchmarks.bench_transcode --root DIR           # your own ImageFolder tree

Both variants run the same function in one process, one after another, on one core: there is no
pipeline beside them to distort them. Compare ratios within one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import simplejpeg
import torch

from benchmarks import _harness


def _size_class(height: int, width: int) -> str:
    side = max(height, width)
    return "< 800 px" if side < 800 else ("800-1,599 px" if side < 1600 else ">= 1,600 px")


def _time(decoder, images: list[bytes], seeds: list[int]) -> float:
    start = time.perf_counter()
    for data, seed in zip(images, seeds):
        decoder(data, "x.jpg", generator=torch.Generator().manual_seed(seed))
    return time.perf_counter() - start


def measure(root: Path, rounds: int) -> list[str]:
    from fastpipe._jpeg import transcode

    from fastpipe.data import ImageDecoder

    decoder = ImageDecoder(train=True, size=224)
    groups: dict[tuple[str, bool], list[tuple[bytes, bytes]]] = {}
    for path in sorted(root.rglob("*.jpg")):
        data = path.read_bytes()
        height, width = simplejpeg.decode_jpeg_header(data)[:2]
        progressive = b"\xff\xc2" in data[:4096]
        groups.setdefault((_size_class(height, width), progressive), []).append(
            (data, transcode(data)))
    lines = ["| images | files | size overhead | original ms/image | transcoded ms/image | "
             "speed-up |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    total = {False: 0.0, True: 0.0}
    for (size, progressive), pairs in sorted(groups.items()):
        originals, rewritten = [p[0] for p in pairs], [p[1] for p in pairs]
        seeds = list(range(len(pairs)))
        times = _harness.interleaved({
            "original": lambda originals=originals, seeds=seeds: _time(decoder, originals, seeds),
            "transcoded": lambda rewritten=rewritten, seeds=seeds: _time(decoder, rewritten, seeds),
        }, rounds, warmup=0)
        a = statistics.median(times["original"]) / len(pairs)
        b = statistics.median(times["transcoded"]) / len(pairs)
        total[False] += a * len(pairs)
        total[True] += b * len(pairs)
        overhead = sum(map(len, rewritten)) / sum(map(len, originals)) - 1
        kind = f"{size}{', progressive' if progressive else ''}"
        lines.append(f"| {kind} | {len(pairs)} | {100 * overhead:+.1f}% | {1e3 * a:.2f} | "
                     f"{1e3 * b:.2f} | {a / b:.2f}x |")
    count = sum(len(p) for p in groups.values())
    lines.append(f"| all | {count} | | {1e3 * total[False] / count:.2f} | "
                 f"{1e3 * total[True] / count:.2f} | {total[False] / total[True]:.2f}x |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_transcode",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=None)
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.root:
        sets = {"your images": args.root}
    else:
        from benchmarks._photos import photo_set
        from fastpipe.data import sample_images

        sets = {"built-in sample set": sample_images(num_images=args.images),
                "ImageNet-like photos": photo_set("imagenet", args.images),
                "1-2k px photos": photo_set("photos", max(64, args.images // 4))}
    print(f"Machine: {_harness.machine()}.")
    for name, root in sets.items():
        print(f"\n### {name}\n")
        print("\n".join(measure(Path(root), args.rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
