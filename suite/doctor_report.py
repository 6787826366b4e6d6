"""The doctor's report: its items and their one JSON form, torch-free (the GPU check reads it under any python3).

``fleetbench doctor --json [FILE]`` streams the report as JSON lines, each written as it is known, so a doctor
killed at its bound (or by a workflow's timeout) leaves every item that ended before:

1. a head ``{"kind": "fleetbench.doctor", "version": 1, "platform": ..., "nproc": ..., "versions": {...}}``;
2. one line per item as it ends ``{"item": ..., "status": ..., "numbers": ..., "seconds": ...}``;
3. the end ``{"end": true, "ok": ..., "seconds": ..., "versions": {...}}`` (the versions again, with what the items
   found, e.g. the driver NVML reports; the end line is missing when the doctor did not finish).

:func:`read_lines` folds such a stream back into one :class:`Report` (``complete`` False without its end line).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

__all__ = ["Item", "Report", "PASS", "FAIL", "NA", "KIND", "head_line", "item_line", "end_line", "read_lines",
           "format_table"]

PASS, FAIL, NA = "pass", "fail", "not applicable here"
KIND, VERSION = "fleetbench.doctor", 1


@dataclass
class Item:
    item: str
    status: str
    numbers: str
    seconds: float = 0.0


@dataclass
class Report:
    platform: str
    nproc: int
    versions: dict
    items: list[Item] = field(default_factory=list)
    seconds: float = 0.0
    complete: bool = True  # False: read from a stream that has no end line (the doctor was stopped)

    @property
    def ok(self) -> bool:
        return self.complete and not any(i.status == FAIL for i in self.items)

    @property
    def failed(self) -> list[str]:
        return [i.item for i in self.items if i.status == FAIL]


def _line(obj: dict) -> str:
    return json.dumps(obj, default=str) + "\n"


def head_line(report: Report) -> str:
    return _line({"kind": KIND, "version": VERSION, "platform": report.platform, "nproc": report.nproc,
                  "versions": report.versions})


def item_line(item: Item) -> str:
    return _line(asdict(item))


def end_line(report: Report) -> str:
    return _line({"end": True, "ok": report.ok, "seconds": round(report.seconds, 2), "versions": report.versions})


def read_lines(text: str) -> Report | None:
    """The report a ``--json`` stream holds (lines that are not the doctor's are skipped), or None without its head
    line."""
    report: Report | None = None
    for ln in text.splitlines():
        try:
            obj = json.loads(ln)
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        if obj.get("kind") == KIND:
            report = Report(str(obj.get("platform")), int(obj.get("nproc") or 0), dict(obj.get("versions") or {}),
                            complete=False)
        elif report is not None and "item" in obj and "status" in obj:
            report.items.append(Item(str(obj["item"]), str(obj["status"]), str(obj.get("numbers", "")),
                                     float(obj.get("seconds") or 0.0)))
        elif report is not None and obj.get("end") is True:
            report.seconds, report.complete = float(obj.get("seconds") or 0.0), True
            report.versions.update(obj.get("versions") or {})
    return report


def format_table(report: Report) -> str:
    v = report.versions
    head = (f"fleetbench doctor: {v.get('wheel_line', '')}; {report.platform}, {report.nproc} ranks; "
            f"NCCL {v.get('nccl') or '-'}, Python {v.get('python')}, commit {v.get('commit')}")
    rows = [("item", "result", "s", "numbers")] + [(i.item, i.status, f"{i.seconds:.1f}", i.numbers)
                                                   for i in report.items]
    w = [max(len(r[k]) for r in rows) for k in range(3)]
    lines = [head, ""]
    for n, r in enumerate(rows):
        lines.append(f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:>{w[2]}}  {r[3]}")
        if n == 0:
            lines.append(f"{'-' * w[0]}  {'-' * w[1]}  {'-' * w[2]}  {'-' * 40}")
    failed = report.failed
    lines += ["", f"{'FAIL: ' + ', '.join(failed) if failed else 'all checks passed'} "
                  f"({len(report.items)} items, {report.seconds:.0f} s)"]
    return "\n".join(lines)
