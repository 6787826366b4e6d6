"""`fleetbench figures engine_cost`: the profile's rows (worked out by hand on made-up profiler trees), the ratio's
sequential stopping (a fake launcher), and the figure's whole code path at tiny size on the session's ranks (a few
seconds; its numbers say nothing: the figure at `cpu` size is a benchmark, never a test)."""
from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest

from suite.measure.engine_cost import EXTRA, MODEL_START, ROWS, step_rows
from suite.measure.timing import CasePrepared, WindowTiming


def _tree(spec, parent=None) -> list:
    """(name, start µs, end µs, [children]) -> FunctionEvent-like objects (name, time_range, cpu_children,
    cpu_parent), the node first and then every descendant."""
    name, start, end, children = spec
    ev = SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end), cpu_parent=parent,
                         cpu_children=[])
    out = [ev]
    for c in children:
        sub = _tree(c, ev)
        ev.cpu_children.append(sub[0])
        out += sub
    return out


ACC = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
DDP_STEP = ("step", 0, 1000, [
    ("forward", 0, 200, [("DistributedDataParallel.forward", 10, 200, [
        ("c10d::broadcast_", 20, 40, []), (MODEL_START, 50, 50, []), ("aten::linear", 60, 190, [])])]),
    ("backward", 200, 800, [
        (ACC, 300, 340, [("torch::autograd::AccumulateGrad", 300, 310, [("aten::add_", 302, 308, [])]),
                         ("torch::distributed::reducer::mul_out", 310, 330, [("aten::mul", 311, 329, [])]),
                         ("c10d::allreduce_", 330, 338, [])]),
        (ACC, 400, 430, [("torch::autograd::AccumulateGrad", 400, 410, [("aten::add_", 401, 409, [])]),
                         ("torch::distributed::reducer::mul_out", 410, 425, [])]),
        ("torch.distributed.ddp.reducer::copy_bucket_to_grad", 700, 750, [("aten::copy_", 701, 749, [])])]),
    ("optimizer", 800, 950, [("Optimizer.step#SGD.step", 800, 900, []),
                             ("Optimizer.zero_grad#SGD.zero_grad", 900, 950, [])])])
ENGINE_STEP = ("step", 0, 1000, [
    ("broadcast buffers", 0, 30, []),
    ("forward", 30, 200, [(MODEL_START, 35, 35, []), ("aten::linear", 40, 190, [])]),
    ("backward", 200, 600, [
        (ACC, 300, 380, [("torch::autograd::AccumulateGrad", 300, 380, [
            ("aten::add_", 301, 309, []), ("bucket 0 ready", 310, 311, []),
            ("bucket 0 allreduce issue", 312, 372, [("aten::div_", 313, 330, []),
                                                    ("c10d::allreduce_", 331, 370, [])])])]),
        (ACC, 400, 420, [("torch::autograd::AccumulateGrad", 400, 420, [
            ("aten::add_", 401, 409, []), ("aten::copy_", 410, 418, [])])])]),
    ("wait", 600, 700, [("bucket 0 wait", 601, 690, []), ("bucket 0 copy out", 690, 699, [])]),
    ("optimizer", 700, 900, [("Optimizer.step#SGD.step", 700, 850, []), ("aten::zero_", 850, 890, [])]),
    ("aten::_local_scalar_dense", 950, 951, [])])


@pytest.mark.parametrize("tree, expected", [
    # DDP: its buffer sync before the model starts, its copies in (mul_out) and out, its wait at backward's end
    (DDP_STEP, dict(before_forward=0.05, forward=0.15, backward=0.174, hooks=0.013, copy_in=0.035, average=0.0,
                    launch=0.008, wait=0.32, copy_out=0.05, optimizer=0.1, zero_grad=0.05, other=0.05, step=1.0,
                    first_launch=0.13, last_grad=0.23, allreduce=0.35, host_syncs=0)),
    # the engine with copies: its buffer broadcast, the division inside the launch, a copy in its hook, its wait
    (ENGINE_STEP, dict(before_forward=0.035, forward=0.165, backward=0.136, hooks=0.016, copy_in=0.008,
                       average=0.017, launch=0.043, wait=0.271, copy_out=0.009, optimizer=0.16, zero_grad=0.04,
                       other=0.1, step=1.0, first_launch=0.112, last_grad=0.22, allreduce=0.0, host_syncs=1)),
], ids=["ddp", "engine"])
def test_profile_rows_by_hand(tree, expected):
    events = _tree(tree)
    if tree is DDP_STEP:  # gloo's thread: top-level, outside the step's tree
        events += _tree(("gloo:all_reduce", 340, 690, []))
    rows = step_rows(events)
    assert set(rows) == set(ROWS) | set(EXTRA)
    for k, v in expected.items():
        assert rows[k] == pytest.approx(v, abs=1e-9), (k, rows[k], v)
    assert sum(rows[k] for k in ROWS) == pytest.approx(rows["step"], abs=1e-9)  # the rows add up to the step


class _FakeLauncher:
    """Answers the runner's prepared-case calls: each window drawn from the case's own distribution (seeded)."""

    def __init__(self, spread: float):
        self.rng = random.Random(1)
        self.spread = spread
        self.windows = 0

    def run(self, fn, kwargs=None, timeout=None):
        name = fn.__name__
        if name == "prepare_case":
            return [CasePrepared(r, {"allreduce_ops": 2}) for r in range(2)]
        if name == "drop_case":
            return [True, True]
        assert name == "run_window", name
        self.windows += 1
        base = 0.100 if kwargs["key"].startswith("mlp/ddp") else 0.101
        w = base * (1 + self.rng.gauss(0, self.spread))
        return [WindowTiming(r, w, [w], [1.0], {"cpu_s": w, "host_busy_s": 2 * w, "host_total_s": 2 * w, "host": "h"})
                for r in range(2)]


def test_the_ratio_stops_when_its_interval_resolves_five_percent_or_says_what_it_would_take():
    from suite.figures import engine_cost as E

    opts = E.Options(rounds=6, max_rounds=46, steps=1, models=("mlp",), size="tiny")
    quiet = E.time_model(_FakeLauncher(0.001), 2, "mlp", opts)
    assert len(quiet["windows"]["ddp"]) == 6  # resolved at the first look: no more rounds
    s = E.ratio_summary(quiet, 1)
    assert s["width"] <= E.WIDTH and s["needed"] is None and s["ratio"] == pytest.approx(1.01, abs=0.005)
    noisy = E.time_model(_FakeLauncher(0.2), 2, "mlp", opts)
    assert len(noisy["windows"]["ddp"]) == 46  # 6, then blocks of 20 up to max_rounds
    s = E.ratio_summary(noisy, 1)
    assert s["width"] > E.WIDTH and s["needed"] == math.ceil(46 * (s["width"] / E.WIDTH) ** 2)
    assert f"not resolved to {E.WIDTH}: the interval is {s['width']:.3f} wide; about {s['needed']} rounds" \
        in E.verdict(s, noisy)
    # three variants a round (DDP at its default, at its best, the engine): a load sample per window
    assert noisy["others_cpu_share"] == 0.0 and len(noisy["load_during"]) == 3 * 46
    assert set(noisy["windows"]) == {"ddp", "ddp_best", "engine"} and len(noisy["windows"]["ddp_best"]) == 46
    best = E.ratio_summary(noisy, 1, "ddp_best")
    assert best["rounds"] == 46 and best["ratio"] > 0


class _KeepRanks:
    """The session's pool for the figure, its ranks kept (the figure closes them between phases)."""

    def __init__(self, pool):
        self.pool, self.nproc = pool, pool.nproc

    def run(self, fn, kwargs=None, timeout=None):
        return self.pool.run(fn, kwargs, timeout=timeout)

    def close(self) -> None:
        pass


def test_the_figure_runs_end_to_end_at_tiny_size(pool2):
    """The small ResNet (BatchNorm: buffers to broadcast) through every phase: profile, side costs, timing, render."""
    import json

    from suite.figures import engine_cost as E

    opts = E.Options(rounds=2, max_rounds=2, steps=1, models=("resnet",), size="tiny", profile_steps=1)
    raw = E.measure(opts, _KeepRanks(pool2), say=lambda _msg: None)
    json.dumps(raw)
    data = raw["models"]["resnet"]
    for rank in data["profile"]:
        for side in (E.BASE, E.BEST, E.ENGINE):
            steps = rank[side]["steps"]
            assert len(steps) == 1 and (side == E.BEST or all(r["host_syncs"] == 0 for r in steps)), (side, steps)
            assert sum(steps[0][k] for k in ROWS) == pytest.approx(steps[0]["step"], abs=1e-6)
            assert steps[0]["before_forward"] > 0  # both broadcast the buffers before the model runs
        assert rank[E.ENGINE]["hook_us"] > 0 and rank[E.BASE]["hook_us"] is None
        assert rank[E.BASE]["median"]["copy_in"] > 0  # DDP copies into its buckets, the engine's views do not
        assert rank[E.ENGINE]["median"]["copy_in"] == 0
        assert rank[E.BEST]["median"]["copy_in"] == 0  # DDP at its best: gradients are its buckets' views
    assert all(a["buffers"] == 21 and a["broadcast_ms"]["per_tensor"] > 0 and a["digest_ms"] > 0
               for a in data["side"])  # 7 BatchNorm layers x (mean, var, count)
    assert len(data["timing"]["windows"][E.ENGINE]) == 2
    text = E.render(raw, opts)
    row = next(ln for ln in text.splitlines() if ln.startswith("| resnet | "))
    ratio = float(row.split("|")[4].split()[0])
    assert math.isfinite(ratio) and ratio > 0, row
    assert "| copies into the buckets (DDP: `mul_out`, with the division) |" in text
    assert next(ln for ln in text.splitlines() if ln.startswith("| resnet | 21 | "))
