"""Benchmark figure sets: one module per figure, each with DESCRIPTION, Options, measure and render (the contract:
suite/cli/figures.py)."""
