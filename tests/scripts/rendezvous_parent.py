"""A parent whose two ranks wait forever in the rendezvous (the store expects a third that never comes),
for tests/test_hostile.py: it kills this parent while the ranks sit in C++ and checks they are gone.

    python tests/scripts/rendezvous_parent.py [--no-deathsig]

Prints one JSON line: parent, ranks, store (the store file).  ``--no-deathsig`` starts the ranks as
if from another thread (no parent-death signal), to show what the signal is for.
"""
import json
import multiprocessing as mp
import os
import sys
import time

from suite.runtime import pool as P


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
        p = ctx.Process(target=P._worker, args=(r, 3, ("file", store), cmd_qs[r], res_q, opts, watch_r),
                        daemon=True)
        p.start()
        procs.append(p)
    print(json.dumps({"parent": os.getpid(), "ranks": [p.pid for p in procs], "store": store}), flush=True)
    time.sleep(600)


if __name__ == "__main__":
    main()
