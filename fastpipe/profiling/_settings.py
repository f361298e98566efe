"""``LoaderSettings``: one point of the tuning grid, the loader it builds, and the code that
builds it in a training script."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastpipe.profiling._datasets import DatasetSource

WRAPPERS = ("DataLoader", "DataLoaderX", "DataLoaderX+DataPrefetcher")


@dataclass(frozen=True)
class LoaderSettings:
    """One point of the grid."""

    num_workers: int = 0
    batch_size: int = 64
    prefetch_factor: int | None = None
    pin_memory: bool = False
    persistent_workers: bool = False
    wrapper: str = "DataLoader"

    @property
    def wrapper_name(self) -> str:
        return self.wrapper.replace("+", " + ")

    @property
    def label(self) -> str:
        """Every setting on one line (the progress bar, a trial's key in the tuner's table)."""
        return (f"workers={self.num_workers} batch={self.batch_size} "
                f"prefetch={self.prefetch_factor} persistent={self.persistent_workers} "
                f"pin={self.pin_memory} {self.wrapper}")

    def loader_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"batch_size": self.batch_size, "num_workers": self.num_workers}
        if self.num_workers > 0:
            kwargs["prefetch_factor"] = self.prefetch_factor or 2
            kwargs["persistent_workers"] = self.persistent_workers
        if self.pin_memory:
            kwargs["pin_memory"] = True
        return kwargs

    def build(self, dataset: Any, collate_fn: Callable | None, shuffle: bool = True) -> Any:
        from torch.utils.data import DataLoader

        from fastpipe.loader import DataLoaderX
        from fastpipe.prefetch import DataPrefetcher

        kwargs = self.loader_kwargs()
        if collate_fn is not None:
            kwargs["collate_fn"] = collate_fn
        cls = DataLoader if self.wrapper == "DataLoader" else DataLoaderX
        loader = cls(dataset, shuffle=shuffle, drop_last=False, **kwargs)
        if self.wrapper.endswith("DataPrefetcher"):
            return DataPrefetcher(loader)
        return loader

    def code(self, source: DatasetSource | None = None) -> str:
        """Python to paste into a training script."""
        names = ["DataLoaderX"] if self.wrapper != "DataLoader" else []
        if self.wrapper.endswith("DataPrefetcher"):
            names.append("DataPrefetcher")
        lines = []
        if self.wrapper == "DataLoader":
            lines.append("from torch.utils.data import DataLoader")
        else:
            lines.append(f"from fastpipe import {', '.join(names)}")
        if source is not None:
            lines += source.imports
        lines.append("")
        dataset = source.code if source is not None else "dataset"
        if source is not None and source.code != "dataset":
            lines.append(f"dataset = {dataset}")
            dataset = "dataset"
        args = [dataset] + [f"{k}={v!r}" for k, v in self._ordered_kwargs()]
        if source is not None and source.collate_code:
            args.append(f"collate_fn={source.collate_code}")
        cls = "DataLoader" if self.wrapper == "DataLoader" else "DataLoaderX"
        lines.append(_wrap_call(f"loader = {cls}(", args))
        if self.wrapper.endswith("DataPrefetcher"):
            lines.append(
                "loader = DataPrefetcher(loader)  # mean=..., std=... to normalize on the device"
            )
        return "\n".join(lines)

    def _ordered_kwargs(self) -> list[tuple[str, Any]]:
        kwargs = self.loader_kwargs()
        kwargs["shuffle"] = True
        order = ["batch_size", "shuffle", "num_workers", "prefetch_factor", "persistent_workers",
                 "pin_memory"]
        return [(k, kwargs[k]) for k in order if k in kwargs]


def _wrap_call(opening: str, args: list[str], width: int = 96) -> str:
    one_line = opening + ", ".join(args) + ")"
    if len(one_line) <= width:
        return one_line
    indent = " " * len(opening)
    lines, current = [], opening
    for i, arg in enumerate(args):
        piece = arg + (", " if i < len(args) - 1 else ")")
        if len(current) + len(piece.rstrip()) > width and current.strip() != opening.strip():
            lines.append(current.rstrip())
            current = indent
        current += piece
    lines.append(current)
    return "\n".join(lines)
