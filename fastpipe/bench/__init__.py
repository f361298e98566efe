"""The suite behind ``fastpipe bench``."""
