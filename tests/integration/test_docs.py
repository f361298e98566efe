"""The documentation's own checks: Markdown that renders as written, and an API reference that
covers every public name (CI builds the site with `mkdocs build --strict`)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]

FENCE = re.compile(r"^([ \t]*)(`{3,}|~{3,}).*?^\1\2[ \t]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?!`).+?(?<!`)\1(?!`)", re.S)
# Anything Markdown would pass through as an HTML tag (and the browser then hides), but not an
# autolink (<https://...>) or a comment (the benchmark tables' markers).
RAW_TAG = re.compile(r"<(?!https?://|mailto:|!--)[A-Za-z/!?][^>\n]*>")


def raw_tags(text: str) -> list[str]:
    """The ``<...>`` of ``text`` outside fenced blocks and code spans."""
    return RAW_TAG.findall(CODE_SPAN.sub("", FENCE.sub("", text)))


def test_the_lint_finds_what_a_browser_would_swallow():
    assert raw_tags('## "unable to write to file </torch_...>" in Docker') == ["</torch_...>"]
    assert raw_tags('## "unable to write to file `</torch_...>`" in Docker') == []
    assert raw_tags("```text\n<GPU model>\n```\nsee <https://example.org> <!-- marker -->") == []
    assert raw_tags("a `` x <b> `` c <details>") == ["<details>"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_raw_html_tags_outside_code(page):
    found = raw_tags(page.read_text())
    assert not found, (f"{page.relative_to(ROOT)}: {found} would render as HTML tags (and their "
                       "text vanish); put them in backticks")


def public_names(package: str) -> list[str]:
    """``__all__`` of a package, read from its source (fastpipe.dali without DALI too)."""
    path = ROOT / package.replace(".", "/") / "__init__.py"
    values: dict[str, object] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in ("__all__", "_EXPORTS"):
                if isinstance(node.value, ast.Call):  # __all__ = sorted(_EXPORTS)
                    values[name] = sorted(values["_EXPORTS"])  # type: ignore[arg-type]
                else:
                    values[name] = ast.literal_eval(node.value)
    return list(values["__all__"])  # type: ignore[call-overload]


@pytest.mark.parametrize(("package", "page"), [
    ("fastpipe", "fastpipe"), ("fastpipe.data", "data"), ("fastpipe.ops", "ops"),
    ("fastpipe.pack", "pack"), ("fastpipe.dali", "dali"), ("fastpipe.profiling", "profiling"),
])
def test_the_api_reference_shows_every_public_name(package, page):
    text = (ROOT / "docs" / "api" / f"{page}.md").read_text()
    shown = re.findall(r"^::: ([\w.]+)\.(\w+)$", text, re.M)
    names = [name for _, name in shown]
    expected = [n for n in public_names(package) if not (package == "fastpipe" and n == "Recipe")]
    assert names == expected, f"docs/api/{page}.md must show {package}.__all__, in its order"
    for module, name in shown:  # each from the module that defines it
        source = (ROOT / (module.replace(".", "/") + ".py")).read_text()
        assert re.search(rf"^(class|def) {name}\b|^{name}\b.*=", source, re.M), (module, name)
    recipe = (ROOT / "docs" / "api" / "recipe.md").read_text()
    assert "::: fastpipe.recipe.Recipe" in recipe


def test_every_api_page_is_in_the_site_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in sorted((ROOT / "docs" / "api").glob("*.md")):
        assert f"api/{page.name}" in nav, page.name
    assert "mkdocstrings" in nav


def test_the_docs_requirements_are_the_docs_extra_and_in_the_test_extra():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    lines = (ROOT / "docs" / "requirements.txt").read_text().splitlines()
    required = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert required == extras["docs"]
    assert set(required) <= set(extras["test"])  # CI installs .[test] and builds the site
    readme = (ROOT / "README.md").read_text()
    assert "pip install -r docs/requirements.txt && mkdocs serve" in readme
    assert 'pip install -e ".[docs]"' not in readme  # rebuilt the extension to build the docs
