"""Static guards on the design: every suite module in a layer of docs/architecture.md and no upward import, no
import cycle among suite modules, rank functions passed as function objects, one workload builder on the rank
side."""
from __future__ import annotations

import ast
import os
import re

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


# ---- layers: docs/architecture.md's table, bottom (1) to top ----------------------------------------------------
def _layers(text: str) -> dict[str, int]:
    """{module or package prefix: layer} from the rows ``| N | `suite/x/`, `suite/y.py` | ... |``."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].isdigit():
            for path in re.findall(r"`(suite/[^`]*)`", cells[1]):
                out[path.removesuffix("/").removesuffix(".py").removesuffix("/__init__").replace("/", ".")
                    + (".*" if path.endswith("/") else "")] = int(cells[0])
    return out


def _layer_of(mod: str, layers: dict[str, int]) -> int | None:
    """The layer of the most specific row covering ``mod`` (a package row ``suite.x.*`` covers suite.x and below)."""
    best: tuple[int, int] | None = None
    for key, layer in layers.items():
        pkg = key.removesuffix(".*")
        if mod == pkg or (key.endswith(".*") and mod.startswith(pkg + ".")):
            if best is None or len(pkg) > best[0]:
                best = (len(pkg), layer)
    return None if best is None else best[1]


def _upward(graph: dict[str, set[str]], layers: dict[str, int]) -> set[tuple[str, str]]:
    """(importer, imported) for every import of a higher layer, and (module, "no layer") for an unassigned one."""
    bad: set[tuple[str, str]] = set()
    for mod, targets in graph.items():
        here = _layer_of(mod, layers)
        if here is None:
            bad.add((mod, "no layer"))
            continue
        bad |= {(mod, t) for t in targets if (_layer_of(t, layers) or 0) > here}
    return bad


LAYERS = _layers(open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8").read())
# Upward imports being removed by another branch of issue 24 (item 1, the selection layer); delete the entry when
# that lands.  Nothing else may be added here.
KNOWN_UPWARD: set = set()  # none: the selection layer removed the last one (ab.server -> cli.run)


def test_every_module_is_in_a_layer_and_none_imports_a_higher_one():
    mods = _modules()
    graph = {m: _imports(m, p, mods) for m, p in mods.items()}
    assert len(LAYERS) >= 20 and max(LAYERS.values()) >= 10, LAYERS  # the table was read
    assert _upward(graph, LAYERS) - KNOWN_UPWARD == set()


def test_every_row_of_the_layer_table_names_existing_code():
    for key in LAYERS:
        path = os.path.join(ROOT, *key.removesuffix(".*").split("."))
        assert os.path.isdir(path) if key.endswith(".*") else os.path.isfile(path + ".py") or \
            os.path.isfile(os.path.join(path, "__init__.py")), key


def test_the_layer_rule_fails_on_an_upward_import_and_an_unassigned_module():
    """The checker fed fake imports: config importing the runner (layer 1 -> 8), the record types importing the
    comparison beside them in results/ (the more specific row wins), and a module no row covers."""
    mods = _modules()
    graph = {m: _imports(m, p, mods) for m, p in mods.items()}
    fake = dict(graph, **{"suite.config": graph["suite.config"] | {"suite.runner"},
                          "suite.results.records": graph["suite.results.records"] | {"suite.results.compare"},
                          "suite.newthing": set()})
    assert _upward(fake, LAYERS) - KNOWN_UPWARD == {("suite.config", "suite.runner"),
                                                    ("suite.results.records", "suite.results.compare"),
                                                    ("suite.newthing", "no layer")}
    assert _layer_of("suite.results.gate", LAYERS) == _layer_of("suite.runner", LAYERS) == 8
    assert _layer_of("suite", LAYERS) == 5 and _layer_of("suitex.y", LAYERS) is None


# ---- experiments/: a consumer of the package, never a dependency ---------------------------------------------
def _experiments_imports(source: str, where: str = "") -> list[str]:
    """Where ``source`` imports ``experiments`` (an import statement at any depth, or ``import_module`` /
    ``__import__`` of a constant name)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in
              ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant)):
            names = [str(node.args[0].value)]
        found += [f"{where}:{node.lineno}: {n}" for n in names if n == "experiments" or n.startswith("experiments.")]
    return found


def test_nothing_in_the_package_its_harnesses_or_its_tests_imports_experiments():
    """experiments/ (unsupported side projects, experiments/README.md) may import suite; suite/, bench_cases/ and
    tests/ never import it, so `make test` and the package run without it."""
    found = []
    for top in ("suite", "bench_cases", "tests"):
        for root, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(root, f)
                    found += _experiments_imports(open(path, encoding="utf-8").read(), os.path.relpath(path, ROOT))
    assert found == [], found


def test_the_experiments_scan_finds_each_kind_of_import():
    for source in ("import experiments\n", "from experiments.costmodel import cli\n",
                   "def f():\n    import experiments.costmodel.simulate as s\n",
                   "import importlib\nimportlib.import_module('experiments.costmodel')\n",
                   "__import__('experiments')\n"):
        assert len(_experiments_imports(source)) == 1, source
    assert _experiments_imports("import experimentsx\nfrom . import experiments\nx = 'experiments.a'\n") == []


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
                  "figures/local_sgd.py")


@pytest.mark.parametrize("rel", WORKLOAD_USERS)
def test_rank_jobs_build_through_the_workload(rel):
    tree = ast.parse(open(os.path.join(SUITE, rel), encoding="utf-8").read())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
            {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not names & {"get_model", "make_dataset", "build_engine", "step_indices"}, rel
    assert "workload" in names, rel


# ---- rank functions build through the workload -------------------------------------------------------------------
# Names that build a model, a dataset, an engine or a gradient sync (and torch.nn layers put together into a model):
# outside suite.workload and suite.engine no rank function may use them, nor construct a GradSync class itself, nor
# call a function of its module that does.
BUILDERS = {"get_model", "build_engine", "build_grad_sync", "make_dataset", "step_indices", "make", "Sequential"}
# Rank functions that still build models or gradient syncs themselves.  Nothing may be added here.
KNOWN_BUILDERS: set = set()  # none: the doctor's bucketed check moved onto the workload (issue 34)


def _first_arg_name(call: ast.Call, index: int = 0) -> str | None:
    """The function named by the call's argument ``index`` (``fn`` or ``module.fn``), else None."""
    if len(call.args) <= index:
        return None
    arg = call.args[index]
    return arg.id if isinstance(arg, ast.Name) else arg.attr if isinstance(arg, ast.Attribute) else None


def _callee(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")


def _units(tree: ast.Module) -> list[ast.AST]:
    """The module-level functions and the methods of its classes (nested functions are walked inside them)."""
    out: list[ast.AST] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append(node)
        elif isinstance(node, ast.ClassDef):
            out += [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return out


def _launchers(trees: dict[str, ast.Module]) -> dict[str, int]:
    """Functions and methods that hand one of their parameters to a ``.run(...)`` (a pool's, a launcher's): name ->
    the position of that parameter in a call (``DoctorRun.call(self, fn, ...)`` -> {"call": 0}), found again
    through wrappers of wrappers."""
    found: dict[str, int] = {"run": 0}
    changed = True
    while changed:
        changed = False
        for tree in trees.values():
            for fn in _units(tree):
                if fn.name in found:  # type: ignore[attr-defined]
                    continue
                params = [a.arg for a in fn.args.args]
                offset = 1 if params[:1] in (["self"], ["cls"]) else 0
                for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call) and _callee(n) in found):
                    name = _first_arg_name(call, found[_callee(call)])
                    if name in params[offset:]:
                        found[fn.name] = params.index(name) - offset
                        changed = True
                        break
    return found


def _rank_functions(trees: dict[str, ast.Module]) -> set[str]:
    """Every function passed to a pool: as the first argument of a ``.run(...)``, of a wrapper around one
    (:func:`_launchers`), or through a local variable assigned it before (``fn = job; pool.run(fn)``)."""
    launchers = _launchers(trees)
    passed: set[str] = set()
    for tree in trees.values():
        module_level = ast.Module(body=[n for n in tree.body if not isinstance(
            n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))], type_ignores=[])
        for fn in _units(tree) + [module_level]:
            aliases: dict[str, set[str]] = {}
            for node in ast.walk(fn):
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    values = [node.value.body, node.value.orelse] if isinstance(node.value, ast.IfExp) else [node.value]
                    aliases.setdefault(node.targets[0].id, set()).update(
                        v.id if isinstance(v, ast.Name) else v.attr for v in values
                        if isinstance(v, (ast.Name, ast.Attribute)))
            for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call) and _callee(n) in launchers):
                name = _first_arg_name(call, launchers[_callee(call)])
                if name is not None:
                    passed |= {name} | aliases.get(name, set())
    return passed


def _rank_builders(sources: dict[str, str]) -> set[tuple[str, str]]:
    """(module, function) of every module-level function passed to a pool (:func:`_rank_functions`) anywhere in
    ``sources`` whose body, or the body of a function of its module it calls, names a model, dataset, engine or
    gradient-sync builder (:data:`BUILDERS`) or constructs a ``...GradSync`` class, outside suite.workload and
    suite.engine."""
    trees = {m: ast.parse(src) for m, src in sources.items()}
    passed = _rank_functions(trees)
    bad = set()
    for mod, tree in trees.items():
        if mod in ("suite.workload", "suite.engine"):
            continue
        local = {fn.name: fn for fn in tree.body if isinstance(fn, ast.FunctionDef)}
        for name in passed & set(local):
            seen, todo, names, built = set(), [name], set(), set()
            while todo:  # the rank function and the functions of its module it calls, at any depth
                f = local[todo.pop()]
                seen.add(f.name)
                found = {x.id for x in ast.walk(f) if isinstance(x, ast.Name)} | \
                        {x.attr for x in ast.walk(f) if isinstance(x, ast.Attribute)}
                names |= found
                built |= {_callee(c) for c in ast.walk(f) if isinstance(c, ast.Call)}
                todo += [n for n in found & set(local) if n not in seen]
            if names & BUILDERS or any(n.endswith("GradSync") for n in built):
                bad.add((mod, name))
    return bad


def test_no_rank_function_builds_models_or_syncs_outside_the_workload():
    sources = {m: open(p, encoding="utf-8").read() for m, p in _modules().items()}
    assert _rank_builders(sources) - KNOWN_BUILDERS == set()


def test_the_rank_function_rule_finds_a_builder():
    fake = {"suite.x": "def job(n):\n    return get_model('mlp').make(0)\n\ndef go(pool):\n    pool.run(job, {})\n",
            "suite.workload": "def wl_job():\n    return build_engine(1)\n\ndef go(pool):\n    pool.run(wl_job)\n",
            "suite.y": "def helper():\n    return get_model('mlp')\n"}  # not a rank function
    assert _rank_builders(fake) == {("suite.x", "job")}


def test_the_rank_function_rule_finds_one_called_through_a_variable():
    """The doctor's shape before issue 34: ``ctx.call(bucketed_on_rank, ...)``, a method that hands its ``fn`` to
    ``pool.run``, the rank function building its own model (a helper's nn.Sequential) and a BucketedGradSync; and a
    rank function chosen into a variable first."""
    doctor = ("class Run:\n    def call(self, fn, kwargs=None):\n        return self.pool.run(fn, kwargs or {})\n\n"
              "def _net():\n    return torch.nn.Sequential(torch.nn.Linear(2, 2))\n\n"
              "def bucketed_on_rank(config):\n    net = _net()\n    return BucketedGradSync(net, config)\n\n"
              "def item(ctx):\n    return ctx.call(bucketed_on_rank, {})\n")
    chosen = ("def model_on_rank():\n    return get_model('mlp')\n\ndef other_on_rank():\n    return 1\n\n"
              "def go(pool, flag):\n    fn = model_on_rank if flag else other_on_rank\n    return pool.run(fn)\n")
    assert _rank_builders({"suite.doctor": doctor}) == {("suite.doctor", "bucketed_on_rank")}
    assert _rank_builders({"suite.z": chosen}) == {("suite.z", "model_on_rank")}


# ---- imports at module level -------------------------------------------------------------------------------------
# A function-local import of a suite module hides a dependency; it is allowed where the imported module would pull
# one of these packages into a module that does not import it at module level (heavy: torch makes `fleetbench
# --help` take seconds; optional: transformers, pynvml), or where its line says why (e.g. tests replace the name).
HEAVY = {"torch", "numpy", "transformers", "matplotlib", "pynvml", "scipy", "pandas", "jinja2", "asv", "torchvision"}


def _module_level(tree: ast.Module) -> list[ast.stmt]:
    """Import statements run when the module is imported (inside module-level if/try, not under TYPE_CHECKING)."""
    out: list[ast.stmt] = []
    stack = list(tree.body)
    while stack:
        s = stack.pop()
        if isinstance(s, (ast.Import, ast.ImportFrom)):
            out.append(s)
        elif isinstance(s, ast.If) and not (isinstance(s.test, ast.Name) and s.test.id == "TYPE_CHECKING"):
            stack += s.body + s.orelse
        elif isinstance(s, ast.Try):
            stack += s.body + s.orelse + s.finalbody + [x for h in s.handlers for x in h.body]
    return out


def _targets(mod: str, path: str, node: ast.stmt, mods: dict[str, str]) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    assert isinstance(node, ast.ImportFrom)
    pkg = mod if path.endswith("__init__.py") else mod.rsplit(".", 1)[0]
    base = node.module or ""
    if node.level:
        base = ".".join(pkg.split(".")[: len(pkg.split(".")) - node.level + 1] + ([node.module] if node.module else []))
    return [t for t in (f"{base}.{a.name}" for a in node.names) if t in mods] or [base]


def _light_local_imports(sources: dict[str, tuple[str, str]]) -> list[str]:
    """``path:line`` of every function-local import of a suite module (``sources``: module -> (path, text)) that
    pulls no heavy package its module lacks and whose line gives no reason (a comment)."""
    trees = {m: ast.parse(text) for m, (_, text) in sources.items()}
    mods = {m: p for m, (p, _) in sources.items()}
    edges = {m: {t for n in _module_level(t_) for t in _targets(m, mods[m], n, mods)} for m, t_ in trees.items()}
    memo: dict[str, set[str]] = {}

    def heavy(m: str, seen: frozenset = frozenset()) -> set[str]:
        if m not in mods:
            return {m.split(".")[0]} & HEAVY
        if m not in memo:
            parents = {".".join(m.split(".")[:i]) for i in range(1, m.count(".") + 1)}
            memo[m] = set().union(*[heavy(t, seen | {m}) for t in edges[m] | parents if t not in seen | {m}])
        return memo[m]

    bad = []
    for m, tree in trees.items():
        lines = sources[m][1].splitlines()
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for n in ast.walk(fn):
                if isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").startswith("suite")):
                    pulled = set().union(*[heavy(t) for t in _targets(m, mods[m], n, mods)])
                    if not pulled - heavy(m) and "#" not in lines[n.lineno - 1]:
                        bad.append(f"{os.path.relpath(mods[m], ROOT)}:{n.lineno}")
    return sorted(set(bad))


def test_imports_of_suite_modules_are_at_module_level_unless_heavy_or_said():
    sources = {m: (p, open(p, encoding="utf-8").read()) for m, p in _modules().items()}
    assert _light_local_imports(sources) == []


def test_the_import_rule_finds_a_light_local_import():
    root = os.path.join(ROOT, "suite")
    fake = {"suite.a": (os.path.join(root, "a.py"), "import torch\n\ndef f():\n    from .b import g\n    return g\n"),
            "suite.b": (os.path.join(root, "b.py"), "import torch\n\ndef g():\n    pass\n"),
            "suite.c": (os.path.join(root, "c.py"), "def f():\n    from .b import g\n    return g\n"),
            "suite.d": (os.path.join(root, "d.py"), "def f():\n    from .e import h  # why\n    return h\n"),
            "suite.e": (os.path.join(root, "e.py"), "def h():\n    pass\n")}
    # a: b pulls nothing a lacks; c: b pulls torch into c (heavy, allowed); d: light but says why
    assert _light_local_imports(fake) == ["suite/a.py:4"]
