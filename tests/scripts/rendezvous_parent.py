"""A parent whose two ranks are stuck in their rendezvous, for tests/test_pool.py: it kills this parent
while the ranks sit in C++ and checks they are gone.

    python tests/scripts/rendezvous_parent.py [--no-deathsig]

The ranks run the pool's own entry point (``suite.runtime.pool._worker``); their store is made to block in
C holding the GIL (what c10d's FileStore constructor did in the reported case), so the rank's watching
thread cannot run and only the kernel's parent-death signal can end the rank.  Each rank touches
``store.RANK`` when it is inside.  Prints one JSON line: parent, ranks, store (the store file).
``--no-deathsig`` starts the ranks as if from another thread (no parent-death signal), to show what the
signal is for.
"""
import json
import multiprocessing as mp
import os
import sys
import time

from suite.runtime import pool as P


def stuck_rank(rank, *args):
    import ctypes

    import torch.distributed as dist

    def store(path, world):
        open(f"{path}.{rank}", "w").close()
        ctypes.PyDLL(None).sleep(600)  # libc sleep called with the GIL held

    dist.FileStore = store
    P._worker(rank, *args)


def main() -> None:
    d, _owner = P.owned_tempdir("fleetbench-store-")
    store = os.path.join(d, "store")
    open(store, "w").close()
    ctx = mp.get_context("spawn")
    res_q = ctx.Queue()
    watch_r, watch_w = ctx.Pipe(duplex=False)
    parent = 0 if "--no-deathsig" in sys.argv else os.getpid()
    procs, cmd_qs = [], [ctx.Queue() for _ in range(2)]  # kept referenced until the ranks unpickled them
    for r in range(2):
        opts = P._Options(None, 600.0, 1, {"GLOO_SOCKET_IFNAME": P._loopback_ifname()}, None, parent)
        p = ctx.Process(target=stuck_rank, args=(r, 2, ("file", store), cmd_qs[r], res_q, opts, watch_r),
                        daemon=True)
        p.start()
        procs.append(p)
    print(json.dumps({"parent": os.getpid(), "ranks": [p.pid for p in procs], "store": store}), flush=True)
    time.sleep(600)


if __name__ == "__main__":
    main()
