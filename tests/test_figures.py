"""The figure contract (suite/cli/figures.py): typed options built from `fleetbench figures`' arguments,
measure -> raw data -> render.  Runs no ranks: each figure renders raw data made here."""
from __future__ import annotations

import json
import math

import pytest

from suite.cli.main import main
from suite.measure.timing import RankTiming
from tests.clitools import cli as _cli
from tests.clitools import one_error as _one_error


def test_figure_options_are_refused_by_a_figure_that_does_not_take_them(capsys, tmp_path):
    assert main(["figures", "comm", "--memory-gb", "5"]) == 2
    assert "--memory-gb is an option of figures workloads, not of figures comm" in capsys.readouterr().err
    assert main(["figures", "amp", "--load", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert f"--load '{tmp_path / 'x.json'}': no such file" in err, err
    for gone in ("gate", "cluster"):  # the gate's calibration and the cost model's figure left the package
        assert main(["figures", gone]) == 2
        assert f"figure set {gone!r} is unknown" in capsys.readouterr().err


def test_an_option_left_out_keeps_the_figures_own_default_and_one_it_lacks_is_refused(capsys):
    """--rounds and the other shared options fill a figure's field only when given: `figures engine_cost` keeps its
    own 60 rounds (the CLI used to put its 7 there silently), workloads its own size; a figure without the field
    refuses the option; `fleetbench figures` lists each set's defaults from its Options."""
    from suite.cli.figures import options_for
    from suite.cli.main import build_parser
    from suite.figures import engine_cost, reader, workloads

    def opts(*argv):
        args = build_parser().parse_args(["figures", *argv])
        return options_for(args.name, {"engine_cost": engine_cost, "workloads": workloads, "reader": reader}[
            args.name], args)

    assert opts("engine_cost").rounds == 60 and opts("engine_cost", "--rounds", "7").rounds == 7
    assert opts("workloads").size == "cpu" and opts("workloads", "--size", "tiny").size == "tiny"
    assert opts("reader", "--nproc", "1").nproc == 1
    with pytest.raises(ValueError, match="--steps is an option of figures .*comm.*, not of figures reader"):
        opts("reader", "--steps", "3")
    assert main(["figures"]) == 0
    listing = capsys.readouterr().out
    assert "defaults: --nproc 2, --rounds 60, --max-rounds 160, --steps 2, --timeout 1800.0, --size cpu, --models " \
           "mlp,resnet50,gpt2, --profile-steps 5" in listing, listing


def test_every_figure_says_the_size_and_bound_of_its_pool():
    import dataclasses
    import importlib

    from suite.cli.figures import available

    for name in available():
        module = importlib.import_module(f"suite.figures.{name}")
        assert {"nproc", "timeout"} <= {f.name for f in dataclasses.fields(module.Options)}, name


def _summary(group: int, speedup=(0.9, 0.8, 1.0), calls=161.0, bcasts=159.0, windows=None) -> dict:
    s = {"group": group, "step_time_s": {"median": 0.5}, "speedup": speedup[0], "speedup_ci": list(speedup[1:]),
         "exposed_comm_s": 0.1, "comm_calls_per_step": {"world/all_reduce": calls, "world/broadcast": bcasts},
         "comm_bytes_per_step": {"world/all_reduce": 97.5 * 2**20},
         "describe": {"allreduce_ops_before_fusion": 161, "allreduce_ops": 5}}
    return s | ({"window_s": windows} if windows is not None else {})


def test_workloads_figure_renders_its_raw_data_as_before():
    """render() on hand-made data: the lines the figure printed before it moved to measure/render (its format,
    written out here by hand)."""
    from suite.figures import workloads as W

    strategies = {}
    for model in W.MODELS:
        rows = W.rows_for(model)
        v = {n: _summary(1) for n in rows}
        v["ddp"] = {"groups": [_summary(1, (1.0, 1.0, 1.0)), _summary(2, (1.0, 1.0, 1.0))]}
        v["none"] = {"groups": [_summary(1, (1.2, 1.1, 1.3), calls=0, bcasts=0)]}
        strategies[model] = {"variants": v, "groups": [["ddp", "none", *rows]],
                             "spec": {"name": model, "size": "cpu", "description": "", "per_rank_batch": 8,
                                      "tensors": 161, "elements": 25 * 2**20}}
    times = {n: [0.01] * 3 if n == "single" else [0.02] * 3 for n in W.ALONE}
    raw = {"world": 2, "strategies": strategies, "alone": {m: {"times": times, "bytes": 10**8} for m in W.MODELS}}
    text = W.render(raw, W.Options(rounds=3, steps=3))
    lines = text.splitlines()
    assert lines[0] == "## Published workloads at size `cpu`: speedup over torch DDP (2 ranks)"
    assert ("**resnet50** (`cpu`: resnet50; batch 8 per rank), 2 ranks; 161 gradient tensors, 100.0 MiB fp32; "
            "3 rounds x 3 steps; 1 group(s): {ddp, none, plain, fusion") in text
    assert ("| resnet50/ddp | DDP (baseline) | 2 | 500.0 | 1.000 [1.000, 1.000] |  |  | 100.0 | (DDP's own) |  "
            "| (DDP's own) |") in lines
    assert ("| resnet50/none | no communication | 1 | 500.0 | 1.200 [1.100, 1.300] | n/a | no (width 0.200; ~48 "
            "rounds) | 0 (by definition) | 0 | 97.5 | 0 |") in lines
    assert ("| gpt2/plain | plain (one allreduce per gradient) | 1 | 500.0 | 0.900 [0.800, 1.000] | n/a | no (width "
            "0.200; ~48 rounds) | 100.0 | 161 | 97.5 | 159 |") in lines
    # data measured before the engine in DDP's configuration joined the groups: said, not invented
    assert ("- The engine in DDP's configuration was not in these groups (data measured before it joined them): "
            "its own cost is not shown; `fleetbench figures engine_cost` measures it.") in lines
    # overlap's own row (the registry's overlap fuses its broadcasts now: no separate fused-broadcast row)
    assert "- Aim (overlap + bucketing at least as fast as DDP), overlap: speedup 0.900 [0.800, " \
           "1.000]: **not met** on this run." in lines
    assert "- Allreduce ops 161 before fusion, 5 after (overlap's buckets)." in lines
    assert "| one allreduce of all gradient bytes | 10.0 | 10.000 | 1.000 [1.000, 1.000] |" in lines
    assert "| gpt2/multicomm: overlap, 2 communicators (4 MB buckets) | 20.0 | 5.000 | 0.500 [0.500, 0.500] |" in lines
    assert not any("fallback" in ln or "timed alone" in ln for ln in lines)


class _FakePool:
    """Answers the workloads figure's rank functions with fixed numbers; records what it was asked."""

    nproc = 2

    def __init__(self):
        self.calls: list = []

    def close(self):
        self.calls.append("fresh ranks")

    def run(self, fn, kwargs=None, timeout=None):
        if fn.__name__ == "comm_alone_on_rank":
            self.calls.append("alone")
            return [{"times": {v["name"]: [0.01] * kwargs["rounds"] for v in kwargs["variants"]}, "bytes": 10**6}] * 2
        names = [v["name"] for v in kwargs["variants"]]
        self.calls.append(names)
        one = {"windows": [1.0] * kwargs["rounds"], "step_times": [0.1] * 6, "losses": [1.0], "threads": 1,
               "comm_calls_per_step": {}, "comm_bytes_per_step": {}, "host_syncs": 0, "describe": {},
               "peak_memory_bytes": 1, "peak_memory_kind": "process_max_rss"}
        return [RankTiming.from_dict({"rank": r, "variants": {n: dict(one) for n in names}}) for r in range(2)]


def test_workloads_figure_times_each_group_through_the_runner_in_fresh_ranks():
    """measure() goes through CaseRunner with DDP as its baseline: every group carries DDP and none, and runs in
    fresh ranks; the data is JSON."""
    from suite.figures import workloads as W

    pool = _FakePool()
    raw = W.measure(W.Options(rounds=2, steps=1, size="tiny", memory_gb=1e-3), pool)
    json.dumps(raw)
    timed = [c for c in pool.calls if isinstance(c, list)]
    # one row a group at 1 MB, each group with the engine in DDP's configuration
    assert all(c[:3] == ["ddp", "none", W.ENGINE] and len(c) == 4 for c in timed), timed
    assert [c[3] for c in timed] == list(W.rows_for("resnet50")) + list(W.rows_for("gpt2"))
    assert pool.calls.count("fresh ranks") == len(timed) + 2  # after every group and each collectives table
    assert raw["strategies"]["gpt2"]["variants"]["ddp"]["groups"][-1]["group"] == len(W.rows_for("gpt2"))


def test_runner_groups_carry_the_compute_only_case_and_count_it():
    """The runner's groups (which the workloads figure now uses): with `none` among the cases every group holds
    the baseline and `none`, both counted in the memory bound; a single group keeps the cases' order."""
    from suite.cases import get_case
    from suite.config import StrategyConfig
    from suite.run_spec import ResolvedCase, RunOptions
    from suite.runner import CaseRunner

    rcs = [ResolvedCase(get_case(f"mlp/{v}"), StrategyConfig.from_dict(get_case(f"mlp/{v}").config))
           for v in ("none", "plain", "ddp", "fusion", "overlap", "multicomm")]

    def plan(budget: int, baseline: str = "plain") -> list:
        opts = RunOptions(check=False, utilization=False, memory_budget=budget, baseline=baseline)
        return CaseRunner(None, 2, opts, metadata={}).groups(rcs)

    assert plan(2**40) == [["plain", "none", "ddp", "fusion", "overlap", "multicomm"]]
    # the MLP holds ~4.2 M parameters: 4 copies of fp32 per engine per rank, 2 ranks -> ~134 MB per engine
    assert plan(4 * 135_000_000) == [["plain", "none", "ddp", "fusion"], ["plain", "none", "overlap", "multicomm"]]
    assert plan(4 * 135_000_000, "ddp") == [["ddp", "none", "plain", "fusion"], ["ddp", "none", "overlap", "multicomm"]]


def _answers(windows: dict, **extra) -> list[dict]:
    """time_on_rank's answers on 2 ranks: per variant its windows (seconds) and step times of 0.1 s."""
    return [{"rank": r, "variants": {n: {"windows": list(w), "step_times": [0.1] * 4, "losses": [1.0],
                                         "threads": 1, "host_syncs": 40, "threads_observed": [1, 2],
                                         "comm_calls_per_step": {}, "describe": {},
                                         "comm_bytes_per_step": {"world/all_reduce": 3 * 2**20}, **extra}
                                     for n, w in windows.items()}} for r in range(2)]


def test_amp_figure_renders_its_raw_data_as_before():
    from suite.figures import amp

    windows = {n: [0.25] * 3 if "amp" in n else [0.5] * 3 for n, _ in amp.VARIANTS}
    raw = {"world": 2, "answers": {"resnet": _answers(windows), "mlp": _answers(windows)}}
    lines = amp.render(json.loads(json.dumps(raw)), amp.Options(rounds=3, steps=5)).splitlines()
    assert lines[0] == ("### AMP on the resnet (2 ranks, batch 16/rank, plain allreduce; 3 interleaved rounds of "
                        "5 steps)")
    # resnet: 32 samples a step, 5 steps in 0.5 s -> 320 samples/s; AMP's windows half as long
    assert "| fp32 | 100.00 [100.00, 100.00] | 320 [320, 320] | 1.000 [1.000, 1.000] | 3.00 |" in lines
    assert "| amp bf16 | 100.00 [100.00, 100.00] | 640 [640, 640] | 2.000 [2.000, 2.000] | 3.00 |" in lines
    assert "| amp bf16 | 100.00 [100.00, 100.00] | 1280 [1280, 1280] | 2.000 [2.000, 2.000] | 3.00 |" in lines  # mlp
    assert lines[-1].startswith("`allreduce MiB/step` counts every allreduce")


def test_host_figure_renders_its_raw_data_as_before():
    from suite.figures import host

    fetch = {"variants": ["fetch every step", "fetch every 10"], "steps": 20,
             "answers": _answers({"fetch every step": [1.0] * 3, "fetch every 10": [0.5] * 3})}
    threads = {"variants": ["1 threads", "2 threads"], "steps": 5,
               "answers": _answers({"1 threads": [1.0] * 3, "2 threads": [2.0] * 3})}
    raw = {"world": 2, "cores": 2, "default_threads": 1, "fetch": fetch, "threads": threads}
    lines = host.render(json.loads(json.dumps(raw)), host.Options(rounds=3, steps=5)).splitlines()
    assert lines[0] == ("**Loss fetch frequency** (resnet, 2 ranks, batch 16 per rank, windows of 20 steps, "
                        "3 interleaved rounds)")
    # 32 samples a step, 20 steps a window of 1 s -> 640 samples/s; 40 host syncs over 3 windows -> 13
    assert "| fetch every step | 640 [640, 640] | 1.00 [1.00, 1.00] | 13 |" in lines
    assert "| fetch every 10 | 1,280 [1,280, 1,280] | 2.00 [2.00, 2.00] | 13 |" in lines
    assert "**num_threads per rank** (resnet, 2 ranks on 2 cores; default = cores / local ranks = 1)" in lines
    assert "| 2 threads | 80 [80, 80] | 0.50 [0.50, 0.50] | 1, 2 |" in lines


def test_reader_figure_renders_its_raw_data_as_before():
    from suite.figures import reader

    def rank(r: int) -> dict:
        return {"rank": r, "steps_per_window": 8, "variants": {
            n: {"windows": [1.0 if n == "plain" else 0.5] * 3, "data_wait_s": [0.002, 0.004, 0.006],
                "step_times": [0.1] * 4, "losses": [1.0] * 4, "threads": 1, "reader": "PlainReader",
                "worker_kind": "thread"} for n, _ in reader.VARIANTS}}

    raw = {"world": 2, "answers": [rank(0), rank(1)]}
    lines = reader.render(json.loads(json.dumps(raw)), reader.Options(rounds=3)).splitlines()
    assert lines[0].startswith("**Reader, data-bound** (resnet, 2 ranks, batch 16 per rank, dataset 256 ") and \
        lines[0].endswith("a window is one epoch = 8 steps, 3 interleaved rounds; workers are threads here)")
    # 32 samples a step, 8 steps in 1 s -> 256 samples/s; data waits 2, 2, 4, 4, 6, 6 ms: quartiles 2.5 and 5.5
    assert "| plain | 256 [256, 256] | 1.00 [1.00, 1.00] | 4.0 (2.5–5.5) | 100.0 |" in lines
    assert "| all | 512 [512, 512] | 2.00 [2.00, 2.00] | 4.0 (2.5–5.5) | 100.0 |" in lines


def test_local_sgd_figure_renders_its_raw_data_as_before():
    from suite.figures import local_sgd

    names = [n for n, _ in local_sgd.variants()]
    windows = {n + tail: [0.5 if n == "k=16" and not tail else 1.0] * 3 for n in names for tail in ("", " +strag")}
    quality = [{n: {"final_loss": 0.5 + r / 10, "eval_loss": 0.25, "eval_acc": 0.9, "averagings": 4} for n in names}
               for r in range(2)]
    raw = {"world": 2, "steps": 16, "answers": _answers(windows), "quality": quality}
    lines = local_sgd.render(json.loads(json.dumps(raw)), local_sgd.Options(rounds=3)).splitlines()
    assert lines[0].startswith("**Local SGD** (mlp, momentum SGD, 2 ranks, global batch 32, warm-up W=1; windows of "
                               "16 steps, 3 interleaved rounds; stragglers: one seeded random rank sleeps 30 ms")
    # 32 samples a step, 16 steps in 1 s -> 512 samples/s; final loss the mean of 0.5 and 0.6 over the ranks
    assert "| sync DP | 512 [512, 512] | 1.00 [1.00, 1.00] | 512 [512, 512] | 1.00 [1.00, 1.00] | 0.5500 | 0.2500 " \
           "| 90.0% | 4 |" in lines
    assert "| k=16 | 1,024 [1,024, 1,024] | 2.00 [2.00, 2.00] | 512 [512, 512] | 1.00 [1.00, 1.00] | 0.5500 " \
           "| 0.2500 | 90.0% | 4 |" in lines
    assert not any("diverged" in ln for ln in lines)
    quality[0]["k=2"]["final_loss"] = math.nan
    assert "**Warning: a variant diverged (non-finite loss).**" in local_sgd.render(raw, local_sgd.Options(rounds=3))


def test_compute_figure_renders_its_raw_data_as_before():
    from suite.figures import compute

    names = [n for n, _ in compute.FUSION_VARIANTS]
    answers = _answers({n: [0.5] * 3 for n in names},
                       describe={"compute_fusion": {"bn_act": {"found": 3, "fused": 2}, "backend": {"ran": "eager"}}})
    saved = {n: {"saved": 2048 * 1024, "unique": 1024 * 1024, "tensors": 10, "fused_ops": 1}
             for n in names if "compile" not in n}
    opt = {"results": {k: {i: [2e-4 if i == "loop" else 1e-4] * 5 for i in ("loop", "foreach", "fused", "flat (ours)")}
                       for k in ("sgd", "momentum", "adam")}, "tensors": 161, "numel": 25_000_000, "device": "cpu"}
    raw = {"world": 2, "answers": answers, "saved": saved, "optimizers": {"resnet": opt, "mlp": opt}}
    lines = compute.render(json.loads(json.dumps(raw)), compute.Options(rounds=3, steps=5)).splitlines()
    assert lines[0] == ("### Compute fusion on the ResNet (2 ranks, batch 16/rank, compute only: data_parallel='none'; "
                        "3 interleaved rounds of 5 steps)")
    assert "Pattern counts: bn_act: found 3, fused 2.  Compiled variant ran: `eager`." in lines
    # 32 samples a step, 5 steps in 0.5 s -> 320 samples/s; 2 MiB saved -> 2048 KiB
    assert "| unfused | 100.00 [100.00, 100.00] | 320 [320, 320] | 1.000 [1.000, 1.000] | 2048 | 1024 |" in lines
    assert "| all (compile) | 100.00 [100.00, 100.00] | 320 [320, 320] | 1.000 [1.000, 1.000] | (as eager) " \
           "| (as eager) |" in lines
    assert "### Fused optimizer vs torch.optim (rank 0 on cpu; step() alone; ResNet: 161 tensors, 25,000,000 " \
           "elements)" in lines
    assert "| adam | flat (ours) | 100 [100, 100] | 2.00 [2.00, 2.00] |" in lines


def test_comm_figure_renders_its_raw_data_as_before():
    from suite.figures import comm

    names = ["ddp", "no comm", "plain", "overlap 1/10, 1 comm"]
    windows = {"ddp": [1.0] * 3, "no comm": [0.5] * 3, "plain": [2.0] * 3, "overlap 1/10, 1 comm": [1.0] * 3}
    alone = {"plain": [0.2] * 3, "overlap 1/10, 1 comm": [0.25] * 3}
    strategies = {m: {"variants": names, "windows": windows, "alone": alone} for m in ("mlp", "resnet")}
    fused = {"variants": ["single", "unfused (per parameter)"],
             "alone": {"single": [0.01] * 3, "unfused (per parameter)": [0.04] * 3}}
    sweep = {"variants": ["ddp", "bucket 1/10", "bucket all (1 bucket)"],
             "windows": {"ddp": [1.0] * 3, "bucket 1/10": [0.5] * 3, "bucket all (1 bucket)": [1.0] * 3}}
    raw = {"grad_mb": {"mlp": 16.0, "resnet": 0.5}, "strategies": strategies, "fused": fused, "sweep": sweep}
    lines = comm.render(json.loads(json.dumps(raw)), comm.Options(nproc=2, rounds=3, steps=5)).splitlines()
    assert "**mlp**, 2 ranks, gradients 16.00 MiB (bucket 1/10 = 1.60 MiB); 3 rounds x 5 steps" in lines
    assert "**resnet**, 2 ranks, gradients 512.0 KiB (bucket 1/10 = 51.2 KiB); 3 rounds x 5 steps" in lines
    # windows of 5 steps: plain 400 ms a step, 300 exposed over no comm's 100; its collectives alone 200 ms
    assert "| plain | 400.0 | 0.500 [0.500, 0.500] | 300.0 | 200.0 | -0.50 |" in lines
    assert "| no comm | 100.0 | 2.000 [2.000, 2.000] | 0 (baseline) | n/a | n/a |" in lines
    assert "| overlap 1/10, 1 comm | 200.0 | 1.000 [1.000, 1.000] | 100.0 | 250.0 | 0.60 |" in lines
    # 16 MiB in 10 ms on 2 ranks (busbw factor 1): 1.678 GB/s; per parameter 4x slower
    assert "| single | 10.0 | 1.678 | 1.000 [1.000, 1.000] |" in lines
    assert "| unfused (per parameter) | 40.0 | 0.419 | 0.250 [0.250, 0.250] |" in lines
    assert "| 1/10 | 100.0 | 2.000 [2.000, 2.000] | 2.000 [2.000, 2.000] |" in lines


def test_every_figure_is_on_the_contract_and_reads_no_environment():
    """Options (a frozen dataclass), measure and render in every figure module; each figure option of the CLI is
    a field of every figure it names; no figure reads FLEETBENCH_* variables."""
    import dataclasses
    import importlib
    import inspect

    from suite.cli.figures import FIGURE_OPTIONS, available

    names = available()
    assert len(names) == 8 and not {"gate", "cluster"} & set(names), names
    for name in names:
        module = importlib.import_module(f"suite.figures.{name}")
        opts = module.Options()
        assert dataclasses.is_dataclass(opts) and module.Options.__dataclass_params__.frozen, name
        assert callable(module.measure) and callable(module.render) and not hasattr(module, "run"), name
        source = inspect.getsource(module)
        assert "os.environ" not in source and "FLEETBENCH_" not in source, name
    for field, (_, figures, _) in FIGURE_OPTIONS.items():
        for name in figures:
            assert field in {f.name for f in dataclasses.fields(importlib.import_module(f"suite.figures.{name}")
                                                               .Options)}, (field, name)


def test_any_figure_keeps_its_raw_data_and_renders_it_again(tmp_path, monkeypatch, capsys):
    """--save keeps what measure() returned (JSON), --load renders it without measuring or starting ranks."""
    import contextlib

    import suite.runtime
    from suite.figures import amp

    windows = {n: [0.5] * 3 for n, _ in amp.VARIANTS}
    raw = {"world": 2, "answers": {"resnet": _answers(windows), "mlp": _answers(windows)}}
    monkeypatch.setattr(amp, "measure", lambda options, pool: raw)
    monkeypatch.setattr(suite.runtime, "RankPool", lambda *a, **k: contextlib.nullcontext("a pool"))
    kept, first, again = tmp_path / "amp-raw.json", tmp_path / "amp.md", tmp_path / "amp-again.md"
    assert main(["figures", "amp", "--rounds", "3", "--save", str(kept), "--out", str(first)]) == 0
    assert json.loads(kept.read_text()) == raw
    monkeypatch.setattr(amp, "measure", lambda options, pool: pytest.fail("measured with --load"))
    monkeypatch.setattr(suite.runtime, "RankPool", lambda *a, **k: pytest.fail("ranks started with --load"))
    assert main(["figures", "amp", "--rounds", "3", "--load", str(kept), "--out", str(again)]) == 0
    assert again.read_text() == first.read_text() and "| fp32 | 100.00 [100.00, 100.00] | 320 [320, 320] |" in \
        again.read_text()


def test_the_workloads_aim_is_not_resolved_when_the_overlap_interval_spans_one():
    from suite.figures import workloads as W

    model = W.MODELS[0]
    rows = W.rows_for(model)
    v = {n: _summary(1, (1.15, 0.55, 1.39)) for n in rows}
    v["ddp"] = {"groups": [_summary(1, (1.0, 1.0, 1.0))]}
    v["none"] = {"groups": [_summary(1, (1.2, 1.1, 1.3), calls=0, bcasts=0)]}
    spec = {"name": model, "size": "cpu", "description": "", "per_rank_batch": 8, "tensors": 161,
            "elements": 25 * 2**20}
    text, _ = W.strategy_table(model, {"variants": v, "groups": [["ddp", "none", *rows]], "spec": spec},
                               W.Options(rounds=3, steps=3), 2)
    assert "- Aim (overlap + bucketing at least as fast as DDP), overlap: speedup 1.150 [0.550, 1.390]: " \
           "**not resolved (the interval spans 1)** on this run." in text.splitlines()


def test_workloads_figure_shows_each_speedup_beside_the_engines_own_cost():
    """With the engine in DDP's configuration in a group: its cost over DDP, each row's speedup over it (paired by
    round), and whether each row's intervals resolve 5% (else the rounds they would take), worked out by hand."""
    from suite.figures import workloads as W

    model = W.MODELS[0]
    rows = W.rows_for(model)
    engine_w = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    v = {n: _summary(1, (1.0, 0.99, 1.01), windows=[0.8] * 7) for n in rows}  # 1.25x the engine in every round
    v["plain"] = _summary(1, (0.9, 0.8, 1.0), windows=[1.0, 1.1, 0.9, 1.2, 0.8, 1.0, 1.05])
    v["ddp"] = {"groups": [_summary(1, (1.0, 1.0, 1.0))]}
    v["none"] = {"groups": [_summary(1, (1.2, 1.1, 1.3), calls=0, bcasts=0)]}
    v[W.ENGINE] = {"groups": [_summary(1, (0.8, 0.79, 0.81), windows=engine_w)]}
    spec = {"name": model, "size": "cpu", "description": "", "per_rank_batch": 8, "tensors": 161,
            "elements": 25 * 2**20}
    text, _ = W.strategy_table(model, {"variants": v, "groups": [["ddp", "none", W.ENGINE, *rows]], "spec": spec,
                                       "load": [[0.5, 0.6, 0.7], [2.1, 1.0, 0.8]]}, W.Options(rounds=7, steps=3), 2)
    lines = text.splitlines()
    assert (f"| {model}/fusion | fused, synchronous (25 MB buckets) | 1 | 500.0 | 1.000 [0.990, 1.010] | "
            "1.250 [1.250, 1.250] | yes | 100.0 | 161 | 97.5 | 159 |") in lines
    plain = next(ln for ln in lines if ln.startswith(f"| {model}/plain |"))
    assert "| 1.000 [" in plain and "| no (width " in plain, plain  # the engine's over plain's: median 1.0
    assert any(ln.startswith(f"| {model}/{W.ENGINE} | the engine in DDP's configuration (its own cost) | 1 | "
                             "500.0 | 0.800 [0.790, 0.810] |  | yes |") for ln in lines), lines
    assert ("- The engine's own cost: in DDP's configuration its step takes 1.250 [1.235, 1.266] in group 1 x DDP's "
            "(> 1: slower; `fleetbench figures engine_cost` profiles it). A strategy's speedup over the engine in "
            "DDP's configuration is what the strategy itself changes.") in lines
    assert "- Load average (1, 5, 15 min) before 0.5 0.6 0.7, after 2.1 1.0 0.8." in lines


def test_figures_load_of_a_file_that_is_not_raw_data_is_one_error(tmp_path, capsys, no_ranks):
    """The probe: `figures host --load /etc/hostname` ended in a traceback."""
    for text in ("myhost\n", "12345\n", '{"rows": 3}\n'):
        (tmp_path / "hostname").write_text(text)
        code, _, err = _cli(["figures", "host", "--load", tmp_path / "hostname"], capsys)
        _one_error(code, err, "--load", str(tmp_path / "hostname"))
