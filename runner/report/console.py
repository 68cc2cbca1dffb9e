"""The terminal view of a report: the verdict table, failure detail, headline perf figures and
the lines no output mode may hide. Text from a bundle, a device or the user goes through `plain`
(control and bidi characters made visible, rich markup escaped) before it reaches a terminal."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bundlerun.runner.judging.stats_records import OutputStats
from bundlerun.runner.report.criteria_text import criteria_items
from bundlerun.runner.report.model import REPORT_FILE, CaseRecord, OutputRecord, Report, format_amount
from bundlerun.targets.base import Verdict
from bundlerun.runner.judging.outcome import EXIT_INFRA
from bundlerun.runner.judging.quant_steps import suffix
from bundlerun.runner.report.safe_text import visible

# C0 controls but tab and newline, DEL, the C1 controls (0x9b is a one-byte CSI) and lone
# surrogates (from surrogateescape'd bytes): shown as escapes, never sent to the terminal
_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x00, 0x09), *range(0x0b, 0x20), *range(0x7f, 0xa0)]}
_CONTROL.update({c: f"\\u{c:04x}" for c in range(0xD800, 0xE000)})


def plain(text: object) -> str:
    """Text from a bundle, a device or the user, safe for the console: control, bidi and other
    invisible characters (newlines and terminal escapes included) made visible
    (runner/report/safe_text.py), rich markup escaped. Print it with soft_wrap=True (or in a table
    cell): rich's own wrapping must not start a line with it either."""
    from rich.markup import escape

    return escape(visible(text))


def _num(x: Any, fmt: str = ".3g") -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    return format(x, fmt)


@dataclass
class OutputRow:
    """One (method, output) over every case: its worst case and the verdict counts."""

    method: str
    index: int
    name: str
    verdict: str
    counts: dict[str, int]
    worst_case: int
    worst: OutputRecord
    min_sqnr: Any  # a number, "inf" (an exact match, as the report writes it) or None


_RANK: dict[str, int] = {Verdict.ERROR: 0, Verdict.TIMEOUT: 0, Verdict.FAIL: 1, Verdict.SKIP: 3, Verdict.PASS: 2}


def output_rows(report: Report) -> list[OutputRow]:
    """One row per (method, output): the worst case first (verdict, then error_max)."""
    groups: dict[tuple[str, int], list[tuple[CaseRecord, OutputRecord]]] = {}
    for case in report.cases:
        for out in case.outputs:
            groups.setdefault((case.method, out.index), []).append((case, out))
    rows = []
    for (method, index), items in groups.items():
        decisive = deciding_criterion([o for _, o in items])
        items.sort(key=lambda item: (_RANK.get(item[1].verdict, 9), _badness(item[1], decisive)))
        worst_case, worst = items[0]
        counts: dict[str, int] = {}
        for _, out in items:
            counts[out.verdict] = counts.get(out.verdict, 0) + 1
        sqnrs = [o.stats.sqnr for _, o in items if o.stats]
        finite = [s for s in sqnrs if isinstance(s, (int, float))]
        rows.append(OutputRow(method, index, worst.name, worst.verdict, counts, worst_case.case, worst,
                              min(finite) if finite else (sqnrs[0] if sqnrs else None)))
    rows.sort(key=lambda r: (_RANK.get(r.verdict, 9), r.method, r.index))
    return rows


def deciding_criterion(outputs: list[OutputRecord]) -> str | None:
    """The criterion that decided one output's verdict over its cases: the one most failing cases
    failed (the earliest case breaks a tie); with no failure, the criterion it is judged by first
    (element-wise bounds, then the SQNR floor, then cosine). The "worst case" is worst on it."""
    tally: dict[str, int] = {}
    for out in outputs:
        for name in dict.fromkeys(f.criterion for f in out.failed):
            if isinstance(name, str):
                tally[name] = tally.get(name, 0) + 1
    if tally:
        return max(tally, key=lambda k: tally[k])  # dicts keep first-seen order: ties go to the earliest case
    crit = next((o.criteria for o in outputs if o.criteria), None)
    if crit and (crit.exact or crit.elementwise):
        return "elementwise"
    return next((k for k in ("sqnr_min_db", "cosine_min") if crit is not None and getattr(crit, k) is not None), None)


@dataclass
class Agreement:
    """An exact output over every case: how many cases agree and which values were confused."""

    method: str
    name: str
    agree: int
    judged: int
    confusion: dict[str, int]  # "expected -> actual" -> cases

    def line(self, shown: int = 8) -> str:
        pct = 100.0 * self.agree / self.judged if self.judged else 0.0
        text = f"{self.method}.{self.name} (exact): {self.agree}/{self.judged} cases agree ({pct:.1f}%)"
        if self.confusion:
            pairs = sorted(self.confusion.items(), key=lambda kv: -kv[1])
            listed = ", ".join(k + (f" x{v}" if v > 1 else "") for k, v in pairs[:shown])
            more = f", +{len(pairs) - shown} more" if len(pairs) > shown else ""
            text += f"; mismatches (expected -> actual): {listed}{more}"
        return text


_PAIR = re.compile(r"(-?[\w.+-]+) -> (-?[\w.+-]+) at ")


def agreement(report: Report) -> list[Agreement]:
    """Top-1 agreement of every exact output (an argmax, a class id): the cases whose values all
    equal the reference, and the confusion of the mismatches the failure lines name."""
    found: dict[tuple[str, int], Agreement] = {}
    for case in report.cases:
        for out in case.outputs:
            if not (out.criteria and out.criteria.exact) or out.verdict not in (Verdict.PASS, Verdict.FAIL):
                continue
            entry = found.setdefault((case.method, out.index), Agreement(case.method, out.name, 0, 0, {}))
            entry.judged += 1
            exact = [f for f in out.failed if f.criterion == "exact"]
            if not out.failed:
                entry.agree += 1
            for failure in exact:
                for pair in _PAIR.findall(str(failure.detail or "")):
                    key = f"{pair[0]} -> {pair[1]}"
                    entry.confusion[key] = entry.confusion.get(key, 0) + 1
    return list(found.values())


def agreement_lines(report: Report) -> list[str]:
    return [a.line() for a in agreement(report)]


# Criteria whose measured value is worse when lower; for every other one a larger value is worse.
_LOWER_IS_WORSE = frozenset({"sqnr_min_db", "cosine_min"})
_STAT_OF = {"sqnr_min_db": "sqnr", "cosine_min": "cosine_similarity", "elementwise": "error_max",
            "exact": "error_max", "rel_frobenius_max": "relative_frobenius"}


def _badness(out: OutputRecord, criterion: str | None) -> float:
    """How bad one case is on `criterion` (smaller sorts first): the value its failure measured, or
    the matching statistic of a case that passed it."""
    failed = next((f for f in out.failed if f.criterion == criterion), None)
    value = failed.measured if failed else getattr(out.stats, _STAT_OF.get(criterion or "", "error_max"), None)
    if value == "inf":
        value = math.inf
    elif value == "-inf":
        value = -math.inf
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
        return math.inf if failed is None else -math.inf  # a failure without a number still ranks first
    return value if criterion in _LOWER_IS_WORSE else -value


# The figures worth one console line, in this order (the JSON report has them all).
_HEADLINE = ("inference_cpu_cycles", "npu_active_cycles", "execution_time", "execution_wall_time", "interpreter_time",
             "session_wall_time", "method_allocator_used", "pte_program_size")


def perf_line(report: Report, limit: int = 5) -> str:
    """One line of headline perf figures (median over cases, with the kind that says what clock it
    is), e.g. `forward: inference_cpu_cycles 1.2e+06 cycles [simulation-cycles] · ...`; "" if none."""
    rows = report.perf_summary()
    sizes = {(r.method, r.name): r for r in rows if r.name.endswith("_size")}
    several_methods = len({r.method for r in rows}) > 1
    parts = []
    for name in _HEADLINE:
        for r in rows:
            if r.name != name:
                continue
            text = f"{r.name}{'(' + r.phase + ')' if r.phase else ''} {format_amount(r.median, r.unit)}"
            total = sizes.get((r.method, name.replace("_used", "_size"))) if name.endswith("_used") else None
            if total:
                text += f" of {format_amount(total.median, total.unit)}"
            if r.cases > 1 and r.max != r.min:
                text += f" ({format_amount(r.min, r.unit)}..{format_amount(r.max, r.unit)})"
            parts.append((f"{r.method}." if several_methods else "") + f"{text} [{r.kind}]")
    if not parts:
        return ""
    shown = parts[:limit]
    more = len(rows) - len(shown)
    return " · ".join(shown) + (f" · +{more} more in report.json" if more > 0 else "")


HISTORY_NOT_RECORDED = "history not recorded"  # how session.finish_run and the farm word that warning


def must_show(report: Report) -> list[str]:
    """Warnings no output mode may hide (`--quiet`, `--json`): that the run is missing from the
    history, which a later --baseline, compare, trend or HUD would silently lack."""
    return [w for w in report.warnings if isinstance(w, str) and HISTORY_NOT_RECORDED in w]


def echo_must_show(report: Report) -> None:
    """Print `must_show` warnings on stderr, one inert line each (for the quiet and JSON modes)."""
    import sys

    for warning in must_show(report):
        print(f"warning: {visible(warning)}", file=sys.stderr, flush=True)


def wide_console(stderr: bool = False):
    """A rich Console; when not on a terminal (CI logs) use 160 columns, not 80."""
    import sys

    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    # soft_wrap: rich never breaks a printed line itself, so text from a bundle (a long model id
    # in a title or a warning) cannot be pushed to the start of a line of its own (a forged verdict)
    return Console(stderr=stderr, width=None if stream.isatty() else 160, soft_wrap=True)


def _steps(stats: OutputStats | None, key: str) -> str:
    return suffix(stats, key, "q")


# Every SQNR bundlerun shows is this one (runner/judging/numerics.py); tables say so.
SQNR_CAPTION = ("worst case: the case worst on the criterion that decided the verdict; "
                "SQNR = 20*log10(||ref|| / ||actual - ref||), the signal being the reference")


def print_summary(report: Report, console=None) -> None:
    """Rich table: one row per output, worst case first, then the failure detail."""
    from rich.table import Table

    console = console or wide_console()
    bundle = report.bundle
    title = plain(f"{bundle.get('model') or Path(bundle['path']).name} on {report.target.get('url')}")
    if bundle.get("dtype"):
        title += plain(f" ({bundle['backend']}, {bundle['dtype']})")
    for line in bundle.get("inputs_used") or []:
        title += "\n" + plain(str(line))
    table = Table(title=title, title_justify="left")
    table.caption = SQNR_CAPTION
    table.caption_justify = "left"
    for col in ("output", "verdict", "cases", "worst case", "max |err|", "MAE", "min SQNR dB", "cosine", "mismatches",
                "criteria"):
        table.add_column(col, justify="right" if col not in ("output", "verdict", "criteria") else "left")
    style: dict[str, str] = {Verdict.PASS: "green", Verdict.FAIL: "bold red", Verdict.ERROR: "bold yellow", Verdict.TIMEOUT: "bold yellow", Verdict.SKIP: "dim"}
    for row in output_rows(report):
        out = row.worst
        stats = out.stats
        crit = out.criteria
        exact = bool(crit and crit.exact)
        crit_text = ", ".join(criteria_items(  # 4 significant digits, as every view prints criteria
            crit, ("atol", "rtol", "qtol", "scale" if crit and crit.qtol else "", "sqnr_min_db", "cosine_min",
                   "rel_frobenius_max", "argmax_match", "kl_max", "top_k_overlap_min"))) or (
            "exact" if exact else "-")
        counts = " ".join(f"{k}:{v}" for k, v in sorted(row.counts.items()))
        mism = (stats.mismatch_count if stats else None)
        # An exact output (class ids, indices, masks) is equal or not: distances and SQNR say nothing.
        figures = ["-"] * 4 if exact else [
            _num((stats.error_max if stats else None)) + _steps(stats, "error_max"),  # quantized: also in quantization steps
            _num((stats.error_mae if stats else None)) + _steps(stats, "error_mae"),
            _num(row.min_sqnr, ".1f"),
            _num((stats.cosine_similarity if stats else None), ".5f")]
        table.add_row(
            plain(f"{row.method}.{row.name}"),
            f"[{style.get(row.verdict, '')}]{row.verdict}[/]",
            counts,
            str(row.worst_case),
            *figures,
            "-" if mism is None else f"{mism}/{stats.actual_stats.numel if stats and stats.actual_stats.numel is not None else '?'}",
            plain(crit_text),  # criteria come from the report file: their text is inert here
        )
    console.print(table)
    print_sequences(report, console)
    for line in agreement_lines(report):
        console.print(plain(line), highlight=False)
    shown = 0
    for case in report.cases:
        if case.verdict == Verdict.PASS:
            continue
        if shown >= 8:
            console.print("[dim]... more failing cases in the JSON report[/]")
            break
        shown += 1
        if case.verdict in (Verdict.ERROR, Verdict.TIMEOUT) and case.error:
            console.print(f"[yellow]{case.verdict}[/] {plain(case.method)}[{case.case}]: {plain(case.error)}",
                          highlight=False)
            for line in case.log_excerpt[-3:]:
                console.print(f"    [dim]{plain(line)}[/]", highlight=False)
        for out in case.outputs:
            for failure in out.failed:
                label = "[red]FAIL[/]" if out.verdict == Verdict.FAIL else f"[yellow]{plain(out.verdict)}[/]"
                console.print(
                    f"{label} {plain(case.method)}[{case.case}].{plain(out.name)} "
                    f"{plain(failure.criterion)}: {plain(failure.detail)}", highlight=False
                )
    line = perf_line(report)
    if line:
        console.print(f"[dim]perf[/] {plain(line)}", highlight=False)
    from bundlerun.runner.judging.replay import console_lines  # --replay: distinct results, spread, verdict flips

    for text in console_lines(report):
        console.print(plain(text), highlight=False, style="yellow" if (report.replay or {}).get("findings") else "")
    for warning in report.warnings:
        console.print(f"[yellow]warning:[/] {plain(warning)}", highlight=False)
    s = report.summary
    console.print(
        f"[bold]{s.verdict}[/] ({', '.join(f'{k} {v}' for k, v in s.counts.items() if v)}) "
        f"in {report.run.get('duration_s') or 0:.1f} s — exit code {s.exit_code}"
    )


def print_sequences(report: Report, console) -> None:
    """LLM bundles: one table per sequence, a row per step (runner/report/sequences.py)."""
    from rich.table import Table

    from bundlerun.runner.report.sequences import MAX_STEPS_SHOWN, STEP_COLUMNS, columns, headline, step_cells  # start-up: loads numpy on use

    style = {Verdict.PASS: "green", Verdict.FAIL: "bold red", Verdict.ERROR: "bold yellow", Verdict.TIMEOUT: "bold yellow", Verdict.SKIP: "dim"}
    for seq in report.sequences:
        table = Table(title=plain(headline(seq)), title_justify="left")
        cols = columns(seq)
        for col in cols:
            table.add_column(col, justify="left" if col in ("kind", "verdict", "replay") else "right")
        for step in seq.steps[:MAX_STEPS_SHOWN]:
            cells = [plain(c) for c in step_cells(step, len(cols) > len(STEP_COLUMNS))]
            cells[-1] = f"[{style.get(step.verdict, '')}]{cells[-1]}[/]"
            table.add_row(*cells)
        if len(seq.steps) > MAX_STEPS_SHOWN:
            table.caption = f"{len(seq.steps) - MAX_STEPS_SHOWN} more steps in the JSON report"
        console.print(table)


def say_report(report: Report, report_dir: Path) -> None:
    """Where the report is, or which of its files could not be written and why (on stderr; a full
    disk never takes the verdict with it, and neither --quiet nor --json hides it)."""
    import click

    warn_unwritten(report)
    if not any(Path(u["file"]).name == REPORT_FILE for u in report.unwritten):
        click.echo(f"report: {Path(report_dir) / REPORT_FILE}", err=True)
    if report.run.get("history_error"):
        click.echo(f"bundlerun: error: {plain(report.run['history_error'])} (the report is written; "
                   f"verdict {report.summary.verdict}, exit code {exit_code(report)})", err=True)


def exit_code(report: Report) -> int:
    """The process exit code of a run: its verdict's, except that a run whose record (report.json)
    could not be written never exits 0: no command says success when its record was not written."""
    code = report.summary.exit_code
    if code == 0 and any(Path(u["file"]).name == REPORT_FILE for u in report.unwritten):
        return EXIT_INFRA
    if report.run.get("history_error"):  # a shared history (a server) that did not record the run
        return EXIT_INFRA
    return code


def warn_unwritten(report: Report) -> None:
    """One stderr line per report file the run could not write (never hidden by --quiet/--json)."""
    import click

    for entry in report.unwritten:
        click.echo(f"bundlerun: could not write {plain(entry['file'])}: {plain(entry['error'])} "
                   f"(the verdict above stands: {report.summary.verdict}, exit code "
                   f"{exit_code(report)})", err=True)
