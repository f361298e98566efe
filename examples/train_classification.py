"""A small image-classification training script in the shape of torchvision's reference
``references/classification/train.py``, with a switch for the loader (docs/training-scripts.md).

    python examples/train_classification.py --loader dataloader     # torch's DataLoader
    python examples/train_classification.py --loader dataloaderx    # + background thread
    python examples/train_classification.py --loader prefetcher     # + copy/normalize on device
    python examples/train_classification.py --loader both           # DataLoaderX + DataPrefetcher
    python examples/train_classification.py --loader image_loader   # fastpipe.image_loader
    torchrun --nproc_per_node 2 examples/train_classification.py --loader both

What changes between the modes is only in ``load_data`` and ``make_loader``: with a
DataPrefetcher the dataset stays uint8 (no ToDtype/Normalize in the transforms), the prefetcher
normalizes on the device, and the batch mixing moves from the collate function (float images on
the CPU) to ``batch_transform`` (on the device, after normalization). ``evaluate()`` reads
``data_loader.dataset`` and the epoch loop calls ``set_epoch``, as the reference does.
``--loader image_loader`` replaces both with the factory's loaders (fastpipe's decode path, its
own shards under torchrun, no mixing). Without ``--data-path`` it trains on fastpipe's generated
sample images.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SequentialSampler
from torch.utils.data.dataloader import default_collate

from fastpipe import DataLoaderX, DataPrefetcher, image_loader, ops
from fastpipe.data import sample_images

LOADERS = ("dataloader", "dataloaderx", "prefetcher", "both", "image_loader")
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="fastpipe classification training example")
    parser.add_argument("--data-path", default=None, help="ImageFolder root with train/ and val/"
                        " (or one folder used for both); default: fastpipe's sample images")
    parser.add_argument("--loader", choices=LOADERS, default="both")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("-b", "--batch-size", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("-j", "--workers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--crop-size", type=int, default=64)
    parser.add_argument("--mixup-alpha", type=float, default=0.2)
    parser.add_argument("--label-smoothing", type=float, default=0.1)
    return parser


def init_distributed_mode(args) -> None:
    args.distributed = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if not args.distributed:
        args.rank, args.world_size = 0, 1
        return
    args.rank, args.world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")


def load_data(traindir: str, valdir: str, args):
    from torchvision import datasets
    from torchvision.transforms import v2

    on_device = args.loader in ("prefetcher", "both")
    # With a DataPrefetcher the images stay uint8 until the device: it normalizes there.
    to_float = [] if on_device else [
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(mean=MEAN, std=STD),
    ]
    train = datasets.ImageFolder(traindir, v2.Compose([
        v2.RandomResizedCrop(args.crop_size, antialias=True), v2.RandomHorizontalFlip(),
        v2.PILToTensor(), *to_float,
    ]))
    val = datasets.ImageFolder(valdir, v2.Compose([
        v2.Resize(args.crop_size * 8 // 7, antialias=True), v2.CenterCrop(args.crop_size),
        v2.PILToTensor(), *to_float,
    ]))
    if args.distributed:
        train_sampler = DistributedSampler(train)
        val_sampler = DistributedSampler(val, shuffle=False)
    else:
        train_sampler, val_sampler = RandomSampler(train), SequentialSampler(val)
    return train, val, train_sampler, val_sampler


def make_loader(dataset, sampler, args, num_classes: int, train: bool):
    """The one place the modes differ: the loader class, and where mixing and normalizing run."""
    mix = train and args.mixup_alpha > 0
    collate_fn = default_collate
    if mix and args.loader in ("dataloader", "dataloaderx"):
        from torchvision.transforms import v2

        # The reference script's collate-time mixing, on float images on the CPU.
        mixer = v2.MixUp(alpha=args.mixup_alpha, num_classes=num_classes)

        def collate_fn(batch):
            return mixer(*default_collate(batch))

    loader_class = DataLoaderX if args.loader in ("dataloaderx", "both") else DataLoader
    loader = loader_class(
        dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers,
        pin_memory=torch.cuda.is_available(), collate_fn=collate_fn, drop_last=False,
    )
    if args.loader in ("dataloader", "dataloaderx"):
        return loader

    def mix_on_device(images, targets):
        return ops.mixup(images, targets, args.mixup_alpha, num_classes,
                         label_smoothing=args.label_smoothing)

    return DataPrefetcher(
        loader, device=args.device, mean=MEAN, std=STD,
        batch_transform=mix_on_device if mix else None,
    )


class SmallNet(nn.Sequential):
    def __init__(self, num_classes: int) -> None:
        super().__init__(
            nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes),
        )


def train_one_epoch(model, criterion, optimizer, data_loader, device, epoch: int) -> float:
    model.train()
    total, seen = 0.0, 0
    for images, targets in data_loader:
        images = images.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        loss = criterion(model(images), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item() * images.shape[0]
        seen += images.shape[0]
    return total / max(seen, 1)


def evaluate(model, criterion, data_loader, device) -> float:
    model.eval()
    correct = torch.zeros((), device=device)
    processed = torch.zeros((), device=device)
    with torch.inference_mode():
        for images, targets in data_loader:
            images, targets = images.to(device), targets.to(device)
            correct += (model(images).argmax(1) == targets).sum()
            processed += images.shape[0]
    if dist.is_initialized():
        dist.all_reduce(correct)
        dist.all_reduce(processed)
    # As the reference script: DistributedSampler pads the last batch to equal shards, so the
    # count may exceed the dataset; it reads the dataset from the loader to say so.
    dataset_size = len(data_loader.dataset)
    if int(processed) != dataset_size and (not dist.is_initialized() or dist.get_rank() == 0):
        print(f"evaluated {int(processed)} samples for a dataset of {dataset_size}: "
              "padding of DistributedSampler")
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(f"evaluated {int(processed)} of {dataset_size} samples")
    return float(correct / processed * 100)


def main(args) -> None:
    init_distributed_mode(args)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    root = args.data_path or str(sample_images(num_images=64, num_classes=4))
    traindir = os.path.join(root, "train") if os.path.isdir(os.path.join(root, "train")) else root
    valdir = os.path.join(root, "val") if os.path.isdir(os.path.join(root, "val")) else root
    if args.loader == "image_loader":
        # The factory shards by torch.distributed itself; set_epoch is the loader's.
        train_loader, val_loader = (
            image_loader(folder, args.batch_size, train=train, size=args.crop_size,
                         device=args.device, num_workers=args.workers)
            for folder, train in ((traindir, True), (valdir, False)))
        train_sampler = train_loader
        num_classes = len(train_loader.dataset.classes)
    else:
        train, val, train_sampler, val_sampler = load_data(traindir, valdir, args)
        num_classes = len(train.classes)
        train_loader = make_loader(train, train_sampler, args, num_classes, train=True)
        val_loader = make_loader(val, val_sampler, args, num_classes, train=False)

    model = SmallNet(num_classes).to(device)
    if args.distributed:
        model = nn.parallel.DistributedDataParallel(model)
    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    start = time.perf_counter()
    for epoch in range(args.epochs):
        if args.distributed:
            train_sampler.set_epoch(epoch)
        loss = train_one_epoch(model, criterion, optimizer, train_loader, device, epoch)
        acc1 = evaluate(model, criterion, val_loader, device)
        if args.rank == 0:
            print(f"epoch {epoch} loader {args.loader}: loss {loss:.3f} acc@1 {acc1:.1f}")
    for loader in (train_loader, val_loader):
        if hasattr(loader, "close"):  # fastpipe's loaders stop their thread at once
            loader.close()
    if args.rank == 0:
        print(f"done in {time.perf_counter() - start:.1f} s")
    if args.distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(get_args_parser().parse_args())
