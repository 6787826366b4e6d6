"""Memory groups on two "hosts" with different free memory (tests/test_torchrun.py).

Started by two torchrun agents (``--nnodes 2 --node_rank N``), one rank each.  Each host's free-memory
probe is faked from its node rank (torchrun's GROUP_RANK): node 0 has a terabyte, node 1 almost nothing.
Each rank writes the groups its runner decided to ``OUT.RANK``, and what ``gather`` brought it."""
import json
import os
import sys

from suite.run_spec import RunFacts, RunOptions, Selection
from suite.runner import CaseRunner
from suite.runtime.device import Platform
from suite.runtime.launch import init_from_env, shutdown
from suite.runtime.torchrun import TorchrunLauncher
from suite.selection import base_cases, resolve_at

FREE = {"0": 2**40, "1": 1}  # bytes free per host


SELECTION = Selection(cases=("mlp/plain", "mlp/overlap", "mlp/fusion", "mlp/ddp"), size="tiny")


if __name__ == "__main__":
    Platform.free_memory = lambda self, local_ranks=1: FREE[os.environ["GROUP_RANK"]]  # this host's probe
    ctx = init_from_env(device="cpu", pg_timeout=60)
    try:
        launcher = TorchrunLauncher(ctx, timeout=60)
        runner = CaseRunner(launcher, ctx.world_size, RunOptions(check=False, utilization=False),
                            metadata={}, reporter=ctx.rank == 0, facts=RunFacts(size="tiny"))
        cases = resolve_at(SELECTION, base_cases(SELECTION, "tiny"), ctx.world_size, ctx.local_world_size)
        plan = runner.groups(cases)
        hosts = launcher.gather(os.environ["GROUP_RANK"])  # what each node's sampler would send to rank 0
        with open(f"{sys.argv[1]}.{ctx.rank}", "w") as fh:
            json.dump({"host": os.environ["GROUP_RANK"], "groups": plan, "gathered": hosts}, fh)
    finally:
        shutdown()
