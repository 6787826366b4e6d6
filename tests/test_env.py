"""The environment is honest: the Python floor declared in pyproject.toml (``requires-python``)
is one that every pinned package accepts (their own ``Requires-Python`` metadata, read from the
installed distributions) and that the code itself runs on (``vermin`` reads every source file
for stdlib modules, functions and syntax newer than the floor)."""
from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tomllib

from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Everything Python that the project runs: the package, its tests, the benchmark cases.
SOURCE_DIRS = ("suite", "tests", "bench_cases")


def declared_floor() -> Version:
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as fh:
        spec = tomllib.load(fh)["project"]["requires-python"]
    lows = [Version(s.version) for s in SpecifierSet(spec) if s.operator == ">="]
    assert len(lows) == 1, f"requires-python {spec!r}: expected exactly one '>=X.Y' bound"
    return lows[0]


def pins() -> list[tuple[str, str]]:
    out = []
    with open(os.path.join(REPO, "constraints.txt")) as fh:
        for line in fh:
            line = line.split("#", 1)[0].strip()
            if line:
                name, _, version = line.partition("==")
                assert version, f"constraints.txt: {line!r} is not pinned with =="
                out.append((name.strip(), version.strip()))
    return out


def test_floor_is_one_every_pinned_package_accepts():
    floor = declared_floor()
    assert pins(), "constraints.txt pins nothing"
    refused, not_installed, other_version = [], [], []
    for name, pin in pins():
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            not_installed.append(name)
            continue
        if not SpecifierSet(f"=={pin}").contains(dist.version, prereleases=True):  # 2.13.0+cpu is ==2.13.0
            other_version.append(f"{name} {dist.version} (pinned {pin})")
            continue
        needs = dist.metadata.get("Requires-Python")
        if needs and not SpecifierSet(needs).contains(floor, prereleases=True):
            refused.append(f"{name}=={pin} needs Python {needs}")
    assert not not_installed, f"pinned in constraints.txt but not installed (run `make setup`): {not_installed}"
    assert not other_version, f"installed versions differ from the pins (run `make setup`): {other_version}"
    assert not refused, f"pyproject.toml declares requires-python >= {floor}, but " + "; ".join(refused)


def test_code_needs_no_python_newer_than_the_floor():
    floor = declared_floor()
    target = f"{floor.major}.{floor.minor}"
    # --eval-annotations: StrategyConfig's annotations are evaluated at run time (typing.get_type_hints).
    vermin = os.path.join(os.path.dirname(sys.executable), "vermin")
    assert os.path.exists(vermin), f"vermin is a dev dependency but {vermin} is missing: run `make setup`"
    out = subprocess.run(
        [vermin, "--no-tips", "--processes=1", "--violations", "--eval-annotations",
         f"--target={target}-", *SOURCE_DIRS],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, (
        f"pyproject.toml declares requires-python >= {target}, but the code needs more:\n{out.stdout}{out.stderr}"
    )
