"""The fuzz lane: a mutational driver over fastpipe's native decoders (docs/fuzzing.md)."""
