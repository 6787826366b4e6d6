"""`predict`'s inputs (moved from tests/test_hardening.py, tests/test_outputs.py and tests/test_probes36.py with the
cost model): every bad number or file is one line, exit 2, before any rank or profile measurement; a good
profile predicts; an output that is a FIFO is refused; a profile's model name is escaped on the terminal."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

HOSTILE = "evil\x1b[31mred\x1b[0m\u202eright\x07"


def _cli(argv, capsys) -> tuple[int, str, str]:
    from experiments.costmodel.cli import main

    term = signal.getsignal(signal.SIGTERM)
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        signal.signal(signal.SIGTERM, term)
    out, err = capsys.readouterr()
    return code, out, err


GOOD_PROFILE = {"forward_s": 0.01, "backward_s": 0.02, "optimizer_s": 0.005, "per_rank_batch": 16, "model": "mlp",
                "buffers": [64], "params": [{"name": "w", "nbytes": 4096, "ready_s": 0.01}]}


def _profile_with(**change) -> str:
    d = json.loads(json.dumps(GOOD_PROFILE))
    for key, value in change.items():
        if key.startswith("param_"):
            d["params"][0][key[6:]] = value
        else:
            d[key] = value
    return json.dumps(d)


PROFILE_TEXTS = {  # file content -> words the one error line must hold
    "list": ("[]", ["expected a JSON object"]),
    "params-int": (_profile_with(params=3), ["params is int"]),
    "param-not-object": (_profile_with(params=[1]), ["params[0] is 1"]),
    "nbytes-float": (_profile_with(param_nbytes=1.5), ["nbytes is 1.5"]),
    "nbytes-bool": (_profile_with(param_nbytes=True), ["nbytes is True"]),
    "nbytes-negative": (_profile_with(param_nbytes=-1), ["nbytes is -1"]),
    "forward-nan": (_profile_with(forward_s="__NaN__"), ["forward_s is nan"]),
    "forward-negative": (_profile_with(forward_s=-0.1), ["forward_s is -0.1"]),
    "forward-string": (_profile_with(forward_s="fast"), ["forward_s is 'fast'"]),
    "backward-infinity": (_profile_with(backward_s="__Infinity__"), ["backward_s is inf"]),
    "backward-overflow": (_profile_with(backward_s="__1e400__"), ["backward_s is inf"]),
    "ready-nan": (_profile_with(param_ready_s="__NaN__"), ["ready_s is nan"]),
    "ready-negative": (_profile_with(param_ready_s=-1), ["ready_s is -1"]),
    "batch-zero": (_profile_with(per_rank_batch=0), ["per_rank_batch is 0"]),
    "batch-float": (_profile_with(per_rank_batch=2.5), ["per_rank_batch is 2.5"]),
    "buffers-negative": (_profile_with(buffers=[-1]), ["buffers[0] is -1"]),
    "buffers-string": (_profile_with(buffers="x"), ["buffers is str"]),
    "model-number": (_profile_with(model=3), ["model is 3"]),
    "all-zero": (_profile_with(forward_s=0, backward_s=0, optimizer_s=0, params=[]), ["is 0"]),
    "nested": ("[" * 100000 + "]" * 100000, ["nested too deeply"]),
    "not-json": ("{forward_s: 1}", ["not valid JSON"]),
    "empty": ("", ["not valid JSON"]),
}



def _bad_inputs(tmp: Path) -> list:
    """(argv, words) for every bad numeric option and unusable file of predict."""
    binary = tmp / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00{not text")
    folder = tmp / "folder.json"
    folder.mkdir()
    huge = tmp / "huge.json"  # sparse: no disk space, but more than any profile
    with open(huge, "wb") as fh:
        fh.truncate(65 * 2**20)
    prof = tmp / "profile.json"
    prof.write_text(json.dumps(GOOD_PROFILE))
    P = ["predict", "--cluster", "2x2:inter=1gbit", "--profile", str(prof)]
    M = ["predict", "--cluster", "2x2:inter=1gbit", "--model", "mlp"]
    cases = [
        (M + ["--per-rank-batch", "0"], ["--per-rank-batch 0", ">= 1"]),
        (M + ["--per-rank-batch", "-3"], ["--per-rank-batch -3", ">= 1"]),
        (M + ["--nproc", "0"], ["--nproc 0", ">= 1"]),
        (M + ["--nproc", "100000"], ["--nproc 100000", "<= "]),
        (M + ["--save-profile", str(folder)], ["--save-profile", "is a directory"]),
        (M + ["--save-profile", str(tmp / "no" / "such" / "dir.json")], ["--save-profile", "does not exist"]),
        (P + ["--inter-lat", "nan"], ["--inter-lat nan", "finite"]),
        (P + ["--inter-lat", "-1"], ["--inter-lat -1", ">= 0"]),
        (P + ["--inter-lat", "inf"], ["--inter-lat inf", "finite"]),
        (P + ["--intra-lat", "-1"], ["--intra-lat -1", ">= 0"]),
        (P + ["--bucket-mb", "0"], ["--bucket-mb 0", "> 0"]),
        (P + ["--bucket-mb", "inf"], ["--bucket-mb inf", "finite"]),
        (P + ["--bucket-mb", "nan"], ["--bucket-mb nan", "finite"]),
        (P + ["--local-sgd-k", "0"], ["--local-sgd-k 0", ">= 1"]),
        (P + ["--per-rank-batch", "0"], ["--per-rank-batch 0", ">= 1"]),
        (P + ["--nproc", "-1"], ["--nproc -1", ">= 1"]),
        (["predict", "--cluster", "0x2:inter=1gbit", "--profile", str(prof)], ["--cluster '0x2:inter=1gbit'"]),
        (["predict", "--cluster", "2x2:inter=0mbit", "--profile", str(prof)], ["inter='0mbit'"]),
        (["predict", "--cluster", "2x2:inter=1gbit", "--profile", str(binary)], ["--profile", "not UTF-8"]),
        (["predict", "--cluster", "2x2:inter=1gbit", "--profile", str(folder)], ["--profile", "is a directory"]),
        (["predict", "--cluster", "2x2:inter=1gbit", "--profile", "/dev/null"], ["--profile", "not a regular file"]),
        (["predict", "--cluster", "2x2:inter=1gbit", "--profile", str(huge)], ["--profile", "a profile is at most"]),
        (["predict", "--cluster", "2x2:inter=1gbit", "--profile", str(tmp / "missing.json")],
         ["--profile", "No such file"]),
    ]
    for name, (text, words) in PROFILE_TEXTS.items():
        path = tmp / f"profile-{name}.json"
        for token in ("NaN", "Infinity", "1e400"):
            text = text.replace(f'"__{token}__"', token)
        path.write_text(text)
        cases.append((["predict", "--cluster", "2x2:inter=1gbit", "--profile", str(path)], ["--profile", *words]))
    return cases


def test_every_bad_number_or_file_is_one_line_exit_2_before_any_rank(tmp_path, monkeypatch, capsys, no_ranks):
    import experiments.costmodel.predict

    def no_measuring(*a, **k):
        raise AssertionError("a profile was measured despite bad input")

    monkeypatch.setattr(experiments.costmodel.predict, "measure_profile", no_measuring)
    problems = []
    for argv, words in _bad_inputs(tmp_path):
        shown = " ".join(a if len(a) < 60 else a[:20] + "…" for a in argv)
        try:
            code, _, err = _cli(argv, capsys)
        except BaseException as exc:  # noqa: BLE001 - a traceback is what this test looks for
            capsys.readouterr()
            problems.append(f"{shown}: raised {type(exc).__name__}: {str(exc)[:120]}")
            continue
        lines = [ln for ln in err.splitlines() if ln.strip()]
        if code != 2 or len(lines) != 1 or "Traceback" in err or not all(w in err for w in words):
            problems.append(f"{shown}: exit {code}, stderr {err[:300]!r}; expected one line with {words}")
    assert not problems, "\n".join(problems)


def test_a_good_profile_file_still_predicts(tmp_path, capsys):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(GOOD_PROFILE))
    code, out, err = _cli(["predict", "--cluster", "2x2:inter=1gbit", "--profile", str(path), "--json"], capsys)
    assert code == 0, err
    rows = json.loads(out)
    assert rows and all(r["step_s"] > 0 for r in rows)


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_save_profile_never_turns_a_fifo_or_a_device_node_into_a_file(tmp_path, capsys, no_ranks, monkeypatch, kind):
    import stat

    import experiments.costmodel.predict

    monkeypatch.setattr(experiments.costmodel.predict, "measure_profile", lambda *a, **k: pytest.fail("measured"))
    target = tmp_path / "target" if kind == "fifo" else Path("/dev/null")
    if kind == "fifo":
        os.mkfifo(target)
    before = stat.S_IFMT(os.stat(target).st_mode)
    code, _, err = _cli(["predict", "--cluster", "2x2:inter=1gbit", "--model", "mlp", "--size", "tiny",
                         "--save-profile", target], capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "--save-profile" in err and str(target) in err, (code, err)
    assert stat.S_IFMT(os.stat(target).st_mode) == before, f"--save-profile replaced the {kind}"


def test_a_profiles_model_name_reaches_the_terminal_with_its_control_characters_escaped(tmp_path, capsys, no_ranks):
    """The probe: `predict --profile` printed the profile's model name raw."""
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({**GOOD_PROFILE, "model": HOSTILE}))
    code, out, err = _cli(["predict", "--cluster", "2x2:inter=1gbit", "--profile", path], capsys)
    assert code == 0, err
    assert not [c for c in out + err if c in "\x1b\x07\u202e"] and "model evil\\u001b[31mred" in out, out
