"""The run specification (``suite/run_spec.py``): one typed value with versioned, strict to_dict/from_dict whose
every refusal names the field, the value and what is allowed (``suite/validate.py``, shared with the knobs and
the records), and whose defaults are stated once: changing one shows in ``run``, ab's trial server and
bench_cases alike."""
from __future__ import annotations

import dataclasses
import json

import pytest

from suite.run_spec import AbOptions, RunFacts, RunOptions, RunSpec, Selection, SeqOptions, SpecError

FULL = RunSpec(Selection(cases=("mlp/plain,mlp/overlap",), tags=("smoke",), size="tiny", worlds=(2,), device="cpu",
                         config="/abs/my.toml", sets=("fuse_grad_size_in_MB=8",), set_baseline=True,
                         varies=("nccl_comm_num=1,2",)),
               RunOptions(per_rank_batch=4, steps=3, rounds=7, warmup=1, check=False, check_steps=2, timeout=60.0,
                          trace_steps=2, utilization=False),
               AbOptions(trial_warmup=0, seq=SeqOptions(delta=0.01, rotate=3, seed=4), total_budget_s=90.0))


def test_a_spec_goes_to_json_and_back_unchanged():
    data = json.loads(json.dumps(FULL.to_dict()))  # plain JSON: lists, numbers, strings, null
    assert data["spec_version"] == 1 and data["selection"]["cases"] == ["mlp/plain", "mlp/overlap"]
    assert RunSpec.from_dict(data) == FULL and RunSpec.from_json(FULL.to_json()) == FULL
    assert RunSpec.from_dict({}) == RunSpec()  # a key left out takes its default
    # the run's resolved facts (size, device, backend ... filled in by the command) are no part of the options
    facts = FULL.replace(selection={"config": None, "set_baseline": False, "sets": (
        "fuse_grad_size_in_MB=8", "lr=0.5")}).facts("tiny", "cpu", "gloo", "/r")
    assert (facts.size, facts.backend) == ("tiny", "gloo")
    assert facts.baseline_overrides == ("lr=0.5",)  # the baseline takes the workload's knobs only
    assert set(FULL.to_dict()["run"]) == {f.name for f in dataclasses.fields(RunOptions)}
    assert not {f.name for f in dataclasses.fields(RunFacts)} & set(FULL.to_dict()["run"])


@pytest.mark.parametrize("data,words", [
    ({"run": {"stepz": 3}}, "field 'run.stepz' is not a field of the run specification's run; allowed: "
                            "per_rank_batch, steps"),
    ({"run": {"steps": 0}}, "field 'run.steps' is 0; expected a whole number >= 1 and <= 1000000"),
    ({"run": {"steps": "5"}}, "field 'run.steps' is '5'; expected a whole number"),
    ({"run": {"steps": True}}, "field 'run.steps' is true; expected a whole number"),
    ({"run": {"timeout": -1}}, "field 'run.timeout' is -1; expected null or a number > 0 and <= 604800 (seconds, "
                               "a week)"),
    ({"run": {"backend": "nccl"}}, "field 'run.backend' is not a field"),  # resolved, never a spec's
    ({"selection": {"size": "huge"}}, "field 'selection.size' is 'huge'; expected null or one of full, cpu, tiny"),
    ({"selection": {"worlds": [2, 0]}}, "field 'selection.worlds' is [2, 0]; expected a list of whole numbers >= 1"),
    ({"selection": {"cases": "mlp/plain"}}, "field 'selection.cases' is 'mlp/plain'; expected a list of strings"),
    ({"selection": []}, "field 'selection' is []; expected an object"),
    ({"ab": {"seq": {"confidence": 2}}}, "field 'ab.seq.confidence' is 2; expected a number > 0.5 and < 1"),
    ({"ab": {"seq": {"delta": 0.1}}}, "ab.seq: --delta 0.1 is above --threshold 0.05"),  # a combination
    ({"ab": {"trial_warmup": -1}}, "field 'ab.trial_warmup' is -1; expected a whole number >= 0"),
    ({"spec_version": 2}, "field 'spec_version' is 2; this fleetbench reads run specifications of version 1"),
    ({"extra": 1}, "field 'extra' is not a part of a run specification; allowed: spec_version, selection, run, ab"),
    ([1, 2], "expected an object (a run specification), got [1, 2]"),
])
def test_a_bad_spec_is_one_error_naming_field_value_and_what_is_allowed(data, words):
    with pytest.raises(SpecError) as info:
        RunSpec.from_dict(data, "FILE")
    assert str(info.value).startswith("FILE: ") and words in str(info.value), str(info.value)


def test_options_built_in_code_are_refused_by_their_option_names():
    """Built from a command's options (not from JSON), a refusal names the option, as the command line says it."""
    for kw, words in [(dict(steps=0), "--steps 0: must be >= 1 and <= 1000000"),
                      (dict(per_rank_batch=0), "--batch 0: must be >= 1"),
                      (dict(timeout=float("nan")), "--timeout nan: must be a finite number of seconds > 0"),
                      (dict(rounds=10**6), "--rounds 1000000: must be >= 1 and <= 100000")]:
        with pytest.raises(SpecError, match=words.replace("(", r"\(").replace(")", r"\)")):
            RunOptions(**kw)
    with pytest.raises(SpecError, match="--size 'huge': allowed values are full, cpu, tiny"):
        Selection(size="huge")
    with pytest.raises(SpecError, match="world size 0: must be a whole number >= 1"):
        Selection(worlds=(2, 0))
    assert Selection(cases=["a, b", "c"]).cases == ("a", "b", "c")  # comma-separated names are several


def test_one_validation_for_knobs_specs_and_records():
    """The three readers share suite/validate.py: the same field kinds, the same three facts in each refusal."""
    from suite.config import ConfigError, StrategyConfig
    from suite.results.records import CaseRecord, ResultsFileError
    from suite.validate import Invalid, field_specs

    with pytest.raises(ConfigError, match="nccl_comm_num=-1: out of range, allowed >= 1 and <= 16"):
        StrategyConfig(nccl_comm_num=-1)
    with pytest.raises(ResultsFileError, match="field 'world_size' is 0; expected a whole number >= 1"):
        CaseRecord.from_dict({"kind": "fleetbench.case", "schema_version": 4, "case": "a", "model": "m",
                              "world_size": 0, "config": {}, "run_id": "r"}, "x")
    fs = field_specs(RunOptions)["steps"]
    with pytest.raises(Invalid) as info:
        fs.check(0)
    exc = info.value
    assert (exc.name, exc.value) == ("steps", 0)
    assert exc.assignment() == "steps=0: out of range, allowed >= 1 and <= 1000000"
    assert exc.field("f:1", "run.") == "f:1: field 'run.steps' is 0; expected a whole number >= 1 and <= 1000000"
    assert exc.option("--steps") == "--steps 0: must be >= 1 and <= 1000000"


def _patch_default(monkeypatch, cls, name: str, value) -> None:
    """``cls``'s default of ``name`` changed where every instance takes it: the generated __init__'s defaults."""
    names = [f.name for f in dataclasses.fields(cls)]
    defaults = list(cls.__init__.__defaults__)
    assert len(defaults) == len(names)  # every field has a plain default
    defaults[names.index(name)] = value
    monkeypatch.setattr(cls.__init__, "__defaults__", tuple(defaults))


def test_a_default_changed_once_shows_in_run_in_abs_trial_server_and_in_bench_cases(monkeypatch, tmp_path, capsys):
    """The steps per window, stated once (RunOptions.steps), changed there: `fleetbench run` times 7 steps, ab's
    client sends 7 and ab's trial server builds a runner of 7 from a spec that leaves steps out, and pytest's and
    asv's harnesses build specs of 7."""
    import suite.runtime
    from bench_cases import _matrix
    from suite.ab import server
    from suite.cli import ab as ab_cli
    from suite.cli.main import build_parser, main
    from tests.fakes import FakeRankPool

    assert RunOptions().steps != 7
    _patch_default(monkeypatch, RunOptions, "steps", 7)
    assert RunOptions().steps == 7
    # run
    monkeypatch.setattr(suite.runtime, "RankPool", FakeRankPool)
    monkeypatch.setattr(FakeRankPool, "made", [])
    assert main(["run", "--case", "mlp/plain", "--size", "tiny", "--no-check", "--no-utilization", "--rounds", "2",
                 "--results", str(tmp_path / "runs.jsonl")]) == 0
    capsys.readouterr()
    assert FakeRankPool.made[-1].calls[0]["steps"] == 7
    assert json.loads(open(tmp_path / "runs.jsonl").readline())["spec"]["run"]["steps"] == 7
    # ab: its client's spec, and its trial server's runner
    spec = ab_cli.options(build_parser().parse_args(["ab", "A", "B", "--case", "mlp/plain", "--nproc", "2"]))
    assert spec.run.steps == 7
    state = server._State(2, 60.0, 60.0, None)
    state.pool, state.metadata = type("Pool", (), {"start": lambda self: None})(), {}
    request = {"op": "prepare", "spec": {"selection": {"cases": ["mlp/plain"], "size": "tiny"}}}
    assert server._runner(state, server._spec(request)).opts.steps == 7
    # bench_cases: pytest's and asv's options through the one builder, and asv's variable
    from suite import spec_options

    assert spec_options.spec_from(spec_options.Given("pytest", {("selection", "cases"): ["mlp/plain"]})).run.steps == 7
    assert _matrix.env_spec({"FLEETBENCH_BENCH_CASES": "mlp/plain"}).run.steps == 7
    assert _matrix.env_spec({"FLEETBENCH_BENCH_SPEC": '{"selection": {"cases": ["mlp/plain"]}}'}).run.steps == 7


def test_the_harnesses_take_a_spec_or_the_sugar_not_both():
    from bench_cases import _matrix
    from suite.config import ConfigError

    with pytest.raises(ConfigError, match="FLEETBENCH_BENCH_SPEC states the selection and options; "
                                          "FLEETBENCH_BENCH_STEPS given too: give one or the other"):
        _matrix.env_spec({"FLEETBENCH_BENCH_SPEC": "{}", "FLEETBENCH_BENCH_STEPS": "3"})
    with pytest.raises(ConfigError, match="FLEETBENCH_BENCH_SPEC: field 'run.steps' is 0"):
        _matrix.env_spec({"FLEETBENCH_BENCH_SPEC": '{"run": {"steps": 0}}'})
    with pytest.raises(ConfigError, match="FLEETBENCH_BENCH_ROUNDS 1000000: must be >= 1 and <= 100000"):
        _matrix.env_spec({"FLEETBENCH_BENCH_ROUNDS": "1000000"})  # the spec's range, the sugar's name
    # the same run, spelled either way, is the same spec
    from suite import spec_options

    by_options = spec_options.Given("pytest", {("selection", "cases"): ["mlp/plain"], ("run", "steps"): 3})
    assert _matrix.env_spec({"FLEETBENCH_BENCH_CASES": "mlp/plain", "FLEETBENCH_BENCH_STEPS": "3"}) == \
        _matrix.env_spec({"FLEETBENCH_BENCH_SPEC": spec_options.spec_from(by_options).to_json()})
