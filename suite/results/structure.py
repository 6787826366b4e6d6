"""A case's structure: the exact facts a structural gate compares, no statistics needed.

A code change that alters *what* a case does (how many allreduces before and after fusion,
the buckets and their bytes, the collectives and bytes per step on each process group, the
fused-op counts, the precision settings torch reported (TF32, cuDNN), and, where the
configuration is deterministic on CPU, the loss trajectory bit for bit) is a change whatever
the timings say.  :func:`structure_of` extracts those facts from what a run records (the
engine's ``describe()``, the per-step communication counts, the check's per-step losses);
:func:`structure_diff` lists every difference between two.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["structure_of", "structure_diff"]

# describe() keys that are structure (what the engine set up), copied as they are
# ("precision": TF32, matmul precision, cuDNN switches and version, as torch reported them on the ranks)
_DESCRIBE_KEYS = ("strategy", "allreduce_ops_before_fusion", "allreduce_ops", "fuse_all_reduce_ops", "overlap",
                  "nccl_comm_num", "hierarchical", "init_broadcasts", "precision")


def structure_of(describe: Mapping | None, metrics: Mapping | None, check: Mapping | None,
                 deterministic: bool = False) -> dict:
    """The structural facts of one case (see the module docstring).

    ``deterministic``: the run's losses are reproducible bit for bit (CPU, no straggler sleeps,
    no compiled kernels), so the check's loss trajectory is part of the structure.
    """
    describe, metrics = describe or {}, metrics or {}
    out: dict[str, Any] = {k: describe[k] for k in _DESCRIBE_KEYS if k in describe}
    if isinstance(describe.get("buckets"), list):
        out["buckets"] = [{"params": b.get("params"), "bytes": b.get("bytes"), "comm": b.get("comm")}
                          for b in describe["buckets"] if isinstance(b, dict)]
    fusion = describe.get("compute_fusion")
    if isinstance(fusion, dict):
        out["fused_ops"] = {k: v.get("fused") for k, v in fusion.items() if isinstance(v, dict) and "fused" in v}
    opt = describe.get("optimizer")
    if isinstance(opt, dict):
        out["optimizer_ops"] = {k: opt.get(k) for k in ("optimizer_ops_before_fusion", "optimizer_ops")}
    for key in ("comm_calls_per_step", "comm_bytes_per_step"):
        if isinstance(metrics.get(key), dict):
            out[key] = dict(sorted(metrics[key].items()))
    losses = (check or {}).get("losses")
    if deterministic and isinstance(losses, list) and losses:
        out["loss_trajectory"] = [float(v).hex() if isinstance(v, (int, float)) else str(v) for v in losses]
    return out


def structure_diff(base: dict, head: dict) -> list[str]:
    """Every difference between two structures, one readable line each (empty: identical).

    A fact present on one side only counts as a difference, except the loss trajectory, which
    is compared only when both sides recorded one (it is recorded only where deterministic).
    """
    lines: list[str] = []
    keys = list(dict.fromkeys(list(base) + list(head)))
    for k in keys:
        if k == "loss_trajectory" and (k not in base or k not in head):
            continue
        b, h = base.get(k, "<absent>"), head.get(k, "<absent>")
        if b == h:
            continue
        if isinstance(b, dict) and isinstance(h, dict):
            for sub in dict.fromkeys(list(b) + list(h)):
                if b.get(sub) != h.get(sub):
                    lines.append(f"{k}.{sub}: {b.get(sub, '<absent>')} -> {h.get(sub, '<absent>')}")
        elif k == "loss_trajectory":
            first = next((i for i, (x, y) in enumerate(zip(b, h)) if x != y), min(len(b), len(h)))
            lines.append(f"loss_trajectory: differs from step {first + 1} "
                         f"({float.fromhex(b[first]) if first < len(b) else '-'} -> "
                         f"{float.fromhex(h[first]) if first < len(h) else '-'})")
        elif k == "buckets" and isinstance(b, list) and isinstance(h, list):
            lines.append(f"buckets: {len(b)} -> {len(h)} "
                         f"(bytes {[x.get('bytes') for x in b]} -> {[x.get('bytes') for x in h]})")
        else:
            lines.append(f"{k}: {b} -> {h}")
    return lines
