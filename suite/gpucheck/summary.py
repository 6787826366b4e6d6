"""The GPU check's ``SUMMARY.md``: one row per phase (status, seconds, what to do next), then each phase's numbers
(every doctor item, every premise expected vs observed, every case's verdict and error tail, the plan with the
measured step times to suggest), which docs/gpu.md rows this GPU confirmed and which still need 2 or 8 GPUs, and the
files beside it.  Rewritten as each phase ends."""
from __future__ import annotations

import json
import os
import time
from typing import Any

from ..doctor_report import Report, read_lines
from ..runtime.wheel import first_line

__all__ = ["write_summary", "CONFIRMS", "NEEDS_MORE_GPUS", "FILES", "PHASE_FILES", "ONE_RANK"]

# the files a check leaves beside SUMMARY.md (at most 7; traces as one archive)
FILES = ("env.json", "doctor.jsonl", "premises.json", "runs.jsonl", "traces.tar.gz", "pip-freeze.txt", "stderr.log")
# the files each phase writes (removed before the phase runs again: a reused OUT shows nothing stale)
PHASE_FILES = {1: ("pip-freeze.txt",), 2: ("doctor.jsonl",), 3: ("premises.json",), 4: ("runs.jsonl", "traces.tar.gz")}

# What a collective on one rank proves: NCCL launches no kernel for an in-place sum on a one-rank communicator
# (ncclLaunchOneRank, src/enqueue.cc: a copy only when the buffers differ), so the premises timed on such a
# collective confirm torch's stream plumbing around it (its event, the wait of the current stream), not NCCL's.
ONE_RANK = ("at one rank NCCL launches nothing for an in-place sum (ncclLaunchOneRank): this confirms torch's stream "
            "plumbing around a collective, not NCCL's kernels on their streams")

# docs/gpu.md's rows a single GPU confirms, each with its evidence: a doctor item (name prefix), a premise, or the
# cases of phase 4 ("run")
CONFIRMS = (
    ("issue 22.1 arithmetic that rounds the same on CPU and CUDA",
     (("doctor", "reader device copy"), ("premise", "division on the device"))),
    ("issue 22.3 precision as configuration (TF32)", (("doctor", "precision settings take effect"),)),
    ("issue 22.7 CUDA events vs a synchronized clock", (("doctor", "CUDA event timing vs host clock"),)),
    ("issue 22.7 fused optimizers vs torch.optim on CUDA", (("doctor", "fused optimizers vs torch.optim"),)),
    ("issue 22.7 AMP fp16 and bf16 on CUDA", (("doctor", "AMP against its reference"),)),
    ("issue 22.7 compute fusion on CUDA", (("doctor", "compute fusion against the unfused model"),)),
    ("compute fusion's timing: fused (eager composition) vs unfused (issue 32.6)",
     (("doctor", "compute fusion timing"),)),
    ("issue 22.7 pinned double buffer, identical batches", (("doctor", "reader device copy"),)),
    ("issue 22.7 memory footprint", (("doctor", "memory footprint vs the allocator"),)),
    ("memory window", (("doctor", "memory window"),)),
    ("NVML", (("doctor", "NVML"),)),
    ("post-accumulate hooks: off the main thread, on the stream of their AccumulateGrad node",
     (("premise", "post-accumulate hook: thread and stream"),)),
    ("Work.wait() makes the current stream wait, not the host",
     (("premise", "work.wait() does not block the host"),), ONE_RANK),
    ("collective spans: a synchronous collective runs on the calling stream",
     (("premise", "a synchronous collective runs on the current stream"),), ONE_RANK),
    ("side streams and record_stream (double buffer, hierarchical overlap's streams)",
     (("premise", "side-stream chain and record_stream under a spin"),)),
    ("the memory budget: mem_get_info plus the allocator's reserved-but-free blocks (issue 32.7)",
     (("premise", "mem_get_info vs the caching allocator"),)),
    ("step times from CUDA events, memory and a trace, per case at full size", (("run", ""),)),
)

NEEDS_MORE_GPUS = (
    ("allreduce on each communicator, half precision, bucketed overlap: order across communicators", "2"),
    ("a rank error under NCCL: every communicator aborted, the world rebuilt (issue 22.5)", "2"),
    ("torchrun error path with NCCL", "2"),
    ("hierarchical allreduce with overlap: side streams, no hang within --hang-timeout", "4 (two nodes of 2)"),
    ("issue 22.2: every nightly-gpu case at world size 8, */hierarchical as two nodes of 4", "8"),
    ("the nightly's estimates at world size 8, ab's trial servers of both revisions", "8"),
)


def _cell(text) -> str:
    return str(text if text is not None else "").replace("|", "\\|").replace("\n", " ").strip() or "—"


def _read_json(path: str):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _records(path: str) -> list[dict]:
    try:
        with open(path) as fh:
            return [json.loads(ln) for ln in fh if ln.strip()]
    except (OSError, ValueError):
        return []


def _doctor(path: str) -> Report | None:
    try:
        with open(path, errors="replace") as fh:
            return read_lines(fh.read())
    except OSError:
        return None


def _evidence(kind: str, key: str, doctor: Report | None, premises: list, records: list) -> str | None:
    """pass / fail / None (not measured) for one piece of evidence."""
    if kind == "doctor":
        items = [i for i in (doctor.items if doctor else []) if i.item.startswith(key)]
        if not items or items[0].status == "not applicable here":
            return None
        return "pass" if items[0].status == "pass" else "fail"
    if kind == "premise":
        rows = [r for r in premises if r.get("premise") == key]
        return None if not rows else ("pass" if rows[0].get("ok") else "fail")
    ok = [r for r in records if str(r.get("device", "")).startswith("cuda")]
    return None if not ok else ("pass" if all(r.get("verdict") == "pass" for r in ok) else "fail")


def write_summary(c: Any) -> None:
    """``c``: the running :class:`suite.gpucheck.phases.Check` (its options, phases, facts and files)."""
    out = c.out
    host, v = c.facts.get("host") or {}, c.facts.get("versions") or {}
    doctor = _doctor(os.path.join(out, "doctor.jsonl"))
    premises = _read_json(os.path.join(out, "premises.json")) or []
    records = _records(os.path.join(out, "runs.jsonl"))
    gpus = sorted({g.get("name", "?") for g in host.get("gpus") or []})
    code = c.exit_code()
    L = [f"# .ci/gpu-check --device {c.opts.device}: {', '.join(gpus) or 'no GPU'} "
         f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(c.started))})", ""]
    meaning = {0: "every phase passed or did not apply", 1: "a phase failed, hit its bound or could not run",
               2: c.fatal or ""}
    L.append(f"**Exit {code}**: {meaning[code]}")
    if v:
        L.append(f"- {first_line(v['torch'], v.get('cuda'), c.driver)}")
    it = c.interpreter
    if it:
        L.append(f"- phases ran under `{it.path or '-'}`: {it.how}; torch {it.torch or '-'}"
                 + (f"; it lacks {', '.join(it.missing)}" if it.missing else ""))
        L += [f"  - not chosen: {t}" for t in it.tried]
    L += [f"- note: {n}" for n in c.notes]
    L += ["", "| # | phase | status | s | what to do next |", "|---|---|---|---|---|"]
    for n in sorted(c.results):
        p = c.results[n]
        L.append(f"| {n} | {p.name} | {p.status} | {p.seconds:.1f} | {_cell(p.next)} |")

    L += ["", "## 0 host facts", ""]
    drv = host.get("driver") or {}
    for g in host.get("gpus") or []:
        L.append(f"- {g.get('name')}: compute capability {g.get('capability')}, memory {g.get('memory_total')} "
                 f"({g.get('memory_used')} used), driver {g.get('driver')}")
    L.append(f"- NVIDIA driver {drv.get('driver') or '-'} (supports CUDA {drv.get('cuda') or '-'}), "
             f"{drv.get('gpus', 0)} GPU(s)" if c.driver is not None else "- no nvidia-smi (no NVIDIA driver)")
    L.append(f"- {host.get('cores_usable')} of {host.get('cores')} cores, "
             f"{(host.get('memory_kib') or 0) / 2**20:.0f} GiB memory, {host.get('os')}")

    if v:
        tf = v.get("tf32_defaults") or {}
        L += ["", "## 1 versions", "",
              f"- torch {v.get('torch')} ({v.get('wheel')} wheel), CUDA {v.get('cuda') or '-'}, cuDNN "
              f"{v.get('cudnn') or '-'}, NCCL {v.get('nccl') or '-'}; CUDA available: {v.get('cuda_available')}"
              + (f" ({v.get('cuda_init_error')})" if v.get("cuda_init_error") else ""),
              f"- TF32 defaults: matmul {tf.get('matmul_allow_tf32')}, cuDNN {tf.get('cudnn_allow_tf32')}, "
              f"float32_matmul_precision {tf.get('float32_matmul_precision')!r}"]
        L += [f"- device {i}: {d.get('name')}, capability {d.get('capability')}" if isinstance(d, dict) else
              f"- device {i}: {d}" for i, d in enumerate(v.get("devices") or [])]

    if doctor:
        ended = f"{doctor.seconds:.1f} s" if doctor.complete else f"stopped after {len(doctor.items)} item(s)"
        L += ["", f"## 2 doctor ({doctor.platform}, {ended})", "", f"{doctor.versions.get('wheel_line', '')}", "",
              "| item | result | s | numbers |", "|---|---|---|---|"]
        L += [f"| {_cell(i.item)} | {i.status} | {i.seconds:.1f} | {_cell(i.numbers)} |" for i in doctor.items]
    if premises:
        L += ["", "## 3 premises (1-rank NCCL)", "", "| premise | expected | observed | verdict |", "|---|---|---|---|"]
        L += [f"| {_cell(r.get('premise'))} | {_cell(r.get('expected'))} | {_cell(r.get('observed'))} | "
              f"{'as expected' if r.get('ok') else 'NOT as expected'} |" for r in premises]
    if records or 4 in c.results:
        L += ["", "## 4 cases (one per strategy family, world size 1)", "",
              "| case | verdict | step ms (median) | peak MiB | error tail |", "|---|---|---|---|---|"]
        for r in records:
            m = r.get("metrics") or {}
            med = (m.get("step_time_s") or {}).get("median")
            peak = m.get("peak_memory_bytes")
            L.append(f"| {r.get('case')} | {r.get('verdict')} ({r.get('status')}) | "
                     f"{'' if med is None else f'{med * 1e3:.1f}'} | "
                     f"{'' if peak is None else f'{peak / 2**20:.0f}'} | {_cell((r.get('error') or '')[-300:])} |")
        p4 = c.results.get(4)
        for call in (p4.details.get("calls", []) if p4 else []):
            if call.get("status"):
                what = call["status"]
            elif call.get("timed_out"):
                what = "killed at its share of the cap"
            elif call.get("exit") not in (0, None):
                what = f"exit {call['exit']}"
            else:
                continue
            extra = call.get("tail") or call.get("why")
            L.append(f"- {call['model']}: {what}" + (f": {_cell(extra)}" if extra else ""))
    steps = c.facts.get("step_times")
    if c.facts.get("plan") or steps:
        L += ["", "## 5 plan", ""]
        if steps:
            L += ["Suggested estimates (seconds per step at world size 1; `nightly --plan --step-times FILE`):", "",
                  "```json", json.dumps({"models": steps.get("models"), "cases": steps.get("cases")}, indent=1), "```",
                  ""]
        L += ["```", (c.facts.get("plan") or "").strip()[-6000:], "```"]

    nccl = {k: v for k, v in sorted((c.nccl or {}).items()) if v}
    if nccl:
        L += ["", "## NCCL's own lines (NCCL_DEBUG=WARN, written into NCCL_DEBUG_FILE: the first of each phase here, "
                  "all of them in stderr.log)", ""]
        for number, lines in nccl.items():
            L += [f"phase {number}:", "", "```", *lines, "```", ""]

    L += ["", "## docs/gpu.md rows", ""]
    confirmed: list[str] = []
    plumbing: list[str] = []
    open_rows: list[str] = []
    for row, evidence, *caveat in CONFIRMS:
        got = [_evidence(k, key, doctor, premises, records) for k, key in evidence]
        if got and all(g == "pass" for g in got) and c.opts.device == "cuda":
            (plumbing if caveat else confirmed).append(row)
        else:
            why = "failed here" if "fail" in got else "not measured here"
            open_rows.append(f"{row} ({why})")
    L += ["Confirmed on this GPU:", ""] + ([f"- {r}" for r in confirmed] or [
        "- none" + (" (--device cpu: no GPU was asked for)" if c.opts.device == "cpu" else "")])
    if plumbing:
        L += ["", f"Seen on one rank, not confirmed for NCCL ({ONE_RANK}; 2 GPUs confirm them):", ""]
        L += [f"- {r}" for r in plumbing]
    L += ["", "Not confirmed by this run:", ""] + ([f"- {r}" for r in open_rows] or ["- none"])
    L += ["", "Still need more GPUs (NCCL refuses two ranks on one GPU):", ""]
    L += [f"- {row}: {n} GPUs" for row, n in NEEDS_MORE_GPUS]
    L += ["", "## files", ""]
    L += [f"- `{f}`" for f in FILES if os.path.exists(os.path.join(out, f))]
    c.dir.write("SUMMARY.md", "\n".join(L) + "\n")
