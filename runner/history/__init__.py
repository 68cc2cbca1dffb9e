"""Room history: the SQLite store of runs, their tags and commits, baselines and trends,
earlier runs read back.

May import bundles/, judging/ and runner/report/; never writers/, debug/, pictures/ or the
front door. See docs/architecture.md."""
