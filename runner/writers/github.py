"""GitHub Actions: workflow-command annotations and the job's step summary, for whoever reads a
GitHub job page. The step summary is a registered format ("github-summary", runner/writers/
__init__.py) with no file in the report folder: the Markdown summary, appended to the file GitHub
names; the annotations go to stdout from the commands that run reports (`annotate`).

When `GITHUB_ACTIONS=true`, `annotate(report)` (a typed Report) prints one `::error` per failing output
(numerical FAIL, and baseline regressions) and one `::warning` per case that could not
run (infrastructure ERROR/TIMEOUT: a flaky board, not a regression), capped per level
so a bad run does not drown the job page (GitHub shows at most 10 of each level per
step); the last one says how many more there were. When `GITHUB_STEP_SUMMARY` is set,
`append_step_summary(text)` appends Markdown to it (the "github-summary" writer does this for
every report written with every format, i.e. every run).

Escaping follows GitHub's workflow-command rules (actions/toolkit `command.ts`): in the
message `%`, `\\r`, `\\n` become `%25`, `%0D`, `%0A`; in a property value `:` and `,`
also become `%3A` and `%2C`. Text from a bundle, a device or a user therefore cannot
end the command early or inject a second one.

Nothing here changes a verdict or an exit code.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from bundlerun.runner.report.safe_text import visible  # stdlib only
from bundlerun.runner.writers import Inputs, writer
from bundlerun.targets.base import Verdict
from bundlerun.runner.writers.markdown import render_markdown

if TYPE_CHECKING:
    from bundlerun.runner.report.model import Report

MAX_PER_LEVEL = 10


def enabled(env: dict[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return str(env.get("GITHUB_ACTIONS", "")).lower() == "true"


def escape_data(text: Any) -> str:
    return str(text).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: Any) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def command(level: str, message: str, **props: Any) -> str:
    """`::level k=v,k=v::message`, escaped. None-valued properties are left out."""
    shown = ",".join(f"{k}={escape_property(v)}" for k, v in props.items() if v is not None and v != "")
    return f"::{level}{' ' + shown if shown else ''}::{escape_data(message)}"


def _fmt(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _file_for(report: "Report", report_path: str | Path | None) -> str | None:
    """The file an annotation points at: the bundle when it lies in the workspace (relative, so
    GitHub can link it), else the report.json."""
    workspace = os.environ.get("GITHUB_WORKSPACE") or os.getcwd()
    for candidate in (report.bundle.get("path"), report_path):
        if not candidate:
            continue
        try:
            return str(Path(candidate).resolve().relative_to(Path(workspace).resolve()))
        except ValueError:
            continue
    return str(report_path) if report_path else report.bundle.get("path")


def annotations(report: "Report", report_path: str | Path | None = None,
                limit: int = MAX_PER_LEVEL) -> list[str]:
    """The workflow commands for one report (empty when everything passed)."""
    bundle = report.bundle
    model = bundle.get("model") or Path(str(bundle.get("path") or "bundle")).stem
    what = f"{model}{'-' + bundle['dtype'] if bundle.get('dtype') else ''} on {report.target.get('url') or '?'}"
    file = _file_for(report, report_path)
    errors: list[tuple[str, str]] = []
    warnings: list[tuple[str, str]] = []
    for case in report.cases:
        where = f"{case.method}[{case.case}]"
        for out in case.outputs:
            if out.verdict == Verdict.FAIL:
                failed = "; ".join(f"{f.criterion}: measured {_fmt(f.measured)} limit {_fmt(f.limit)}"
                                   for f in out.failed) or "output did not meet its criteria"
                worst = out.stats.worst_index if out.stats else None
                errors.append((f"bundlerun FAIL: {what} {where}.{out.name}",
                               failed + (f" (worst element {worst})" if worst is not None else "")))
        if case.verdict in (Verdict.ERROR, Verdict.TIMEOUT):
            kind = case.error_kind.value if case.error_kind else ("timeout" if case.verdict == Verdict.TIMEOUT else "error")
            warnings.append((f"bundlerun {case.verdict} ({kind}): {what} {where}",
                             case.error or "the case could not run"))
    for reg in report.regressions or []:
        errors.append((f"bundlerun regression ({reg.get('rule')}): {what}", str(reg.get("message"))))
    lines: list[str] = []
    for level, items, noun in (("error", errors, "failing outputs"), ("warning", warnings, "cases that could not run")):
        shown = items if len(items) <= limit else items[: max(limit - 1, 0)]
        # titles and messages quote names and errors from bundles and devices: controls, newlines,
        # bidi and invisible characters made visible first (runner/report/safe_text.py), so the job page
        # cannot show a forged line or reordered text
        lines += [command(level, visible(msg), file=file, title=visible(title)) for title, msg in shown]
        if len(items) > len(shown):
            lines.append(command(level, f"{len(items) - len(shown)} more {noun}; see the job summary and "
                                        f"{report_path or 'report.json'}",
                                 file=file, title=f"bundlerun: {what}: {len(items)} {noun}"))
    return lines


def annotate(report: "Report", report_path: str | Path | None = None, stream: TextIO | None = None,
             env: dict[str, str] | None = None) -> int:
    """Print the annotations when running under GitHub Actions; returns how many were printed."""
    if not enabled(env):
        return 0
    lines = annotations(report, report_path)
    out = stream or sys.stdout
    for line in lines:
        out.write(line + "\n")
    out.flush()
    return len(lines)


def append_step_summary(text: str, env: dict[str, str] | None = None) -> bool:
    """Append Markdown to $GITHUB_STEP_SUMMARY when it is set; False when not set or not writable."""
    target = (os.environ if env is None else env).get("GITHUB_STEP_SUMMARY")
    if not target:
        return False
    try:
        with open(target, "a", encoding="utf-8") as fh:
            fh.write(text.rstrip("\n") + "\n\n")
    except OSError:
        return False
    return True


@writer("github-summary", None, "GitHub step summary")
def _write_step_summary(report: "Report", path: None, inputs: Inputs) -> None:
    """The Markdown summary appended to $GITHUB_STEP_SUMMARY, when set (a convenience: an
    unwritable step summary is ignored, the report folder is what counts)."""
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        append_step_summary(render_markdown(report, inputs.regressions))
    return None
