"""The documentation's own checks: Markdown that renders as written, and an API reference that
covers every public name (CI builds the site with `mkdocs build --strict`)."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
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


# --------------------------------------------------------------------- the README's commands


def readme_command(name: str) -> str:
    """The command README.md marks ``<!-- ci: NAME -->``, which .ci/run runs as written."""
    text = (ROOT / "README.md").read_text()
    match = re.search(rf"<!-- ci: {name} -->\s*```bash\n(.*?)\n```", text, re.S)
    assert match, f"README.md has no command marked <!-- ci: {name} -->"
    return match.group(1)


def test_ci_runs_the_readmes_main_and_test_commands():
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'eval "$main_command"' in ci and 'eval "$test_command"' in ci
    main, tests = readme_command("main"), readme_command("test")
    assert main.startswith("python3 -m venv .venv") and main.endswith("&& fastpipe bench")
    assert '--no-build-isolation -e ".[bench,dali]"' in main
    # After the main command: the test extra's packages only, no second compile.
    assert "-e " not in tests and "--no-build-isolation" not in tests and "venv" not in tests
    assert tests.endswith("python -m pytest")


def test_the_prerequisites_come_first_and_name_what_ci_installs():
    text = (ROOT / "README.md").read_text()
    prerequisites = readme_command("prerequisites")
    assert text.index(prerequisites) < text.index(readme_command("main"))
    ci = (ROOT / ".ci" / "run").read_text()
    for package in ("libjpeg-dev", "libpng-dev", "libisal-dev"):
        assert package in prerequisites and package in ci, package
    for package in ("build-essential", "python3-dev", "python3-venv"):
        assert package in prerequisites, package


def test_one_spelling_of_each_install_command_across_the_pages():
    main_install = readme_command("main").removesuffix(" && fastpipe bench")
    assert main_install in (ROOT / "docs" / "getting-started.md").read_text()
    for page in PAGES:
        text = page.read_text()
        name = str(page.relative_to(ROOT))
        assert '-e ".[bench]"' not in text, name
        for line in re.findall(r"apt(?:-get)? install[^`\n]*", text):
            assert "libjpeg62-turbo-dev" not in line and "libjpeg-turbo8-dev" not in line, name
        for line in re.findall(r"pip install -r docs/requirements.txt[^`\n]*", text):
            assert line == "pip install -r docs/requirements.txt && mkdocs serve", (name, line)


# ------------------------------------------------- the API reference's Sphinx roles as links

SPHINX_ROLES = ROOT / "docs" / "sphinx_roles.py"


def _sphinx_roles():
    pytest.importorskip("griffe", exc_type=ImportError)
    spec = importlib.util.spec_from_file_location("sphinx_roles", SPHINX_ROLES)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sphinx_roles_become_optional_autorefs():
    roles = _sphinx_roles()
    paths = {"fastpipe.data.ImageFolder": "fastpipe.data.datasets.folders.ImageFolder",
             "close": "fastpipe.loader.DataLoaderX.close"}
    text = ("A :class:`~fastpipe.data.ImageFolder`, :class:`fastpipe.data.ImageFolder`, "
            ":meth:`close`, :py:func:`the pack <fastpipe.pack.pack>`, :class:`torch.Tensor`.")
    assert roles.to_autorefs(text, paths.get) == (
        'A <autoref identifier="fastpipe.data.datasets.folders.ImageFolder" optional><code>'
        'ImageFolder</code></autoref>, <autoref identifier="fastpipe.data.datasets.folders.'
        'ImageFolder" optional><code>fastpipe.data.ImageFolder</code></autoref>, <autoref '
        'identifier="fastpipe.loader.DataLoaderX.close" optional><code>close</code></autoref>, '
        '<span title="fastpipe.pack.pack"><code>the pack</code></span>, <span '
        'title="torch.Tensor"><code>torch.Tensor</code></span>.')
    assert roles.ROLE.search("a :attr:`x` and :mod:`y`") is not None


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_the_built_site_has_no_raw_sphinx_role_and_links_them(tmp_path):
    """mkdocs build --strict, as CI does: the docstrings' roles render as links (or as code where
    the site shows no such name), never as ':class:' text."""
    pytest.importorskip("mkdocstrings_handlers.python", exc_type=ImportError)
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(site)], cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    raw = re.compile(r":(?:py:)?(?:class|meth|func|attr|mod|data|exc|obj|const):(?:`|<code>)")
    leftovers = {str(p.relative_to(site)): raw.findall(p.read_text())
                 for p in site.rglob("*.html")}
    assert not {k: v for k, v in leftovers.items() if v}
    data = (site / "api" / "data" / "index.html").read_text()
    # fastpipe.data's docstrings name ImageFolder with a role; it is shown on this page.
    assert re.search(r'<a class="autorefs autorefs-internal"[^>]*href="#fastpipe\.data\.'
                     r'[\w.]*ImageFolder"><code>ImageFolder</code></a>', data)
    assert not (site / "sphinx_roles.py").exists()
