"""`python -m experiments.costmodel predict`: the cost model's command line (its --help: ``ABOUT``).

The variants predicted are ``experiments.costmodel.simulate.PREDICTED``; a profile is measured by
``experiments.costmodel.profile`` or read from JSON as saved."""
from __future__ import annotations

import functools
import json
import math
import os
import stat
import sys
from dataclasses import dataclass

from suite.cli import error, helps
from suite.cli.checks import require_nproc, require_writable
from suite.cli.options import add_fields, add_shared, from_args
from suite.cluster.spec import ClusterSpecError, parse_cluster
from suite.outputs import write_atomic
from suite.results.records import plain
from suite.run_spec import SIZES
from suite.validate import spec

from . import costmodel as cm
from .calibrate import Calibration
from .simulate import Profile, predict_step, predict_table, registry_settings

MAX_PROFILE_BYTES = 64 * 2**20  # a profile is a few KB; refuse to read a huge file (or a device) whole
fail = functools.partial(error, "predict")


@dataclass(frozen=True)
class PredictOptions:
    """predict's own numbers, each declared once (flag, default, help and bounds: checked by ``from_args``)."""

    per_rank_batch: int | None = spec(None, "default: the model's at its size", ge=1)
    size: str = spec("cpu", "model size (default cpu)", choices=SIZES)
    inter_lat: float = spec(100.0, "alpha of an inter-node message step, µs (100)", ge=0.0, unit="µs")
    intra_lat: float = spec(50.0, "alpha of an intra-node message step, µs (50)", ge=0.0, unit="µs")
    bucket_mb: float = spec(16.0, "bucket size of the fused variants, MiB", gt=0.0, unit="MiB")
    local_sgd_k: int = spec(4, "Local SGD averaging period of local_sgd's row", ge=1)


# --help's description: what the command does, for its users (the docstring above is for developers)
ABOUT = """`python -m experiments.costmodel predict`: predicted step time, throughput and scaling efficiency of
each strategy the cost model covers (plain, fusion, overlap, multicomm, hierarchical, local_sgd) on a cluster of
any size.

The model's compute profile is measured (--model: ranks on this machine train without gradient
communication) or read (--profile, a JSON file --save-profile wrote).  The cluster is only modelled;
nothing is emulated."""


def add_parser(sub) -> None:
    p = sub.add_parser("predict", help="predict step time per communication setting on a cluster (cost model)",
                       **helps(ABOUT, """
    python -m experiments.costmodel predict --cluster 8x8:inter=100gbit,intra=2400gbit --profile mlp.json
    python -m experiments.costmodel predict --cluster 2x2:inter=200mbit --model mlp --save-profile mlp.json"""))
    add_shared(p, cluster=dict(required=True, help="the cluster to predict, e.g. 64x8:inter=200gbit,intra=2400gbit"))
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--profile", help="a profile JSON file (as written by --save-profile)")
    src.add_argument("--model", help="measure a profile of this model now (a registry name such as resnet50 or "
                     "mlp, or module:function)")
    add_shared(p, nproc="ranks that measure the profile at once (default: ranks per node, at most 4)")
    add_fields(p, PredictOptions, "per_rank_batch", "size")
    p.add_argument("--save-profile", help="write the measured profile here")
    add_fields(p, PredictOptions, "inter_lat", "intra_lat")
    p.add_argument("--calibration", help="fitted terms of this emulated cluster (python -m experiments.costmodel "
                   "calibrate --cluster SPEC --out FILE): calibrated latency per message size, intra-node phases, CPU "
                   "contention; its shape and rates must be --cluster's")
    add_fields(p, PredictOptions, "bucket_mb", "local_sgd_k")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    p.set_defaults(func=main)


def measure_profile(model: str, nproc: int, per_rank_batch: int | None, size: str = "cpu",
                    timeout: float = 600.0) -> dict:
    from suite.runtime import RankPool  # at call time: tests replace it
    from suite.workload import WorkloadSpec

    from .profile import record_profile, summarize_profile

    with RankPool(nproc, timeout=timeout) as pool:
        answers = pool.run(record_profile, {"workload_spec": WorkloadSpec(model, size, per_rank_batch)})
    return summarize_profile(answers)


def read_json_file(path: str):
    """The JSON value in the regular file ``path``; ValueError saying what is wrong (missing, a
    directory or device, too large, not UTF-8 text, not JSON)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ValueError(exc.strerror or str(exc)) from None
    if stat.S_ISDIR(st.st_mode):
        raise ValueError("is a directory; give a profile JSON file")
    if not stat.S_ISREG(st.st_mode):
        raise ValueError("is not a regular file (a device or a pipe); give a profile JSON file")
    if st.st_size > MAX_PROFILE_BYTES:
        raise ValueError(f"is {st.st_size} bytes; a profile is at most {MAX_PROFILE_BYTES // 2**20} MiB")
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except OSError as exc:
        raise ValueError(exc.strerror or str(exc)) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise ValueError("not usable JSON: nested too deeply") from None


def main(args) -> int:
    try:
        spec = parse_cluster(args.cluster, emulate=False)
    except ClusterSpecError as exc:
        return fail(str(exc))
    opts = from_args(PredictOptions, args)  # every number's bounds, before anything is measured
    require_nproc(args.nproc)
    if args.profile:
        try:
            profile = Profile.from_dict(read_json_file(args.profile))
        except ValueError as exc:
            return fail(f"--profile {args.profile!r}: {exc}")
    else:
        from suite.models import ModelError, model_info

        try:
            model_info(args.model, opts.size)  # a user's factory runs in a child process
        except ModelError as exc:
            return fail(str(exc))
        require_writable("--save-profile", args.save_profile)  # found out now, not after the measurement
        nproc = args.nproc if args.nproc is not None else min(4, spec.ranks_per_node)
        raw = measure_profile(args.model, nproc, opts.per_rank_batch, opts.size)
        if args.save_profile:
            try:
                write_atomic(args.save_profile, json.dumps(raw, indent=1))
            except OSError as exc:  # the measurement is kept: printed instead
                print(json.dumps(raw), file=sys.stderr)
                return fail(f"--save-profile {args.save_profile!r}: {exc.strerror or exc}; the measured profile "
                            f"is printed above")
        profile = Profile.from_dict(raw)
    cluster = cm.Cluster(spec.nodes, spec.ranks_per_node, spec.inter_bps / 8,
                         spec.intra_bps / 8 if spec.intra_bps else math.inf,
                         opts.inter_lat * 1e-6, opts.intra_lat * 1e-6)
    note = f"alpha inter {opts.inter_lat:g} µs, intra {opts.intra_lat:g} µs"
    if getattr(args, "calibration", None):
        try:
            cal = Calibration.from_dict(read_json_file(args.calibration))
        except (ValueError, TypeError) as exc:
            return fail(f"--calibration {args.calibration!r}: {exc}")
        if cal.cluster != str(spec):
            return fail(f"--calibration {args.calibration!r} was fitted on {cal.cluster}, not {spec}: calibrate "
                        f"on the cluster predicted (python -m experiments.costmodel calibrate --cluster {spec} --out "
                        f"FILE)")
        cluster = cal.cluster_model()
        note = f"calibrated terms of {args.calibration}"
    rows = registry_settings(opts.bucket_mb, opts.local_sgd_k)
    if args.json:
        print(json.dumps([predict_step(profile, cluster, cfg, name) for name, cfg in rows], indent=1))
        return 0
    print(f"Predicted on {spec} ({note}; model {plain(profile.model or '?')}, "
          f"{len(profile.params)} gradients, {profile.grad_bytes / 2**20:.1f} MiB, compute "
          f"{profile.compute_s * 1e3:.1f} ms per step of {profile.per_rank_batch} samples per rank). The registry's "
          f"variants, fused ones at {opts.bucket_mb:g} MiB, local_sgd at k={opts.local_sgd_k}. Rates are link payload "
          f"rates; the model is an extrapolation, not a measurement.\n")
    print(predict_table(profile, cluster, rows))
    return 0
