"""Training: the distributed worker loop, the single-process reference, metrics."""
