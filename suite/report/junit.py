"""JUnit XML of fleetbench's verdicts, for the test views of CI systems (GitHub Actions, GitLab, Jenkins, Buildkite).

One ``<testcase>`` per verdict: ``run`` one per case × world size, ``doctor`` one per item, ``ab`` one per
comparison (case × world size), the nightly one per stage plus its stages' own suites.  The commands build
:class:`TestCase` values from their typed results (the ``*_cases`` functions below: every mapping rule is here)
and :func:`write_junit` writes them; nothing else in the suite writes JUnit.

=========================================================  ==========================================
fleetbench                                                 JUnit
=========================================================  ==========================================
pass, same, faster; n/a (no correctness verdict: it says   passed (n/a: why, in ``<system-out>``)
why)
fail; an ab comparison with a failure (slower, structure   ``<failure message=…>``
changed, check worse, HEAD errors)
error                                                      ``<error message=…>``
skipped, not_run, inconclusive, "not applicable here"      ``<skipped message=…>``: the reason
=========================================================  ==========================================

The XML is checked against Jenkins' ``junit-10.xsd`` (``tests/data/junit-10.xsd``, ``tests/test_junit.py``): the
schema pytest's own tests validate ``--junitxml`` with.  Text that XML 1.0 cannot hold (control characters of a
rank's traceback, ANSI colours) is replaced with U+FFFD, so the file always parses.
"""
from __future__ import annotations

import datetime
import os
import re
import socket
import stat
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from ..outputs import open_input, write_atomic
from ..results.records import CaseRecord

__all__ = ["TestCase", "Suite", "to_xml", "write_junit", "path_problem", "merge_files", "record_cases",
           "doctor_cases", "ab_cases", "stage_case", "MAX_MESSAGE"]

Outcome = Literal["passed", "failure", "error", "skipped"]
MAX_MESSAGE = 1000  # characters of the message attribute; the whole text goes in the element's body
MAX_MERGED_BYTES = 64 * 2**20  # a stage's JUnit file read by the nightly

# XML 1.0's characters: tab, newline, carriage return, and U+0020 on (without surrogates and U+FFFE/U+FFFF)
_NOT_XML = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


@dataclass(frozen=True)
class TestCase:
    """One verdict: ``name`` (e.g. ``mlp/overlap@2``), ``classname`` (the group a CI view files it under, e.g.
    ``fleetbench.run.mlp``), the outcome, its message (the reason for any outcome but passed), the seconds it
    took, and more text for the element's body (``details``) or ``<system-out>`` (``output``)."""

    __test__ = False  # not a pytest class, whatever its name

    name: str
    classname: str
    outcome: Outcome = "passed"
    message: str = ""
    seconds: float = 0.0
    details: str = ""
    output: str = ""


@dataclass(frozen=True)
class Suite:
    """One ``<testsuite>``: its cases and a few properties (``run_id``, ``world_size`` …)."""

    name: str
    cases: tuple[TestCase, ...] = ()
    properties: tuple[tuple[str, str], ...] = ()
    timestamp: str = field(default_factory=lambda: datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))


def _text(value: Any, limit: int | None = None) -> str:
    text = _NOT_XML.sub("\ufffd", str(value))
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def _seconds(s: float) -> str:
    """A duration as the schema's SUREFIRE_TIME wants it: digits, a point, three decimals (never nan or negative)."""
    return f"{s:.3f}" if isinstance(s, (int, float)) and s == s and 0 <= s < 1e12 else "0.000"


def _counts(cases: Sequence[TestCase]) -> dict[str, str]:
    n = {o: sum(c.outcome == o for c in cases) for o in ("failure", "error", "skipped")}
    return {"tests": str(len(cases)), "failures": str(n["failure"]), "errors": str(n["error"]),
            "skipped": str(n["skipped"]), "time": _seconds(sum(c.seconds for c in cases))}


def _suite_element(suite: Suite) -> ET.Element:
    el = ET.Element("testsuite", {"name": _text(suite.name), **_counts(suite.cases), "timestamp": suite.timestamp,
                                  "hostname": _text(socket.gethostname())})
    if suite.properties:
        props = ET.SubElement(el, "properties")
        for k, v in suite.properties:
            ET.SubElement(props, "property", {"name": _text(k), "value": _text(v)})
    for c in suite.cases:
        tc = ET.SubElement(el, "testcase", {"classname": _text(c.classname), "name": _text(c.name),
                                            "time": _seconds(c.seconds)})
        if c.outcome != "passed":
            tag = {"failure": "failure", "error": "error", "skipped": "skipped"}[c.outcome]
            sub = ET.SubElement(tc, tag, {"message": _text(c.message or c.outcome, MAX_MESSAGE),
                                          **({} if tag == "skipped" else {"type": tag})})
            body = c.details or (c.message if len(c.message) > MAX_MESSAGE else "")
            if body:
                sub.text = _text(body)
        if c.output:
            ET.SubElement(tc, "system-out").text = _text(c.output)
    return el


def to_xml(suites: Iterable[Suite | ET.Element], name: str = "fleetbench") -> str:
    """The document: ``<testsuites>`` around each suite (a :class:`Suite`, or a ``<testsuite>`` element read from
    another file: :func:`merge_files`), with the totals."""
    root = ET.Element("testsuites", {"name": _text(name)})
    totals = dict.fromkeys(("tests", "failures", "errors"), 0)
    seconds = 0.0
    for s in suites:
        el = _suite_element(s) if isinstance(s, Suite) else s
        root.append(el)
        for k in totals:
            totals[k] += int(el.get(k) or 0)
        try:
            seconds += float(el.get("time") or 0)
        except ValueError:
            pass
    root.attrib.update({k: str(v) for k, v in totals.items()}, time=_seconds(seconds))
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True).decode("utf-8") + "\n"


def path_problem(option: str, path: str, other_outputs: Sequence[str] = ()) -> str | None:
    """Why ``path`` cannot take a JUnit file (checked before any work starts), or None: a directory, a symbolic
    link, something other than a regular file, one of the command's other outputs (``other_outputs``, e.g. the
    results file), or a place that cannot be written."""
    if not path:
        return f"{option}: an empty path; give a file, e.g. junit.xml"
    if os.path.islink(path):
        return f"{option} {path}: is a symbolic link; give the file itself, so the XML is written where you pointed"
    if os.path.isdir(path):
        return f"{option} {path}: is a directory; give a file, e.g. {os.path.join(path, 'junit.xml')}"
    if os.path.exists(path) and not stat.S_ISREG(os.stat(path).st_mode):
        return f"{option} {path}: is not a regular file (a FIFO, device or socket); give an .xml file"
    for other in other_outputs:
        if other and os.path.abspath(other) == os.path.abspath(path):
            return f"{option} {path}: is also this command's {other!r} output; give the JUnit XML its own file"
    where = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(where):  # created when written
        where = os.path.dirname(where)
    if not os.path.isdir(where) or not os.access(where, os.W_OK | os.X_OK):
        return f"{option} {path}: {where} is not a writable directory"
    return None


def write_junit(path: str, suites: Iterable[Suite | ET.Element], name: str = "fleetbench") -> None:
    """The one place JUnit XML is written: whole or not at all, over any earlier file, parents created."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_atomic(path, to_xml(suites, name))


def merge_files(paths: Iterable[str]) -> tuple[list[ET.Element], list[str]]:
    """The ``<testsuite>`` elements of JUnit files a stage wrote (fleetbench's, pytest's ``--junitxml``), and a
    line per file that is missing or unreadable (its stage said why, or did not get that far)."""
    suites: list[ET.Element] = []
    problems: list[str] = []
    for path in paths:
        if not os.path.lexists(path):
            problems.append(f"{path}: not written")
            continue
        try:
            with open_input(path, "JUnit XML file", MAX_MERGED_BYTES) as fh:  # a FIFO is refused, never read
                root = ET.parse(fh).getroot()
        except (OSError, ValueError, ET.ParseError) as exc:
            problems.append(f"{path}: not read ({exc})")
            continue
        found = [root] if root.tag == "testsuite" else root.findall("testsuite") if root.tag == "testsuites" else []
        if not found:
            problems.append(f"{path}: no <testsuite> in it (root <{root.tag}>)")
        suites += found
    return suites, problems


# ---- the commands' results as test cases ----------------------------------------------------------------------

def record_cases(records: Iterable[CaseRecord], seconds: dict[str, float] | None = None) -> list[TestCase]:
    """``fleetbench run``'s records: one test case per case × world size; ``seconds`` per case name (its check,
    its share of the interleaved timing, its trace)."""
    out = []
    for r in records:
        v = r.verdict
        check = r.check
        message = r.error or (check.message if check is not None else "") or ""
        output = [f"run {r.run_id}, {r.device or 'cpu'}/{r.backend or '-'}, size {r.size}, status {r.status}"]
        sps = r.metrics.samples_per_s
        if isinstance(sps, float):
            sp = r.metrics.speedup
            output.append(f"{sps:.1f} samples/s" + (f", speedup {sp:.2f}x over the baseline"
                                                    if isinstance(sp, float) else ""))
        if check is not None and v in ("pass", "fail"):
            output.append(f"check: param err {check.param_error:.3g}, loss err {check.loss_error:.3g}")
        if r.fallback:
            output.append(f"timed alone: {r.fallback}")
        if v in ("pass", "n/a") and r.status == "ok":
            outcome: Outcome = "passed"
            if v == "n/a":
                output.append("no correctness verdict: " + (message or "the check did not run (--no-check)"))
        elif v == "fail":
            outcome = "failure"
        elif v in ("skipped", "not_run") or r.status in ("skipped", "not_run"):
            outcome = "skipped"
        else:
            outcome = "error"
        out.append(TestCase(f"{r.case}@{r.world_size}", f"fleetbench.run.{r.model}", outcome,
                            "" if outcome == "passed" else message or v, (seconds or {}).get(r.case, 0.0),
                            output="\n".join(output)))
    return out


class DoctorItem(Protocol):
    item: str
    status: str
    numbers: str
    seconds: float


def doctor_cases(items: Iterable[DoctorItem]) -> list[TestCase]:
    """``fleetbench doctor``'s items: pass, fail, and anything else ("not applicable here") skipped with its
    numbers as the reason."""
    out = []
    for i in items:
        outcome: Outcome = "passed" if i.status == "pass" else "failure" if i.status == "fail" else "skipped"
        message = i.numbers if outcome == "failure" else f"{i.status}: {i.numbers}" if outcome == "skipped" else ""
        out.append(TestCase(i.item, "fleetbench.doctor", outcome, message, i.seconds, output=i.numbers))
    return out


class AbComparison(Protocol):
    case: str
    world: int
    verdict: str
    failures: list
    error: str | None
    summary: str
    seconds: float


class NotComparedCase(Protocol):
    @property
    def case(self) -> str: ...

    @property
    def why(self) -> str: ...


def ab_cases(comparisons: Iterable[AbComparison], only: Iterable[NotComparedCase] = (), errors: Iterable[str] = ()
             ) -> list[TestCase]:
    """``fleetbench ab``'s comparisons: a failure where the gate fails the case (slower, structure changed, check
    worse, an error on HEAD only), an error where the case errors on both sides or BASE only, skipped where it is
    inconclusive (the interval so far as the reason); cases compared on one side only are skipped, and a failure
    not tied to a case (HEAD's trial server) is an error of its own."""
    out = []
    for c in comparisons:
        name = f"{c.case}@{c.world}"
        if c.failures:
            out.append(TestCase(name, "fleetbench.ab", "failure", "; ".join(map(str, c.failures)), c.seconds,
                                output=c.summary))
        elif c.verdict == "error":
            out.append(TestCase(name, "fleetbench.ab", "error", c.error or c.summary or "error", c.seconds))
        elif c.verdict == "inconclusive":
            # the summary starts with its verdict ("inconclusive: HEAD/BASE ..."): not said twice
            why = c.summary if c.summary.startswith("inconclusive") else f"inconclusive: {c.summary}".rstrip(": ")
            out.append(TestCase(name, "fleetbench.ab", "skipped", why, c.seconds))
        else:
            out.append(TestCase(name, "fleetbench.ab", "passed", "", c.seconds, output=c.summary))
    out += [TestCase(o.case, "fleetbench.ab", "skipped", f"not compared: {o.why}") for o in only]
    out += [TestCase("gate", "fleetbench.ab", "error", e) for e in errors]
    return out


STAGE_OUTCOMES: dict[int, tuple[Outcome, str]] = {
    0: ("passed", ""), 1: ("failure", "regression"), 2: ("error", "unusable input, or a stage that could not run"),
    3: ("skipped", "undecided: inconclusive, nothing worse")}


def stage_case(name: str, code: Any, seconds: float) -> TestCase:
    """A nightly stage by its exit status (the table every command shares); "cancelled" is an error."""
    outcome, why = STAGE_OUTCOMES.get(code, ("error", f"exit {code}")) if isinstance(code, int) else \
        ("error", str(code))
    return TestCase(name, "fleetbench.nightly", outcome, f"{why} (exit {code})" if why else "", seconds)

