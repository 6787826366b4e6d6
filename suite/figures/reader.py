"""Reader figures: a data-bound case (a small model, a costly decode and augmentation) with each
reader option on its own and all together: samples/s and the time each step waits for data."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from ..measure.reader_timing import ReaderTiming, measure_reader_on_rank
from ..measure.stats import bootstrap_median_ci, describe, paired_speedup, window_seconds
from ..workload import WorkloadSpec

DESCRIPTION = "reader options in a data-bound case: samples/s, data wait per step (plain vs each option)"

MODEL = "resnet"
PER_RANK_BATCH = 16
DATASET_SIZE = 256
DECODE_WORK = 24  # passes of the costly augmentation per sample: decode ≈ compute per step on this CPU
WORKERS = 2

VARIANTS = [
    ("plain", {}),
    ("uint8 to device", {"reader_return_uint8": True}),
    ("double buffer", {"use_double_buffer": True}),
    ("infinite", {"use_infinite_reader": True}),
    (f"{WORKERS} workers", {"reader_num_workers": WORKERS}),
    (f"{WORKERS} workers + infinite", {"reader_num_workers": WORKERS, "use_infinite_reader": True}),
    ("all", {"reader_return_uint8": True, "use_double_buffer": True, "use_infinite_reader": True,
             "reader_num_workers": WORKERS}),
]


@dataclass(frozen=True)
class Options:
    nproc: int = 2
    rounds: int = 7
    timeout: float = 1800.0  # bound on each multi-rank call, seconds


def measure(options: Options, pool) -> dict:
    """Every reader variant's windows, data waits and step times on the ranks (JSON-able)."""
    answers = pool.run(measure_reader_on_rank,
                       dict(workload_spec=WorkloadSpec(MODEL, per_rank_batch=PER_RANK_BATCH, dataset_size=DATASET_SIZE),
                            variants=[{"name": n, "config": c} for n, c in VARIANTS], warmup=1,
                            rounds=options.rounds, epochs_per_window=1, decode_work=DECODE_WORK))
    return {"world": pool.nproc, "answers": [a.to_dict() for a in answers]}


def _ms(seconds: float | None) -> str:
    return f"{1e3 * seconds:.1f}" if seconds is not None else "-"


def render(raw: dict, options: Options) -> str:
    answers, world = [ReaderTiming.from_dict(a) for a in raw["answers"]], raw["world"]
    steps = answers[0].steps_per_window
    gb = PER_RANK_BATCH * world
    base = window_seconds(answers, "plain")
    first = answers[0].variants
    lines = [
        f"**Reader, data-bound** ({MODEL}, {world} ranks, batch {PER_RANK_BATCH} per rank, dataset "
        f"{DATASET_SIZE} zlib-compressed images, augmentation {DECODE_WORK} passes per sample; a window is one epoch "
        f"= {steps} steps, {options.rounds} interleaved rounds; "
        f"workers are {first[VARIANTS[-1][0]].worker_kind}s here)",
        "",
        "| reader | samples/s [95% CI] | speedup vs plain | data wait per step, median (IQR) ms | "
        "step time median ms |",
        "|---|---|---|---|---|",
    ]
    for name, _ in VARIANTS:
        w = window_seconds(answers, name)
        xs = [gb * steps / t for t in w]
        lo, hi = bootstrap_median_ci(xs)
        sp = paired_speedup(base, w)
        waits = describe([t for a in answers for t in a.variants[name].data_wait_s])
        st = describe([t for a in answers for t in a.variants[name].step_times])
        lines.append(
            f"| {name} | {statistics.median(xs):,.0f} [{lo:,.0f}, {hi:,.0f}] | "
            f"{sp['speedup']:.2f} [{sp['ci'][0]:.2f}, {sp['ci'][1]:.2f}] | "
            f"{_ms(waits.median)} ({_ms(waits.q25)}–{_ms(waits.q75)}) | {_ms(st.median)} |"
        )
    lines += [
        "",
        "Speedup > 1 is faster. Data wait = time the training loop spent getting the step's batch (decode, "
        "augmentation and copy when nothing was prefetched). Background pipelines keep prefetching during the "
        "other variants' windows, so they may start a window with a batch or two ready (see "
        "docs/local-sgd-and-reader.md). On CPU the uint8 option saves only the host-side float conversion "
        "(there is no host-to-device copy to shrink), and the pinned-memory/side-stream part of the double "
        "buffer does not exist.",
    ]
    return "\n".join(lines)
