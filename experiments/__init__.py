"""Unsupported side projects that consume ``suite`` (see experiments/README.md); nothing in ``suite/``,
``bench_cases/`` or ``tests/`` imports them."""
