"""Static guards on the design: no import cycle among suite modules, rank functions passed as
function objects, one workload builder on the rank side."""
from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITE = os.path.join(ROOT, "suite")


def _modules() -> dict[str, str]:
    out = {}
    for root, _, files in os.walk(SUITE):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(root, f)
                mod = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                out[mod.removesuffix(".__init__")] = path
    return out


def _imports(mod: str, path: str, mods: dict[str, str]) -> set[str]:
    """Suite modules imported by ``mod`` (at any depth of the file: lazy imports count too)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    pkg = mod if path.endswith("__init__.py") else mod.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            targets = [f"{target}.{a.name}" for a in node.names] + [target]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        for t in targets:
            if t in mods and t != mod:
                found.add(t)
                break
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_among_suite_modules():
    mods = _modules()
    # A package's __init__ re-exporting its submodules is not a dependency of those submodules on it.
    graph = {m: {t for t in _imports(m, p, mods) if not (m.startswith(t + ".") and mods[t].endswith("__init__.py"))}
             for m, p in mods.items()}
    assert _cycles(graph) == []


def test_the_cycle_detector_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _string_rank_calls(path: str) -> list[str]:
    tree = ast.parse(open(path, encoding="utf-8").read())
    bad = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "run"
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                and ":" in node.args[0].value):
            bad.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}")
    return bad


def test_no_rank_function_is_named_by_a_string():
    bad = []
    for top in ("suite", "bench_cases", "tests"):
        for root, _, files in os.walk(os.path.join(ROOT, top)):
            bad += [b for f in files if f.endswith(".py") for b in _string_rank_calls(os.path.join(root, f))]
    assert bad == []


def test_the_pool_refuses_names_and_lambdas():
    from suite.runtime.pool import check_rank_fn
    from suite.runtime.probes import whoami

    check_rank_fn(whoami)
    with pytest.raises(TypeError, match="pass the function object itself"):
        check_rank_fn("suite.runtime.probes:whoami")
    with pytest.raises(TypeError, match="define it at module level"):
        check_rank_fn(lambda: 1)


# Rank-side jobs start from the workload: none of them builds a model, a dataset or an engine itself.
WORKLOAD_USERS = ("measure/timing.py", "measure/trace.py", "measure/reader_timing.py", "check/harness.py",
                  "cluster/profile.py", "figures/local_sgd.py")


@pytest.mark.parametrize("rel", WORKLOAD_USERS)
def test_rank_jobs_build_through_the_workload(rel):
    tree = ast.parse(open(os.path.join(SUITE, rel), encoding="utf-8").read())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
            {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not names & {"get_model", "make_dataset", "build_engine", "step_indices"}, rel
    assert "workload" in names, rel
