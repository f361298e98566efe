"""fastpipe's version, in a module of its own so that any part can read it without importing the
package root (pyproject.toml holds the same string; tests/integration/test_package.py keeps them
equal)."""

__version__ = "0.1.0"
