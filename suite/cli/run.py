"""`fleetbench run`: the main job.

For each selected case: a correctness verdict against the reference that fits it, then
throughput measured interleaved with the model's baseline (plain data parallel) in one
process group; speedup stated as speedup (> 1 is faster).  Each case's record is appended
to the results file as soon as it finishes; a table closes the run.

Everything the user typed is validated before any rank starts.  A case whose ranks die or
hang is reported as an error and the run goes on.
"""
from __future__ import annotations

import datetime
import os
import sys
import time
import uuid
from typing import Optional

from ..cases import BASELINE, Case, select_cases
from ..config import ConfigError, StrategyConfig
from suite.measure.timing import measure_on_rank
from suite.measure.trace import trace_on_rank

DEFAULT_RESULTS = os.path.join("results", "runs.jsonl")


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="run cases: correctness verdict, throughput, speedup over plain data parallel")
    p.add_argument("--nproc", type=int, default=2, help="local ranks to spawn (default 2; ignored under torchrun)")
    p.add_argument("--device", choices=("cpu", "cuda"), help="override the device (default: cuda if every "
                   "local rank has a GPU, else cpu)")
    p.add_argument("--case", action="append", default=[], metavar="NAME",
                   help="case name or glob (model/variant, e.g. 'resnet/overlap', '*/local_sgd'); repeatable")
    p.add_argument("--tag", action="append", default=[], help="cases with this tag (default, smoke, nightly-cpu, "
                   "nightly-gpu); repeatable. Without --case/--tag: the 'default' tag")
    p.add_argument("--model", action="append", default=[], help="only cases of this model; repeatable")
    p.add_argument("--config", help="TOML file of strategy fields applied on top of every case")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a strategy field applied on top of every case; repeatable")
    p.add_argument("--steps", type=int, default=5, help="steps per timed window (default 5)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timed rounds (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up steps per case (default 2)")
    p.add_argument("--batch", type=int, default=None, help="per-rank batch size (default: the case's, 16)")
    p.add_argument("--check-steps", type=int, default=3, help="steps of the correctness check (default 3)")
    p.add_argument("--no-check", action="store_true", help="skip the correctness check")
    p.add_argument("--results", default=DEFAULT_RESULTS, help=f"JSON-lines results file (default {DEFAULT_RESULTS})")
    p.add_argument("--timeout", type=float, default=600.0, help="bound on each multi-rank call, seconds")
    p.add_argument("--pg-timeout", type=float, default=120.0, help="bound on each collective wait, seconds")
    p.add_argument("--list", action="store_true", help="list the selected cases and exit")
    p.add_argument("--resume", metavar="RESULTS_FILE_OR_RUN_ID",
                   help="continue an interrupted run: the same selection, skipping the cases already recorded for "
                        "that run id (a results file: its last run; a run id: that run in --results)")
    p.add_argument("--no-utilization", action="store_true", help="do not sample CPU/GPU utilization")
    p.add_argument("--trace-steps", type=int, default=0, metavar="N",
                   help="after timing, run N traced steps per case and write a Chrome/Perfetto trace next to the "
                        "results (traces/RUN_ID/CASE@WORLD.json; default 0: no trace)")
    p.add_argument("--cluster", metavar="NxR:inter=RATE[,intra=RATE]",
                   help="run the ranks on an emulated cluster (network namespaces; root): N nodes of R ranks, "
                        "node links limited to RATE (e.g. 2x2:inter=200mbit); sets --nproc N*R")
    p.set_defaults(func=main)


def _positive(name: str, value: int, low: int = 1) -> None:
    if value < low:
        raise ConfigError(f"--{name} {value}: must be >= {low}")


def resolve_cases(args, world: int, local_world: Optional[int] = None) -> list[tuple[Case, StrategyConfig, Optional[str]]]:
    """Every selected case with its validated config; the reason when it cannot run at ``world``."""
    try:
        cases = select_cases(args.case, args.tag, args.model)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if not cases:
        raise ConfigError("no case matches the selection (--case/--tag/--model); `fleetbench run --list --tag "
                          "nightly-cpu` shows the cases")
    base = StrategyConfig.from_toml(args.config).diff() if args.config else {}
    out = []
    for case in cases:
        try:
            cfg = StrategyConfig.from_dict({**case.config, **base}).with_overrides(args.set)
            why = case.applies_to_world(world)
            if why is None:
                # Under torchrun (local_world given) the hierarchy's nodes default to the real machines.
                cfg.check_world(world, local_world, torchrun=local_world is not None)
        except ConfigError as exc:
            raise ConfigError(f"case {case.name}: {exc}") from None
        out.append((case, cfg, why))
    return out


def main(args) -> int:
    from ..runtime.launch import torchrun_env

    env = torchrun_env()
    cluster_spec = None
    if getattr(args, "cluster", None):
        from ..cluster.launch import apply_cluster_args

        cluster_spec = apply_cluster_args(args, under_torchrun=env is not None)
    world = env.world_size if env else args.nproc
    _positive("nproc", args.nproc)
    for name in ("steps", "rounds", "check_steps"):
        _positive(name.replace("_", "-"), getattr(args, name))
    _positive("warmup", args.warmup, 0)
    _positive("trace-steps", args.trace_steps, 0)
    if args.batch is not None:
        _positive("batch", args.batch)
    # every config validated before any rank starts
    selected = resolve_cases(args, world, env.local_world_size if env else None)
    if args.list:
        for case, cfg, why in selected:
            print(f"{case.name:32s} {','.join(case.tags):40s} {case.description}" + (f"  [skip: {why}]" if why else ""))
        return 0
    _check_results_file(args.results)
    resume = _resolve_resume(args, world) if args.resume else None

    if env:
        from ..runtime.launch import init_from_env
        from ..runtime.torchrun import TorchrunLauncher

        ctx = init_from_env(device=args.device, pg_timeout=args.pg_timeout)
        launcher = TorchrunLauncher(ctx)
        reporter = ctx.rank == 0
    else:
        from ..runtime import RankPool

        cluster_kw, cluster = {}, None
        if cluster_spec is not None:
            from ..cluster.launch import start_cluster

            cluster, cluster_kw = start_cluster(cluster_spec)
        launcher = RankPool(args.nproc, device=args.device, timeout=args.timeout, pg_timeout=args.pg_timeout,
                            **cluster_kw)
        launcher.cluster = cluster  # taken down with the launcher
        reporter = True
    try:
        records = Runner(args, launcher, world, reporter, resume=resume).run(selected)
    finally:
        launcher.close()
        if getattr(launcher, "cluster", None) is not None:
            launcher.cluster.down()
        if env:
            from ..runtime.launch import shutdown

            shutdown()
    if reporter:
        print_table(records)
        print(f"\n{len(records)} record(s) appended to {args.results}")
        if any(r.verdict in ("fail", "error") for r in records):
            return 1
    return 0


def _check_results_file(path: str) -> None:
    """A corrupt results file is an error before any rank starts (nothing in it is touched)."""
    if os.path.exists(path) and os.path.getsize(path):
        from ..results.records import ResultsFileError, read_records

        try:
            read_records(path)
        except ResultsFileError as exc:
            raise ConfigError(f"--results {path}: {exc}; move it aside or pick another --results file") from None


def _resolve_resume(args, world: int) -> tuple[str, set]:
    """(run id, cases already recorded for it) of the run to resume; sets ``args.results``.

    ``--resume`` names a results file (its last run is resumed and new records go to it) or a
    run id in ``--results``.  Every record is read through ``read_records``: a corrupt file is
    an error naming the file and line, and nothing in it is touched.
    """
    from ..results.records import ResultsFileError, read_records

    target = args.resume
    if os.path.exists(target):
        args.results, run_id = target, None
    else:
        run_id = target
    if not os.path.exists(args.results):
        raise ConfigError(f"--resume {target}: no results file {args.results} to resume from")
    try:
        records = read_records(args.results)
    except ResultsFileError as exc:
        raise ConfigError(f"--resume {target}: {exc}") from None
    if run_id is None:
        if not records:
            raise ConfigError(f"--resume {target}: the results file holds no record, nothing to resume")
        run_id = records[-1].run_id
    mine = [r for r in records if r.run_id == run_id]
    if not mine:
        ids = list(dict.fromkeys(r.run_id for r in records))[-5:]
        raise ConfigError(f"--resume {target}: run id {run_id!r} is not in {args.results}; its last runs: "
                          f"{', '.join(ids) or 'none'}")
    worlds = {r.world_size for r in mine}
    if worlds != {world}:
        raise ConfigError(f"--resume {target}: run {run_id} ran at world size {sorted(worlds)}, this one at {world}; "
                          f"resume with the same --nproc")
    # A case that ended in an error is run again; finished ones are kept as they are.
    return run_id, {r.case for r in mine if r.status != "error"}


class Runner:
    def __init__(self, args, launcher, world: int, reporter: bool, resume: Optional[tuple] = None):
        self.args = args
        self.launcher = launcher
        self.world = world
        self.reporter = reporter
        self.run_id = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ-") + uuid.uuid4().hex[:6]
        self.done: set = set()
        if resume is not None:
            self.run_id, self.done = resume
        self.metadata = None

    def say(self, msg: str) -> None:
        if self.reporter:
            print(msg, flush=True)

    def run(self, selected) -> list:
        from ..measure.metadata import collect
        from ..results.records import CaseRecord, append_record

        self.metadata = collect(world_size=self.world)
        if self.done:
            kept = [c.name for c, _, _ in selected if c.name in self.done]
            self.say(f"resuming run {self.run_id}: {len(kept)} case(s) already recorded, skipped: {', '.join(kept)}")
            selected = [(c, cfg, why) for c, cfg, why in selected if c.name not in self.done]
        runnable = [(c, cfg) for c, cfg, why in selected if why is None]
        records = []
        for case, cfg, why in selected:
            if why is not None:
                rec = CaseRecord(case.name, case.model, self.world, cfg.to_dict(), self.run_id, status="skipped",
                                 verdict="skipped", tags=list(case.tags), error=why, metadata=self.metadata,
                                 timestamp=_now())
                self.say(f"  skip  {case.name}: {why}")
                if self.reporter:
                    append_record(self.args.results, rec)
                records.append(rec)
        models = list(dict.fromkeys(c.model for c, _ in runnable))
        total, done = len(runnable), 0
        self.say(f"fleetbench run {self.run_id}: {total} case(s) on {self.world} rank(s); results -> "
                 f"{self.args.results}")
        for model in models:
            group = [(c, cfg) for c, cfg in runnable if c.model == model]
            for rec in self.run_group(model, group, done, total):
                if self.reporter:
                    append_record(self.args.results, rec)
                records.append(rec)
            done += len(group)
        return records

    # -- one model: check each case, then time them all interleaved with the baseline --------
    def run_group(self, model: str, group, done: int, total: int) -> list:
        from ..check.harness import run_check
        from ..results.records import CaseRecord

        checks = {}
        for i, (case, cfg) in enumerate(group):
            t0 = time.perf_counter()
            if self.args.no_check:
                checks[case.name] = None
                continue
            try:
                res = run_check(self.launcher, model, cfg, steps=self.args.check_steps, timeout=self.args.timeout)
                checks[case.name] = res
                verdict = res.verdict if res else "?"
                detail = f" (param err {res.param_error:.2g}, loss err {res.loss_error:.2g})" if res and \
                    res.verdict in ("pass", "fail") else ""
                if res and res.verdict == "fail":
                    detail += f": {res.message}"
            except Exception as exc:  # noqa: BLE001 - a failed case is reported, the run goes on
                checks[case.name] = exc
                verdict, detail = "error", f": {_short(exc)}"
            self.say(f"[{done + i + 1}/{total}] {case.name:28s} check {verdict}{detail} "
                     f"({time.perf_counter() - t0:.1f}s)")

        measured = self.measure(model, group)
        records = []
        for case, cfg in group:
            chk = checks.get(case.name)
            rec = CaseRecord(case.name, model, self.world, cfg.to_dict(), self.run_id, tags=list(case.tags),
                             timestamp=_now(), metadata=self.metadata)
            if isinstance(chk, Exception):
                rec.status, rec.verdict, rec.error = "error", "error", _short(chk, 2000)
            elif chk is not None:
                rec.check = chk.to_dict()
                rec.verdict = chk.verdict
            m = measured.get(case.variant)
            if isinstance(m, Exception):
                rec.status, rec.verdict = "error", "error"
                rec.error = (rec.error + "\n" if rec.error else "") + _short(m, 2000)
            elif m is not None:
                rec.describe = m.pop("describe", {})
                rec.metrics = m
                if self.args.trace_steps and rec.status == "ok":
                    self.trace(case, cfg, rec)
            records.append(rec)
        if self.reporter:
            for rec in records:
                m = rec.metrics
                if m:
                    self.say(f"      {rec.case:28s} {m['samples_per_s']:9.1f} samples/s   speedup "
                             f"{m.get('speedup', float('nan')):.2f}x")
        return records

    def trace(self, case: Case, cfg: StrategyConfig, rec) -> None:
        """A few traced steps of the case on every rank, written as a Chrome/Perfetto trace file."""
        import json

        from ..report.trace import chrome_trace

        try:
            answers = self.launcher.run(trace_on_rank,
                                        dict(model=case.model, config=cfg.to_dict(), steps=self.args.trace_steps,
                                             per_rank_batch=self.args.batch or case.per_rank_batch),
                                        timeout=self.args.timeout)
        except Exception as exc:  # noqa: BLE001 - the timing stands; the trace is reported missing
            rec.metrics["trace_error"] = _short(exc)
            return
        if answers is None or not self.reporter:
            return
        rel = os.path.join("traces", self.run_id, f"{case.name.replace('/', '_')}@{self.world}.json")
        path = os.path.join(os.path.dirname(os.path.abspath(self.args.results)), rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            json.dump(chrome_trace(answers, title=f"{case.name} at world size {self.world}, run {self.run_id}"), fh)
        rec.metrics["trace_file"] = rel

    def measure(self, model: str, group) -> dict:
        """Time every case of ``group`` and the baseline interleaved; on failure, each case alone."""
        from ..measure.stats import busbw, paired_speedup, variant_summary, window_seconds

        base_cfg = StrategyConfig().with_overrides(self.args.set)
        variants = {c.variant: cfg for c, cfg in group}
        variants.setdefault(BASELINE, base_cfg)
        batch = self.args.batch or group[0][0].per_rank_batch
        kwargs = dict(model=model, warmup=self.args.warmup, steps=self.args.steps, rounds=self.args.rounds,
                      per_rank_batch=batch)

        def once(names: list[str]) -> dict:
            from ..measure.utilization import UtilizationSampler

            device = self.args.device or ("cuda" if (self.metadata.get("gpu") or {}).get("available") else "cpu")
            sampler = None if self.args.no_utilization else UtilizationSampler(device=device).start()
            try:
                answers = self.launcher.run(
                    measure_on_rank,
                    dict(kwargs, variants=[{"name": n, "config": variants[n].to_dict()} for n in names]),
                    timeout=self.args.timeout)
            finally:
                if sampler is not None:
                    sampler.stop()
            if answers is None:
                return {n: None for n in names}
            base = window_seconds(answers, BASELINE)
            out = {}
            for n in names:
                s = variant_summary(answers, n, batch * self.world, self.args.steps)
                sp = paired_speedup(base, window_seconds(answers, n))
                s.update(speedup=sp["speedup"], speedup_ci=sp["ci"], baseline=BASELINE,
                         global_batch=batch * self.world, steps_per_window=self.args.steps)
                out[n] = s
            if "none" in out:
                compute = out["none"]["step_time_s"]["median"]
                for s in out.values():
                    s["exposed_comm_s"] = s["step_time_s"]["median"] - compute
                    s["compute_s"] = compute
                    ar = sum(v for k, v in s["comm_bytes_per_step"].items() if k.endswith("/all_reduce"))
                    s["busbw_GBps"] = busbw(ar, s["exposed_comm_s"], self.world) / 1e9
            if sampler is not None:
                util = sampler.summary()
                util["shared_by"] = names  # the variants ran interleaved: one sampling covers them all
                for s in out.values():
                    s["utilization"] = util
            return out

        names = list(variants)
        try:
            return once(names)
        except Exception as exc:  # noqa: BLE001 - fall back to one case at a time
            self.say(f"      interleaved timing of {model} failed ({_short(exc)}); timing each case alone")
        out: dict = {}
        for n in names:
            if n == BASELINE:
                continue
            try:
                pair = once([BASELINE, n])
                out[n] = pair[n]
                out.setdefault(BASELINE, pair[BASELINE])  # the baseline's figures from its first pairing
            except Exception as exc:  # noqa: BLE001
                out[n] = exc
        return out


def _short(exc: BaseException, limit: int = 300) -> str:
    text = f"{type(exc).__name__}: {exc}"
    lines = [ln for ln in text.splitlines() if ln.strip()]
    # The last lines of a rank's traceback say what went wrong.
    text = lines[0] if len(lines) < 3 else lines[0] + " … " + " | ".join(lines[-2:])
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def print_table(records) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="fleetbench run", show_lines=False)
    for col, just in (("case", "left"), ("verdict", "left"), ("samples/s", "right"), ("speedup vs plain", "right"),
                      ("step ms (median, IQR)", "right"), ("collectives/step", "right")):
        table.add_column(col, justify=just)
    for r in records:
        m = r.metrics or {}
        sps = m.get("samples_per_s")
        sp = m.get("speedup")
        ci = m.get("speedup_ci") or [None, None]
        st = m.get("step_time_s") or {}
        calls = m.get("comm_calls_per_step") or {}
        ar = sum(calls.values())  # every collective fleetbench issued (DDP's own are not counted)
        table.add_row(
            r.case,
            r.verdict,
            f"{sps:.1f}" if isinstance(sps, float) else "-",
            f"{sp:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]" if isinstance(sp, float) and ci[0] is not None else "-",
            f"{st['median'] * 1e3:.1f} ({st['iqr'] * 1e3:.1f})" if st.get("n") else "-",
            f"{ar:g}" if m else "-",
        )
    Console(width=max(120, os.get_terminal_size(sys.stdout.fileno()).columns if sys.stdout.isatty() else 120)).print(
        table)
