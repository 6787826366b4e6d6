"""Predicting a training step: gradient buckets on communicators over a measured profile.

A profile (measured on one rank, see ``profile.py``) gives forward, backward and optimizer
times and, for every parameter, its gradient's size and the moment in backward it became
ready.  A ``StrategyConfig`` says how gradients travel, read as the engine reads it:

- ``fuse_all_reduce_ops``/``fuse_grad_size_in_MB``/``fuse_grad_size_in_layers``: buckets planned by the
  engine's own planner (``suite.comm.buckets.plan``), launched in bucket order; fusion off: one
  allreduce per parameter;
- ``sync_nccl_allreduce=False``: a bucket's allreduce starts when it is ready, during backward
  (True: all start after backward and each is waited on before the next);
- ``nccl_comm_num``: bucket i goes to communicator i mod k; each communicator runs its buckets one
  after another, different communicators at once;
- ``use_hierarchical_allreduce``: the two-level allreduce instead of the flat ring;
- ``use_local_sgd``: gradients are not communicated; every ``local_sgd_steps``-th step the parameters
  are averaged after the optimizer step (registration-order chunks, all ready at once).

What ``python -m experiments.costmodel predict`` predicts are the registry's variants (``suite.cases.VARIANTS``)
named in ``PREDICTED``, with their configs: the ones that differ only in how gradients travel.

Collectives that run at once share the network: each allreduce's cost is split into a
latency part (its alpha terms; it does not slow down when shared) followed by a bandwidth
part (its bytes; k active bandwidth parts each progress at 1/k of the full rate, the
processor-sharing model of a fairly shared link).  Computation is assumed not to slow down
while communication runs (on GPUs it mostly does not; on this CPU machine gloo's reductions
compete with compute for the cores, which is one source of prediction error).

    step = buffer broadcasts + forward + max(backward, last allreduce done) + optimizer   (overlap)
    step = buffer broadcasts + forward + backward + allreduces one by one + optimizer    (no overlap)
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from suite.cases import VARIANTS
from suite.config import StrategyConfig

from . import costmodel as cm

__all__ = ["Profile", "ParamGrad", "Bucket", "scaled_profile", "make_buckets", "engine_buckets", "average_chunks",
           "simulate_comm", "contention_s", "predict_step", "predict_table", "PREDICTED", "registry_settings"]

MiB = 1024 * 1024


@dataclass(frozen=True)
class ParamGrad:
    name: str
    nbytes: int
    ready_s: float  # seconds after backward started


@dataclass(frozen=True)
class Profile:
    forward_s: float
    backward_s: float
    optimizer_s: float
    params: tuple  # ParamGrad, in any order
    per_rank_batch: int = 1
    model: str = ""
    buffers: tuple = ()  # bytes of each buffer the engine broadcasts from rank 0 before a forward

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s + self.optimizer_s

    @property
    def grad_bytes(self) -> int:
        return sum(p.nbytes for p in self.params)

    def to_dict(self) -> dict:
        return {"forward_s": self.forward_s, "backward_s": self.backward_s, "optimizer_s": self.optimizer_s,
                "per_rank_batch": self.per_rank_batch, "model": self.model, "buffers": list(self.buffers),
                "params": [{"name": p.name, "nbytes": p.nbytes, "ready_s": p.ready_s} for p in self.params]}

    @classmethod
    def from_dict(cls, d: dict) -> Profile:
        """A profile from its JSON form, every field checked: times are finite seconds >= 0 (their sum
        > 0), sizes whole numbers of bytes >= 0, ``per_rank_batch`` a whole number >= 1; a ValueError
        names the field, the value and what is allowed."""
        if not isinstance(d, dict):
            raise ValueError(f"profile: expected a JSON object with forward_s, backward_s, optimizer_s and params, "
                             f"got {type(d).__name__}")
        for key in ("forward_s", "backward_s", "optimizer_s", "params"):
            if key not in d:
                raise ValueError(f"profile: field {key!r} is missing; a profile has forward_s, backward_s, "
                                 f"optimizer_s and params [{{name, nbytes, ready_s}}]")
        fwd, bwd, opt = (_seconds(d[k], k) for k in ("forward_s", "backward_s", "optimizer_s"))
        if fwd + bwd + opt <= 0:
            raise ValueError("profile: forward_s + backward_s + optimizer_s is 0; a step takes some time")
        if not isinstance(d["params"], list):
            raise ValueError(f"profile: params is {type(d['params']).__name__}; expected a list of "
                             f"{{name, nbytes, ready_s}}")
        params = []
        for i, p in enumerate(d["params"]):
            if not isinstance(p, dict) or any(k not in p for k in ("name", "nbytes", "ready_s")):
                raise ValueError(f"profile: params[{i}] is {p!r:.80}; expected {{name, nbytes, ready_s}}")
            name = p["name"]
            if not isinstance(name, str):
                raise ValueError(f"profile: params[{i}].name is {name!r:.80}; expected a string")
            nbytes = _whole(p["nbytes"], f"params[{i}] ({name!r:.40}) nbytes", 0)
            ready = _seconds(p["ready_s"], f"params[{i}] ({name!r:.40}) ready_s")
            if ready > bwd * 1.5 + 1e-3:
                raise ValueError(f"profile: parameter {name!r:.40} has ready_s={ready}; expected "
                                 f"0 <= ready_s <= backward_s ({bwd})")
            params.append(ParamGrad(name, nbytes, ready))
        model = d.get("model", "")
        if not isinstance(model, str):
            raise ValueError(f"profile: model is {model!r:.80}; expected a string")
        buffers = d.get("buffers", [])
        if not isinstance(buffers, list):
            raise ValueError(f"profile: buffers is {type(buffers).__name__}; expected a list of byte counts")
        return cls(fwd, bwd, opt, tuple(params), _whole(d.get("per_rank_batch", 1), "per_rank_batch", 1), model,
                   tuple(_whole(b, f"buffers[{i}]", 0) for i, b in enumerate(buffers)))


def scaled_profile(profile: Profile, compute_s: float) -> Profile:
    """The profile's parts and ready times scaled to a compute time measured later (the profile says how a step
    divides, e.g. the no-communication windows timed alongside a setting how long it takes now)."""
    k = compute_s / profile.compute_s if profile.compute_s > 0 else 1.0
    return replace(profile, forward_s=profile.forward_s * k, backward_s=profile.backward_s * k,
                   optimizer_s=profile.optimizer_s * k,
                   params=tuple(ParamGrad(q.name, q.nbytes, q.ready_s * k) for q in profile.params))


def _seconds(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"profile: {what} is {value!r:.80}; expected a finite number of seconds >= 0")
    return float(value)


def _whole(value, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"profile: {what} is {value!r:.80}; expected a whole number >= {minimum}")
    return value


@dataclass(frozen=True)
class Bucket:
    nbytes: int
    ready_s: float
    names: tuple = field(default=(), compare=False)


# The registry's variants the cost model predicts: those that differ from plain only in how gradients travel
# (the others change the computation a profile measures).
PREDICTED = ("plain", "fusion", "overlap", "multicomm", "hierarchical", "local_sgd")


def registry_settings(bucket_mb: float | None = None, local_sgd_k: int | None = None,
                      names: Sequence[str] = PREDICTED) -> list[tuple[str, StrategyConfig]]:
    """(name, config) of the registry's variants ``names``, a fused one's bucket size set to ``bucket_mb`` and
    Local SGD's period to ``local_sgd_k`` where given."""
    configs = {v.name: v.config for v in VARIANTS}
    out = []
    for name in names:
        cfg = StrategyConfig.from_dict(configs[name])
        if bucket_mb is not None and cfg.fuse_all_reduce_ops:
            cfg = cfg.replace(fuse_grad_size_in_MB=bucket_mb)
        if local_sgd_k is not None and cfg.use_local_sgd:
            cfg = cfg.replace(local_sgd_steps=local_sgd_k)
        out.append((name, cfg))
    return out


def make_buckets(params: Sequence[ParamGrad], bucket_mb: float | None) -> list[Bucket]:
    """Buckets in ready order; a bucket closes when adding the next gradient would pass the cap
    (a gradient larger than the cap gets a bucket of its own).  None: one bucket per parameter."""
    order = sorted(params, key=lambda p: p.ready_s)
    if bucket_mb is None:
        return [Bucket(p.nbytes, p.ready_s, (p.name,)) for p in order]
    cap = bucket_mb * MiB
    out: list[Bucket] = []
    cur: list[ParamGrad] = []
    size = 0
    for p in order:
        if cur and size + p.nbytes > cap:
            out.append(Bucket(size, cur[-1].ready_s, tuple(q.name for q in cur)))
            cur, size = [], 0
        cur.append(p)
        size += p.nbytes
    if cur:
        out.append(Bucket(size, cur[-1].ready_s, tuple(q.name for q in cur)))
    return out


def engine_buckets(params: Sequence[ParamGrad], bucket_mb: float | None, layers_cap: int = 50) -> list[Bucket]:
    """The engine's buckets (``suite.comm.buckets.plan``) of a profile whose parameters are in registration
    order (a layer: the name without its last component, the module that owns the parameter).  A bucket is
    launched when it is complete and every earlier bucket was launched, so its ready time is the running
    maximum."""
    from suite.comm.buckets import plan  # heavy: the module imports torch (for the engine's flat buffers)

    plans = plan([(p.nbytes, p.name.rpartition(".")[0], None) for p in params], bucket_mb is not None,
                 math.inf if bucket_mb is None else bucket_mb, layers_cap)
    out: list[Bucket] = []
    for pl in plans:
        ready = max([params[i].ready_s for i in pl.members] + [out[-1].ready_s if out else 0.0])
        out.append(Bucket(pl.nbytes, ready, tuple(params[i].name for i in pl.members)))
    return out


def average_chunks(params: Sequence[ParamGrad], bucket_mb: float | None) -> list[Bucket]:
    """Local SGD's parameter averaging (``average_tensors``): chunks in registration order, closed once
    they reach the cap (fusion off: one per tensor), all launched at once after the optimizer step."""
    cap = 0.0 if bucket_mb is None else bucket_mb * MiB
    out: list[Bucket] = []
    size, names = 0, []
    for p in params:
        size += p.nbytes
        names.append(p.name)
        if size >= cap:
            out.append(Bucket(size, 0.0, tuple(names)))
            size, names = 0, []
    if names:
        out.append(Bucket(size, 0.0, tuple(names)))
    return out


def simulate_comm(buckets: Sequence[Bucket], cluster: cm.Cluster, *, comm_num: int = 1, hierarchical: bool = False,
                  serial: bool = False, start_s: float = 0.0,
                  spans: list | None = None) -> float:
    """When the last bucket's allreduce finishes (seconds, same clock as the ready times).

    ``serial``: the buckets run one after another from ``start_s`` in ready order (no overlap);
    otherwise bucket i joins communicator i mod comm_num's queue at max(ready, start_s), and
    communicators share the link (processor sharing of the bandwidth parts).  ``spans``, when
    given, receives (start, end, bytes) of every bucket's allreduce.
    """
    if not buckets:
        return start_s
    costs = [cm.latency_bandwidth_split(b.nbytes, cluster, hierarchical) for b in buckets]
    if serial:
        t = start_s
        for b, (lat, bw) in zip(buckets, costs):
            if spans is not None:
                spans.append((t, t + lat + bw, b.nbytes))
            t += lat + bw
        return t
    k = max(1, int(comm_num))
    queues: list[list] = [[] for _ in range(k)]
    for i, (b, (lat, bw)) in enumerate(zip(buckets, costs)):
        queues[i % k].append([max(b.ready_s, start_s), lat, bw, b.nbytes, None])
    # per communicator: the jobs in progress [ready, latency left, bandwidth work left, bytes, start], at most
    # ``lanes`` of them (gloo's worker threads; the two-level chain runs on one thread per communicator)
    lanes = 1 if hierarchical else max(1, cluster.async_lanes)
    active: list[list] = [[] for _ in range(k)]
    t = min(q[0][0] for q in queues if q)
    finish = t
    eps = 1e-15
    for _ in range(100_000):
        for c in range(k):  # start the next jobs on a communicator with a free lane, in order, when ready
            while len(active[c]) < lanes and queues[c] and queues[c][0][0] <= t + eps:
                job = queues[c].pop(0)
                job[4] = t
                active[c].append(job)
        if not any(active) and not any(queues):
            return finish
        sharing = sum(1 for jobs in active for a in jobs if a[1] <= eps and a[2] > eps)
        # next event: a latency part ends, a bandwidth part ends, or a job becomes ready
        candidates = []
        for c in range(k):
            for a in active[c]:
                candidates.append(a[1] if a[1] > eps else a[2] * max(1, sharing))
            if len(active[c]) < lanes and queues[c]:
                candidates.append(max(0.0, queues[c][0][0] - t))
        dt = max(0.0, min(candidates))
        for c in range(k):
            for a in list(active[c]):
                if a[1] > eps:
                    a[1] -= dt
                else:
                    a[2] -= dt / max(1, sharing)
                if a[1] <= eps and a[2] <= eps:
                    active[c].remove(a)
                    finish = t + dt
                    if spans is not None:
                        spans.append((a[4], finish, a[3]))
        t += dt
    raise RuntimeError("bucket simulation did not converge")  # pragma: no cover


def contention_s(spans: Sequence[tuple], cluster: cm.Cluster, until: float, hierarchical: bool) -> float:
    """How much longer computation running until ``until`` takes because the allreduces in ``spans``
    (start, end, bytes) ran on the same cores (0 where communication has cores of its own).

    Every rank spends ``cpu_per_byte`` CPU seconds per byte it allreduces (calibrated); the part of a
    bucket that runs before ``until`` is its share of [start, end].  The world's p ranks compute at
    once on ``cores`` cores: when they fill them (p >= cores) the comm work of all p ranks, p·w, is
    shared over the cores, so computation ends p·w/cores later; idle cores (p < cores) absorb it first.
    """
    if not math.isfinite(cluster.cores):
        return 0.0
    p, cores = cluster.world, cluster.cores
    work, busy = 0.0, 0.0
    for start, end, nbytes in spans:
        if end <= start or start >= until:
            continue
        frac = (min(end, until) - start) / (end - start)
        work += frac * cm.comm_cpu_seconds(nbytes, cluster, hierarchical)
        busy += min(end, until) - start
    spare = max(0.0, cores - p) * busy
    return max(0.0, p * work - spare) / cores


def predict_step(profile: Profile, cluster: cm.Cluster, config: StrategyConfig, name: str = "",
                 order: str = "engine") -> dict:
    """Predicted step time (seconds, averaged over a Local SGD period), throughput, efficiency of ``config``.
    ``order``: "engine", buckets as the engine plans them; "ready", in ready order, closed before the cap is
    passed (for a synthetic profile without layers)."""
    if config.data_parallel != "suite" or config.use_adaptive_local_sgd:
        raise ValueError(f"{name or config}: the cost model predicts the suite's data parallelism with a fixed "
                         f"Local SGD period, not data_parallel={config.data_parallel!r} or adaptive Local SGD")
    if order not in ("engine", "ready"):
        raise ValueError(f"order={order!r}: allowed engine, ready")
    mb = config.fuse_grad_size_in_MB if config.fuse_all_reduce_ops else None
    hier, comm_num, k = config.use_hierarchical_allreduce, config.nccl_comm_num, config.local_sgd_steps
    buckets = engine_buckets(profile.params, mb, config.fuse_grad_size_in_layers) if order == "engine" else \
        make_buckets(profile.params, mb)
    comm_alone = sum(cm.allreduce(b.nbytes, cluster, hier) for b in buckets)
    f, b, o = profile.forward_s, profile.backward_s, profile.optimizer_s
    # buffers (BatchNorm statistics) are broadcast one by one before each communicating step
    bufs = sum(cm.broadcast(n, cluster) for n in profile.buffers)
    contention = 0.0
    if config.use_local_sgd:
        # parameters (same bytes as the gradients) averaged every k-th step, all launched at once after the
        # optimizer step; between averagings nothing is communicated (buffers stay local too)
        chunks = average_chunks(profile.params, mb) if order == "engine" else [Bucket(x.nbytes, 0.0) for x in buckets]
        step = f + b + o + simulate_comm(chunks, cluster, comm_num=comm_num, hierarchical=hier) / k
    elif not config.sync_nccl_allreduce:
        spans: list = []
        done = simulate_comm(buckets, cluster, comm_num=comm_num, hierarchical=hier, spans=spans)
        contention = contention_s(spans, cluster, b, hier)
        if contention > 0:
            # backward stretched by the comm's CPU work; its gradients become ready correspondingly later
            scale = (b + contention) / b if b > 0 else 1.0
            late = [Bucket(x.nbytes, x.ready_s * scale, x.names) for x in buckets]
            done = simulate_comm(late, cluster, comm_num=comm_num, hierarchical=hier)
        step = bufs + f + max(b + contention, done) + o
    else:
        step = bufs + f + simulate_comm(buckets, cluster, hierarchical=hier, serial=True, start_s=b) + o
    world = cluster.world
    return {
        "setting": name,
        "buckets": len(buckets),
        "step_s": step,
        "exposed_comm_s": step - profile.compute_s,
        "comm_alone_s": comm_alone,
        "contention_s": contention,
        "throughput": world * profile.per_rank_batch / step if step > 0 else math.inf,
        "scaling_efficiency": profile.compute_s / step if step > 0 else math.nan,
    }


def predict_table(profile: Profile, cluster: cm.Cluster, settings: Sequence[tuple[str, StrategyConfig]] = ()) -> str:
    """Markdown table of :func:`predict_step` for each (name, config) (default: :func:`registry_settings`)."""
    rows = [predict_step(profile, cluster, cfg, name) for name, cfg in settings or registry_settings()]
    lines = [
        "| setting | buckets | step (ms) | exposed comm (ms) | comm alone (ms) | throughput (samples/s) "
        "| scaling efficiency |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['setting']} | {r['buckets']} | {r['step_s'] * 1e3:.1f} | {r['exposed_comm_s'] * 1e3:.1f} "
                     f"| {r['comm_alone_s'] * 1e3:.1f} | {r['throughput']:.1f} | {r['scaling_efficiency']:.0%} |")
    return "\n".join(lines)
