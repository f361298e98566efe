"""Lightning 2.6, 2 CPU processes (gloo, ddp_spawn), with fastpipe loaders
(tests/integration/test_lightning.py).

Usage: python lightning_ddp.py OUT_DIR SCENARIO. Each rank appends the sample ids of every
training batch to OUT_DIR/rank{r}.jsonl as {"epoch": e, "ids": [...]}; a run that fails writes
its error to OUT_DIR/error.txt.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import Dataset, DistributedSampler

from fastpipe import DataLoaderX, DataPrefetcher

SAMPLES = 20


class Indexed(Dataset):
    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int):
        return torch.full((3, 2, 2), float(index) / SAMPLES), index


def loader_for(scenario: str):
    if scenario == "dataloaderx":
        return DataLoaderX(Indexed(), batch_size=4, shuffle=True, prefetch_depth=3)
    if scenario == "prefetcher_sharded":
        dataset = Indexed()
        sampler = DistributedSampler(dataset, shuffle=True, seed=0)
        return DataPrefetcher(DataLoaderX(dataset, batch_size=4, sampler=sampler), device="cpu")
    if scenario == "prefetcher_unsharded":
        return DataPrefetcher(DataLoaderX(Indexed(), batch_size=4, shuffle=True), device="cpu")
    raise ValueError(scenario)


class Model(L.LightningModule):
    def __init__(self, out: str, scenario: str | None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(12, 1)
        self.out, self.scenario = out, scenario

    def train_dataloader(self):
        return loader_for(self.scenario)

    def training_step(self, batch, batch_idx):
        images, ids = batch
        with open(Path(self.out) / f"rank{self.global_rank}.jsonl", "a") as f:
            f.write(json.dumps({"epoch": self.current_epoch, "ids": ids.tolist()}) + "\n")
        return self.layer(images.flatten(1)).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def teardown(self, stage: str) -> None:
        # Lightning destroys only NCCL process groups. A gloo group left to interpreter exit can
        # abort the rank ("terminate called without an active exception"): its worker thread
        # frees the last allreduce's work, which needs the GIL, while the main thread finalizes.
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def main() -> None:
    out, scenario = sys.argv[1], sys.argv[2]
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy="ddp_spawn", max_epochs=2, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    try:
        if scenario == "peeked_dataloaderx":
            # A loader that was iterated (and closed) before fit, handed to fit: ddp_spawn
            # pickles it into the processes.
            loader = DataLoaderX(Indexed(), batch_size=4, shuffle=True)
            next(iter(loader))
            loader.close()
            trainer.fit(Model(out, None), train_dataloaders=loader)
        else:
            trainer.fit(Model(out, scenario))
    except Exception as error:  # noqa: BLE001 - reported to the test
        (Path(out) / "error.txt").write_text(f"{type(error).__name__}: {error}")


if __name__ == "__main__":
    main()
