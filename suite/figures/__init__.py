"""Benchmark figure sets: one module per strategy, each with DESCRIPTION and run(pool, args) -> Markdown."""
