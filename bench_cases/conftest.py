"""pytest-benchmark set-up: the case matrix as parameters, a session-scoped rank pool, machine info.

Options (pytest has a command line, so no environment variable is read here; asv's are in ``_matrix.py``):
``--fleetbench-spec FILE``, the run specification (``suite/run_spec.py``; ``fleetbench nightly`` writes one), or
the spec's options a person types, made from the spec's metadata (``suite.spec_options.options("pytest")``) and
built into the same spec by the one builder (``spec_options.spec_from``): ``--fleetbench-case`` (name or glob,
repeatable), ``--fleetbench-tag`` (default smoke), ``--fleetbench-model``, ``--fleetbench-world`` (repeatable;
default one: 2 on CPU, every GPU on CUDA), ``--fleetbench-device``, ``--fleetbench-size``, ``--fleetbench-config``,
``--fleetbench-set`` (repeatable), ``--fleetbench-steps`` (K steps per timed window), ``--fleetbench-rounds``
(timed windows; both default to the spec's, as ``fleetbench run``), ``--fleetbench-no-check``,
``--fleetbench-timeout`` (bound on each multi-rank call, seconds; default the spec's, scaled to the model).  The
selection is resolved once (``suite/selection.py``), as
``fleetbench run`` resolves its own: a case named without ``--fleetbench-world`` runs at the one default world
size.  It is resolved when pytest is configured, so an option it cannot use is one ``ERROR:`` line naming the
option (``--fleetbench-case``), the value and what is allowed, before anything is collected.

Each model's cases at a world size are measured once, together, as ``fleetbench run`` measures them
(:meth:`_Pools.measured`, ``CaseRunner.run_model``): the group is the session's cases of that model after every
selection (``-k``, ``--deselect``, node ids: :func:`pytest_collection_finish`), always timed with the model's
baseline, interleaved round by round in one call on the ranks.  Each benchmark then runs ``benchmark.pedantic``
over its own case's windows: a fixed number of rounds (``--fleetbench-rounds``, or ``--benchmark-min-rounds``
when only that is given), no calibration, no warm-up rounds (the engines are warmed up before the timed
rounds), the ranks' clock as timer.  pytest-benchmark's options for its own rounds
(``--benchmark-timer``, ``--benchmark-warmup``, ``--benchmark-max-time`` ...) do nothing here: given, they
are named in one warning line at the start.  The saved JSON's ``options`` say what ran (``min_rounds``,
``warmup``, ``timer``).

``machine_info["fleetbench"]`` holds the machine's metadata and ``setup`` (``_matrix.setup_of``, the fields of
``suite.run_spec.run_setup``: device, backend, size, steps, rounds, warm-up, overrides); ``--benchmark-compare``
against a run whose setup differs warns, naming the fields (pytest-benchmark's own warning, ``PytestBenchmarkWarning``).

Parameters are ``case`` (the case's name, a string) and ``world`` (an int), so the saved JSON holds
``"params": {"case": "mlp/plain", "world": 2}`` and test ids read ``test_step[mlp/plain@2]``.  Each
benchmark's ``group`` is its model and world size (``mlp@2``): pytest-benchmark prints one table per group,
so only cases that share a baseline are compared side by side.  The unit, one training step, is said in
``extra_info`` and in a note after the tables.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from bench_cases._matrix import harness_message, resolved_of, setup_of
from suite import spec_options
from suite.results.export import what_a_round_is  # the nightly's export says the same


class Timed:
    """The benchmarks that ran: (group, steps per window) each, for the note after pytest-benchmark's tables."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, int]] = []

    def add(self, group: str, steps: int) -> None:
        self.runs.append((group, steps))


_TIMED = pytest.StashKey[Timed]()
_GROUPS = pytest.StashKey[dict]()  # (model, world) -> the session's cases of that model, in order
_RESOLVED = pytest.StashKey[object]()
_SPEC = pytest.StashKey[object]()
_ROUNDS = pytest.StashKey[int]()
_PARSER: list = []  # pytest's parser, for the defaults of pytest-benchmark's options

# pytest-benchmark's options for its own rounds, which benchmark.pedantic does not use: dest -> (option, what
# decides it here).  --benchmark-min-rounds is not here: it is taken as the number of rounds (_rounds).
IGNORED = {
    "benchmark_timer": ("--benchmark-timer", "the ranks' clock times the rounds"),
    "benchmark_warmup": ("--benchmark-warmup", "the engines are warmed up before the timed rounds"),
    "benchmark_warmup_iterations": ("--benchmark-warmup-iterations", "the engines are warmed up before the timed "
                                                                     "rounds"),
    "benchmark_min_time": ("--benchmark-min-time", "a round is one window"),
    "benchmark_max_time": ("--benchmark-max-time", "the rounds run however long they take"),
    "benchmark_calibration_precision": ("--benchmark-calibration-precision", "nothing is calibrated"),
    "benchmark_precision": ("--benchmark-precision", "the rounds are --fleetbench-rounds"),
    "benchmark_confidence": ("--benchmark-confidence", "the rounds are --fleetbench-rounds"),
}


# pytest's help where it says more than the spec's metadata (a field added to the spec gets the metadata's)
HELP = {"tags": "cases with this tag (default: smoke)", "models": "every case of this model (repeatable)",
        "device": "default: cuda where torch sees a GPU",
        "sets": "a strategy field applied on top of every case (repeatable)",
        "steps": "steps per timed window (default: the spec's, as fleetbench run)",
        "rounds": "timed windows, pytest-benchmark's rounds (default: the spec's, as fleetbench run)",
        "check": "skip the correctness verdict",
        "timeout": "bound on each multi-rank call, seconds (default: the spec's, scaled to the model)"}


def pytest_addoption(parser):
    """The run specification's options on pytest (each field's name, type, choices and help from its metadata,
    pytest's :data:`HELP` over it), and the spec file instead of them."""
    _PARSER[:] = [parser]
    g = parser.getgroup("fleetbench")
    for o in spec_options.options("pytest"):
        g.addoption(o.named("pytest"), **o.kwargs("pytest", HELP.get(o.name)))
    g.addoption(spec_options.SPEC_FILE["pytest"], metavar="FILE", dest="fleetbench_spec",
                help="the run specification as JSON (suite/run_spec.py; `fleetbench nightly` writes one) instead of "
                     "the options above")


def spec_of(config):
    """The session's run specification: --fleetbench-spec FILE, or the spec's options, by the one builder
    (``spec_options.spec_from``); an error is a UsageError naming the option."""
    if _SPEC not in config.stash:
        from suite.config import ConfigError

        given = spec_options.Given("pytest", spec_options.parsed("pytest", config.getoption),
                                   config.getoption("fleetbench_spec"))
        try:
            config.stash[_SPEC] = spec_options.spec_from(given)
        except ConfigError as exc:
            raise pytest.UsageError(harness_message(str(exc), "pytest")) from None
    return config.stash[_SPEC]


def resolved(config):
    """The spec's selection, resolved once per session; an error is a UsageError naming the option."""
    if _RESOLVED not in config.stash:
        from suite.config import ConfigError

        spec = spec_of(config)
        try:
            config.stash[_RESOLVED] = resolved_of(spec, "pytest")
        except ConfigError as exc:
            raise pytest.UsageError(str(exc)) from None
    return config.stash[_RESOLVED]


def _defaults() -> dict:
    """Every option's default, as pytest parses them (pytest-benchmark's are parsed values: a timer, a bool)."""
    return vars(_PARSER[0].parse_known_args([])) if _PARSER else {}


def _rounds(config) -> int:
    """The timed windows: the spec's (--fleetbench-rounds), or --benchmark-min-rounds when only that one is given."""
    rounds = spec_of(config).run.rounds
    asked = config.getoption("benchmark_min_rounds", None)
    default = _defaults().get("benchmark_min_rounds", asked)
    if asked is None or asked == default or asked == rounds:
        return rounds
    if config.getoption("fleetbench_rounds") is not None or config.getoption("fleetbench_spec"):
        raise pytest.UsageError(f"--benchmark-min-rounds={asked} and --fleetbench-rounds {rounds}: both set the "
                                f"timed windows (rounds); give one")
    return asked


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """The options checked and the selection resolved before anything is collected (and before pytest-benchmark
    compares against a saved run): an option it cannot use is one line, not a collection traceback."""
    if config.getoption("help", False) or config.getoption("version", False):
        return
    config.stash[_ROUNDS] = _rounds(config)
    resolved(config)


def rounds_of(config) -> int:
    if _ROUNDS not in config.stash:
        config.stash[_ROUNDS] = _rounds(config)
    return config.stash[_ROUNDS]


def ignored_options(config) -> list[str]:
    """pytest-benchmark's round options given with a non-default value, each as "--option=value (why)"."""
    defaults, out = _defaults(), []
    for dest, (flag, why) in IGNORED.items():
        value = config.getoption(dest, None)
        if dest in defaults and str(value) != str(defaults[dest]):
            out.append(f"{flag}={value} ({why})")
    return out


def session_setup(config) -> dict:
    """This session's setup (``_matrix.setup_of``, ``suite.run_spec.run_setup``'s fields): what its numbers depend
    on besides code and machine; the nightly's export writes the same from its records."""
    from dataclasses import replace

    return setup_of(resolved(config), replace(spec_of(config).run, rounds=rounds_of(config)))


def pytest_report_header(config):
    rc = resolved(config)
    return (f"fleetbench: {rc.device} ({rc.backend}), size {rc.size}; each benchmark's rounds: {rounds_of(config)} "
            f"timed windows of {spec_of(config).run.steps} steps (benchmark.pedantic), timed by the ranks' "
            f"clock (rank_clock), whatever pytest-benchmark's defaults above say; each model's cases timed "
            f"together, interleaved with its baseline, as `fleetbench run` does")


@pytest.hookimpl(wrapper=True)
def pytest_sessionstart(session):
    """One warning line, after the header, when pytest-benchmark options are given that do nothing here."""
    result = yield
    ignored = ignored_options(session.config)
    if ignored:
        line = (f"fleetbench: warning: ignored here (each benchmark runs --fleetbench-rounds windows of "
                f"--fleetbench-steps steps, timed by the ranks' clock): {'; '.join(ignored)}")
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        if tr is not None:
            tr.write_line(line, yellow=True)
        else:
            import sys

            print(line, file=sys.stderr)
    return result


def pytest_collection_modifyitems(config, items):
    """The saved JSON's ``options`` say what ran: min_rounds the rounds, warmup off (the engine's own is not
    pytest-benchmark's), the benchmark marker's timer kept."""
    rounds = rounds_of(config)
    for item in items:
        if "benchmark" in getattr(item, "fixturenames", ()):
            mark = item.get_closest_marker("benchmark")
            item.add_marker(pytest.mark.benchmark(**{**(mark.kwargs if mark else {}), "min_rounds": rounds,
                                                     "warmup": False}), append=False)  # the closest one


def pytest_generate_tests(metafunc):
    if {"case", "world"} <= set(metafunc.fixturenames):
        pairs = resolved(metafunc.config).matrix()  # world by world: one pool alive at a time
        metafunc.parametrize(["case", "world"], [(rc.case.name, w) for rc, w in pairs],
                             ids=[f"{rc.case.name}@{w}" for rc, w in pairs])


def pytest_collection_finish(session):
    """Each model's group at each world size: the session's cases of that model (after ``-k``, ``--deselect``,
    node ids ...), in the session's order; :meth:`_Pools.measured` times them together, once."""
    groups: dict[tuple[str, int], list[str]] = {}
    rc = None
    for item in session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "case" in params and "world" in params:
            rc = rc or resolved(session.config)
            model = rc.find(params["case"], params["world"]).case.model
            group = groups.setdefault((model, params["world"]), [])
            if params["case"] not in group:
                group.append(params["case"])
    session.config.stash[_GROUPS] = groups


@dataclass
class Measured:
    """One model's measurement at one world size: each case's record (``CaseRunner.run_model``, as ``fleetbench
    run`` records it) and, per variant, the variants timed together with it and every rank's answer (its windows)."""

    records: dict  # case name -> CaseRecord
    answers: dict  # variant -> (the variants timed in the same interleaved call, every rank's RankTiming)

    def rank_windows(self, variant: str) -> list[list[float]]:
        """Per window, each rank's window (by rank), as the interleaved call measured them."""
        _, answers = self.answers.get(variant, ((), ()))
        per_rank = [a.variants[variant].windows for a in sorted(answers, key=lambda a: a.rank)]
        return [list(ws) for ws in zip(*per_rank)]

    def timed_with(self, variant: str) -> list[str]:
        return list(self.answers.get(variant, ((), ()))[0])


class _Pools:
    """One RankPool (and its case runner) per world size, started on first use; the previous world's is closed.
    Each model's cases at a world size are measured once, together (:meth:`measured`)."""

    def __init__(self, config):
        self.config = config
        self.pool = None
        self._runner = None
        self._measured: dict[tuple[str, int], Measured | Exception] = {}

    def measured(self, case: str, world: int) -> Measured:
        """The measurement of ``case``'s model at ``world``, made by the first benchmark of the group that runs: the
        group's cases checked, then every one of them and the model's baseline (always, selected or not)
        interleaved round by round in one timing on the ranks, as ``fleetbench run`` times a model
        (``CaseRunner.run_model``: ``time_on_rank``, ``suite.measure.interleave.interleaved_rounds``).  An error
        that stopped the whole group is raised for each of its benchmarks."""
        sel = resolved(self.config)
        model = sel.find(case, world).case.model
        key = (model, world)
        if key not in self._measured:
            names = list(self.config.stash.get(_GROUPS, {}).get(key, ()))
            if case not in names:  # not collected as this session's (called directly): its own group
                names.append(case)
            rcs = [rc for rc in (sel.find(n, world) for n in names) if rc.skip is None]
            runner = self.runner(world)
            answers: dict = {}

            def keep(variants: list[str], got: list) -> None:
                for v in variants:  # a variant's first timing is its record's (CaseRunner.measure: setdefault)
                    answers.setdefault(v, (tuple(variants), got))

            runner.on_answers = keep
            try:
                records = runner.run_model(rcs, lambda rc, line, seconds: None)
                self._measured[key] = Measured({r.case: r for r in records}, answers)
            except Exception as exc:  # noqa: BLE001 - each benchmark of the group fails with it
                self._measured[key] = exc
            finally:
                runner.on_answers = None
        got = self._measured[key]
        if isinstance(got, Exception):
            raise got
        if case not in got.records:
            raise RuntimeError(f"{case}@{world} was not in its model's measurement ({sorted(got.records)})")
        return got

    def get(self, world: int):
        from suite.runtime import RankPool

        if self.pool is not None and self.pool.nproc != world:
            self.close()
        if self.pool is None:
            from suite.runner import BASE_TIMEOUT_S  # a call's bound given none (the runner bounds each call itself)

            opts = self.options()
            self.pool = RankPool(world, device=resolved(self.config).device, timeout=opts.timeout or BASE_TIMEOUT_S,
                                 pg_timeout=opts.pg_timeout)
        return self.pool

    def options(self):
        """The runner's options: the spec's, with the session's rounds."""
        from dataclasses import replace

        # pytest-benchmark traces nothing (`fleetbench run --trace-steps` does): the nightly's spec asks for traces
        return replace(spec_of(self.config).run, rounds=rounds_of(self.config), trace_steps=0)

    def runner(self, world: int):
        from bench_cases._matrix import facts_of
        from suite.runner import CaseRunner

        pool = self.get(world)
        if self._runner is None or self._runner.launcher is not pool:
            self._runner = CaseRunner(pool, world, self.options(), spec=spec_of(self.config),
                                      facts=facts_of(resolved(self.config), spec_of(self.config)))
        return self._runner

    def close(self):
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        self._runner = None


@pytest.fixture(scope="session")
def selection(pytestconfig):
    """The resolved selection (suite.selection.Resolved): the cases' configs at each world size."""
    return resolved(pytestconfig)


@pytest.fixture(scope="session")
def rank_pools(pytestconfig):
    pools = _Pools(pytestconfig)
    yield pools
    pools.close()


@pytest.fixture
def timed(pytestconfig) -> Timed:
    """Where a benchmark notes its group and steps per window (for the note after the tables)."""
    return pytestconfig.stash.setdefault(_TIMED, Timed())


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter):
    """After pytest-benchmark's tables: what their rounds measured."""
    config = terminalreporter.config
    timed = config.stash.get(_TIMED, None)
    if timed is None or not timed.runs:  # nothing timed (--benchmark-disable, --benchmark-skip): no tables
        return
    if config.getoption("benchmark_quiet", False) and not config.getoption("benchmark_verbose", False):
        return  # pytest-benchmark printed no tables
    steps = " or ".join(str(k) for k in sorted({k for _, k in timed.runs}))
    tr = terminalreporter
    tr.section("fleetbench: what the tables above measure", sep="-")
    tr.write_line(f"Each round (Min, Max, Mean, Median ..., in the unit shown; OPS = steps/s) is "
                  f"{what_a_round_is(steps)}.")
    tr.write_line("extra_info holds each rank's windows (rank_window_s), the slowest rank's (window_s) and every "
                  "rank's step times (step_times_s), in seconds.")
    tr.write_line("One table per group, MODEL@WORLD, measured once: its cases and the model's baseline (plain, "
                  "selected or not) interleaved round by round in one timing, as `fleetbench run` does, each row "
                  "its own case's windows. Compare cases within a group only; extra_info.speedup (and `fleetbench "
                  "run`) states each case's speedup over plain with its interval.")


def pytest_benchmark_update_machine_info(config, machine_info):
    """torch, CUDA and NCCL versions; GPU names and clocks through NVML (or why there are none); under
    ``fleetbench``: the machine's metadata, the ranks' backend, the world sizes and the session's ``setup``.
    World size and threads per rank are each benchmark's (``extra_info``): a session can run several."""
    from suite.measure.metadata import collect

    rc = resolved(config)
    meta = collect(backend=rc.backend)
    for per_benchmark in ("world_size", "threads_per_rank"):
        meta.pop(per_benchmark, None)
    meta["worlds"] = list(rc.worlds)
    meta["setup"] = session_setup(config)
    machine_info["torch"] = meta["torch"]
    machine_info["cuda"] = meta["cuda"]
    machine_info["nccl"] = meta["nccl"]
    machine_info["gpu"] = meta["gpu"]
    machine_info["fleetbench"] = meta


def setup_changes(mine: dict | None, theirs: dict | None) -> list[str] | None:
    """The setup fields that differ, each "field: THEIRS (compared run) -> MINE (this one)"; None when the
    compared run recorded no setup."""
    if not isinstance(theirs, dict):
        return None
    mine = mine or {}
    return [f"{k}: {theirs.get(k)!r} -> {mine.get(k)!r}" for k in sorted(set(mine) | set(theirs))
            if mine.get(k) != theirs.get(k)]


def pytest_benchmark_compare_machine_info(config, benchmarksession, machine_info, compared_benchmark):
    """--benchmark-compare against a run of another setup (size, steps, rounds, warm-up, overrides, device) warns,
    naming the fields: the same test id then measured something else."""
    mine = (machine_info.get("fleetbench") or {}).get("setup")
    theirs = ((compared_benchmark.get("machine_info") or {}).get("fleetbench") or {}).get("setup")
    when = compared_benchmark.get("datetime", "?")
    changes = setup_changes(mine, theirs)
    if changes is None:
        benchmarksession.logger.warning(
            f"fleetbench: the compared run ({when}) records no setup (saved before setups were recorded): its size, "
            f"steps, rounds and overrides may differ from this run's")
    elif changes:
        benchmarksession.logger.warning(
            f"fleetbench: the compared run ({when}) had another setup ({'; '.join(changes)}): the same benchmark "
            f"names measured something else, so the comparison is not like for like")
