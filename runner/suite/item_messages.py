"""What a failed pytest item says about its run's report: the counts, the worst output's numbers or
the cases that could not run. Shared by the plugin's bundle items (runner/pytest_plugin.py) and the
backend test suite's compare step (runner/suite/device.py), so neither imports the other."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from bundlerun.runner.judging.outcome import EXIT_INFRA
from bundlerun.targets.base import Verdict

if TYPE_CHECKING:
    from bundlerun.runner.report.model import CaseRecord, OutputRecord, Report


def worst_output(report: Report) -> tuple[CaseRecord, OutputRecord] | None:
    """The failing output with the largest max error (the case and the output)."""
    failing = [(c, o) for c in report.cases for o in c.outputs if o.verdict == Verdict.FAIL]
    if not failing:
        return None

    def size(pair: tuple[CaseRecord, OutputRecord]) -> float:
        value = pair[1].stats.error_max if pair[1].stats else None
        return value if isinstance(value, (int, float)) else float("inf")

    return max(failing, key=size)


def failure_message(report: Report, report_dir: Path) -> str:
    """What a failed item says: the counts, then the worst output's numbers."""
    # lazy: pytest loads the plugin (and this) in every session; the writers and numpy load on a failure only
    from bundlerun.runner.writers.junit import failure_text

    s = report.summary
    fail_cases = sum(1 for c in report.cases if c.verdict == Verdict.FAIL)
    lines = [f"bundlerun FAIL: {fail_cases} of {s.cases} cases failed "
             f"({s.counts.get('FAIL', 0)} of {s.outputs} outputs)"]
    worst = worst_output(report)
    if worst:
        case, out = worst
        _message, body = failure_text(out)
        stats = out.stats
        lines.append(f"worst output: {case.method}[{case.case}].{out.name}")
        lines += ["  " + line for line in body.splitlines()]
        if stats is not None and stats.worst_index is not None:
            lines.append(f"  worst element {stats.worst_index}: actual {stats.worst_actual} "
                         f"expected {stats.worst_expected} allowed {stats.worst_allowed}")
    for reg in report.regressions or []:
        lines.append(f"regression {reg.get('rule')}: {reg.get('message')}")
    lines.append(f"report: {report_dir / 'report.json'}")
    return "\n".join(lines)


def error_kind_text(case: CaseRecord) -> str:
    return case.error_kind.value if case.error_kind else "error"


def error_message(report: Report, report_dir: Path) -> str:
    bad = [c for c in report.cases if c.verdict in (Verdict.ERROR, Verdict.TIMEOUT)]
    lines = [f"bundlerun ERROR (infrastructure, exit code {EXIT_INFRA}): {len(bad)} of {len(report.cases)} cases "
             f"could not run"]
    for case in bad[:5]:
        lines.append(f"  {case.method}[{case.case}] {case.verdict} ({error_kind_text(case)}): {case.error}")
    if len(bad) > 5:
        lines.append(f"  ... and {len(bad) - 5} more")
    lines += [f"warning: {w}" for w in report.warnings[:3]]
    lines.append(f"report: {report_dir / 'report.json'}")
    return "\n".join(lines)
