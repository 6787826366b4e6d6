"""A/B comparison of two git revisions: `fleetbench ab`, `fleetbench bisect`, history alerts.

- :mod:`.worktrees`: both revisions materialised as git worktrees in a temporary directory,
  removed afterwards whatever happens;
- :mod:`.protocol`, :mod:`.server`, :mod:`.client`: each revision runs in its own interpreter
  (``PYTHONPATH=<worktree>``) as a *trial server* (``fleetbench trial-server``) that reads JSON
  requests on stdin and answers JSON lines: select cases, prepare a case on its rank pool, run
  a timed trial window, report the case's structure and check verdict, close;
- :mod:`.stats`: the sequential ABBA statistics (per-block log ratio of step time, Yuen's or
  Student's interval with alpha spent over a few looks, the gate's threshold δ and the equivalence
  margin, verdicts slower / not slower / faster / same / inconclusive);
- :mod:`.compare`: the comparison of one case, trial by trial, and of a selection;
- :mod:`.bisect`: bisection over a first-parent range with the same harness;
- :mod:`.history`: change-point alerts over the asv history (asv's own step detection).
"""
