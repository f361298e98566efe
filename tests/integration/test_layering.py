"""The arrows of docs/architecture.md ("Which way the arrows point"), held by walking every import
of every module in the package, lazy imports inside functions included.

Each module belongs to a floor; a module imports only from its own floor and the floors its row
of ALLOWED names. Nothing imports the package root (``import fastpipe`` or ``from fastpipe import
X`` for a name that is not a module) or the CLI from inside the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "fastpipe"

# Floors, from the ground up: module-name prefixes (a package prefix covers its modules).
FLOORS = {
    # The compiled modules (_C, _jpeg, _resize, _png) are leaves: they import nothing of fastpipe.
    "ground": ["fastpipe._C", "fastpipe._jpeg", "fastpipe._resize", "fastpipe._png", "fastpipe._io",
               "fastpipe._background", "fastpipe._compat", "fastpipe._constants",
               "fastpipe._cuda_archs", "fastpipe._geometry", "fastpipe._hardware",
               "fastpipe._malloc", "fastpipe._optional", "fastpipe._progress", "fastpipe._seed",
               "fastpipe._threads", "fastpipe._validate", "fastpipe._version",
               "fastpipe.recipe"],
    "ops": ["fastpipe.ops"],
    "data": ["fastpipe.data"],
    "pack": ["fastpipe.pack"],
    "loading": ["fastpipe.loader", "fastpipe.prefetch", "fastpipe._batch", "fastpipe._streams",
                "fastpipe._frameworks"],
    "dali": ["fastpipe.dali"],
    "profiling": ["fastpipe.profiling"],
    "top": ["fastpipe.factory", "fastpipe.bench", "fastpipe._doctor"],
    "cli": ["fastpipe._cli", "fastpipe.__main__"],
}
BELOW_TOP = {"ground", "ops", "data", "pack", "loading", "dali", "profiling"}
ALLOWED = {
    "ground": {"ground"},
    "ops": {"ground", "ops"},
    "data": {"ground", "ops", "data"},  # the readers never import the writer (pack)
    "pack": {"ground", "ops", "data", "pack"},
    "loading": {"ground", "ops", "data", "loading"},
    "dali": {"ground", "ops", "data", "dali"},
    "profiling": {"ground", "ops", "data", "loading", "dali", "profiling"},
    "top": BELOW_TOP | {"top"},
    "cli": BELOW_TOP | {"top", "cli"},
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file() or any(
        path.parent.glob(path.name + ".*.so"))


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every import of a fastpipe module in ``path``; the package
    root is ``"fastpipe"``."""
    found = []
    here = _module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] ==
                      "fastpipe"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            if module.split(".")[0] != "fastpipe":
                continue
            for alias in node.names:
                target = f"{module}.{alias.name}"
                found.append((node.lineno, target if _is_module(target) else module))
    return found


def _floor(module: str) -> str | None:
    best = None
    for floor, prefixes in FLOORS.items():
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > len(best[1]):
                    best = (floor, prefix)
    return None if best is None else best[0]


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent !=
                 PACKAGE)


def test_every_module_has_a_floor():
    homeless = [_module_name(p) for p in MODULES if _floor(_module_name(p)) is None]
    assert not homeless, f"add these modules to a floor in FLOORS (and docs/architecture.md): " \
                         f"{homeless}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: _module_name(p))
def test_imports_follow_the_arrows(path):
    here = _module_name(path)
    floor = _floor(here)
    wrong = []
    for line, module in _imports(path):
        if module == "fastpipe":
            wrong.append(f"line {line}: imports the package root; import from the defining "
                         "module instead")
            continue
        target = _floor(module)
        if target not in ALLOWED[floor]:
            wrong.append(f"line {line}: {module} (floor {target!r}) from floor {floor!r}")
    assert not wrong, f"{here}:\n" + "\n".join(wrong)


def test_the_walker_sees_lazy_imports_and_the_root(tmp_path, monkeypatch):
    """A check that cannot fail is no check: a module with a lazy upward import and a root
    import is caught."""
    module = PACKAGE / "data" / "_layering_probe.py"
    module.write_text("def f():\n    from fastpipe.factory import image_loader\n"
                      "    from fastpipe import DataLoaderX\n    import fastpipe\n")
    try:
        found = {name for _, name in _imports(module)}
        assert found == {"fastpipe.factory", "fastpipe"}
        with pytest.raises(AssertionError, match="factory.*floor 'top'.*package root"):
            test_imports_follow_the_arrows(module)
    finally:
        module.unlink()
