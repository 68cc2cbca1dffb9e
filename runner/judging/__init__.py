"""Room judging: raw outputs -> verdicts (error statistics, backend rules, criteria, exit codes).

Imports bundles/, targets/' records and runner/report/'s model; `calibrate.py` (tolerance suggest)
also reads a saved run (history/) and opens a session. See docs/architecture.md."""
