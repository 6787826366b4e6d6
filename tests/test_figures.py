"""The figure contract (suite/cli/figures.py): typed options built from `fleetbench figures`' arguments,
measure -> raw data -> render.  Runs no ranks: the gate figure renders runs read from a file."""
from __future__ import annotations

import json
import math

import numpy as np

from suite.cli.main import main


def _runs(path) -> None:
    """Two A/A pairs and one pair per slowdown of one case, each of 20 blocks in 2 preparations."""
    rng = np.random.default_rng(0)
    runs = []
    for inject in (0.0, 0.0, 0.02, 0.05, 0.10):
        d = list(math.log1p(inject) + rng.normal(0, 0.02, 20))
        runs.append({"case": "mlp/plain", "inject": inject, "d": d, "base_trials": list(0.05 + rng.random(40) / 100),
                     "head_trials": list((0.05 + rng.random(40) / 100) * (1 + inject)), "seconds": 20.0,
                     "setup_s": 5.0, "load": [1.0, 2.0], "group": [0] * 10 + [1] * 10, "prep_s": [0.3]})
    path.write_text(json.dumps(runs))


def test_gate_figure_renders_kept_runs_from_its_options(tmp_path, capsys):
    """--load renders the kept runs (nothing measured), with the options given: one case, 2 simulations a pair,
    compare's windows from --rounds."""
    raw = tmp_path / "runs.json"
    _runs(raw)
    out = tmp_path / "gate.md"
    assert main(["figures", "gate", "--load", str(raw), "--cases", "mlp/plain", "--sims", "2", "--rounds", "4",
                 "--out", str(out)]) == 0
    text = out.read_text()
    assert "| mlp/plain | none (A/A) | one preparation (--rotate 0) | 2 x 20 (1.00) |" in text, text
    assert "| mlp/plain | +10% | --rotate 5 --restart 2 (default) | 1 x 20 (1.00) |" in text, text
    assert "resnet/plain" not in text and "(4 windows a run," in text and "(recomputed from saved runs)." in text
    assert "sequential comparisons simulated (2 per pair measured)" in text, text


def test_figure_options_are_refused_by_a_figure_that_does_not_take_them(capsys):
    assert main(["figures", "comm", "--blocks", "5"]) == 2
    assert "--blocks is an option of figures gate, not of figures comm" in capsys.readouterr().err
    assert main(["figures", "gate", "--blocks", "0", "--load", "x.json"]) == 2
    assert "figures gate: blocks 0: must be >= 1" in capsys.readouterr().err


def test_cluster_figure_options_are_checked_before_anything_runs(capsys):
    assert main(["figures", "cluster", "--models", "mlp,nope"]) == 2
    assert "figures cluster: models nope unknown; allowed: mlp, resnet, resnet50, gpt2" in capsys.readouterr().err
    assert main(["figures", "cluster", "--rates", "fast"]) == 2
    assert "rate='fast': expected a number and a unit" in capsys.readouterr().err
    assert main(["figures", "cluster", "--sims", "3"]) == 2
    assert "--sims is an option of figures gate, not of figures cluster" in capsys.readouterr().err
