"""Lazy imports of optional dependencies, with an error that says which extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingDependencyError(ImportError):
    """An optional dependency needed by the feature in use is not installed."""


def require(module: str, *, extra: str, package: str | None = None,
            feature: str = "") -> ModuleType:
    """Import ``module`` or raise :class:`MissingDependencyError` naming the extra to install.

    ``package`` is the name pip knows it by when it differs from the module name.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        what = feature or "this part of fastpipe"
        raise MissingDependencyError(
            f"{what} needs the optional package '{package or module}', which is not installed "
            f"({exc}). Install it with: pip install 'fastpipe[{extra}]'"
        ) from exc
