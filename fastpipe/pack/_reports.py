"""What ``pack``, ``merge_packs`` and ``verify`` return."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_LISTED = 50  # problems or skipped inputs a summary shows before "... and N more"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


@dataclass
class PackReport:
    """What a pack or merge produced. ``skipped`` lists ``{"index", "source", "reason"}`` dicts."""

    output: Path
    format: str
    storage: str
    merge: str
    inputs: int
    count: int
    skipped: list[dict[str, Any]]
    shards: int
    resumed_shards: int
    seconds: float
    size_bytes: int
    notes: list[str] = field(default_factory=list)  # what the caller should know: not problems

    @property
    def files_per_second(self) -> float:
        return self.inputs / self.seconds if self.seconds > 0 else float("inf")

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["output"] = str(self.output)
        out["files_per_second"] = round(self.files_per_second, 2)
        return out

    def summary(self) -> str:
        resumed = f", {self.resumed_shards} resumed" if self.resumed_shards else ""
        lines = [
            f"packed {self.count} of {self.inputs} inputs into {self.output} ({self.format}, "
            f"{self.storage} storage, {_plural(self.shards, 'shard')}, merge {self.merge}"
            f"{resumed}) in {self.seconds:.1f} s ({self.files_per_second:.1f} files/s, "
            f"{self.size_bytes / 2**20:.1f} MiB)"
        ]
        if self.skipped:
            lines.append(f"skipped {_plural(len(self.skipped), 'input')} "
                         "(also listed in the pack's metadata):")
            lines.extend(f"  {s['source']}: {s['reason']}" for s in self.skipped[:_LISTED])
            if len(self.skipped) > _LISTED:
                lines.append(f"  ... and {len(self.skipped) - _LISTED} more")
        lines.extend(f"note: {note}" for note in self.notes)
        return "\n".join(lines)


@dataclass
class VerifyReport:
    """The result of :func:`~fastpipe.pack.verify`. ``ok`` is True when ``problems`` is empty."""

    path: Path
    format: str = ""
    storage: str = ""
    count: int = 0
    checked: int = 0
    skipped_inputs: int = 0
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)  # what was not checked, and why

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["path"] = str(self.path)
        out["ok"] = self.ok
        return out

    def summary(self) -> str:
        if not self.storage:  # it did not open as a pack
            return (f"{self.path}: not readable as a fastpipe pack:\n"
                    + "\n".join(f"  {p}" for p in self.problems))
        skipped = (f", {self.skipped_inputs} inputs were skipped when packing"
                   if self.skipped_inputs else "")
        head = (f"{self.path}: {self.format} pack, {self.storage} storage, {self.count} samples, "
                f"{self.checked} checked in {self.seconds:.1f} s{skipped}")
        notes = [f"  note: {n}" for n in self.notes]
        if self.ok:
            return "\n".join([head + ": OK", *notes])
        lines = [head + f": {_plural(len(self.problems), 'problem')}"]
        lines.extend(f"  {p}" for p in self.problems[:_LISTED])
        if len(self.problems) > _LISTED:
            lines.append(f"  ... and {len(self.problems) - _LISTED} more")
        return "\n".join(lines + notes)


def storage_of(schema: Any) -> str:
    """What a report calls a pack's storage: ``"bytes"`` (encoded images) or ``"array"`` for an
    ``(image, label)`` pack, ``"fields"`` for records."""
    if schema.record != "pair":
        return "fields"
    return "bytes" if next(iter(schema.fields.values())).kind == "image" else "array"
