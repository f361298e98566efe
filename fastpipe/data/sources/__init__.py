"""Sources: where records come from, one module per kind, behind one interface
(:class:`~fastpipe.data.sources._base.Source`, docs/architecture.md)."""
