"""What the loaders keep between batches: the order of an epoch, the per-sample seeds, the resume
kit, the skipped samples."""
