"""A case's structure: the exact facts a structural gate compares, no statistics needed.

A code change that alters *what* a case does (how many allreduces before and after fusion,
the buckets and their bytes, how many buckets were launched before backward ended, the
collectives and bytes per step on each process group, the fused-op counts, the precision
settings torch reported (TF32, cuDNN), and, where the configuration is deterministic on CPU,
the loss trajectory bit for bit) is a change whatever the timings say.  :func:`structure_of`
extracts those facts from what a run records (the engine's ``describe()``, the per-step
communication counts, the check's per-step losses); :func:`structure_diff` lists every
difference between two.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["structure_of", "structure_diff", "structure_new", "acknowledged", "read_acks", "ACK_FILE"]

# An intended structure change, committed with it: `ab` and the nightly gate accept the listed facts' changes.
ACK_FILE = "structure-changes.toml"

# describe() keys that are structure (what the engine set up), copied as they are
# ("precision": TF32, matmul precision, cuDNN switches and version, as torch reported them on the ranks)
# ("launched_in_backward": the fewest buckets launched before backward ended in a step, what overlap means)
_DESCRIBE_KEYS = ("strategy", "allreduce_ops_before_fusion", "allreduce_ops", "fuse_all_reduce_ops", "overlap",
                  "launched_in_backward", "nccl_comm_num", "hierarchical", "init_broadcasts", "precision")


def structure_of(describe: Mapping | None, comm_calls_per_step: Mapping[str, float] | None = None,
                 comm_bytes_per_step: Mapping[str, float] | None = None, losses: Sequence | None = None,
                 deterministic: bool = False) -> dict:
    """The structural facts of one case (see the module docstring): from the engine's ``describe`` (its own keys,
    and ``precision`` as torch reported it), the collectives and bytes per step on each process group, and the
    check's per-step ``losses`` (a record reads them from its typed parts: ``CaseRecord.derived_structure``).

    ``deterministic``: the run's losses are reproducible bit for bit (CPU, no straggler sleeps,
    no compiled kernels), so the check's loss trajectory is part of the structure.
    """
    describe = describe or {}
    out: dict[str, Any] = {k: dict(describe[k]) if isinstance(describe[k], Mapping) else describe[k]
                           for k in _DESCRIBE_KEYS if k in describe}
    if isinstance(describe.get("buckets"), list):
        out["buckets"] = [{"params": b.get("params"), "bytes": b.get("bytes"), "comm": b.get("comm")}
                          for b in describe["buckets"] if isinstance(b, dict)]
    fusion = describe.get("compute_fusion")
    if isinstance(fusion, dict):
        out["fused_ops"] = {k: v.get("fused") for k, v in fusion.items() if isinstance(v, dict) and "fused" in v}
    opt = describe.get("optimizer")
    if isinstance(opt, dict):
        out["optimizer_ops"] = {k: opt.get(k) for k in ("optimizer_ops_before_fusion", "optimizer_ops")}
    for key, per_step in (("comm_calls_per_step", comm_calls_per_step), ("comm_bytes_per_step", comm_bytes_per_step)):
        if isinstance(per_step, Mapping):
            out[key] = dict(sorted(per_step.items()))
    if deterministic and losses:
        out["loss_trajectory"] = [float(v).hex() if isinstance(v, (int, float)) else str(v) for v in losses]
    return out


def structure_diff(base: Mapping, head: Mapping) -> list[str]:
    """Every difference between two structures, one readable line each (empty: identical).

    Only facts both sides recorded are compared: a fact one side does not record (an older revision
    that did not record it yet, or the loss trajectory, recorded only where deterministic) is "new"
    (:func:`structure_new`), not a change, so a gate's baseline from before the fact existed is not
    stuck on it.
    """
    lines: list[str] = []
    keys = list(dict.fromkeys(list(base) + list(head)))
    for k in keys:
        if k not in base or k not in head:
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


def structure_new(base: Mapping, head: Mapping) -> list[str]:
    """Facts recorded on one side only, one line each: reported as "new", never as a change."""
    return [f"{k}: new in HEAD" if k in head else f"{k}: recorded by BASE only"
            for k in dict.fromkeys(list(base) + list(head)) if (k in base) != (k in head)
            and k != "loss_trajectory"]


def read_acks(path: str) -> list[dict]:
    """The acknowledged structure changes of a revision (its ``structure-changes.toml``; none if absent):

        [[change]]
        case = "mlp/fusion"        # a case name or glob
        fact = "buckets"           # the structural fact (the part of a difference line before '.' or ':')
        why = "bucket size 32 MB"  # required: what the change is for
    """
    import os
    import tomllib

    if not os.path.isfile(path):
        return []
    with open(path, "rb") as fh:
        try:
            doc = tomllib.load(fh)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path}: not valid TOML ({exc})") from None
    changes = doc.get("change", [])
    if set(doc) - {"change"} or not isinstance(changes, list):
        raise ValueError(f"{path}: only [[change]] tables are allowed, found {sorted(doc)}")
    for i, c in enumerate(changes):
        if not (isinstance(c, dict) and set(c) == {"case", "fact", "why"} and all(isinstance(v, str) and v
                                                                                  for v in c.values())):
            raise ValueError(f"{path}: change {i + 1} must have exactly case, fact and why, as non-empty strings; "
                             f"got {c!r}")
    return changes


def acknowledged(case: str, diff: list[str], acks: list[dict]) -> bool:
    """Every difference of this case is a fact an acknowledgement names (and there is one)."""
    import fnmatch
    import re

    def fact(line: str) -> str:
        return re.split(r"[.:]", line, maxsplit=1)[0]

    names = {a["fact"] for a in acks if fnmatch.fnmatchcase(case, a["case"])}
    return bool(diff) and all(fact(d) in names for d in diff)
