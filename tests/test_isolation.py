"""The gate-sources factors (suite/ab/isolation.py) do what they say: checked in the processes they touch."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys

import pytest

from suite.ab.client import TrialServer
from suite.ab.isolation import ADDR_NO_RANDOMIZE, FACTORS, Isolation
from suite.ab.power import Run, block_noise, block_statistics, prep_spread, spread_interval

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="personality and /proc are Linux's")


def test_factor_names_are_distinct_and_each_switches_one_thing_but_the_last():
    names = [f.name for f in FACTORS]
    assert len(set(names)) == len(names)
    assert names[0] == "default" and FACTORS[0] == Isolation()
    assert "+" not in "".join(names[1:-1]) and names[-1].count("+") == 3


def test_environment_sets_and_prepare_fields():
    assert Isolation().env() == {} and Isolation().prepare_fields() == {}
    env = Isolation(malloc_fixed=True, thp=True).env()
    assert env["MALLOC_ARENA_MAX"] == "1" and env["MALLOC_MMAP_THRESHOLD_"] == "131072"
    assert env["THP_MEM_ALLOC_ENABLE"] == "1"
    assert Isolation(threads=2).prepare_fields() == {"set": ["num_threads=2"]}
    assert Isolation(gc_frozen=True, layout_pad=True).prepare_fields() == {"gc_frozen": True, "layout_pad": True}
    with pytest.raises(ValueError, match="threads 0"):
        Isolation(threads=0)


@linux
def test_aslr_off_reaches_the_child_and_its_children():
    def personality(iso):
        fn = iso.preexec(None)
        # the child's child reads its own personality: it is inherited over fork and exec, as the ranks' is
        code = "import subprocess; print(subprocess.run(['cat', '/proc/self/personality'], capture_output=True, " \
               "text=True).stdout)"
        out = subprocess.run([sys.executable, "-c", code], preexec_fn=fn, capture_output=True, text=True,
                             timeout=60, check=True).stdout
        return int(out.strip(), 16)

    assert not personality(Isolation()) & ADDR_NO_RANDOMIZE
    assert personality(Isolation(aslr_off=True)) & ADDR_NO_RANDOMIZE


def _run(groups):
    r = Run("c", 0.0)
    for k, g in enumerate(groups):
        r.d += list(g)
        r.group += [k] * len(g)
    return r


def test_block_noise_and_the_pair_resampled_interval():
    # two pairs whose preparations sit at +-0.05 with block noise 0.01 about them (hand-computed: SD 0.01)
    a = _run([[0.04, 0.05, 0.06], [-0.06, -0.05, -0.04]])
    b = _run([[0.06, 0.05, 0.04], [-0.04, -0.05, -0.06]])
    assert block_noise([a, b]) == pytest.approx(0.01)
    sp = prep_spread([a, b])
    # between preparations: means +-0.05 about a pair mean of 0 -> SS 0.005 on 1 df a pair, minus v = 1e-4 / 3
    assert sp["tau_prep"] == pytest.approx((0.005 - 1e-4 / 3) ** 0.5, rel=1e-6)
    ci = spread_interval([a, b], n=50, seed=1)
    assert ci["noise"] == pytest.approx((0.01, 0.01))
    lo, hi = ci["tau_prep"]
    assert lo <= sp["tau_prep"] <= hi


@linux
def test_a_trial_server_under_every_factor_at_once_pins_randomizes_nothing_and_freezes(tmp_path):
    iso = Isolation(pin=True, aslr_off=True, malloc_fixed=True, gc_frozen=True, layout_pad=True, threads=1)
    with TrialServer(ROOT, "A", nproc=2, timeout=300, isolation=iso) as srv:
        started = srv.request("start", pin=True)
        allowed = sorted(os.sched_getaffinity(0))
        assert started["cores"] == [[allowed[0]], [allowed[1 % len(allowed)]]]
        for pid in started["pids"]:
            with open(f"/proc/{pid}/personality") as fh:
                assert int(fh.read(), 16) & ADDR_NO_RANDOMIZE, f"rank {pid} has address-space randomization"
            with open(f"/proc/{pid}/environ", "rb") as fh:
                assert b"MALLOC_ARENA_MAX=1" in fh.read().split(b"\0")
        key = srv.request("prepare", case="mlp/plain", size="tiny", warmup=1, check=False, seed=3,
                          **iso.prepare_fields())["key"]
        trial = srv.request("trial", key=key, steps=2, warmup=0)
        assert trial["step_s"] > 0 and len(trial["step_times_s"]) == 2


def test_gc_frozen_leaves_the_collector_off_with_the_survivors_frozen():
    code = ("import gc; from suite.ab.isolation import gc_freeze_on_rank; r = gc_freeze_on_rank(); "
            "print(gc.isenabled(), r['frozen'] > 1000, gc.get_freeze_count() == r['frozen'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
                         cwd=ROOT).stdout.split()
    assert out == ["False", "True", "True"]


def test_block_statistics_from_kept_step_times():
    # one block: BASE trials' steps [1, 1, 4] and [1, 1, 1], HEAD's [2, 2, 2] twice; the window mean (as ab) is d
    r = Run("c", 0.0, d=[0.5], base_steps=[[1.0, 1.0, 4.0], [1.0, 1.0, 1.0]], head_steps=[[2.0, 2.0, 2.0]] * 2)
    st = block_statistics(r)
    assert st["window mean step (ab)"] == [0.5]
    assert st["median step"] == pytest.approx([math.log(2.0)])  # medians 1, 1 against 2, 2
    assert st["fastest step"] == pytest.approx([math.log(2.0)])
    assert block_statistics(Run("c", 0.0, d=[0.5])) == {}  # step times not kept: nothing claimed


def test_gate_sources_renders_every_factor_and_the_statistic_table_from_rows():
    import random

    from suite.figures import gate_sources

    rng = random.Random(4)
    rows = []
    for factor in ("default", "pin"):
        for _k in range(3):
            groups = [[rng.gauss(0, 0.05) for _ in range(4)] for _ in range(3)]
            r = _run(groups)
            r.base_steps = [[rng.uniform(0.9, 1.1) for _ in range(3)] for _ in range(2 * len(r.d))]
            r.head_steps = [[rng.uniform(0.9, 1.1) for _ in range(3)] for _ in range(2 * len(r.d))]
            r.case, r.load = "mlp/plain", [1.0, 2.0]
            rows.append({"factor": factor, "run": dataclasses.asdict(r)})
    opts = gate_sources.Options(cases=("mlp/plain",), factors=("default", "pin"), pairs=3, blocks=12, regroup=4)
    text = gate_sources.render({"rows": rows, "seconds": 60.0, "loaded": True}, opts)
    lines = [ln for ln in text.splitlines() if ln.startswith("| mlp/plain")]
    assert [ln.split(" | ")[1] for ln in lines[:2]] == ["default", "pin"]
    assert all("3 x 3 x 4" in ln for ln in lines[:2])
    assert any("median step" in ln for ln in lines[2:]) and "nan" not in text
    with pytest.raises(ValueError, match="factor 'pinned' is unknown"):
        gate_sources.Options(factors=("pinned",))


def test_parse_names_round_trip_and_refuse_unknown_factors():
    for iso in FACTORS:
        assert Isolation.parse(iso.name) == iso
    assert Isolation.parse("none") == Isolation() and Isolation.parse("thp,pin") == Isolation(thp=True, pin=True)
    with pytest.raises(ValueError, match="'pinned' is unknown; allowed: none, aslr_off"):
        Isolation.parse("thp+pinned")
    with pytest.raises(ValueError, match="threads='x' is not an integer"):
        Isolation.parse("threads=x")


def test_ab_runs_with_the_default_isolation_unless_told_and_says_which():
    from suite.ab.isolation import AB_DEFAULT
    from suite.ab.trials import _options_dict
    from suite.cli import ab
    from suite.cli.main import build_parser

    parse = build_parser().parse_args
    assert AB_DEFAULT == Isolation()  # what docs/figures/gate.md's "Sources" found; change both together
    assert ab.options(parse(["ab", "BASE", "HEAD", "--nproc", "2", "--device", "cpu"])).isolation == AB_DEFAULT
    opts = ab.options(parse(["ab", "BASE", "HEAD", "--nproc", "2", "--device", "cpu", "--isolation", "thp+pin"]))
    assert opts.isolation == Isolation(thp=True, pin=True) and _options_dict(opts)["isolation"] == "pin+thp"
    with pytest.raises(ValueError, match="'fast' is unknown"):
        ab.options(parse(["ab", "BASE", "HEAD", "--nproc", "2", "--device", "cpu", "--isolation", "fast"]))


@linux
def test_calibration_switches_the_injection_on_and_off_within_one_preparation(tmp_path):
    """The path only (no timing asserted): the server's inject op switches the slowdown between trials of one key
    in ABBA blocks, and the table reads them."""
    from suite.figures import gate_sources

    opts = gate_sources.Options(cases=("mlp/plain",), calibration=(0.5,), trials=4, steps=2)
    row = gate_sources._calibrate("mlp/plain", 0.5, opts, say=lambda m: None)
    assert len(row["before"]) == len(row["after"]) == 4 and len(row["step_s"]) == 2
    assert all(t > 0 for t in row["before"] + row["after"] + row["step_s"])
    text = gate_sources.render({"rows": [], "calibration": [row]}, opts)
    assert "| mlp/plain | +50% | 4, 4 |" in text and "nan" not in text
    kept = tmp_path / "calibration.json"
    kept.write_text(json.dumps({"calibration": [row]}))
    again = gate_sources.measure(dataclasses.replace(opts, load=str(kept)))
    assert gate_sources.render(again, opts) == text  # rendered again from the kept raw data, nothing measured
    with pytest.raises(ValueError, match="calibration"):
        gate_sources.Options(calibration=(5.0,))
