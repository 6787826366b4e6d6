"""The versions phase's probe, run under the chosen interpreter (``python -c "from suite.gpucheck.versions import
main; main()"``): torch, its CUDA, cuDNN and NCCL, whether CUDA initialises (and why not), the GPUs torch sees, the
TF32 defaults of a fresh process, and every installed distribution (the freeze).  One JSON object on stdout."""
from __future__ import annotations

import json
import warnings

__all__ = ["collect", "main"]


def _try(fn, default=None):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn()
    except Exception as exc:  # noqa: BLE001 - a missing piece is reported, not fatal
        return default if default is not None else f"{type(exc).__name__}: {exc}"[:300]


def collect() -> dict:
    import importlib.metadata

    import torch

    out: dict = {"torch": str(torch.__version__), "cuda": torch.version.cuda, "git": torch.version.git_version,
                 "cudnn": _try(lambda: torch.backends.cudnn.version()),
                 "cuda_available": bool(torch.cuda.is_available()), "device_count": _try(torch.cuda.device_count, 0)}
    if torch.version.cuda:
        out["nccl"] = _try(lambda: ".".join(map(str, torch.cuda.nccl.version())))
        if not out["cuda_available"]:  # why not: torch's own words
            out["cuda_init_error"] = _try(lambda: torch.cuda.init() or "torch.cuda.init() raised nothing")
        out["devices"] = [_try(lambda i=i: {"name": torch.cuda.get_device_name(i),
                                            "capability": ".".join(map(str, torch.cuda.get_device_capability(i))),
                                            "memory_bytes": torch.cuda.get_device_properties(i).total_memory})
                          for i in range(out["device_count"] if out["cuda_available"] else 0)]
        out["bf16"] = _try(lambda: torch.cuda.is_bf16_supported()) if out["cuda_available"] else None
    out["tf32_defaults"] = {"matmul_allow_tf32": _try(lambda: torch.backends.cuda.matmul.allow_tf32),
                            "cudnn_allow_tf32": _try(lambda: torch.backends.cudnn.allow_tf32),
                            "float32_matmul_precision": _try(torch.get_float32_matmul_precision)}
    out["freeze"] = sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()
                           if d.metadata["Name"])
    return out


def main() -> None:
    print(json.dumps(collect()), flush=True)
