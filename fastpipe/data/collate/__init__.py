"""Collation: samples into batches, in the memory the batch goes to."""
