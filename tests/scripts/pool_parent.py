"""A parent process for the orphan tests: it starts a rank pool, reports the pids, then keeps the
ranks busy in a long call until it is killed (tests/test_pool.py kills it and watches the ranks).

    python tests/scripts/pool_parent.py [--thread] [--grandchild] [--fork]

``--thread``: the pool is started from a short-lived thread, which has ended (and the ranks have
answered another call) before the pids are reported.  ``--grandchild``: every rank first starts a
child process of its own (standing in for reader workers), which must go with the rank.
``--fork``: the parent forks a child (no exec) that lives on after the parent is killed, holding
copies of the parent's descriptors; the ranks must not wait for it.
Prints one JSON line: parent, ranks, grandchildren, store (the FileStore's path or null),
after_thread, forked (the forked child's pid or null).
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time

from suite.runtime import RankPool
from suite.runtime.probes import allreduce_rank_sum

_CHILDREN = []  # keeps the Popen objects of a rank's children referenced


def start_child() -> int:
    """On a rank: start a long-lived child process; return its pid."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    _CHILDREN.append(p)
    return p.pid


def busy(seconds: float) -> None:
    """On a rank: be inside a call (not between calls) for a long time."""
    time.sleep(seconds)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--thread", action="store_true")
    ap.add_argument("--grandchild", action="store_true")
    ap.add_argument("--fork", action="store_true")
    args = ap.parse_args()
    pool = RankPool(2, num_threads=1, timeout=900, start_timeout=300)
    after_thread = None
    if args.thread:
        starter = threading.Thread(target=pool.start, name="short-lived-starter")
        starter.start()
        starter.join()
        time.sleep(1.0)  # the starting thread is gone; the ranks must still be there and working
        after_thread = {"alive": pool.alive, "allreduce": pool.run(allreduce_rank_sum)}
    else:
        pool.start()
    grandchildren = pool.run(start_child) if args.grandchild else []
    forked = None
    if args.fork:
        forked = os.fork()
        if forked == 0:
            time.sleep(600)
            os._exit(0)
    print(json.dumps({"parent": os.getpid(), "ranks": pool.pids, "grandchildren": grandchildren,
                      "store": getattr(pool, "store_path", None), "after_thread": after_thread,
                      "forked": forked}), flush=True)
    pool.run(busy, {"seconds": 600})


if __name__ == "__main__":
    main()
