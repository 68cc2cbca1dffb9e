"""The accuracy HUD: a static site of model x target x dtype against labels (commits) over time.

    bundlerun hud --out site/ [--history PATH] [--baseline LABEL]

One row per (model, target, dtype), one column per label in time order (a run recorded without
a label is a column of its own, `#<run id>`). Each cell is the row's latest run under that
label: its verdict (colour) and its metric, top-1 for dataset runs, the worst SQNR over the
case-outputs for element-wise ones. A cell is red ("regressed") when, against the row's
baseline (the run under `--baseline LABEL`, else the row's first run), a PASS became a FAIL,
the worst SQNR fell by more than `[regression] sqnr_drop_db` (both clamped to
`sqnr_ceiling_db` first), or top-1 fell by more than `top1_drop_points`: the defaults of
runner/regression.py, applied to the recorded summary numbers. Errors and timeouts are
infrastructure, shown apart and never called a regression. The culprit of a row is the first
label of its current run of regressed cells: where it went bad and stayed bad.

Each row has a sparkline (inline SVG) of its metric; each cell links to that run's report,
rendered into the site from the JSON stored in the history (`runs/<id>.html`), and to the
original report.html when it still exists.

Self-contained: one HTML file with inline CSS, inline SVG and one small inline script (row
filter and a count check), allowed by its hash in the page's Content-Security-Policy, so
nothing else can run even if text were to slip through. Everything that comes from the
database is HTML-escaped with control characters made visible.
"""

from __future__ import annotations

import base64
import hashlib
import math
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bundlerun.bundles.fileio import atomic_write_text
from bundlerun.runner import history
from bundlerun.runner.html_report import _e
from bundlerun.runner.regression import RegressionRules


@dataclass
class Column:
    key: str  # the label, or "#<id>" for a run without one
    label: str | None
    first_id: int
    started: str | None


@dataclass
class Cell:
    run: history.RunRecord
    runs: int  # how many runs of this row carry this label (the latest is shown)
    metric: str  # "top1" | "sqnr"
    value: float | None
    regressed: bool = False
    why: str = ""
    culprit: bool = False
    baseline: bool = False


@dataclass
class Row:
    model: str | None
    target: str | None
    dtype: str | None
    cells: dict[str, Cell] = field(default_factory=dict)
    baseline: str | None = None  # column key
    culprit: str | None = None  # column key

    @property
    def key(self) -> tuple:
        return (self.model or "", self.target or "", self.dtype or "")

    def latest(self, columns: list[Column]) -> Cell | None:
        for col in reversed(columns):
            if col.key in self.cells:
                return self.cells[col.key]
        return None


@dataclass
class Grid:
    columns: list[Column]
    rows: list[Row]
    baseline_label: str | None
    runs: int
    rules: RegressionRules


def _metric(r: history.RunRecord) -> tuple[str, float | None]:
    if r.top1 is not None:
        return "top1", float(r.top1)
    return "sqnr", (None if r.min_sqnr is None else float(r.min_sqnr))


def _regressed(cur: Cell, base: Cell, rules: RegressionRules) -> tuple[bool, str]:
    if cur.run.verdict in ("ERROR", "TIMEOUT"):
        return False, ""
    if base.run.verdict == "PASS" and cur.run.verdict == "FAIL":
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


def build_grid(db_path: str | Path, baseline: str | None = None, rules: RegressionRules | None = None,
               limit: int | None = None) -> Grid:
    """The HUD's grid from the history database (read through runner.history only)."""
    rules = rules or RegressionRules()
    records = list(reversed(history.list_runs(db_path, limit=limit or None)))  # oldest first
    cols: dict[str, Column] = {}
    rows: dict[tuple, Row] = {}
    for r in records:
        key = r.label if r.label else f"#{r.id}"
        col = cols.get(key)
        if col is None:
            cols[key] = Column(key, r.label, r.id, r.started)
        elif r.started and (col.started is None or r.started < col.started):
            col.started = r.started
        row = rows.setdefault((r.model or "", r.target or "", r.dtype or ""), Row(r.model, r.target, r.dtype))
        metric, value = _metric(r)
        before = row.cells.get(key)
        row.cells[key] = Cell(r, (before.runs if before else 0) + 1, metric, value)  # the latest wins
    columns = sorted(cols.values(), key=lambda c: (c.started or "\uffff", c.first_id))
    order = {c.key: i for i, c in enumerate(columns)}
    for row in rows.values():
        present = [c.key for c in columns if c.key in row.cells]
        if baseline is not None:
            row.baseline = baseline if baseline in row.cells else None
        else:
            row.baseline = present[0] if present else None
        if row.baseline is None:
            continue
        base = row.cells[row.baseline]
        base.baseline = True
        for key in present:
            if order[key] > order[row.baseline]:
                cell = row.cells[key]
                cell.regressed, cell.why = _regressed(cell, base, rules)
        # the culprit: first label of the trailing run of regressed cells (infrastructure errors
        # in between neither break nor start it)
        culprit = None
        for key in reversed([k for k in present if order[k] > order[row.baseline]]):
            cell = row.cells[key]
            if cell.run.verdict in ("ERROR", "TIMEOUT") and not cell.regressed:
                continue
            if not cell.regressed:
                break
            culprit = key
        row.culprit = culprit
        if culprit:
            row.cells[culprit].culprit = True
    ordered = sorted(rows.values(), key=lambda r: (r.culprit is None, r.key))  # regressed rows first
    return Grid(columns, ordered, baseline, len(records), rules)


# ---- rendering -------------------------------------------------------------------------------------
_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:20px;color:#222;background:#fafafa}
h1{font-size:1.35em;margin:0 0 4px} .meta{color:#555;font-size:.88em;margin:2px 0}
.legend span{display:inline-block;padding:1px 8px;margin-right:6px;border-radius:8px;font-size:.82em}
.wrap{overflow-x:auto;border:1px solid #ddd;background:#fff;margin-top:10px}
table.hud{border-collapse:separate;border-spacing:0;font-size:.8em}
table.hud th,table.hud td{border-right:1px solid #eee;border-bottom:1px solid #eee;padding:2px 5px;white-space:nowrap}
table.hud thead th{position:sticky;top:0;background:#f0f0f0;z-index:1;vertical-align:bottom}
th.lab{writing-mode:vertical-rl;transform:rotate(180deg);max-height:140px;overflow:hidden;text-overflow:ellipsis;font-weight:500}
th.lab.base{background:#e3f2fd}
td.k{text-align:left;max-width:240px;overflow:hidden;text-overflow:ellipsis}
td.c{text-align:right;min-width:42px} td.c a{color:inherit;text-decoration:none;display:block}
td.PASS{background:#e8f5e9;color:#1b5e20} td.FAIL{background:#ffebee;color:#b71c1c}
td.ERROR{background:#fff3e0;color:#e65100} td.TIMEOUT{background:#f3e5f5;color:#4a148c} td.SKIP{background:#f5f5f5;color:#555}
td.reg{background:#e53935;color:#fff;font-weight:600} td.base{box-shadow:inset 0 0 0 2px #1e88e5}
td.culprit{box-shadow:inset 0 0 0 3px #212121}
td.none{background:#fafafa}
.bad{color:#c62828;font-weight:600} .ok{color:#2e7d32}
tr.hidden{display:none}
input#filter{margin-top:8px;padding:3px 6px;width:320px}
svg.spark{display:block}
"""

# The page's one script: filter rows by text, and say in the title how much of the grid the
# browser built (rows, label columns and cells counted from the DOM, not from the data).
_SCRIPT = """
(function () {
  var table = document.getElementById('hud');
  var rows = table.tBodies[0].rows;
  var cols = table.tHead.querySelectorAll('th.lab').length;
  var cells = table.querySelectorAll('td.c:not(.none)').length;
  var regressed = table.querySelectorAll('td.reg').length;
  document.title = 'bundlerun HUD: ' + rows.length + ' rows, ' + cols + ' labels, ' + cells + ' runs, ' +
    regressed + ' regressed';
  var box = document.getElementById('filter');
  box.addEventListener('input', function () {
    var q = box.value.toLowerCase();
    for (var i = 0; i < rows.length; i++) {
      var text = rows[i].getAttribute('data-key').toLowerCase();
      rows[i].classList.toggle('hidden', q !== '' && text.indexOf(q) < 0);
    }
  });
})();
"""


_VERDICTS = ("PASS", "FAIL", "ERROR", "TIMEOUT", "SKIP")


def _fmt(cell: Cell) -> str:
    if cell.value is None:
        return cell.run.verdict or "?"
    if cell.metric == "top1":
        return f"{cell.value * 100:.1f}%"
    if math.isinf(cell.value):
        return "exact"
    return f"{cell.value:.1f}"


def _sparkline(row: Row, columns: list[Column], cap: float, width: int = 120, height: int = 26) -> str:
    pts = [(i, row.cells[c.key]) for i, c in enumerate(columns) if c.key in row.cells and row.cells[c.key].value is not None]
    if not pts:
        return "<svg class='spark' width='%d' height='%d' role='img' aria-label='no metric'></svg>" % (width, height)
    metric = pts[0][1].metric
    vals = [min(c.value, cap) if metric == "sqnr" else c.value for _, c in pts]
    lo, hi = min(vals), max(vals)
    span = (hi - lo) or 1.0
    n = max(len(columns) - 1, 1)
    xy = [(2 + (i / n) * (width - 4), height - 3 - ((v - lo) / span) * (height - 6)) for (i, _), v in zip(pts, vals)]
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
    dots = "".join(f"<circle cx='{x:.1f}' cy='{y:.1f}' r='2.2' fill='#e53935'/>"
                   for (x, y), (_, c) in zip(xy, pts) if c.regressed)
    unit = "top-1" if metric == "top1" else "worst SQNR (dB)"
    shown = (lambda v: f"{v * 100:.1f}%") if metric == "top1" else (lambda v: f"{v:.1f}")
    title = f"{unit}: {shown(lo)} .. {shown(hi)} over {len(pts)} run(s)"
    return (f"<svg class='spark' width='{width}' height='{height}' viewBox='0 0 {width} {height}' role='img' "
            f"aria-label='{_e(title)}'><title>{_e(title)}</title>"
            f"<polyline fill='none' stroke='#1e88e5' stroke-width='1.4' points='{line}'/>{dots}</svg>")


def _href(path: Path, out: Path) -> str:
    """A link from the site to a file: relative when it can be, a file:// URI otherwise."""
    from urllib.parse import quote

    try:
        rel = os.path.relpath(path, out)
        return quote(rel.replace(os.sep, "/"))
    except ValueError:
        return path.resolve().as_uri()


def render(grid: Grid, out: Path, db_path: str | Path, run_pages: dict[int, str], originals: dict[int, str]) -> str:
    cap = grid.rules.sqnr_ceiling_db
    cols = grid.columns
    head = ["<th>model</th><th>target</th><th>dtype</th><th>trend</th><th>status</th>"]
    for c in cols:
        when = history.display_time(c.started, utc=True) if c.started else ""
        base = " base" if grid.baseline_label is not None and c.key == grid.baseline_label else ""
        head.append(f"<th class='lab{base}' title='{_e(c.key)} {_e(when)}'>{_e(c.key)}</th>")
    body = []
    for ri, row in enumerate(grid.rows):
        latest = row.latest(cols)
        if row.baseline is None:
            status = "<span class='meta'>no baseline run</span>"
        elif row.culprit:
            ci = next(i for i, c in enumerate(cols) if c.key == row.culprit)
            status = (f"<span class='bad'>regressed since <a href='#r{ri}c{ci}'>{_e(row.culprit)}</a></span>")
        elif latest is not None and latest.run.verdict in ("ERROR", "TIMEOUT"):
            status = f"<span class='meta'>latest: {_e(latest.run.verdict)}</span>"
        else:
            status = "<span class='ok'>ok</span>"
        key = " ".join(str(x) for x in row.key)
        tds = [f"<td class='k'>{_e(row.model)}</td><td class='k'>{_e(row.target)}</td><td class='k'>{_e(row.dtype)}</td>",
               f"<td>{_sparkline(row, cols, cap)}</td><td class='k'>{status}</td>"]
        for ci, c in enumerate(cols):
            cell = row.cells.get(c.key)
            if cell is None:
                tds.append("<td class='c none'></td>")
                continue
            classes = ["c", cell.run.verdict if cell.run.verdict in _VERDICTS else "unknown"]
            if cell.regressed:
                classes.append("reg")
            if cell.baseline:
                classes.append("base")
            if cell.culprit:
                classes.append("culprit")
            r = cell.run
            tip = [f"run #{r.id}", f"verdict {r.verdict}", f"{'top-1' if cell.metric == 'top1' else 'worst SQNR'} {_fmt(cell)}"]
            if cell.runs > 1:
                tip.append(f"latest of {cell.runs} runs under this label")
            if cell.baseline:
                tip.append("baseline")
            if cell.why:
                tip.append("regressed: " + cell.why)
            if cell.culprit:
                tip.append("first label of the current regression")
            if r.started:
                tip.append(history.display_time(r.started, utc=True))
            link = run_pages.get(r.id)
            text = _e(_fmt(cell)) + ("&#9670;" if cell.culprit else "")
            inner = f"<a href='{_e(link)}'>{text}</a>" if link else text
            orig = originals.get(r.id)
            if orig:
                tip.append("original report: " + orig)
            tds.append(f"<td id='r{ri}c{ci}' class='{' '.join(_e(x) for x in classes)}' "
                       f"title='{_e(' | '.join(tip))}'>{inner}</td>")
        body.append(f"<tr data-key='{_e(key)}'>{''.join(tds)}</tr>")
    regressed_rows = sum(1 for r in grid.rows if r.culprit)
    script_hash = base64.b64encode(hashlib.sha256(_SCRIPT.encode()).digest()).decode()
    csp = (f"default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-{script_hash}'; img-src data:; "
           "base-uri 'none'; form-action 'none'")
    generated = datetime.now(timezone.utc).isoformat(timespec="seconds")
    baseline_text = (f"baseline: label {_e(grid.baseline_label)}" if grid.baseline_label is not None
                     else "baseline: each row's first run")
    r = grid.rules
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<meta http-equiv='Content-Security-Policy' content=\"{csp}\">"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>bundlerun HUD</title><style>{_CSS}</style></head><body>"
        "<h1>bundlerun accuracy HUD</h1>"
        f"<p class='meta'>{len(grid.rows)} model &times; target &times; dtype rows, {len(cols)} labels, "
        f"{grid.runs} runs from {_e(db_path)}; generated {_e(generated)}; {baseline_text}; "
        f"<span class='{'bad' if regressed_rows else 'ok'}'>{regressed_rows} row(s) regressed</span></p>"
        f"<p class='meta'>cell: the latest run under the label: top-1 for dataset runs, else the worst SQNR (dB) over "
        f"the case-outputs (exact: no error at all). Regressed: PASS &rarr; FAIL, worst SQNR down by more than "
        f"{r.sqnr_drop_db:g} dB (both capped at {r.sqnr_ceiling_db:g} dB), or top-1 down by more than "
        f"{r.top1_drop_points:g} points, against the baseline. &#9670; marks the culprit: the first label of a "
        "row's current regression.</p>"
        "<p class='meta legend'><span class='PASS' style='background:#e8f5e9'>PASS</span>"
        "<span style='background:#ffebee'>FAIL</span><span style='background:#e53935;color:#fff'>regressed</span>"
        "<span style='background:#fff3e0'>ERROR</span><span style='background:#f3e5f5'>TIMEOUT</span>"
        "<span style='box-shadow:inset 0 0 0 2px #1e88e5'>baseline</span></p>"
        "<input id='filter' type='search' placeholder='filter rows (model, target, dtype)' aria-label='filter rows'>"
        f"<div class='wrap'><table class='hud' id='hud'><thead><tr>{''.join(head)}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table></div>"
        f"<script>{_SCRIPT}</script></body></html>"
    )


def write_site(db_path: str | Path, out: str | Path, baseline: str | None = None,
               rules: RegressionRules | None = None, limit: int | None = None) -> tuple[Path, Grid]:
    """Write `out/index.html` and `out/runs/<id>.html`; returns the index path and the grid."""
    from bundlerun.runner.html_report import render_html

    out = Path(out)
    if not Path(db_path).exists():
        raise history.HistoryError(f"no history database at {db_path}")
    grid = build_grid(db_path, baseline, rules, limit)
    if baseline is not None and not any(c.key == baseline for c in grid.columns):
        raise history.HistoryError(f"baseline label {baseline!r} is not in history {db_path}")
    (out / "runs").mkdir(parents=True, exist_ok=True)
    run_pages: dict[int, str] = {}
    originals: dict[int, str] = {}
    for row in grid.rows:
        for cell in row.cells.values():
            rid = cell.run.id
            if rid in run_pages:
                continue
            report = history.load_report(db_path, rid)
            if cell.run.report_path:
                html_path = Path(cell.run.report_path).with_name("report.html")
                if html_path.is_file():
                    originals[rid] = str(html_path)
            nav = "<p class='meta'><a href='../index.html'>&larr; accuracy HUD</a>"
            if rid in originals:
                nav += f" &middot; <a href='{_e(_href(Path(originals[rid]), out / 'runs'))}'>original report</a>"
            page = render_html(report).replace("<body>", "<body>" + nav + "</p>", 1)
            atomic_write_text(out / "runs" / f"{rid}.html", page)
            run_pages[rid] = f"runs/{rid}.html"
    index = out / "index.html"
    atomic_write_text(index, render(grid, out, db_path, run_pages, originals))
    return index, grid
