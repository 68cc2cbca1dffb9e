"""Room history: the SQLite store of runs, their tags and commits, baselines and trends, earlier
runs read back.

Imports bundles/, judging/ and runner/report/. See docs/architecture.md."""
