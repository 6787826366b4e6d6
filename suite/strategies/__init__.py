"""Strategies that are not gradient communication: mixed precision, Local SGD, the optimizer, host syncs."""
