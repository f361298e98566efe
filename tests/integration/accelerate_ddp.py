"""accelerate 1.15 with 2 CPU processes (gloo) and fastpipe loaders; run by
tests/integration/test_accelerate.py.

Launched with torchrun (``python -m torch.distributed.run --nproc_per_node 2``); each rank writes
what it saw to OUT_DIR/rank{r}.json.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset

from fastpipe import DataLoaderX, DataPrefetcher

SAMPLES = 100


class Indexed(Dataset):
    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int):
        return torch.full((3, 2, 2), float(index) / SAMPLES), index


def epochs(accelerator, model, optimizer, loader, num_epochs: int = 2):
    """Per epoch: this rank's ids, gathered ids, end-of-data flags and gradient syncs."""
    out = []
    for _ in range(num_epochs):
        record = {"ids": [], "gathered": [], "end": [], "sync": []}
        for images, ids in loader:
            with accelerator.accumulate(model):
                loss = model(images.flatten(1)).mean()
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            record["end"].append(accelerator.gradient_state.end_of_dataloader)
            record["sync"].append(accelerator.sync_gradients)
            record["ids"].extend(ids.tolist())
            record["gathered"].extend(accelerator.gather_for_metrics(ids).tolist())
        out.append(record)
    return out


def main() -> None:
    out = Path(sys.argv[1])
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=3)
    model = torch.nn.Linear(12, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    result = {"world_size": accelerator.num_processes}

    def plain_loader():
        return DataLoader(Indexed(), batch_size=8, shuffle=True)

    # The plain prepared DataLoader: accelerate's own behaviour, the reference.
    result["plain"] = epochs(accelerator, model, optimizer, accelerator.prepare(plain_loader()))
    # The recommended spelling: wrap the prepared loader.
    prefetcher = DataPrefetcher(accelerator.prepare(plain_loader()), device="cpu", prefetch_depth=2)
    result["prefetcher"] = epochs(accelerator, model, optimizer, prefetcher)
    # prepare(DataLoaderX): rebuilt without its thread, with a warning.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prepared = accelerator.prepare(DataLoaderX(Indexed(), batch_size=8, shuffle=True))
    result["dataloaderx_warnings"] = [str(w.message) for w in caught]
    result["dataloaderx"] = epochs(accelerator, model, optimizer, prepared, num_epochs=1)
    # prepare(DataPrefetcher(...)): accelerate leaves it as it is; iterating it is refused.
    wrapped = accelerator.prepare(
        DataPrefetcher(DataLoaderX(Indexed(), batch_size=8, shuffle=True), device="cpu")
    )
    try:
        iter(wrapped)
        result["prefetcher_prepared_error"] = None
    except RuntimeError as error:
        result["prefetcher_prepared_error"] = str(error)
    (out / f"rank{accelerator.process_index}.json").write_text(json.dumps(result))
    accelerator.end_training()


if __name__ == "__main__":
    main()
