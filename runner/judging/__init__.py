"""Room judging: raw outputs -> verdicts (statistics, rules, criteria, exit codes).

May import bundles/, targets/ (records only) and runner/report/; never history/, debug/,
pictures/, writers/ or the front door. See docs/architecture.md."""
