"""An emulated multi-node cluster on one machine: `run --cluster` and `comm --cluster` run their ranks on it.

- ``spec.py``: the ``--cluster NxR:inter=RATE[,intra=RATE]`` value (``ClusterSpec``), parsed in one place.
- ``emulate.py``: network namespaces, veth links, a switch, ``tbf`` rate limits (``EmulatedCluster``).
- ``launch.py``: rank-pool keyword arguments that start ranks inside their node's namespace.

The cost model once checked against it lives in ``experiments/costmodel/`` (unsupported).
"""
