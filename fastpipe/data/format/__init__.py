"""The pack format and its fields: what the writer (fastpipe.pack) and every reader
(fastpipe.data.sources) share."""
