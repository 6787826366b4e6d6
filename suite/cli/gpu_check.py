"""`fleetbench gpu-check` (what `.ci/gpu-check` runs): the options; the check is ``suite.gpucheck``'s.  Imports no
torch, so it runs under any python3 and picks the phases' interpreter itself."""
from __future__ import annotations

import os
import sys

from ..config import ConfigError
from ..gpucheck.interpreter import INDEX_TIMEOUT_S, INDEX_URL
from ..gpucheck.phases import Check, Options
from . import helps

ABOUT = """`fleetbench gpu-check`: the first contact with a GPU machine, one command (`.ci/gpu-check`).

Phases, each bounded (a hung phase is killed and marked; the later ones still run) and written as it ends:
0 host facts (nvidia-smi), 1 versions (torch, CUDA, cuDNN, NCCL, TF32; exit 2 with one line when torch is a CPU
wheel beside a GPU or the driver is too old for its CUDA), 2 the doctor (one rank), 3 the premises probe (what
docs/gpu.md assumes of CUDA and NCCL, expected vs observed), 4 one case per strategy family of resnet50, gpt2 and
bert (capped), 5 the GPU workflow's nightly plan from the step times measured in 4.  OUT/SUMMARY.md says what
passed, what to do next, which docs/gpu.md rows are confirmed and NCCL's own warnings; at most 7 more files beside
it.  The whole check, the choice of its interpreter included, keeps within six minutes; nothing is installed unless
--setup asks.  --device cpu runs 0, 2, 4 and 5 on CPU (tiny size) and marks 1 and 3 not applicable."""


CODES = {0: "every phase passed or did not apply",
         1: "a phase failed, hit its bound or could not run (its reason in SUMMARY.md)",
         2: "torch cannot use this machine's GPUs (one line says why), or bad options"}


def add_parser(sub) -> None:
    p = sub.add_parser("gpu-check", help="the first GPU contact: host facts, versions, doctor, premises, one case per "
                                         "family, the plan; bounded phases, OUT/SUMMARY.md",
                       **helps(ABOUT, """
                           fleetbench gpu-check --out /tmp/out
                           fleetbench gpu-check --only 4,5
                           fleetbench gpu-check --device cpu --out /tmp/gpu-check-cpu""",
                               codes=CODES))
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cuda (default): the GPU check; cpu: the same phases on CPU, the CUDA-only ones marked")
    p.add_argument("--out", default=os.environ.get("OUT") or os.path.join("results", "gpu-check"),
                   help="output folder (default $OUT, else results/gpu-check)")
    p.add_argument("--only", metavar="PHASES", help="rerun these phases, comma-separated (e.g. 3,4,5); the others "
                   "keep what the last check wrote in --out")
    p.add_argument("--venv", default=os.environ.get("VENV") or ".venv",
                   help="the project's environment, tried first (default $VENV, else .venv)")
    p.add_argument("--setup", action="store_true",
                   help="when no environment imports a CUDA torch, run `make setup` (the pinned CUDA build) if the "
                        "package index answers; its time is not the check's.  Without it nothing is installed: the "
                        "present python3 runs the phases")
    p.add_argument("--index-url", default=None, help="what the package index probe asks (--setup; default the "
                                                     "public index)")
    p.add_argument("--index-timeout", type=float, default=None,
                   help="seconds the index may take to answer before make setup is not tried (--setup; default 20)")
    p.set_defaults(func=main)


def _only(text: str | None) -> tuple:
    if not text:
        return ()
    out = []
    for part in text.replace(" ", "").split(","):
        if not part.isdigit() or int(part) > 5:
            raise ConfigError(f"--only {text!r}: {part!r} is not a phase; phases are 0 to 5, comma-separated")
        out.append(int(part))
    return tuple(sorted(set(out)))


def main(args) -> int:
    opts = Options(device=args.device, out=args.out, only=_only(args.only), venv=args.venv, setup=args.setup,
                   index_url=args.index_url or INDEX_URL,
                   index_timeout=INDEX_TIMEOUT_S if args.index_timeout is None else args.index_timeout)
    check = Check(opts)
    code = check.run()
    print(f"gpu-check: exit {code}; {os.path.join(check.out, 'SUMMARY.md')}", flush=True)
    if code == 2 and check.fatal:
        print(f"gpu-check: {check.fatal}", file=sys.stderr, flush=True)
    return code
