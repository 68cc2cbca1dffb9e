"""Verdicts and exit codes: the one definition every command, report and writer uses.

CI lanes branch on the exit code, so it must tell a numerical regression (1) from a lane that
could not run (2) and from a job somebody stopped (130 Ctrl-C, 143 SIGTERM: 128 + the signal,
as shells report it).
"""

from __future__ import annotations

from bundlerun.targets.base import Verdict  # defined beside CaseStatus: targets relay a device's PASS/FAIL

# Per output and per case (docs/report-schema.md). Order is severity for display only.
VERDICTS = tuple(Verdict)
RUN_VERDICTS = (Verdict.PASS, Verdict.FAIL, Verdict.ERROR)  # a whole run

EXIT_PASS = 0
EXIT_FAIL = 1  # a numerical failure, or a regression against --baseline
EXIT_INFRA = 2  # could not run: infrastructure error, timeout, bad input
EXIT_INTERRUPTED = 130  # 128 + SIGINT: Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM: a CI system cancelling the job

STOPPED_CODES = (EXIT_INTERRUPTED, EXIT_TERMINATED)
EXIT_CODES = (EXIT_PASS, EXIT_FAIL, EXIT_INFRA, *STOPPED_CODES)  # every code a report may record


def combine_exit_codes(codes: list[int]) -> int:
    """The exit code of several runs: a stop wins (the command did not finish), then a numerical
    failure (a real regression is never mistaken for a flaky board), then could-not-run; nothing
    run at all cannot pass."""
    if not codes:
        return EXIT_INFRA
    for stopped in (EXIT_TERMINATED, EXIT_INTERRUPTED):
        if stopped in codes:
            return stopped
    if EXIT_FAIL in codes:
        return EXIT_FAIL
    return EXIT_INFRA if any(c != EXIT_PASS for c in codes) else EXIT_PASS


# How each verdict is drawn: HTML badges, HUD cells and legend, plot points. (strong: badges and
# plot points; light: a cell's background; text: a cell's text on its light background.)
# bundlerun's own palette (Material Design shades), one colour per verdict, nothing from ExecuTorch.
VERDICT_COLOURS: dict[str, tuple[str, str, str]] = {
    Verdict.PASS: ("#2e7d32", "#e8f5e9", "#1b5e20"),
    Verdict.FAIL: ("#c62828", "#ffebee", "#b71c1c"),
    Verdict.ERROR: ("#ef6c00", "#fff3e0", "#e65100"),
    Verdict.TIMEOUT: ("#6a1b9a", "#f3e5f5", "#4a148c"),
    Verdict.SKIP: ("#757575", "#f5f5f5", "#555555"),
    "STOPPED": ("#37474f", "#eceff1", "#263238"),  # a run stopped by Ctrl-C / SIGTERM (exit 130 / 143)
}
STOPPED = "STOPPED"  # not a verdict: how a run that was stopped before it finished is shown


def run_status(verdict: str | None, exit_code: int | None, timeouts: int | None = 0, errors: int | None = 0) -> str:
    """What a run is shown as: STOPPED when it was stopped (its numbers cover only the cases that
    ran), TIMEOUT when every case that did not finish timed out, else its verdict."""
    def count(n: object) -> int:  # counts read from a report file or the history: anything not a count is 0
        return n if isinstance(n, int) and not isinstance(n, bool) else 0

    if exit_code in STOPPED_CODES:
        return STOPPED
    if verdict == Verdict.ERROR and count(timeouts) > 0 and not count(errors):
        return Verdict.TIMEOUT
    return verdict if verdict in VERDICTS else Verdict.ERROR

