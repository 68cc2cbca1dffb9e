"""The HUD's page (index.html) from the grid (runner/pictures/hud_grid.py): readable at suite scale.

Hundreds of rows: rows are grouped by flow/backend and operator, each group a header row with
its own cells over the commits (the worst of its rows there: red when one regressed, else the
count of failing rows), collapsible by a click; operator groups with nothing failing start
collapsed when the grid is large. A filter box (text, plus "only regressed or failing"),
headers that stay in view while scrolling (the column row and the name column), and regressed
rows first at every level.

Self-contained: inline CSS, inline SVG and one inline script allowed by its hash in the page's
Content-Security-Policy. Everything from the database is HTML-escaped with control characters
made visible (runner/writers/html.py `_e`).
"""

from __future__ import annotations

import base64
import hashlib
import math
import os
from datetime import datetime, timezone
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from bundlerun.runner.history import store as history
from bundlerun.runner.history.commits import looks_like_sha
from bundlerun.runner.judging.outcome import VERDICT_COLOURS, run_status
from bundlerun.runner.report.criteria_text import short_name
from bundlerun.runner.report.safe_text import one_line
from bundlerun.runner.writers.html import _e as _escape

MAX_SHOWN = 1000  # characters of one name, label or tooltip on the index (bundlerun's own: a stored
# string may be megabytes long; the page stays readable and small whatever the history holds)


def _e(value: object) -> str:
    """HTML-escaped text, cut to MAX_SHOWN characters."""
    text = "" if value is None else str(value)
    return _escape(text if len(text) <= MAX_SHOWN else one_line(text, MAX_SHOWN))
from bundlerun.runner.pictures.hud_grid import MODELS, SEVERITY, Cell, Column, Grid, Row
from bundlerun.targets.base import Verdict

_LEGEND: dict[str, str] = {Verdict.FAIL: "FAIL output criterion"}
COLLAPSE_ABOVE = 40  # rows: above this, operator groups with nothing failing start collapsed

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:16px;color:#222;background:#fafafa}
h1{font-size:1.3em;margin:0 0 4px} .meta{color:#555;font-size:.86em;margin:2px 0}
.legend span{display:inline-block;padding:2px 8px;margin:2px 6px 2px 0;border-radius:8px;font-size:.8em;line-height:1.3}
.bar{margin:8px 0;display:flex;gap:12px;align-items:center;font-size:.86em}
input#filter{padding:3px 6px;width:340px} button{font-size:.85em;padding:2px 8px}
.wrap{overflow:auto;max-height:calc(100vh - 150px);border:1px solid #ddd;background:#fff}
table.hud{border-collapse:separate;border-spacing:0;font-size:.78em}
table.hud th,table.hud td{border-right:1px solid #eee;border-bottom:1px solid #eee;padding:1px 4px;white-space:nowrap;
 box-sizing:border-box}
table.hud thead th{position:sticky;top:0;background:#f0f0f0;z-index:3;vertical-align:bottom}
.nm,.st,.tr{position:sticky;z-index:1;background:#fff;overflow:hidden;text-overflow:ellipsis}
.nm{left:0;width:330px;min-width:330px;max-width:330px;text-align:left}
.st{left:330px;width:190px;min-width:190px;max-width:190px;text-align:left}
.tr{left:520px;width:92px;min-width:92px;max-width:92px;border-right:2px solid #cfd8dc !important}
table.hud thead th.nm,table.hud thead th.st,table.hud thead th.tr{z-index:4;background:#f0f0f0}
th.lab{writing-mode:vertical-rl;transform:rotate(180deg);max-height:130px;overflow:hidden;font-weight:500;
 font-family:ui-monospace,Menlo,monospace;font-size:.95em}
th.lab.base{background:#e3f2fd} th.lab.bucket{color:#777;font-style:italic}
.sub{color:#78909c;font-size:.9em;margin-left:4px}
td.c{text-align:right;min-width:34px} td.c a{color:inherit;text-decoration:none;display:block}
td.c.llm a{display:inline} td.c a.sq{margin-left:3px;font-size:.85em;opacity:.8}
""" + "".join(f"td.{v},.legend .{v}{{background:{c[1]};color:{c[2]}}} " for v, c in VERDICT_COLOURS.items()) + """
td.flaky,.legend .flaky{outline:2px dashed #8e24aa;outline-offset:-3px}
.legend .flaky{padding:4px 10px}
td.reg{background:#e53935;color:#fff;font-weight:600} td.base{box-shadow:inset 0 0 0 2px #1e88e5}
td.culprit{box-shadow:inset 0 0 0 3px #212121}
td.none{background:#fcfcfc}
tr.grp td,tr.grp th{background:#eceff1;font-weight:600;cursor:pointer;border-bottom:1px solid #cfd8dc}
tr.grp .nm,tr.grp .st,tr.grp .tr{z-index:2;background:#eceff1}
tr.g2 th.nm{padding-left:18px;font-weight:500} tr.g2 .nm,tr.g2 .st,tr.g2 .tr,tr.g2 td{background:#f5f7f8}
tr.grp td.g{text-align:center;font-weight:500;min-width:34px}
""" + "".join(f"tr.grp td.g{v}{{background:{c[1]};color:{c[2]}}} " for v, c in VERDICT_COLOURS.items()) + """
tr.grp td.greg{background:#c62828;color:#fff}
tr.grp .tw{display:inline-block;width:1em} tr.grp.shut .tw::before{content:'\\25B8'} tr.grp .tw::before{content:'\\25BE'}
.src{font-size:.78em;color:#607d8b;margin-left:4px}
tr.hid{display:none}
.bad{color:#c62828;font-weight:600} .ok{color:#2e7d32}
svg.spark{display:block}
"""

# The page's one script: collapsible groups, the filter, and the title saying how much of the
# grid the browser built (rows, label columns, run cells and regressed cells counted from the DOM).
_SCRIPT = """
(function () {
  var table = document.getElementById('hud');
  var rows = table.querySelectorAll('tr.row');
  var groups = table.querySelectorAll('tr.grp');
  var cols = table.tHead.querySelectorAll('th.lab').length;
  var cells = table.querySelectorAll('td.c:not(.none)').length;
  var regressed = table.querySelectorAll('td.c.reg').length;
  var box = document.getElementById('filter');
  var bad = document.getElementById('bad');
  var facets = document.querySelectorAll('select[data-f]');
  var label = document.getElementById('f-l');
  var heads = table.tHead.querySelectorAll('th.lab');
  function onecol() {  // the label filter: that commit's column alone
    var k = -1;
    for (var i = 0; i < heads.length; i++) if (heads[i].getAttribute('data-c') === label.value) k = i;
    var trs = table.querySelectorAll('tr');
    for (var j = 0; j < trs.length; j++) {
      var tds = trs[j].children;
      for (var c = 3; c < tds.length; c++) tds[c].style.display = (k < 0 || c - 3 === k) ? '' : 'none';
    }
  }
  function shut(g) { var h = table.querySelector('tr.grp[data-id="' + g + '"]'); return h && h.classList.contains('shut'); }
  function apply() {
    var q = box.value.toLowerCase(), only = bad.checked, filtering = q !== '' || only;
    for (var e = 0; e < facets.length; e++) if (facets[e].value !== '') filtering = true;
    var seen = {};
    for (var i = 0; i < rows.length; i++) {
      var r = rows[i];
      var match = (q === '' || r.getAttribute('data-key').toLowerCase().indexOf(q) >= 0) &&
        (!only || r.getAttribute('data-bad') === '1');
      for (var f = 0; f < facets.length; f++) {
        if (facets[f].value !== '' && r.getAttribute('data-' + facets[f].getAttribute('data-f')) !== facets[f].value) match = false;
      }
      if (match) { seen[r.getAttribute('data-g')] = 1; seen[r.getAttribute('data-o')] = 1; }
      var open = filtering || (!shut(r.getAttribute('data-g')) && !shut(r.getAttribute('data-o')));
      r.classList.toggle('hid', !(match && open));
    }
    for (var j = 0; j < groups.length; j++) {
      var h = groups[j], id = h.getAttribute('data-id'), parent = h.getAttribute('data-g');
      var show = !filtering || seen[id];
      if (parent && !filtering && shut(parent)) show = false;
      h.classList.toggle('hid', !show);
    }
    var shown = table.querySelectorAll('tr.row:not(.hid)').length;
    document.title = 'bundlerun HUD: ' + rows.length + ' rows, ' + cols + ' labels, ' + cells + ' runs, ' +
      regressed + ' regressed, ' + shown + ' shown';
  }
  for (var k = 0; k < groups.length; k++) {
    groups[k].addEventListener('click', function () { this.classList.toggle('shut'); apply(); });
  }
  function all(closed) { for (var i = 0; i < groups.length; i++) groups[i].classList.toggle('shut', closed); apply(); }
  document.getElementById('expand').addEventListener('click', function () { all(false); });
  document.getElementById('collapse').addEventListener('click', function () { all(true); });
  box.addEventListener('input', apply);
  bad.addEventListener('change', apply);
  for (var s = 0; s < facets.length; s++) facets[s].addEventListener('change', apply);
  label.addEventListener('change', onecol);
  if (location.hash.indexOf('#q=') === 0) box.value = decodeURIComponent(location.hash.slice(3));  // a shared filter
  apply();
  var wrap = table.parentNode;
  wrap.scrollLeft = wrap.scrollWidth;  // the newest commits in view; names, status and trend stay
})();
"""


@dataclass
class Page:
    """Where a page sits in a paged site (runner/pictures/hud_site.py): the offsets of its first row
    and column in the whole grid (cell ids stay unique across pages), its navigation, and where a
    culprit outside its window is (`elsewhere(column key, row index)` -> href)."""

    row_offset: int = 0
    col_offset: int = 0
    nav: str = ""
    elsewhere: Callable[[str, int], str] = lambda key, ri: "#"
    sequence_pages: dict[tuple, str] = field(default_factory=dict)  # row key -> its per-sequence page (LLM rows)


def _facets(grid: Grid) -> str:
    """The filters by model, target, backend, dtype and label (a label shows that commit's column
    alone), filled with what the page holds."""
    def options(values) -> str:
        return "<option value=''>all</option>" + "".join(f"<option>{_e(v)}</option>" for v in sorted(set(values)))

    rows = grid.rows
    return ("<div class='bar facets'>"
            + "".join(f"<label>{name} <select id='f-{k}' data-f='{k}'>{options(str(get(r) or '') for r in rows)}</select></label>"
                      for k, name, get in (("m", "model", lambda r: r.model), ("t", "target", lambda r: r.target),
                                           ("b", "backend", lambda r: r.backend or r.group), ("d", "dtype", lambda r: r.dtype)))
            + f"<label>label <select id='f-l'>{options(c.key for c in grid.columns)}</select></label></div>")


def fmt(cell: Cell, value: float | None = None, metric: str | None = None) -> str:
    value = cell.value if value is None and metric is None else value
    metric = metric or cell.metric
    if value is None:
        return cell.run.verdict or "?"
    if metric == "top1":
        return f"{value * 100:.1f}%"
    if math.isinf(value):
        return "exact"
    return f"{value:.1f}"


SQNR_LABEL = "SQNR (dB, signal = reference)"  # the report's SQNR: 20*log10(||reference|| / ||actual - reference||)


def status(cell: Cell) -> str:
    """What the cell is shown as (runner/judging/outcome.py run_status): its verdict, TIMEOUT when every case
    that did not finish timed out, STOPPED when the run was stopped (Ctrl-C / SIGTERM)."""
    x = cell.extra
    return run_status(cell.run.verdict, cell.run.exit_code, _count(x.get("n_timeout")), _count(x.get("n_error")))


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def complete(cell: Cell) -> bool:
    """Whether the run judged every case (its numbers describe the run, not the cases that happened to run)."""
    x = cell.extra
    return status(cell) in (Verdict.PASS, Verdict.FAIL) and not _count(x.get("n_timeout")) and not _count(x.get("n_error"))


def failure(cell: Cell) -> str:
    """`out0 sqnr` (+N more failing outputs): the run's first failing output and its failed criteria."""
    import json

    x = cell.extra
    name = x.get("fail_output")
    if not name:
        return ""
    try:
        failed = json.loads(x.get("fail_criteria") or "[]")
    except (TypeError, ValueError):
        failed = []
    crits = list(dict.fromkeys(short_name(f.get("criterion")) for f in failed if isinstance(f, dict))) \
        if isinstance(failed, list) else []
    more = _count(x.get("failing_outputs")) - 1
    text = str(name)[:16] + (" " + "+".join(crits[:2]) if crits else "")
    return text + (f" +{more}" if more > 0 else "")


def accuracy_delta(r: history.RunRecord) -> str:
    """A dataset run's paired top-1 difference against the float reference: `+0.0`."""
    return "" if r.top1_diff is None else f"{r.top1_diff * 100:+.1f}"


def accuracy_tip(r: history.RunRecord) -> list[str]:
    """A dataset run's accuracy for the tooltip: top-1, the float reference's, the paired difference
    with its interval (runner/judging/accuracy.py), the agreement."""
    if r.top1 is None:
        return []
    tip = [f"dataset top-1 {r.top1 * 100:.2f}%" + (f" of {r.samples} samples" if r.samples else "")]
    if r.reference_top1 is not None:
        tip.append(f"float reference {r.reference_top1 * 100:.2f}%")
    if r.top1_diff is not None:
        ci = (f", 95% CI [{r.top1_diff_low * 100:+.2f}, {r.top1_diff_high * 100:+.2f}]"
              if r.top1_diff_low is not None and r.top1_diff_high is not None else "")
        tip.append(f"target - float {r.top1_diff * 100:+.2f} points{ci} (paired)")
    if r.agreement is not None:
        tip.append(f"agreement {r.agreement * 100:.2f}%")
    return tip


def cell_text(cell: Cell) -> str:
    """The cell's visible text: the metric for a PASS; for a FAIL which output and criterion failed
    (`FAIL out0 sqnr`); for a run that did not complete its status alone, never a number over the
    cases that happened to run. A dataset run (`bundlerun accuracy`) is judged by its dataset
    numbers: its top-1 and the paired difference against the float model (`94.3% +0.0`), also
    when some cases fail element-wise (the tooltip counts them)."""
    shown = status(cell)
    if cell.metric == "top1" and cell.value is not None and complete(cell):
        delta = accuracy_delta(cell.run)
        return fmt(cell) + (f" {delta}" if delta else "")
    if shown == Verdict.PASS:
        return fmt(cell)
    if shown == Verdict.FAIL:
        why = failure(cell)
        return f"FAIL {why}" if why else Verdict.FAIL
    return shown


def sparkline(row: Row, columns: list[Column], cap: float, width: int = 110, height: int = 20) -> str:
    pts = [(i, row.cells[c.key]) for i, c in enumerate(columns)
           if c.key in row.cells and row.cells[c.key].value is not None and complete(row.cells[c.key])]
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
    unit = "top-1" if metric == "top1" else "worst " + SQNR_LABEL
    shown = (lambda v: f"{v * 100:.1f}%") if metric == "top1" else (lambda v: f"{v:.1f}")
    title = f"{unit}: {shown(lo)} .. {shown(hi)} over {len(pts)} column(s)"
    return (f"<svg class='spark' width='{width}' height='{height}' viewBox='0 0 {width} {height}' role='img' "
            f"aria-label='{_e(title)}'><title>{_e(title)}</title>"
            f"<polyline fill='none' stroke='#1e88e5' stroke-width='1.4' points='{line}'/>{dots}</svg>")


def href(path: Path, out: Path) -> str:
    """A link from the site to a file: relative when it can be, a file:// URI otherwise."""
    from urllib.parse import quote

    try:
        return quote(os.path.relpath(path, out).replace(os.sep, "/"))
    except ValueError:
        return path.resolve().as_uri()


def _column_head(c: Column, baseline: str | None) -> str:
    shown = c.key[:12] if looks_like_sha(c.key) else c.key
    tip = [c.key]
    if c.bucket:
        tip.append("runs with no label and no commit, bucketed by UTC day")
    if c.commit and c.commit != c.key:
        tip.append(f"commit {c.commit}")
    if c.commit_time:
        tip.append("committed " + history.display_time(c.commit_time, utc=True))
    if c.started:
        tip.append("first run " + history.display_time(c.started, utc=True))
    tip.append(f"{c.runs} run(s)")
    classes = "lab" + (" base" if baseline is not None and c.key == baseline else "") + (" bucket" if c.bucket else "")
    return f"<th class='{classes}' data-c='{_e(c.key)}' title='{_e(' | '.join(tip))}'>{_e(shown)}</th>"


def _cell(cell: Cell | None, ri: int, ci: int, run_pages: dict[int, str], originals: dict[int, str],
          sequences: str | None = None) -> str:
    if cell is None:
        return "<td class='c none'></td>"
    shown = status(cell)
    classes = ["c", shown]
    if cell.regressed:
        classes.append("reg")
    if cell.baseline:
        classes.append("base")
    if cell.culprit:
        classes.append("culprit")
    if cell.extra.get("replay_findings"):  # --replay: flaky numerics, told apart from wrong numerics
        classes.append("flaky")
    r = cell.run
    x = cell.extra
    tip = [f"run #{r.id}", f"verdict {r.verdict}" + (f" (shown as {shown})" if shown != r.verdict else "")]
    if complete(cell) and cell.metric == "top1":
        tip += accuracy_tip(r)
        if r.n_fail:
            tip.append(f"element-wise: {r.n_pass or 0} cases PASS, {r.n_fail} FAIL (a dataset run is judged by its "
                       "top-1)")
    elif complete(cell):
        tip.append(f"{'top-1' if cell.metric == 'top1' else 'worst ' + SQNR_LABEL} {fmt(cell)}")
    else:
        tip.append(f"did not complete ({_count(x.get('n_timeout'))} timed out, {_count(x.get('n_error'))} errors): "
                   "no metric shown for the cases that happened to run")
    if shown == Verdict.FAIL and failure(cell):
        tip.append(f"failed: {failure(cell)}")
    if x.get("max_error") is not None:
        tip.append(f"max error {x['max_error']:.4g}")
    if r.max_mae is not None:
        tip.append(f"max MAE {r.max_mae:.4g}")
    if x.get("replay_findings"):
        tip.append(f"flaky numerics: {x['replay_findings']} output(s) differed between --replay runs"
                   + (f", {x['replay_flips']} with a verdict that flipped" if x.get("replay_flips") else ""))
    if x.get("suite_result"):
        tip.append(f"suite: {x['suite_result']}" + (f" ({x['suite_detail']})" if x.get("suite_detail") else ""))
    if cell.runs > 1:
        tip.append(f"latest of {cell.runs} runs in this column")
        if cell.worst is not None and cell.worst.id != r.id:
            tip.append(f"worst: run #{cell.worst.id} {cell.worst.verdict} "
                       f"{fmt(cell, cell.worst_value, cell.metric)}")
    if cell.baseline:
        tip.append("baseline")
    if cell.why:
        tip.append("regressed: " + cell.why)
    if cell.culprit:
        tip.append("first column of the current regression")
    if x.get("dirty"):
        tip.append("working tree had local changes")
    if r.started:
        tip.append(history.display_time(r.started, utc=True))
    link = run_pages.get(r.id)
    if not link:
        tip.append("report page not rendered yet (bundlerun hud --all-run-pages)")
    text = _e(cell_text(cell)) + ("&#9670;" if cell.culprit else "")
    inner = f"<a href='{_e(link)}'>{text}</a>" if link else text
    if sequences:  # an LLM row: this run's per-sequence figures, among the row's other commits
        classes.append("llm")
        inner += f"<a class='sq' href='{_e(sequences)}#run{r.id}' title='per-sequence figures over commits'>&#8801;</a>"
    if originals.get(r.id):
        tip.append("original report: " + originals[r.id])
    return (f"<td id='r{ri}c{ci}' class='{' '.join(_e(c) for c in classes)}' "
            f"title='{_e(' | '.join(tip))}'>{inner}</td>")


def _group_cells(rows: list[Row], cols: list[Column]) -> str:
    """Per column: the worst of the group's rows there (red when one regressed)."""
    out = []
    for c in cols:
        cells = [r.cells[c.key] for r in rows if c.key in r.cells]
        if not cells:
            out.append("<td class='g'></td>")
            continue
        reg = sum(1 for x in cells if x.regressed)
        failing = sum(1 for x in cells if x.run.verdict == Verdict.FAIL)
        worst = status(max(cells, key=lambda x: SEVERITY.get(x.run.verdict or "", 3)))
        kind = "greg" if reg else f"g{worst if worst in VERDICT_COLOURS else 'ERROR'}"
        text = f"{reg}&#9660;" if reg else (str(failing) if failing else "ok" if worst == Verdict.PASS else _e(worst[:3]))
        tip = f"{len(cells)} row(s): {reg} regressed, {failing} failing, worst {worst}"
        out.append(f"<td class='g {kind}' title='{_e(tip)}'>{text}</td>")
    return "".join(out)


def _group_head(level: int, gid: str, parent: str | None, label: str, rows: list[Row], cols: list[Column],
                shut: bool) -> str:
    reg = sum(1 for r in rows if r.culprit)
    failing = sum(1 for r in rows if r.failing(cols))
    counts = f"{len(rows)} row(s)" + (f", <span class='bad'>{reg} regressed</span>" if reg else "") + (
        f", {failing} failing" if failing else "")
    attrs = f"data-id='{gid}'" + (f" data-g='{parent}'" if parent else "")
    return (f"<tr class='grp g{level}{' shut' if shut else ''}' {attrs}><th class='nm' title='{label}'>"
            f"<span class='tw'></span>{label}</th><td class='st'>{counts}</td><td class='tr'></td>"
            f"{_group_cells(rows, cols)}</tr>")


def render(grid: Grid, out: Path, db_path: str | Path, run_pages: dict[int, str], originals: dict[int, str],
           page: Page | None = None) -> str:
    """The page: the whole grid, or with `page` one window of commits x one slice of rows of a
    larger grid (runner/pictures/hud_site.py), with links to the other pages."""
    page = page or Page()
    cap = grid.rules.sqnr_ceiling_db
    cols = grid.columns
    head = ["<th class='nm'>what ran (test / model / bundle) &middot; target &middot; dtype</th>"
            "<th class='st'>status</th><th class='tr'>trend</th>"]
    head += [_column_head(c, grid.baseline_label) for c in cols]
    by_group: dict[str, list[Row]] = {}
    by_op: dict[tuple[str, str], list[Row]] = {}
    for row in grid.rows:
        by_group.setdefault(row.group, []).append(row)
        by_op.setdefault((row.group, row.operator), []).append(row)
    large = len(grid.rows) > COLLAPSE_ABOVE
    body, seen_g, seen_o = [], {}, {}
    for ri, row in enumerate(grid.rows, start=page.row_offset):
        if row.group not in seen_g:
            seen_g[row.group] = f"g{len(seen_g)}"
            body.append(_group_head(1, seen_g[row.group], None, "flow/backend: " + _e(row.group),
                                    by_group[row.group], cols, False))
        gid = seen_g[row.group]
        okey = (row.group, row.operator)
        if okey not in seen_o:
            seen_o[okey] = f"{gid}o{len(seen_o)}"
            members = by_op[okey]
            quiet = not any(r.culprit or r.failing(cols) for r in members)
            label = ("operator: " if row.operator != MODELS else "") + _e(row.operator)
            body.append(_group_head(2, seen_o[okey], gid, label, members, cols, large and quiet))
        oid = seen_o[okey]
        body.append(_row_html(row, ri, cols, cap, gid, oid, run_pages, originals, page))
    regressed_rows = sum(1 for r in grid.rows if r.culprit)
    script_hash = base64.b64encode(hashlib.sha256(_SCRIPT.encode()).digest()).decode()
    csp = (f"default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-{script_hash}'; img-src data:; "
           "base-uri 'none'; form-action 'none'")
    generated = datetime.now(timezone.utc).isoformat(timespec="seconds")
    baseline_text = (f"baseline: label {_e(grid.baseline_label)}" if grid.baseline_label is not None
                     else "baseline: each row's first column")
    r = grid.rules
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<meta http-equiv='Content-Security-Policy' content=\"{csp}\">"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>bundlerun HUD</title><style>{_CSS}</style></head><body>"
        "<h1>bundlerun accuracy HUD</h1>"
        f"<p class='meta'>{len(grid.rows)} rows in {len(by_group)} flow/backend group(s) and {len(by_op)} operator "
        f"group(s), {len(cols)} labels (commits), {grid.runs} runs from {_e(db_path)}"
        + (f" ({grid.interrupted} interrupted run(s) left out: no data point)" if grid.interrupted else "")
        + f"; generated {_e(generated)}; "
        f"{baseline_text}; <span class='{'bad' if regressed_rows else 'ok'}'>{regressed_rows} row(s) regressed</span></p>"
        f"<p class='meta'>columns: commits in commit order (runs without a label or commit: by day, in italics). "
        f"cell: the latest run there (the tooltip names the worst when there were several): top-1 for dataset runs, "
        f"else the worst {SQNR_LABEL} over the outputs (exact: no error at all); a FAIL names its first failing output "
        f"and criterion; a run that did not complete shows its status (ERROR, TIMEOUT), no number; a stopped run "
        f"(Ctrl-C / SIGTERM) is no data point and has no cell. Regressed: PASS &rarr; FAIL, worst SQNR "
        f"down by more than {r.sqnr_drop_db:g} dB (both capped at {r.sqnr_ceiling_db:g} dB), or top-1 down by more "
        f"than {r.top1_drop_points:g} points, against the baseline; &#9670; marks the culprit. Group rows: per "
        "column the worst of their rows (&#9660;: regressed rows, a number: failing rows); click to fold.</p>"
        "<p class='meta legend'>" + "".join(f"<span class='{v}'>{_LEGEND.get(v, v)}</span>" for v in VERDICT_COLOURS
                                            if v != "STOPPED")  # stopped runs have no cell (runner/pictures/hud_grid.py)
        + "<span style='background:#e53935;color:#fff'>regressed</span>"
        "<span style='box-shadow:inset 0 0 0 2px #1e88e5'>baseline</span>"
        "<span class='flaky'>flaky numerics (--replay)</span></p>"
        "<div class='bar'><input id='filter' type='search' placeholder='filter rows (test, operator, flow, target, "
        "dtype)' aria-label='filter rows'><span><input id='bad' type='checkbox' aria-label='only regressed or failing'>"
        " only regressed or failing</span><button id='expand' type='button'>expand all</button>"
        "<button id='collapse' type='button'>collapse all</button></div>"
        + _facets(grid) + page.nav +
        f"<div class='wrap'><table class='hud' id='hud'><thead><tr>{''.join(head)}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table></div>"
        f"<script>{_SCRIPT}</script></body></html>"
    )


def _row_html(row: Row, ri: int, cols: list[Column], cap: float, gid: str, oid: str,
              run_pages: dict[int, str], originals: dict[int, str], page: Page) -> str:
    latest = row.latest(cols)
    if row.baseline is None:
        status_html = "<span class='meta'>no baseline run</span>"
    elif row.culprit:
        ci = next((i for i, c in enumerate(cols, start=page.col_offset) if c.key == row.culprit), None)
        where = f"#r{ri}c{ci}" if ci is not None else page.elsewhere(row.culprit, ri)
        shown = row.culprit[:8] if looks_like_sha(row.culprit) else row.culprit
        status_html = (f"<span class='bad' title='regressed since {_e(row.culprit)}'>regressed since "
                       f"<a href='{_e(where)}'>{_e(shown)}</a></span>")
    elif latest is not None and status(latest) != Verdict.PASS:
        status_html = f"<span class='meta'>latest: {_e(status(latest))}</span>"
    else:
        status_html = "<span class='ok'>ok</span>"
    key = " ".join(str(x) for x in (row.model, row.operator, row.group, row.target, row.dtype, row.source, row.tag))
    facets = "".join(f" data-{k}='{_e(v)}'" for k, v in (("m", row.model), ("t", row.target), ("b", row.backend or row.group),
                                                         ("d", row.dtype)))
    bad = "1" if row.culprit or row.failing(cols) else "0"
    source = "" if row.source == "bundlerun" else f" &middot; {_e(row.source)}"
    what = f"{row.model} | {row.target} | {row.dtype} | {row.group} / {row.operator} | {row.source}"
    series = f" &middot; <span class='series'>{_e(row.tag)}</span>" if row.tag else ""  # runner/history/series.py
    seq = page.sequence_pages.get(row.key)
    seq_link = f" &middot; <a href='{_e(seq)}'>sequences</a>" if seq else ""  # hud_sequences.py
    tds = [f"<td class='nm' title='{_e(what)}'>{_e(row.model)}<span class='sub'>{_e(row.target)} &middot; "
           f"{_e(row.dtype)}{series}{source}{seq_link}</span></td><td class='st'>{status_html}</td>"
           f"<td class='tr'>{sparkline(row, cols, cap, width=84)}</td>"]
    tds += [_cell(row.cells.get(c.key), ri, ci, run_pages, originals, seq)
            for ci, c in enumerate(cols, start=page.col_offset)]
    return (f"<tr class='row' data-g='{gid}' data-o='{oid}' data-bad='{bad}' data-key='{_e(key)}'{facets}>"
            f"{''.join(tds)}</tr>")
