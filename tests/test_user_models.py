"""Users' own models (tests/scripts/my_models.py): what the backend cannot run is skipped with its reason, a bug
is an error, and parameters without a gradient get one message, the fix first, per run.

`fleetbench run` is driven in-process on the session's pool (its close() is the session's business)."""
from __future__ import annotations

import contextlib
import io
import json
import traceback

import pytest
import torch

import suite.runtime
from suite.cli.main import main
from suite.comm.grad_sync import unused_parameters_error
from suite.runner import backend_lacks, unused_parameters
from suite.runtime import RankError, RankFailure
from tests.scripts import my_models

MODELS = "tests.scripts.my_models"
LSTM_SKIP = ("the cpu backend cannot run this: could not create a primitive descriptor for the LSTM forward "
             "propagation primitive")


class Borrowed:
    def __init__(self, pool):
        self.pool = pool

    def run(self, *args, **kwargs):
        return self.pool.run(*args, **kwargs)

    def close(self):
        pass


def run_cli(pool2, monkeypatch, tmp_path, factory: str, *cases: str) -> tuple[int, dict]:
    monkeypatch.setattr(suite.runtime, "RankPool", lambda *a, **k: Borrowed(pool2))
    results = tmp_path / f"{factory}.jsonl"
    argv = ["run", "--model", f"{MODELS}:{factory}", "--size", "tiny", "--rounds", "2", "--steps", "2",
            "--warmup", "1", "--no-utilization", "--results", str(results)]
    for c in cases:
        argv += ["--case", c]
    rc = main(argv)
    recs = {r["case"]: r for r in map(json.loads, results.read_text().splitlines())}
    return rc, recs


def raised(fn) -> str:
    """The traceback text a rank would send for the error ``fn`` raises."""
    try:
        fn()
    except Exception:  # noqa: BLE001
        return traceback.format_exc()
    raise AssertionError("expected an error")


def on_ranks(*tracebacks: str) -> RankError:
    return RankError("raised on the ranks", dict(enumerate(tracebacks)))


def lstm_bf16() -> None:
    spec = my_models.make_lstm("tiny")
    x, _ = spec.dataset(8).get(torch.arange(8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        spec.make(0)(x)


def own_not_implemented() -> None:
    raise NotImplementedError("Could not decide")  # a model's own: a bug or a stub, never the backend


def test_backend_lacks_only_what_the_backend_says_it_lacks():
    onednn = raised(lstm_bf16)
    assert backend_lacks(on_ranks(onednn, onednn), "cpu") == LSTM_SKIP
    eigh = raised(lambda: torch.linalg.eigh(torch.eye(2, dtype=torch.bfloat16)))  # a dtype's kernel missing
    assert backend_lacks(on_ranks(eigh), "cuda") == ("the cuda backend cannot run this: \"linalg_eigh_cpu\" "
                                                     "not implemented for 'BFloat16'")
    sparse = raised(lambda: torch.ones(2, 2).to_sparse().view(4))  # the dispatcher: no kernel for this backend
    assert backend_lacks(on_ranks(sparse), "cpu") == ("the cpu backend cannot run this: Could not run 'aten::view' "
                                                      "with arguments from the 'SparseCPU' backend")
    bugs = [
        raised(lambda: my_models.make_buggy("tiny").make(0)(torch.ones(2, 32))),  # a shape bug
        raised(own_not_implemented),  # NotImplementedError raised by the model, not torch
        raised(lambda: torch.nn.Module()(torch.ones(1))),  # raised inside torch, but the model lacks forward()
        raised(lambda: torch.nn.functional.linear(torch.ones(2, 2, dtype=torch.long), torch.ones(2, 2))),
        raised(lambda: torch.ones(2, dtype=torch.bool).mean()),  # wrong dtype for the op: the caller's bug
    ]
    for tb in bugs:
        assert backend_lacks(on_ranks(tb, tb), "cpu") is None, tb
    assert backend_lacks(on_ranks(onednn, bugs[0]), "cpu") is None, "one rank's real error keeps it an error"
    assert backend_lacks(RankFailure(f"rank 0 died:\n{onednn}", [0], "checking"), "cpu") is None
    assert backend_lacks(RuntimeError("could not create a primitive descriptor"), "cpu") is not None  # in-process


def test_a_kernel_the_backend_lacks_is_skipped_with_its_reason_and_the_run_passes(pool2, monkeypatch, tmp_path,
                                                                                 capsys):
    # On this machine's CPU (AVX512-BF16) torch's oneDNN has the bf16 LSTM: my_models.Tagger raises oneDNN's
    # message itself there (a stand-in, from inside the model's forward), as the LSTM does on CPUs without it.
    rc, recs = run_cli(pool2, monkeypatch, tmp_path, "make_lstm", "*/plain", "*/amp_bf16")
    out = capsys.readouterr().out
    assert rc == 0, out
    skipped = recs["my_models.make_lstm/amp_bf16"]
    assert (skipped["status"], skipped["verdict"], skipped["error"]) == ("skipped", "skipped", LSTM_SKIP)
    assert not skipped["metrics"], "a case that cannot run is not timed"
    plain = recs["my_models.make_lstm/plain"]
    assert plain["verdict"] == "pass" and plain["metrics"]["samples_per_s"] > 0
    assert "check skipped: " + LSTM_SKIP in out and "failed" not in out, out


def test_an_ordinary_error_in_a_user_model_stays_an_error(pool2, monkeypatch, tmp_path, capsys):
    rc, recs = run_cli(pool2, monkeypatch, tmp_path, "make_buggy", "*/plain")
    assert rc == 1, capsys.readouterr().out
    rec = recs["my_models.make_buggy/plain"]
    assert (rec["status"], rec["verdict"]) == ("error", "error")
    assert "mat1 and mat2 shapes cannot be multiplied" in rec["error"], rec["error"]


def test_the_unused_parameter_message_names_the_fix_first():
    assert str(unused_parameters_error(["spare.weight"])).startswith("set find_unused_parameters=true ")
    ddp = ("RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. "
           "You can enable unused parameter detection by passing the keyword argument `find_unused_parameters=True`"
           " to `torch.nn.parallel.DistributedDataParallel`")
    assert unused_parameters(on_ranks(f'  File "x.py", line 1, in f\n    g()\n{ddp}\n')).startswith(
        "set find_unused_parameters=true: torch DDP says Expected to have finished")
    assert unused_parameters(on_ranks(raised(own_not_implemented))) is None


@pytest.fixture(scope="module")
def spare_run(pool2, tmp_path_factory):
    mp, buf = pytest.MonkeyPatch(), io.StringIO()  # module-scoped: no capsys, the output is captured here
    try:
        with contextlib.redirect_stdout(buf):
            rc, recs = run_cli(pool2, mp, tmp_path_factory.mktemp("spare"), "make_spare", "*/plain", "*/overlap",
                                  "*/ddp", "*/fusion", "*/none")
    finally:
        mp.undo()
    return rc, buf.getvalue(), recs


def test_parameters_without_a_gradient_get_the_fix_first_in_records_and_output(spare_run):
    rc, out, recs = spare_run
    assert rc == 1, out  # plain data parallel cannot run the model as it is: a real failure
    for case in ("my_models.make_spare/plain", "my_models.make_spare/overlap", "my_models.make_spare/fusion"):
        assert recs[case]["status"] == "error" and recs[case]["error"].startswith("set find_unused_parameters=true")
    assert recs["my_models.make_spare/ddp"]["error"].startswith("set find_unused_parameters=true: torch DDP says")
    note = [ln for ln in out.splitlines() if ln.startswith("set find_unused_parameters=true")]
    assert len(note) == 1 and "'spare.weight'" in note[0], out


def test_the_unused_parameter_message_is_said_once_per_run(spare_run):
    rc, out, recs = spare_run
    assert out.count("received no gradient") == 1, out
    assert out.count("find_unused_parameters (see above)") == 4, out  # the cases that stopped, named in one line
    assert "interleaved timing" not in out, "cases whose check stopped there are not timed again"


def test_the_unused_parameter_message_is_no_error_for_none(spare_run):
    rc, out, recs = spare_run
    none = recs["my_models.make_spare/none"]
    assert (none["status"], none["verdict"], none["error"]) == ("ok", "n/a", None), none
    assert none["metrics"]["samples_per_s"] > 0 and "speedup" not in none["metrics"], "timed without the baseline"
    assert "nan" not in out and "no baseline" in next(
        ln for ln in out.splitlines() if "my_models.make_spare/none " in ln and "samples/s" in ln), out


def test_two_modules_factories_of_one_name_get_their_own_cases_and_histories(tmp_path, monkeypatch, capsys):
    """The README's factory name in two modules (issue 46.3): cases named after the module and the function, so
    their records never share a name, and the report's history of each is its own."""
    from suite.report.trend import trends
    from suite.results.records import CaseRecord

    source = (__import__("pathlib").Path(my_models.__file__)).read_text()
    for mod in ("team_a", "team_b"):
        (tmp_path / f"{mod}.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--model", "team_a:make_spec", "--model", "team_b:make_spec", "--list", "--size",
                 "tiny"]) == 0
    listed = capsys.readouterr().out
    assert "team_a.make_spec/plain" in listed and "team_b.make_spec/plain" in listed, listed
    recs = [CaseRecord(f"{m}.make_spec/plain", f"{m}:make_spec", 2, {}, f"r{i}", size="tiny", device="cpu",
                       metrics={"samples_per_s": 100.0 + i})
            for i, m in enumerate(("team_a", "team_b", "team_a", "team_b"))]
    final = {(r.case, r.world_size): r for r in recs}
    got = trends(recs, final)
    assert set(got) == {("team_a.make_spec/plain", 2), ("team_b.make_spec/plain", 2)}
    assert [p["samples_per_s"] for p in got[("team_a.make_spec/plain", 2)]["points"]] == [100.0, 102.0]
