"""History alerts: change-point detection over each case's stored asv series.

The nightly gate is `fleetbench ab` against the last good commit; the history is watched
separately.  For every benchmark and parameter combination of a machine's asv results, the
series of nightly values (ordered by commit date, one point per commit: the median step time
that asv stored) is fitted with **asv's own step detection** (``asv.step_detect``: a
piecewise-constant fit, each point weighted by its 99% interval as ``asv publish`` weights
it), the same code that draws the dashboard's regressions page.  An alert is raised only
for an upward step whose new level **persists**: at least ``persist`` nights (default 2) at
the end of the series, and larger than ``threshold`` (asv's relative threshold, default 5%).
A single slow night is never an alert; neither is a step that has since gone back down.

Why asv's step detection and not Apache Otava (E-divisive means): it reads the very series
and weights asv stores and publishes, so an alert is what the dashboard shows; it needs no
new dependency (Otava would bring its own pinned stack, and its defaults (a window of 50
points, p 0.001) are made for long histories, while a nightly history starts short).

    fleetbench history --results results/asv --machine cpu-test [--persist 2] [--markdown alerts.md]

Exit status: 0 no alert; 1 at least one alert (the nightly reports it, the gate does not
read it); 2 unusable input.
"""
from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field

from ..outputs import OutputError, file_kind, output_problem, safe_name, write_atomic

__all__ = ["Alert", "series", "alerts", "alerts_in", "report"]


@dataclass
class Alert:
    benchmark: str
    params: tuple
    before: float  # level before the step (seconds)
    after: float  # level after it
    first_commit: str  # first commit of the new level
    nights: int  # points at the new level, up to the latest
    commits: list = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.after / self.before if self.before else math.inf

    def line(self) -> str:
        return (f"{self.benchmark}{list(self.params)}: {self.ratio:.2f}x slower ({self.before * 1e3:.2f} -> "
                f"{self.after * 1e3:.2f} ms) since {self.first_commit[:10]}, {self.nights} night(s) in a row")


def series(results_dir: str, machine: str) -> dict:
    """{(benchmark, params): [(date, commit, value, weight)]} ordered by commit date (one point per commit), of
    the benchmark's newest version only: another setup (rounds, size ...) is another version and another series,
    as ``asv publish`` draws it (bench_cases/asv_cases.py)."""
    from asv import results as asv_results
    from asv._stats import get_weight

    points: dict = {}
    versions: dict = {}  # (benchmark, commit) -> version; benchmark -> (date, version) of its newest result
    for res in asv_results.iter_results_for_machine(results_dir, machine):
        for key in res.get_all_result_keys():
            version = res.benchmark_version.get(key)
            versions[(key, res.commit_hash)] = version
            if (res.date or 0) >= versions.get(key, (-1, None))[0]:
                versions[key] = (res.date or 0, version)
            params = res.get_result_params(key)
            values = res.get_result_value(key, params)
            stats = res.get_result_stats(key, params)
            import itertools

            combos = list(itertools.product(*params)) if params else [()]
            for combo, value, st in zip(combos, values, stats):
                if value is None or (isinstance(value, float) and math.isnan(value)):
                    continue
                points.setdefault((key, tuple(combo)), {})[res.commit_hash] = (res.date or 0, res.commit_hash,
                                                                              float(value), get_weight(st))
    return {k: sorted(p for commit, p in v.items() if versions[(k[0], commit)] == versions[k[0]][1])
            for k, v in points.items()}


def alerts(results_dir: str, machine: str, persist: int = 2, threshold: float = 0.05) -> tuple[list, int]:
    """(alerts, number of series looked at) for one machine's asv results."""
    all_series = series(results_dir, machine)
    return alerts_in(all_series, persist, threshold), len(all_series)


def alerts_in(all_series: dict, persist: int = 2, threshold: float = 0.05) -> list:
    """The alerts of ``{(benchmark, params): [(date, commit, value, weight)]}`` (see the module docstring)."""
    from asv.step_detect import detect_regressions, detect_steps

    found = []
    for (bench, params), pts in all_series.items():
        y = [p[2] for p in pts]
        w = [p[3] for p in pts]
        if len(y) < persist + 1:
            continue
        steps = detect_steps(y, w)
        last_v, best_v, jumps = detect_regressions(steps, threshold)
        if not jumps:
            continue
        before_idx, after_idx, before_v, _ = jumps[-1]
        if after_idx is None:
            continue
        nights = len(y) - after_idx
        latest_level = steps[-1][2]
        if nights >= persist and latest_level > before_v * (1 + threshold):
            found.append(Alert(bench, params, before_v, latest_level, pts[after_idx][1], nights,
                               [p[1] for p in pts[after_idx:]]))
    return found


MAX_RESULT_BYTES = 256 * 2**20  # one asv result file (a commit's results on one machine: KB to a few MB)


def unreadable(machine_dir: str) -> str | None:
    """Why asv could not read ``machine_dir``'s result files without blocking (None when it can): every ``*.json``
    under it (machine.json included) must be a regular file (a link to one is fine) of bounded size; a FIFO or a
    device would block asv's reader, forever."""
    for root, _dirs, files in os.walk(machine_dir):
        for name in files:
            if not name.endswith(".json"):
                continue
            path = os.path.join(root, name)
            try:
                st = os.stat(path)
            except OSError as exc:
                return f"{path}: cannot be read ({exc.strerror or exc})"
            kind = file_kind(st.st_mode)
            if kind is not None:
                return f"{path}: is {kind}; expected a regular file (an asv result)"
            if st.st_size > MAX_RESULT_BYTES:
                return f"{path}: is {st.st_size} bytes, more than the {MAX_RESULT_BYTES // 2**20} MiB an asv result " \
                       f"may have"
    return None


def report(results: str, machine: str, persist: int = 2, threshold: float = 0.05, markdown: str | None = None) -> int:
    """``fleetbench history``: print (and write to ``markdown``) the alerts; the exit status above."""
    try:
        safe_name(machine, "--machine")
    except OutputError as exc:
        print(f"history: error: {exc}", file=sys.stderr)
        return 2
    if not os.path.isdir(os.path.join(results, machine)):
        print(f"history: error: no asv results for machine {machine!r} under {results}", file=sys.stderr)
        return 2
    if persist < 1:
        print(f"history: error: --persist {persist}: must be >= 1", file=sys.stderr)
        return 2
    problem = (f"--markdown {markdown!r}: {output_problem(markdown)}" if markdown and output_problem(markdown)
               else unreadable(os.path.join(results, machine)))
    if problem:  # found out before asv reads anything (a FIFO would block it) or anything is computed
        print(f"history: error: {problem}", file=sys.stderr)
        return 2
    found, n = alerts(results, machine, persist, threshold)
    lines = [f"history alerts ({machine}: {n} series, asv step detection, a new level lasting >= "
             f"{persist} nights, > {threshold:.0%}): {len(found) or 'none'}"]
    lines += [f"- {a.line()}" for a in found]
    text = "\n".join(lines)
    print(text)
    if markdown:
        write_atomic(markdown, text + "\n")
    return 1 if found else 0
