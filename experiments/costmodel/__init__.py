"""The alpha-beta cost model of the strategies' communication, checked against the emulated cluster
(unsupported: experiments/README.md).  It consumes ``suite``: the emulated cluster itself (``suite.cluster``:
``spec.py``, ``emulate.py``, ``launch.py``) stays in the package.

- ``costmodel.py``: alpha-beta formulas of the collectives over a cluster description.
- ``calibrate.py``: the model's terms fitted from collective micro-benchmarks on an emulated cluster.
- ``simulate.py``: buckets on communicators over a measured profile (``predict``).
- ``profile.py``: the rank function that measures such a profile.
- ``probes.py``: small timed collectives (flat and two-level allreduce) for validation.
- ``extrapolate.py``: the model on real clusters, published figures as inputs.
- ``predict.py``: the ``predict`` command; ``figure.py``: the figure of docs/figures/cluster.md.
- ``cli.py``: ``python -m experiments.costmodel predict|calibrate|extrapolate|figure``.
"""
