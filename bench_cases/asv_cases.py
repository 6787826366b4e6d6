"""asv benchmarks: the step time of every case of the matrix (lower is better), with its spread.

``StepTime.time_step`` is a ``time_`` benchmark, so asv stores for each case a statistic
*with its spread*: the median and its 99% interval, the quartiles and the number of samples
(``stats``: ``ci_99_a``, ``ci_99_b``, ``q_25``, ``q_75``, ``repeat``), and, with
``asv run --record-samples``, the samples themselves.  asv's own regression detection reads
them: ``asv compare`` tests the samples (Mann–Whitney) or the intervals before it calls a
change significant, and the dashboard's step detection weights each point by its interval.
A ``track_`` value (what this benchmark was before) carries none of that, so two unchanged
runs of a noisy machine looked like a +1019% regression.

What a sample is: one timed window of the case on its ranks, in seconds per step (the slowest
rank's window over its steps), the same figure ``fleetbench run`` records.  asv times a
``time_`` benchmark with its ``timer``; here the timer is the ranks' own clock
(:func:`rank_clock`, advanced by each window's time), so the round trip from asv's process to
the ranks and back is not in the samples.  ``number = 1`` (one window per sample, no
calibration), ``repeat`` = the spec's rounds (windows per process), ``rounds`` =
FLEETBENCH_BENCH_PROCESSES processes (default 2: samples of two separate rank pools are
pooled, so part of the between-run noise is in the spread), no warm-up loop (the engine is
warmed up when the case is prepared).

**Timed apart.**  asv runs each (case, world size) in processes of its own, so a case's samples and its
baseline's (``plain``) come from different processes at different times, never from the same rounds: the
ratio of two cases' medians here mixes the machine's drift between them into the speedup (issue 33 saw a
separate timing call ``mlp/overlap`` 1.30x slower than plain where ``fleetbench run``, interleaved, measured it
1.10x faster).  So asv's output says so beside its table (:data:`TIMED_APART`): the benchmark's name on the
dashboard (``pretty_name``), this class's docstring, and one note the first case's process prints (``asv run
--show-stderr``, as ``make asv-smoke`` runs it, shows it under the table).  The speedups to compare are
``fleetbench run``'s (and pytest-benchmark's, which times each model interleaved as ``run`` does); asv's series
are for one case's history, commit after commit.

Parameters come from the run specification of the environment (``_matrix.env_spec``, the one builder:
FLEETBENCH_BENCH_SPEC, as ``fleetbench nightly`` sets it, or the hand-typed FLEETBENCH_BENCH_* options;
default: the smoke tag at the device's default world size), resolved by ``suite/selection.py``:
case name × world size.  A (case, world size) pair the case does not run at is skipped (setup
raises NotImplementedError with the reason, asv's way of saying "n/a").

The ranks (``RankPool``) and the prepared case are started on the first timed call and kept
for the process (asv re-runs ``setup`` before every sample, so setup only validates);
they run through the same runner as ``fleetbench run`` (``suite.runner``).

Import reads the spec and resolves the selection (asv reads ``params``
when it discovers the benchmarks, so they must be known then); nothing is started or written.  A
variable it cannot use is one ConfigError naming it, its value and what is allowed.

``version``: asv keeps one series per benchmark version and starts a new one when the version
changes (for a benchmark it takes the hash of the code).  The numbers also depend on the setup
(model size, steps, windows, warm-up, processes, strategy overrides: ``_matrix.setup_of``, the fields
of ``suite.run_spec.run_setup``), so the version is the code's hash followed by what differs from the
default setup; with the default setup it is the code's hash alone, what asv computed before (the history
stays).  The selection (the cases and world sizes) is the ``params``, not part of the version.
"""
from __future__ import annotations

import atexit
import sys
from dataclasses import replace

from bench_cases import _matrix
from bench_cases._matrix import env_int, env_spec, facts_of, resolved_of

SPEC = env_spec()
ROUNDS, STEPS = SPEC.run.rounds, SPEC.run.steps
PROCESSES = env_int("FLEETBENCH_BENCH_PROCESSES", _matrix.PROCESSES)

_RESOLVED = resolved_of(SPEC, "asv")
_PAIRS = {(rc.case.name, w): rc for rc, w in _RESOLVED.matrix()}
_CLOCK = [0.0]  # seconds per step, summed over every window timed in this process
_LIVE: dict = {}  # (case, world) -> (pool, prepared case)
TIMED_APART = ("fleetbench: asv times each case in processes of its own, timed apart from its model's other cases "
               "and its baseline (plain): compare a case's history here, not one case with another; the speedups to "
               "compare are `fleetbench run`'s, whose cases are timed interleaved with the baseline round by round "
               "(docs/benchmarks.md, asv)")
# the note is printed by the process of the first runnable pair in asv's order (cases x world sizes), once a round
_NOTE_PAIR = next(((c, w) for c in sorted({n for n, _ in _PAIRS}) for w in sorted({w for _, w in _PAIRS})
                   if (c, w) in _PAIRS and not _PAIRS[(c, w)].skip), None)


def rank_clock() -> float:
    """asv's timer for StepTime: the ranks' own seconds per step, accumulated window by window."""
    return _CLOCK[0]


def _close_all() -> None:
    for pool, _ in _LIVE.values():
        pool.close()
    _LIVE.clear()


atexit.register(_close_all)


class StepTime:
    """Seconds per training step of a case at a world size (samples: the ranks' timed windows).

    Each case is timed apart (asv runs every case in processes of its own), not interleaved with its baseline:
    compare a case with its own history; the speedups between cases to compare are `fleetbench run`'s, timed
    interleaved round by round."""

    params = [sorted({n for n, _ in _PAIRS}), sorted({w for _, w in _PAIRS})]
    param_names = ["case", "world_size"]
    timeout = 1800.0  # multi-rank: rank start, engine build, warm-up and the windows
    number = 1
    repeat = ROUNDS
    rounds = PROCESSES
    warmup_time = 0.0
    min_run_count = 1
    timer = staticmethod(rank_clock)
    version: str  # asv's series: the code's hash and the setup, set below the class (setup_version)

    def setup(self, case, world_size):
        rc = _PAIRS.get((case, world_size))
        if rc is None:
            raise NotImplementedError(f"{case} is not run at world size {world_size}")
        if rc.skip:
            raise NotImplementedError(rc.skip)

    def _prepared(self, case, world_size):
        key = (case, world_size)
        if key not in _LIVE:
            for other in list(_LIVE):  # one rank pool alive at a time
                _LIVE.pop(other)[0].close()
            from suite.runner import CaseRunner
            from suite.runtime import RankPool

            rc = _PAIRS[key]
            if key == _NOTE_PAIR:
                print(TIMED_APART, file=sys.stderr, flush=True)
            # no check (asv times; `fleetbench run` judges), every call within half asv's timeout unless the spec says
            opts = replace(SPEC.run, check=False, timeout=SPEC.run.timeout or self.timeout / 2)
            pool = RankPool(world_size, device=_RESOLVED.device, timeout=opts.timeout, pg_timeout=opts.pg_timeout)
            try:
                runner = CaseRunner(pool, world_size, opts, spec=SPEC, facts=facts_of(_RESOLVED, SPEC))
                _LIVE[key] = (pool, runner.prepare(rc))
            except BaseException:
                pool.close()
                raise
        return _LIVE[key][1]

    def time_step(self, case, world_size):
        answers = self._prepared(case, world_size).window()
        _CLOCK[0] += max(a.window_s for a in answers) / STEPS


# what asv's dashboard names the benchmark (its grid, list and graph): said beside the table, outside the code and
# its hash (the version; asv_runner reads ``pretty_name`` from the function)
StepTime.time_step.pretty_name = (  # type: ignore[attr-defined]
    "StepTime.time_step: s per step, each case timed apart (compare `fleetbench run`'s interleaved speedups)")


def _code_hash() -> str:
    """asv's own default version of StepTime.time_step: the SHA-256 of its code and its setup's, as asv_runner
    writes them out (``get_source_code``)."""
    import hashlib

    bench = StepTime()
    try:
        from asv_runner.benchmarks._base import get_source_code
        code = get_source_code([bench.time_step, bench.setup])
    except ImportError:  # asv_runner moved it: a hash of the same code, then a new series (asv's likely changed too)
        import inspect

        code = inspect.getsource(StepTime.time_step) + inspect.getsource(StepTime.setup)
    return hashlib.sha256(code.encode("utf-8")).hexdigest()


def setup_version(setup: dict, default: dict, code_hash: str) -> str:
    """``code_hash`` for the default setup; otherwise followed by each field that differs (``+steps=3``), the
    strategy overrides and config file as a digest."""
    changed = [k for k in setup if setup[k] != default.get(k)]
    if not changed:
        return code_hash
    shown = [f"{k}={_matrix.setup_digest({k: setup[k]})}" if k in ("sets", "config") else f"{k}={setup[k]}"
             for k in changed]
    return code_hash + "+" + "+".join(shown)


StepTime.version = setup_version(_matrix.setup_of(_RESOLVED, SPEC.run, processes=PROCESSES),
                                 _matrix.default_setup(_RESOLVED, processes=_matrix.PROCESSES), _code_hash())
