"""fastpipe's tests, laid out as the package they test (tests/README.md).

A package, as is each folder under it: pytest imports every test module by its dotted name
(``tests.dali.test_loader``), so two folders may hold files of the same name, and the shared
helpers are imported as ``tests.helpers.<name>`` from any folder and from the processes the tests
start (the repository root is on their path).
"""
