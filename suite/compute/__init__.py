"""Compute fusion: a pass over the model and the fused ops it inserts; fused optimizers."""
