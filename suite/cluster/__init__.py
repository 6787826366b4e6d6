"""An emulated multi-node cluster on one machine, and the scaling model checked against it.

- ``spec.py``: the ``--cluster NxR:inter=RATE[,intra=RATE]`` value (``ClusterSpec``), parsed in one place.
- ``emulate.py``: network namespaces, veth links, a switch, ``tbf`` rate limits (``EmulatedCluster``).
- ``launch.py``: rank-pool keyword arguments that start ranks inside their node's namespace.
- ``costmodel.py``: alpha-beta formulas of the collectives over a cluster description.
- ``simulate.py``: buckets on communicators over a measured profile (``fleetbench predict``).
- ``profile.py``: the rank function that measures such a profile.
- ``probes.py``: small timed collectives (flat and two-level allreduce) for validation.
"""
