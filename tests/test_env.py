"""The environment is honest: the Python floor declared in pyproject.toml (``requires-python``)
is one that every pinned package accepts (their own ``Requires-Python`` metadata, read from the
installed distributions) and that the code itself runs on (``vermin`` reads every source file
for stdlib modules, functions and syntax newer than the floor)."""
from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tomllib

import pytest
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


@pytest.mark.heavy  # vermin over every file, ~7 s: make test-slow
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


def _pins_of(path: str) -> dict[str, str]:
    out = {}
    with open(os.path.join(REPO, path)) as fh:
        for line in fh:
            line = line.split("#", 1)[0].strip()
            if "==" in line:
                name, _, version = line.partition("==")
                out[name.strip().lower()] = version.strip()
    return out


def _cuda_side(name: str) -> bool:
    return name.lower().startswith(("nvidia-", "triton", "cuda-"))


def test_torch_floor_is_the_tested_version():
    """pyproject.toml's torch floor is the version constraints.txt pins, the one `make test` runs on."""
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as fh:
        deps = tomllib.load(fh)["project"]["dependencies"]
    (spec,) = [d for d in deps if d.startswith("torch")]
    (floor,) = [s.version for s in SpecifierSet(spec[len("torch"):]) if s.operator == ">="]
    pinned = dict(pins())["torch"]
    assert Version(floor) == Version(pinned), f"pyproject.toml says {spec!r}, constraints.txt pins torch=={pinned}"


def test_gpu_pins_are_those_of_the_committed_dry_run_report():
    """constraints-cuda.txt pins every nvidia-*, triton and cuda-* package that `pip install --dry-run --report`
    resolved for torch's CUDA build (constraints-cuda-report.json), at the report's versions; the report's torch is
    constraints.txt's pin, from the package index, not a +cpu wheel; constraints-cuda.txt refuses the +cpu wheel."""
    report = json.load(open(os.path.join(REPO, "constraints-cuda-report.json")))
    got = {i["metadata"]["name"].lower(): i for i in report["install"]}
    gpu_pins = _pins_of("constraints-cuda.txt")
    every_pin = {**_pins_of("constraints.txt"), **gpu_pins}
    resolved = {n: i["metadata"]["version"] for n, i in got.items() if _cuda_side(n)}
    assert len(resolved) >= 10, sorted(resolved)  # the CUDA runtime, cuDNN, NCCL, cuBLAS, ... and triton
    unpinned = {n: v for n, v in resolved.items() if every_pin.get(n) != v}
    assert not unpinned, f"resolved but not pinned at that version: {unpinned}"
    stale = {n: v for n, v in gpu_pins.items() if n != "torch" and resolved.get(n) != v}
    assert not stale, f"pinned in constraints-cuda.txt but not resolved so by the report: {stale}"
    torch_pin = _pins_of("constraints.txt")["torch"]
    assert got["torch"]["metadata"]["version"] == torch_pin
    assert "+cpu" not in got["torch"]["download_info"]["url"] and got["torch"]["download_info"]["url"].startswith(
        "https://"), got["torch"]["download_info"]["url"]
    text = open(os.path.join(REPO, "constraints-cuda.txt")).read()
    assert f"torch!={torch_pin}+cpu" in text.split()


def _make_n_setup(tmp_path, with_gpu: bool) -> str:
    from tests.fakes import fake_nvidia_smi

    dirs = [d for d in os.environ["PATH"].split(os.pathsep) if d and not os.path.exists(os.path.join(d, "nvidia-smi"))]
    if with_gpu:
        (tmp_path / "smi").mkdir()
        dirs.insert(0, fake_nvidia_smi(tmp_path / "smi"))
    proc = subprocess.run(["make", "-n", "-B", "setup", f"VENV={tmp_path / 'venv'}"], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, PATH=os.pathsep.join(dirs)))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_make_setup_with_nvidia_smi_installs_the_pinned_cuda_build_and_never_the_local_cpu_wheel(tmp_path):
    gpu = _make_n_setup(tmp_path, with_gpu=True)
    (install,) = [ln for ln in gpu.splitlines() if " pip install " in ln and "'.[dev]'" in ln]
    assert "-c constraints.txt -c constraints-cuda.txt" in install and "--find-links" not in install, install
    assert install.startswith("env -u PIP_FIND_LINKS "), install  # the environment's find-links too
    assert "torch.version.cuda" in gpu and "is a CPU wheel on a machine with nvidia-smi" in gpu  # checked after
    cpu = _make_n_setup(tmp_path, with_gpu=False)
    assert "constraints-cuda.txt" not in cpu and "torch.version.cuda" not in cpu
