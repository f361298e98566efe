"""A griffe extension for the API reference: Sphinx roles in fastpipe's docstrings become links.

The docstrings cross-reference in Sphinx's spelling (``:class:`~fastpipe.data.ImageFolder```,
``:meth:`close```), which mkdocstrings would show as raw text. When griffe has loaded the
package, each role is replaced by an autorefs cross-reference to the object it names, resolved
as Python would from where the docstring is (the class's members, then the module's names and
imports, then the package's lazily exported names), under the path the reference pages render
it at (where it is defined). ``~`` shows the last name only, as in Sphinx. The reference is
optional: a name the site renders becomes a link, any other (a private helper, a torch class)
stays code, with its full path as a tooltip, and the build does not fail on it.

Wired in mkdocs.yml (``extensions: [docs/sphinx_roles.py]``); tests/integration/test_docs.py
checks that the built site has no raw role left.
"""

from __future__ import annotations

import ast
import html
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?P<role>class|meth|func|attr|mod|data|exc|obj|const):"
                  r"`(?P<target>[^`]+)`")


def to_autorefs(text: str, resolve) -> str:
    """``text`` with every Sphinx role replaced by an ``<autoref>`` of the path ``resolve(name)``
    gives (None: plain code). ``Title <target>`` is the title given explicitly."""

    def replace(match: re.Match) -> str:
        target = match["target"].strip()
        explicit = re.fullmatch(r"(?P<title>.+?)\s*<(?P<name>[^>]+)>", target)
        if explicit:
            title, name = explicit["title"], explicit["name"].lstrip("~")
        else:
            name = target.lstrip("~").lstrip(".")
            title = name.rsplit(".", 1)[-1] if target.startswith("~") else name
        code = f"<code>{html.escape(title)}</code>"
        path = resolve(name)
        if path is None:
            return f'<span title="{html.escape(name)}">{code}</span>'
        return f'<autoref identifier="{html.escape(path)}" optional>{code}</autoref>'

    return ROLE.sub(replace, text)


class SphinxRoles(griffe.Extension):
    """Rewrites the roles of every docstring of a package once it is loaded."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        names = _public_names(pkg)
        for obj in _objects(pkg):
            docstring = obj.docstring
            if docstring is not None and ROLE.search(docstring.value):
                docstring.value = to_autorefs(
                    docstring.value, lambda name, obj=obj: _resolve(obj, name, loader, names))


def _objects(obj: griffe.Object):
    """``obj`` and everything defined under it (not the aliases: their docstrings are their
    targets')."""
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _objects(member)


def _public_names(pkg: griffe.Module) -> dict[str, str]:
    """Each module-level class and function name of the package by its path, when only one
    object has that name (for a bare name a docstring uses without importing it)."""
    found: dict[str, set[str]] = {}
    for obj in _objects(pkg):
        if (obj.is_class or obj.is_function) and obj.parent is not None and obj.parent.is_module:
            found.setdefault(obj.name, set()).add(obj.path)
    return {name: next(iter(paths)) for name, paths in found.items() if len(paths) == 1}


def _resolve(obj: griffe.Object, name: str, loader: griffe.GriffeLoader,
             names: dict[str, str]) -> str | None:
    """The path of the object ``name`` means in ``obj``'s docstring, where it is defined."""
    first, _, rest = name.partition(".")
    candidates = []
    if first == obj.package.name:
        candidates.append(name)
    scope = obj if obj.is_class else obj.parent
    while scope is not None:  # the class's members (a method named from its class's docstring)
        if scope.is_class and first in scope.members:
            candidates.append(f"{scope.path}.{name}")
        scope = scope.parent
    try:
        resolved = obj.resolve(first)
    except Exception:  # noqa: BLE001 - griffe's NameResolutionError, or an odd scope
        resolved = None
    if resolved:
        candidates.append(f"{resolved}.{rest}" if rest else resolved)
    if first in names:
        candidates.append(f"{names[first]}.{rest}" if rest else names[first])
    for candidate in candidates:
        path = _defined_at(candidate, loader)
        if path is not None:
            return path
    return None


def _defined_at(path: str, loader: griffe.GriffeLoader) -> str | None:
    """``path`` where its object is defined (an import followed, a lazy export looked up in its
    package's ``_EXPORTS``), or None when the package does not have it."""
    parts = path.split(".")
    try:
        obj = loader.modules_collection[parts[0]]
    except KeyError:
        return None
    for index, part in enumerate(parts[1:], 1):
        member = obj.members.get(part)
        if member is None:
            module = _lazy_export(obj, part)
            if module is None:
                return None
            return _defined_at(".".join([module, part, *parts[index + 1:]]), loader)
        obj = member
        if obj.is_alias:
            try:
                obj = obj.final_target
            except Exception:  # noqa: BLE001 - an import from outside the package
                return None
    return obj.path


def _lazy_export(module: griffe.Object, name: str) -> str | None:
    """The module a package's ``_EXPORTS`` table (names loaded on first use) gives for
    ``name``."""
    exports = module.members.get("_EXPORTS")
    if exports is None or exports.is_alias or getattr(exports, "value", None) is None:
        return None
    try:
        table = ast.literal_eval(str(exports.value))
    except (ValueError, SyntaxError):
        return None
    value = table.get(name) if isinstance(table, dict) else None
    return value if isinstance(value, str) else None
