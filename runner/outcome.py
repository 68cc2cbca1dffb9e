"""Verdicts and exit codes: the one definition every command, report and writer uses.

CI lanes branch on the exit code, so it must tell a numerical regression (1) from a lane that
could not run (2) and from a job somebody stopped (130 Ctrl-C, 143 SIGTERM: 128 + the signal,
as shells report it).
"""

from __future__ import annotations

# Per output and per case (docs/report-schema.md). Order is severity for display only.
VERDICTS = ("PASS", "FAIL", "ERROR", "TIMEOUT", "SKIP")
RUN_VERDICTS = ("PASS", "FAIL", "ERROR")  # a whole run

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
