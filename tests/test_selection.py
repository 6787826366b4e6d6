"""The selection layer (suite/selection.py): world sizes from the runner, the default device decided in one
place, and the guards that keep argparse and entry points inside suite/cli."""
from __future__ import annotations

import ast
import os

import pytest

import suite.runtime.device as device_mod
from suite.cases import CASES, VARIANTS
from suite.config import ConfigError
from suite.run_spec import RunSpec, Selection
from suite.selection import base_cases, resolve
from tests.fakes import fake_cuda_platform

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _py_files(*dirs: str):
    for d in dirs:
        for root, _, files in os.walk(os.path.join(ROOT, d)):
            for f in files:
                if f.endswith(".py"):
                    yield os.path.join(root, f)


def test_no_module_outside_suite_cli_imports_argparse_or_suite_cli():
    cli = os.path.join(ROOT, "suite", "cli") + os.sep
    offenders = []
    for path in _py_files("suite", "bench_cases"):
        if path.startswith(cli):
            continue
        rel = os.path.relpath(path, ROOT)
        pkg = rel[:-3].replace(os.sep, ".").rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level:  # relative: resolve against the package
                    base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    mod = ".".join(base + ([mod] if mod else []))
                names = [mod] + [f"{mod}.{a.name}" for a in node.names]
            if any(n == "argparse" or n == "suite.cli" or n.startswith("suite.cli.") for n in names):
                offenders.append(f"{rel}:{node.lineno}")
    assert not offenders, f"argparse / suite.cli imported outside suite/cli: {offenders}"


def test_no_python_m_entry_point_but_suite_cli_main():
    main = os.path.join(ROOT, "suite", "cli", "main.py")
    offenders = []
    for path in _py_files("suite"):
        tree = ast.parse(open(path, encoding="utf-8").read())
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "__name__" in ast.unparse(node.test) and "__main__" in \
                    ast.unparse(node.test):
                offenders.append(os.path.relpath(path, ROOT))
        if path.endswith("__main__.py"):
            offenders.append(os.path.relpath(path, ROOT))
    assert [p for p in offenders if p != os.path.relpath(main, ROOT)] == [], offenders
    assert os.path.relpath(main, ROOT) in offenders  # the guard sees the one that is allowed


def test_requested_world_sizes_replace_the_cases_and_skip_with_a_reason():
    r = resolve(Selection(cases=("mlp/*",), device="cpu", worlds=(1, 3)))
    assert r.worlds == (1, 3) and r.device == "cpu" and r.size == "cpu"
    at1 = {rc.case.name: rc.skip for rc in r.at[1]}
    at3 = {rc.case.name: rc.skip for rc in r.at[3]}
    assert at1["mlp/hierarchical"] == "needs at least 2 ranks" and at1["mlp/plain"] is None
    assert "does not split world size 3" in at3["mlp/hierarchical"] and at3["mlp/overlap"] is None
    assert {w for _, w in r.matrix()} == {1, 3}
    # a size no selected case can run at is an error naming the size
    with pytest.raises(ConfigError, match="world size 1: no selected case can run at it"):
        resolve(Selection(cases=("*/hierarchical",), device="cpu", worlds=(1, 4)))


def test_default_world_is_two_on_cpu_and_every_gpu_on_cuda(monkeypatch):
    assert resolve(Selection(tags=("smoke",), device="cpu")).worlds == (2,)
    monkeypatch.setattr(device_mod, "select_platform", lambda d, r, n: fake_cuda_platform(backend="nccl"))
    monkeypatch.setattr(device_mod, "cuda_device_count", lambda: 8)
    r = resolve(Selection(tags=("smoke",)))
    assert (r.device, r.backend, r.worlds, r.size) == ("cuda", "nccl", (8,), "full")


def test_nightly_gpu_selection_at_worlds_1_and_8_runs_every_applicable_case_at_8(monkeypatch):
    """What an 8-GPU runner selects (through the fake CUDA platform): every nightly-gpu case at 8,
    `*/hierarchical` as two emulated nodes of 4 GPUs; at 1 only the ones that need more ranks are skipped."""
    asked = []

    def fake_select(device, rank, local_world):
        asked.append((device, local_world))
        return fake_cuda_platform(backend="nccl")

    monkeypatch.setattr(device_mod, "select_platform", fake_select)
    monkeypatch.setattr(device_mod, "cuda_device_count", lambda: 8)
    r = resolve(Selection(tags=("nightly-gpu",), device="cuda", worlds=(1, 8)))
    assert asked == [("cuda", 8)]  # one GPU per local rank at the largest world size
    gpu_cases = [c.name for c in CASES if "nightly-gpu" in c.tags]
    assert [rc.case.name for rc in r.at[8]] == gpu_cases
    assert all(rc.skip is None for rc in r.at[8]), [(rc.case.name, rc.skip) for rc in r.at[8] if rc.skip]
    hier = [rc for rc in r.at[8] if rc.case.variant == "hierarchical"]
    assert len(hier) == len({c.model for c in CASES if c.variant == "hierarchical"}) >= 6
    assert all(rc.config.hierarchical_allreduce_inter_nranks == 4 for rc in hier)
    skipped1 = {rc.case.name for rc in r.at[1] if rc.skip}
    assert skipped1 == {c.name for c in CASES if "nightly-gpu" in c.tags and c.min_world > 1}
    # under torchrun the nodes are the real machines (LOCAL_WORLD_SIZE)
    r = resolve(Selection(cases=("mlp/hierarchical",), device="cuda"), world=16, local_world=8)
    assert r.at[16][0].config.hierarchical_allreduce_inter_nranks == 8
    # a user's own split wins
    r = resolve(Selection(cases=("mlp/hierarchical",), device="cuda", sets=("hierarchical_allreduce_inter_nranks=2",)),
                world=8)
    assert r.at[8][0].config.hierarchical_allreduce_inter_nranks == 2


def test_every_variant_is_selected_somewhere():
    assert {c.variant for c in CASES} == {v.name for v in VARIANTS}


def test_comma_separated_cases_tags_and_models_are_several(monkeypatch):
    """`--case a,b` is two cases (as `figures --cases` takes them), in run, nightly (the selection) and ab."""
    sel = Selection(cases=("mlp/plain, mlp/fusion", "resnet/overlap"), tags=("smoke,",), device="cpu")
    assert sel.cases == ("mlp/plain", "mlp/fusion", "resnet/overlap") and sel.tags == ("smoke",)
    names = {c.name for c in base_cases(Selection(cases=("mlp/plain,mlp/fusion",), device="cpu"), "tiny")}
    assert names == {"mlp/plain", "mlp/fusion"}
    from suite.cli import ab as ab_cli
    from suite.cli.main import build_parser

    args = build_parser().parse_args(["ab", "A", "B", "--case", "mlp/plain,mlp/fusion", "--model", "mlp", "--no-check"])
    opts = ab_cli.options(args)
    sel = opts.selection
    assert sel.cases == ("mlp/plain", "mlp/fusion") and sel.models == ("mlp",) and sel.tags == ()


def _configs(sel: Selection) -> dict:
    return {rc.case.name: rc.config for rc in resolve(sel, probe=False).at[2]}


def test_set_and_config_give_the_baseline_their_workload_knobs_only_unless_set_baseline(tmp_path):
    toml = tmp_path / "my.toml"
    toml.write_text('[strategy]\noptimizer = "adam"\nfuse_grad_size_in_MB = 8.0\n')
    cases = ("mlp/plain", "mlp/multicomm")
    sel = Selection(cases=cases, config=str(toml), sets=("nccl_comm_num=2", "lr=0.05"), device="cpu")
    got = _configs(sel)
    plain, multi = got["mlp/plain"], got["mlp/multicomm"]
    assert (plain.nccl_comm_num, plain.fuse_all_reduce_ops, plain.fuse_grad_size_in_MB) == (1, False, 32.0)
    assert (plain.optimizer, plain.lr) == ("adam", 0.05)  # workload knobs: every case's
    assert (multi.nccl_comm_num, multi.optimizer, multi.lr, multi.fuse_grad_size_in_MB) == (2, "adam", 0.05, 8.0)
    # the runner's baseline (when no case of it is selected) takes the same: the one rule, suite.config.baseline_sets
    spec = RunSpec(selection=sel)
    assert spec.facts("cpu", "cpu", "gloo").baseline_overrides == ("optimizer=adam", "lr=0.05")
    everything = Selection(cases=cases, config=str(toml), sets=("nccl_comm_num=2",), set_baseline=True,
                           device="cpu")
    with pytest.warns(UserWarning, match="cannot overlap"):  # plain's allreduces wait as launched: said
        assert _configs(everything)["mlp/plain"].nccl_comm_num == 2
    assert RunSpec(selection=everything).facts("cpu", "cpu", "gloo").baseline_overrides == (
        "optimizer=adam", "fuse_grad_size_in_MB=8", "nccl_comm_num=2")


def test_workload_knobs_are_the_trainings_conditions_not_strategies():
    from suite.config import WORKLOAD

    assert {"optimizer", "lr", "momentum", "weight_decay", "num_threads", "straggler_ms", "matmul_allow_tf32",
            "find_unused_parameters"} <= WORKLOAD
    for knob in ("nccl_comm_num", "fuse_all_reduce_ops", "fuse_grad_size_in_MB", "amp", "data_parallel",
                 "use_local_sgd", "fuse_all_optimizer_ops", "strategy", "fetch_frequency"):
        assert knob not in WORKLOAD, knob


def test_vary_makes_a_case_per_value_and_combination_and_leaves_the_baseline_once():
    sel = Selection(cases=("mlp/plain", "mlp/overlap"), varies=("fuse_grad_size_in_MB=0.01,0.05",
                                                                "grad_comm_dtype=fp32,bf16"), device="cpu")
    got = _configs(sel)
    assert list(got) == ["mlp/plain"] + [f"mlp/overlap+fuse_grad_size_in_MB:{mb}+grad_comm_dtype:{dt}"
                                         for mb in ("0.01", "0.05") for dt in ("fp32", "bf16")]
    assert got["mlp/plain"].fuse_grad_size_in_MB == 32.0
    cfg = got["mlp/overlap+fuse_grad_size_in_MB:0.05+grad_comm_dtype:bf16"]
    # overlap's cap is otherwise sized from the model's gradients: --vary's value wins
    assert (cfg.fuse_grad_size_in_MB, cfg.grad_comm_dtype, cfg.fuse_all_reduce_ops) == (0.05, "bf16", True)
    variants = {rc.case.variant for rc in resolve(sel, probe=False).at[2]}
    assert len(variants) == 5  # each its own variant: timed as a variant of mlp, interleaved with plain


@pytest.mark.parametrize("vary,words", [
    ("fuse_grad_size_in_MB", "expected KEY=V1,V2"),
    ("fuse_grad_size_in_MB=8", "two or more distinct values"),
    ("fuse_grad_size_in_MB=8,8.0", "two or more distinct values"),
    ("fuse_grad_size_in_MB=8,x", "fuse_grad_size_in_MB='x': expected a number"),
    ("nccl_comm_num=2,99", "nccl_comm_num=99: out of range"),
    ("colour=1,2", "unknown strategy field 'colour'"),
    ("lr=0.1,0.2", "lr is a workload knob"),
    ("nccl_comm_num=1,2", "nccl_comm_num is also given by --set"),
])
def test_a_bad_vary_is_one_error_naming_it(vary, words):
    sel = Selection(cases=("mlp/overlap",), varies=(vary,), sets=("nccl_comm_num=2",) if "1,2" in vary else (),
                    device="cpu")
    with pytest.raises(ConfigError) as exc:
        resolve(sel, probe=False)
    assert str(exc.value).startswith(f"--vary {vary!r}: ") and words in str(exc.value), str(exc.value)


# ---- hierarchical cases under torchrun -----------------------------------------------------------------------------
def test_hierarchical_cases_under_torchrun_take_the_nodes_from_local_world_size():
    """`*/hierarchical` emulates two nodes of half the ranks on one machine (8 ranks: 4 + 4); under torchrun
    (LOCAL_WORLD_SIZE known) its nodes are the real machines: 4 hosts of 2 ranks -> inter_nranks 2, not 4; a
    --set value still wins (with a warning when it differs from LOCAL_WORLD_SIZE)."""
    from suite.run_spec import Selection
    from suite.selection import base_cases, resolve_at

    sel = Selection(cases=("mlp/hierarchical",), size="tiny")
    (local,) = resolve_at(sel, base_cases(sel, "tiny"), 8)
    assert local.config.resolve_inter_nranks(8) == 4 and local.skip is None
    (multi,) = resolve_at(sel, base_cases(sel, "tiny"), 8, local_world=2)
    assert multi.config.resolve_inter_nranks(8, 2) == 2 and multi.skip is None
    given = Selection(cases=("mlp/hierarchical",), size="tiny", sets=("hierarchical_allreduce_inter_nranks=4",))
    (rc,) = resolve_at(given, base_cases(given, "tiny"), 8, local_world=2)
    assert rc.config.hierarchical_allreduce_inter_nranks == 4
    with pytest.warns(UserWarning, match="differs from torchrun's LOCAL_WORLD_SIZE=2"):
        rc.config.check_world(8, 2, torchrun=True)


def test_a_strategy_declared_for_one_backend_is_skipped_on_another_with_the_reason():
    from suite.config import StrategyConfig
    from suite.selection import strategy_unmet

    cfg = StrategyConfig(data_parallel="ddp", strategy="tests.scripts.my_strategies:nccl_mean_hook")
    why = strategy_unmet(cfg, "gloo")
    assert why is not None and "nccl_mean runs on nccl only, this run on gloo" in why, why
    assert strategy_unmet(cfg, "nccl") is None
