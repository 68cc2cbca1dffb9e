"""The HUD's grid: rows of what ran, columns of commits, each cell the runs of one row at one commit.

Read from the history through runner/history/store.py (list_runs) and runner/history/tags.py
(source, flow, operator, commit of each run); rendered by runner/pictures/hud_page.py.

- Row: group (the suite's flow, else the run's backend) > operator (the suite's operator test,
  `models` for bundlerun's own model runs) > what ran (the model id; the bundle's file name
  when its manifest names no model; `run #id` when neither is known) > its series
  (runner/history/series.py: target, dtype, test inputs and criteria): another bundle of the same model
  is another row, tagged `in <inputs> · cr <criteria>`, so no culprit is named across bundles.
  An interrupted run is no data point: it is left out of the grid (counted in `Grid.interrupted`).
- Column: the run's label (a run recorded without one is labelled with its commit by the
  history: runner/history/commits.py); a run with neither falls into its UTC day's bucket (`~2026-11-30`).
  Columns are in commit order: the commit's committer date when the history knows it, else the
  time of the column's first run.
- Cell: every run of the row under that column; the latest is shown, the worst (verdict first,
  then the lower metric) is named in the tooltip.
- Regressions and culprits against the row's baseline (its run under `--baseline LABEL`, else
  its first column), with runner/history/regression.py's rules on the summary numbers (docs/hud.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, cast

from bundlerun.runner.history import store as history
from bundlerun.runner.history.regression import RegressionRules
from bundlerun.runner.history.series import Series, tags
from bundlerun.targets.base import Verdict
from bundlerun.runner.history.tags import run_extras

SEVERITY: dict[str, int] = {Verdict.PASS: 0, Verdict.SKIP: 1, Verdict.TIMEOUT: 2, Verdict.ERROR: 3, Verdict.FAIL: 4}
MODELS = "models"  # the operator group of bundlerun's own (model) runs


@dataclass
class Column:
    key: str  # the label, or "~YYYY-MM-DD" for runs with neither label nor commit
    label: str | None
    first_id: int
    started: str | None
    commit_time: str | None = None
    bucket: bool = False  # a time bucket of unlabelled runs
    commit: str | None = None  # the full commit id, when the history knows it
    runs: int = 0

    @property
    def order(self) -> tuple:
        return (self.commit_time or self.started or "\uffff", self.started or "\uffff", self.first_id)


@dataclass
class Cell:
    run: history.RunRecord  # the latest run: what the cell shows
    runs: int  # how many runs of this row are in this column
    metric: str  # "top1" | "sqnr"
    value: float | None
    regressed: bool = False
    why: str = ""
    culprit: bool = False
    baseline: bool = False
    worst: history.RunRecord | None = None  # the worst of the column's runs, when there were several
    worst_value: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # the run's tags, bundle path, largest max error

    @property
    def failing(self) -> bool:
        return self.run.verdict == Verdict.FAIL


@dataclass
class Row:
    model: str | None  # what ran (model id, bundle file name, or "run #id")
    target: str | None
    dtype: str | None
    cells: dict[str, Cell] = field(default_factory=dict)
    baseline: str | None = None  # column key
    culprit: str | None = None  # column key
    group: str = "-"  # flow / backend
    operator: str = MODELS
    source: str = "bundlerun"
    inputs: str | None = None  # the series' inputs_sha256 and criteria_sha256 (runner/history/series.py)
    criteria: str | None = None
    backend: str | None = None  # the first run's backend (the page's backend filter)
    tag: str = ""  # `in 3fa2c1 · cr 9b01de` where another row has the same model, target and dtype

    @property
    def key(self) -> tuple:
        return (self.model or "", self.target or "", self.dtype or "", self.inputs or "", self.criteria or "")

    @property
    def series(self) -> Series:
        return Series(self.model, self.target, self.dtype, self.inputs, self.criteria)

    def latest(self, columns: list[Column]) -> Cell | None:
        for col in reversed(columns):
            if col.key in self.cells:
                return self.cells[col.key]
        return None

    def failing(self, columns: list[Column]) -> bool:
        latest = self.latest(columns)
        return latest is not None and latest.failing


@dataclass
class Grid:
    columns: list[Column]
    rows: list[Row]  # grouped: group, then operator, regressed first at every level
    baseline_label: str | None
    runs: int
    rules: RegressionRules
    interrupted: int = 0  # interrupted runs left out: no data point, never a baseline or a culprit


def _metric(r: history.RunRecord) -> tuple[str, float | None]:
    if r.top1 is not None:
        return "top1", float(r.top1)
    return "sqnr", (None if r.min_sqnr is None else float(r.min_sqnr))


def _regressed(cur: Cell, base: Cell, rules: RegressionRules) -> tuple[bool, str]:
    if cur.run.verdict in (Verdict.ERROR, Verdict.TIMEOUT):
        return False, ""
    # a dataset run is judged by its top-1 (as `bundlerun accuracy` is), not by element-wise flips
    if base.metric != "top1" and base.run.verdict == Verdict.PASS and cur.run.verdict == Verdict.FAIL:
        return True, "PASS -> FAIL"
    if cur.value is None or base.value is None or cur.metric != base.metric:
        return False, ""
    if cur.metric == "sqnr":
        cap = rules.sqnr_ceiling_db
        now, then = min(cur.value, cap), min(base.value, cap)
        if then - now > rules.sqnr_drop_db:
            return True, f"worst SQNR {then:.1f} -> {now:.1f} dB ({now - then:+.1f})"
        return False, ""
    drop = (base.value - cur.value) * 100
    if drop > rules.top1_drop_points:
        return True, f"top-1 {base.value * 100:.2f}% -> {cur.value * 100:.2f}% ({-drop:+.2f} points)"
    return False, ""


def _badness(r: history.RunRecord) -> tuple:
    metric, value = _metric(r)
    return (SEVERITY.get(r.verdict or "", 3), -(value if value is not None else float("inf")))


def what_ran(r: history.RunRecord, extra: dict[str, Any]) -> str:
    """The row's name: the model id, else the bundle's file name, else the run."""
    if r.model:
        return r.model
    path = extra.get("bundle_path")
    return PurePath(str(path)).name if path else f"run #{r.id}"


def column_of(r: history.RunRecord) -> tuple[str, bool]:
    if r.label:
        return r.label, False
    return f"~{(history.utc_iso(r.started) or 'unknown')[:10]}", True


@dataclass
class Compact:
    """The grid's raw material, small enough to keep between builds (runner/pictures/hud_site.py's
    state file): per run what judging needs, per row and column what names and orders them. Built
    from the history one run at a time (`add`), oldest first, so a later build reads only new runs."""

    rows: list[list[Any]] = field(default_factory=list)  # [group, operator, name, target, dtype, inputs, criteria, source, backend]
    runs: list[list[Any]] = field(default_factory=list)  # [id, row index, column key, verdict, metric, value]
    columns: dict[str, list[Any]] = field(default_factory=dict)  # key -> [label, first_id, started, commit_time, bucket, commit, runs]
    interrupted: int = 0
    last_id: int = 0
    _index: dict[tuple, int] = field(default_factory=dict, repr=False)

    def add(self, records: list[history.RunRecord], extras: dict[int, dict[str, Any]]) -> None:
        """Runs oldest first (ids above `last_id`)."""
        if len(self._index) != len(self.rows):
            self._index = {_row_key(r): i for i, r in enumerate(self.rows)}
        for r in records:
            self.last_id = max(self.last_id, r.id)
            if r.interrupted:
                self.interrupted += 1
                continue
            x = extras.get(r.id, {})
            key, bucket = column_of(r)
            col = self.columns.get(key)
            if col is None:
                col = self.columns[key] = [r.label, r.id, r.started, x.get("commit_time"), bucket, x.get("commit_sha"), 0]
            if r.started and (col[2] is None or r.started < col[2]):
                col[2] = r.started
            if x.get("commit_time") and (col[3] is None or x["commit_time"] < col[3]):
                col[3] = x["commit_time"]
            col[6] += 1
            source = x.get("source") or "bundlerun"
            group = x.get("flow") or r.backend or "-"
            operator = x.get("operator") or (MODELS if source == "bundlerun" else "-")
            ident = [group, operator, what_ran(r, x), r.target, r.dtype, r.inputs_sha256, r.criteria_sha256, source,
                     r.backend]
            rk = _row_key(ident)
            ri = self._index.get(rk)
            if ri is None:
                ri = self._index[rk] = len(self.rows)
                self.rows.append(ident)
            metric, value = _metric(r)
            self.runs.append([r.id, ri, key, r.verdict, metric, value])

    def to_json(self) -> dict[str, Any]:
        return {"rows": self.rows, "runs": self.runs, "columns": self.columns, "interrupted": self.interrupted,
                "last_id": self.last_id}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Compact":
        return cls(list(data["rows"]), list(data["runs"]), dict(data["columns"]), int(data["interrupted"]),
                   int(data["last_id"]))


def _row_key(ident: list[Any]) -> tuple:
    return tuple("" if v is None else v for v in ident[:7])


class _Stub:
    """What judging reads of a run (its id, verdict and metric) until `fill` puts the full record
    in its place: 100,000 of these cost a tenth of as many RunRecords (bench/bench_hud.py)."""

    __slots__ = ("id", "verdict", "top1", "min_sqnr", "run_uuid", "report_path")

    def __init__(self, run_id: int, verdict: str | None, metric: str, value: float | None) -> None:
        self.id, self.verdict, self.run_uuid, self.report_path = run_id, verdict, "", None
        self.top1 = value if metric == "top1" else None
        self.min_sqnr = value if metric != "top1" else None


def _stub(run_id: int, verdict: str | None, metric: str, value: float | None) -> history.RunRecord:
    return cast(history.RunRecord, _Stub(run_id, verdict, metric, value))


def grid_of(data: Compact, baseline: str | None = None, rules: RegressionRules | None = None) -> Grid:
    """The grid (cells, regressions, culprits, order) from the compact history; each cell's run is
    a stub holding its id, verdict and metric until `fill` reads the full records."""
    rules = rules or RegressionRules()
    cols = {key: Column(key, v[0], v[1], v[2], v[3], bool(v[4]), v[5], v[6]) for key, v in data.columns.items()}
    rows = [Row(i[2], i[3], i[4], group=i[0], operator=i[1], source=i[7], inputs=i[5], criteria=i[6],
                backend=i[8] if len(i) > 8 else None)
            for i in data.rows]
    for run_id, ri, key, verdict, metric, value in data.runs:
        row = rows[ri]
        r = _stub(run_id, verdict, metric, value)
        before = row.cells.get(key)
        cell = Cell(r, (before.runs if before else 0) + 1, metric, value)  # the latest wins
        if before is not None:
            worst = before.worst or before.run
            cell.worst = worst if _badness(worst) > _badness(r) else r
            cell.worst_value = _metric(cell.worst)[1]
        row.cells[key] = cell
    columns = sorted(cols.values(), key=lambda c: c.order)
    order = {c.key: i for i, c in enumerate(columns)}
    named = tags(row.series for row in rows)
    for row in rows:
        row.tag = named[row.series]
        _judge_row(row, columns, order, baseline, rules)
    ordered = _ordered(rows, columns)
    return Grid(columns, ordered, baseline, len(data.runs), rules, interrupted=data.interrupted)


def fill(db_path: Any, cells: list[Cell], chunk: int = 4000, known: dict[int, history.RunRecord] | None = None,
         known_extras: dict[int, dict[str, Any]] | None = None) -> None:
    """Replace the stub runs of these cells (and their worst runs) by the history's full records
    and extras (what the page shows): read by id, only for the cells being drawn and not `known`
    (the runs the caller has just read)."""

    records: dict[int, history.RunRecord] = dict(known or {})
    extras: dict[int, dict[str, Any]] = dict(known_extras or {})
    ids = sorted(({c.run.id for c in cells} | {c.worst.id for c in cells if c.worst is not None}) - set(records))
    for start in range(0, len(ids), chunk):
        part = ids[start:start + chunk]
        records.update((r.id, r) for r in history.list_runs(db_path, limit=None, ids=part))
        extras.update(run_extras(db_path, ids=part))
    for c in cells:
        c.run = records.get(c.run.id, c.run)
        c.extra = extras.get(c.run.id, {})
        if c.worst is not None:
            c.worst = records.get(c.worst.id, c.worst)


def build_grid(db_path: Any, baseline: str | None = None, rules: RegressionRules | None = None,
               limit: int | None = None) -> Grid:
    """The HUD's grid from the history database, every cell's full record read."""

    data = Compact()
    data.add(list(reversed(history.list_runs(db_path, limit=limit or None))), run_extras(db_path))  # oldest first
    grid = grid_of(data, baseline, rules)
    fill(db_path, [c for row in grid.rows for c in row.cells.values()])
    return grid


def _judge_row(row: Row, columns: list[Column], order: dict[str, int], baseline: str | None,
               rules: RegressionRules) -> None:
    present = [c.key for c in columns if c.key in row.cells]
    if baseline is not None:
        row.baseline = baseline if baseline in row.cells else None
    else:
        row.baseline = present[0] if present else None
    if row.baseline is None:
        return
    base = row.cells[row.baseline]
    base.baseline = True
    for key in present:
        if order[key] > order[row.baseline]:
            cell = row.cells[key]
            cell.regressed, cell.why = _regressed(cell, base, rules)
    # the culprit: first column of the trailing run of regressed cells (infrastructure errors
    # in between neither break nor start it)
    culprit = None
    for key in reversed([k for k in present if order[k] > order[row.baseline]]):
        cell = row.cells[key]
        if cell.run.verdict in (Verdict.ERROR, Verdict.TIMEOUT) and not cell.regressed:
            continue
        if not cell.regressed:
            break
        culprit = key
    row.culprit = culprit
    if culprit:
        row.cells[culprit].culprit = True


def _ordered(rows: list[Row], columns: list[Column]) -> list[Row]:
    """Groups with a regression first, then operators with one, then regressed rows, then rows
    whose latest run fails; by name within each."""
    bad_group = {r.group for r in rows if r.culprit}
    bad_op = {(r.group, r.operator) for r in rows if r.culprit}
    return sorted(rows, key=lambda r: (r.group not in bad_group, r.group, (r.group, r.operator) not in bad_op,
                                       r.operator, r.culprit is None, not r.failing(columns), r.key))
