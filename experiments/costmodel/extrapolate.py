"""Predictions for clusters that cannot be built here (EXTRAPOLATION, not measurement).

Inputs are published figures, each named where it is used:
- NVLink inside a node: A100 NVLink 3, 600 GB/s total per GPU = 300 GB/s each direction
  (NVIDIA A100 datasheet); NCCL's ring reaches about 230 GB/s bus bandwidth of it, which is
  used as the per-pair intra bandwidth.
- Between nodes: 100, 200, 400 Gbit/s per node (EDR/HDR/NDR InfiniBand, 100/200/400 GbE),
  one NIC per node (many real nodes have 4-8: divide the inter times accordingly).
- Latency (alpha) per message step: 10 µs inter-node, 5 µs intra-node (assumed, NCCL-class), the same
  at every size (no calibration of those machines exists here: the size-dependent latency and the CPU
  contention term calibrated on the emulated cluster describe gloo on shared CPU cores, not NCCL on
  GPUs, whose communication has its own engines: contention 0, ``cores`` = inf).
- The case: a ResNet-50-like profile built from published numbers (25.6 M parameters =
  102 MB of fp32 gradients in 161 tensors (Paddle's fuse log: 161 allreduce ops); 329 img/s
  at batch 32 on one V100 (PyTorch DDP benchmark) = 97 ms per step, taken as forward 1/3,
  backward 2/3 minus a 3 ms optimizer; gradients ready evenly through backward, the larger
  ones (late layers) first).  It is synthetic: only its totals are published figures.

    python -m experiments.costmodel extrapolate        # prints the Markdown tables
"""
from __future__ import annotations

from . import costmodel as cm
from .simulate import ParamGrad, Profile, predict_step, registry_settings

__all__ = ["resnet50_like_profile", "extrapolation_markdown", "NODES", "INTER_GBIT"]

NODES = (8, 64, 512)
GPUS_PER_NODE = 8
INTER_GBIT = (100, 200, 400)
NVLINK_BUS_BW = 230e9  # bytes/s
ALPHA_INTER, ALPHA_INTRA = 10e-6, 5e-6


def resnet50_like_profile() -> Profile:
    n = 161
    total = 25_557_032 * 4
    step = 32 / 329
    opt = 0.003
    fwd = (step - opt) / 3
    bwd = step - opt - fwd
    # sizes fall linearly from first-ready to last-ready tensor (weights 2..0.0..), summing to total
    weights = [2.0 * (n - i) / n for i in range(n)]
    scale = total / sum(weights)
    params = tuple(ParamGrad(f"t{i}", int(w * scale), bwd * (i + 1) / n) for i, w in enumerate(weights))
    return Profile(fwd, bwd, opt, params, per_rank_batch=32, model="resnet50-like (synthetic)")


def _cluster(nodes: int, gbit: float) -> cm.Cluster:
    return cm.Cluster(nodes, GPUS_PER_NODE, gbit * 1e9 / 8, NVLINK_BUS_BW, ALPHA_INTER, ALPHA_INTRA)


# The registry's variants at 32 MiB buckets, hierarchical overlapped on 2 communicators and Local SGD averaging
# fused buckets (as this table always had them; the registry's own run synchronously, unfused).  The synthetic
# profile has no layer structure: buckets in ready order (as NCCL-based frameworks form them).
_EXTRA: dict[str, tuple[str, dict]] = {
    "hierarchical": (" (overlap, 2 comms)", {"sync_nccl_allreduce": False, "nccl_comm_num": 2}),
    "local_sgd": (" (fused)", {"fuse_all_reduce_ops": True, "fuse_grad_size_in_MB": 32.0})}
SETTINGS = [(name + _EXTRA.get(name, ("", {}))[0], cfg.replace(**_EXTRA.get(name, ("", {}))[1]))
            for name, cfg in registry_settings(32.0, names=("fusion", "multicomm", "hierarchical", "local_sgd"))]


def extrapolation_markdown() -> str:
    prof = resnet50_like_profile()
    n = prof.grad_bytes
    out = [
        "**EXTRAPOLATION** (cost model only; inputs are published figures, see "
        "`experiments/costmodel/extrapolate.py`).",
        "",
        f"Allreduce of {n / 1e6:.0f} MB (ResNet-50's fp32 gradients) on N nodes x 8 GPUs, NVLink inside a node "
        f"({NVLINK_BUS_BW / 1e9:.0f} GB/s), one NIC per node; alpha {ALPHA_INTER * 1e6:g} µs inter / "
        f"{ALPHA_INTRA * 1e6:g} µs intra:",
        "",
        "| nodes x GPUs | inter Gbit/s | flat ring ms | hierarchical ms | speedup | bound |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for nodes in NODES:
        for g in INTER_GBIT:
            cl = _cluster(nodes, g)
            f, h = cm.ring_allreduce(n, cl), cm.hierarchical_allreduce(n, cl)["total"]
            out.append(f"| {nodes} x {GPUS_PER_NODE} | {g} | {f * 1e3:.1f} | {h * 1e3:.1f} | {f / h:.2f} "
                       f"| {cm.hierarchical_speedup_bound(cl):.2f} |")
    out += [
        "",
        f"Predicted training step of the synthetic ResNet-50-like profile ({prof.compute_s * 1e3:.0f} ms compute, "
        f"batch 32 per GPU) for the registry's variants, fused at 32 MiB: step ms / scaling efficiency.",
        "",
        "| nodes x GPUs | inter Gbit/s | " + " | ".join(name for name, _ in SETTINGS) + " |",
        "|---|---:|" + "---:|" * len(SETTINGS),
    ]
    for nodes in NODES:
        for g in INTER_GBIT:
            cl = _cluster(nodes, g)
            cells = []
            for name, cfg in SETTINGS:
                r = predict_step(prof, cl, cfg, name, order="ready")
                cells.append(f"{r['step_s'] * 1e3:.0f} / {r['scaling_efficiency']:.0%}")
            out.append(f"| {nodes} x {GPUS_PER_NODE} | {g} | " + " | ".join(cells) + " |")
    return "\n".join(out)
