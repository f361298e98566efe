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
                "fastpipe._frameworks", "fastpipe.gpu_decode"],
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


# Inside fastpipe.data, floors of its own (docs/architecture.md, "Which way the arrows point"):
# the format and the per-sample seeds at the bottom; decoding, collation and the sources on them;
# joint geometry and the loaders' kit (samplers, resume, skips) above; the datasets on top. A
# module imports data modules of lower floors, or of its own folder.
DATA_FLOORS = {
    "fastpipe.data.format": 0, "fastpipe.data.sampling.seeds": 0, "fastpipe.data.remote": 0,
    "fastpipe.data.decode": 1, "fastpipe.data.collate": 1, "fastpipe.data.sources": 1,
    "fastpipe.data.samples": 1,
    "fastpipe.data.joint": 2, "fastpipe.data.sampling": 2,
    "fastpipe.data.datasets": 3,
}


def _data_floor(module: str) -> tuple[int, str] | None:
    best = None
    for prefix, floor in DATA_FLOORS.items():
        if (module == prefix or module.startswith(prefix + ".")) and (
                best is None or len(prefix) > len(best[1])):
            best = (floor, prefix)
    return best


def _folder(module: str) -> str:
    return ".".join(module.split(".")[:3])


DATA_MODULES = [p for p in MODULES if _module_name(p).startswith("fastpipe.data.")]


def test_every_data_module_has_a_data_floor():
    homeless = [_module_name(p) for p in DATA_MODULES if _data_floor(_module_name(p)) is None]
    assert not homeless, f"add these modules to DATA_FLOORS: {homeless}"


@pytest.mark.parametrize("path", DATA_MODULES, ids=lambda p: _module_name(p))
def test_data_imports_point_down(path):
    here = _module_name(path)
    floor = _data_floor(here)[0]
    wrong = []
    for line, module in _imports(path):
        if not module.startswith("fastpipe.data.") or _folder(module) == _folder(here):
            continue
        target = _data_floor(module)
        if target is None or target[0] >= floor:
            wrong.append(f"line {line}: {module} (data floor {target and target[0]}) from data "
                         f"floor {floor}")
    assert not wrong, f"{here}:\n" + "\n".join(wrong)


def _type_checking_lines(path: Path) -> set[int]:
    """The lines of ``if TYPE_CHECKING:`` blocks: imports for annotations only, never run."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(
                node.test, "attr", None)) == "TYPE_CHECKING":
            for inner in node.body:
                lines.update(range(inner.lineno, (inner.end_lineno or inner.lineno) + 1))
    return lines


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        here = _module_name(path)
        skip = _type_checking_lines(path)
        graph[here] = {m for line, m in _imports(path)
                       if m != "fastpipe" and m != here and line not in skip}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circles():
    """No two modules import each other, directly or through others, lazily or not (imports for
    annotations only, under ``if TYPE_CHECKING:``, never run and are left out; so is a package's
    ``__init__`` naming the modules it exports)."""
    graph = _graph()
    # A package's __init__ that only re-exports is not a circle with the modules it names.
    for module in list(graph):
        graph[module] = {m for m in graph[module] if not module.startswith(m + ".")}
    circles = _circles(graph)
    assert not circles, f"import circles: {circles}"


def test_the_circle_check_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
