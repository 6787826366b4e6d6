"""The timeline of every rank in one Chrome-trace JSON file, from the ranks' traced steps (``suite.measure.trace``).

What it shows that the torch.profiler traces beside it (one file per rank, Kineto's) cannot: every rank on one
wall clock in one file, each communicator's collectives on a track of their own with their bytes (on CUDA from
device events: when the collective ran, not when it was queued), and each bucket's ready time on the device.

One process per rank; in it one track (thread) for compute (step, forward, backward, wait,
optimizer spans, complete ``X`` events) and one per communicator, plus instant marks when a
bucket's gradients are all ready, as Horovod's timeline shows.  "backward" ends at the last
gradient, "wait" runs from there to the optimizer's start (the engine waits for the gradients'
communication in ``finish_step``, before ``optimizer.step()``; with AMP its found-inf agreement
too), "optimizer" from its start to the step's end.  Timestamps are wall-clock microseconds.
Open the file in Perfetto's UI (https://ui.perfetto.dev, "Open trace file": the file is read in the
browser, not uploaded) or chrome://tracing.

Collectives are *async* events (``"ph": "b"`` / ``"e"`` pairs with one ``id`` each), not ``X``
spans: collectives of one communicator overlap (several buckets in flight; on CUDA the spans come
from device events), and Perfetto draws overlapping ``X`` events of one thread as a wrong nesting.
Async events get their own rows, overlaps shown side by side.
"""
from __future__ import annotations

__all__ = ["chrome_trace", "COMPUTE_TID", "COMM_CAT"]

COMPUTE_TID = 0
COMM_CAT = "comm"


def _us(t: float) -> float:
    return round(t * 1e6, 3)


def chrome_trace(answers: list[dict], title: str = "") -> dict:
    events: list = []
    next_id = 0
    labels = sorted({c["group"] for a in answers for s in a["steps"] for c in s["comm"]})
    tid_of = {g: i + 1 for i, g in enumerate(labels)}
    t_lo = min((s["t0"] for a in answers for s in a["steps"]), default=0.0)
    t_hi = max((s["t1"] for a in answers for s in a["steps"]), default=0.0)
    for a in answers:
        pid = a["rank"]
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"rank {pid}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}})
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": COMPUTE_TID, "args": {"name": "compute"}})
        for g, tid in tid_of.items():
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                           "args": {"name": f"communicator {g}"}})
        buckets = a.get("buckets") or []
        for i, s in enumerate(a["steps"]):
            def span(name, t0, t1, tid=COMPUTE_TID, cat="compute", args=None, pid=pid, step=i + 1):
                events.append({"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": _us(t0),
                               "dur": max(0.0, _us(t1) - _us(t0)), "args": dict(args or {}, step=step)})

            span(f"step {i + 1}", s["t0"], s["t1"], cat="step")
            grads = dict(s["grads"])
            last_grad = max(grads.values()) if grads else None
            if s.get("forward"):
                span("forward", s["forward"][0], s["forward"][1])
                if last_grad is not None:
                    span("backward", s["forward"][1], last_grad)
            opt_start = s.get("optimizer")  # None: not marked (an older answer), or AMP skipped the step
            if last_grad is not None:
                span("wait", last_grad, opt_start if opt_start is not None else s["t1"])
            if opt_start is not None:
                span("optimizer", opt_start, s["t1"])
            for c in s["comm"]:
                next_id += 1
                common = {"name": c["op"], "cat": COMM_CAT, "pid": pid, "tid": tid_of[c["group"]],
                          "id": next_id}
                t0, t1 = _us(c["t0"]), _us(c["t1"])
                args = {"bytes": c["nbytes"], "group": c["group"], "step": i + 1}
                if c.get("start"):  # what the span's start marks (suite.comm.collectives.Span.start_means)
                    args["start"] = c["start"]
                events.append(dict(common, ph="b", ts=t0, args=args))
                events.append(dict(common, ph="e", ts=max(t0, t1), args={"step": i + 1}))
            ready = dict(s["bucket_ready"]) if s.get("bucket_ready") is not None else {
                b: max(grads[n] for n in names) for b, names in enumerate(buckets)
                if names and all(n in grads for n in names)}  # plain: each gradient is its own bucket
            for b, t in sorted(ready.items()):
                events.append({"ph": "i", "s": "t", "name": f"bucket {b} ready", "cat": "bucket", "pid": pid,
                               "tid": COMPUTE_TID, "ts": _us(t),
                               "args": {"step": i + 1, "params": len(buckets[b]) if b < len(buckets) else None}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"title": title, "window_s": [t_lo, t_hi], "ranks": len(answers),
                          "steps": len(answers[0]["steps"]) if answers else 0,
                          "buckets": len(answers[0].get("buckets") or []) if answers else 0,
                          "communicators": labels}}
