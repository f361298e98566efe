"""The datasets a training loop builds: one record dataset over any source, and the classes that
build it from a path."""
