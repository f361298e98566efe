"""Helpers shared by the tests of several folders: ``from tests.helpers.<name> import ...``.

None of them imports an optional dependency (DALI, h5py, lmdb) at import time.
"""
