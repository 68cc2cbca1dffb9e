"""The HUD as an incremental, paged static site: fast at 100,000 runs.

Pages: the grid (runner/pictures/hud_grid.py) is cut into windows of WINDOW commits, fixed from the
oldest so a new commit changes only the newest window, times slices of ROWS rows in the grid's
order (regressed first). `w0003-r001.html` is window 3, slice 1; `index.html` is the newest window's
first slice. A page links to the older and newer window, the other slices and `pages.html` (every
window and every row, with where it is). Each page filters its rows by model, target, backend and
dtype and shows one label's column alone (runner/pictures/hud_page.py).

Incremental: `.hud-state.json` in the site keeps the compact grid (hud_grid.Compact: per run its id,
row, column, verdict and metric), the last run id read, a digest of what each page shows and which
run pages are written. A build reads only the runs after that id, rebuilds the grid in memory,
and renders and writes only the pages whose digest changed, reading full records for their
cells alone. An LLM row (model id llm:ARCH) also has `seq/<row>.html`, its per-sequence figures over
commits (runner/pictures/hud_sequences.py), linked from its name and its cells and rewritten when
the row's runs change. The state is derived data: one from another history (the last run it read is gone or
another run), other options or another version is ignored and the site rebuilt from scratch.

Run pages (`runs/<id>.html`: the report rendered from the JSON stored in the history, written
once: a recorded run never changes) are written for every run a build reads as new that a cell
shows, so a site kept up to date has one for every cell. A first build over a large history writes
those of the newest window and of every cell that is not a PASS (what people open); older passing
cells link to their original report.html while it exists, else say how to get the page
(`bundlerun hud --all-run-pages`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from bundlerun.bundles.fileio import atomic_write_text
from bundlerun.runner.history import store as history
from bundlerun.runner.history.regression import RegressionRules
from bundlerun.runner.pictures.hud_grid import Cell, Column, Compact, Grid, Row, fill, grid_of
from bundlerun.runner.pictures import hud_sequences
from bundlerun.runner.pictures.hud_page import Page, render, status
from bundlerun.runner.writers.html import _e
from bundlerun.targets.base import Verdict
from bundlerun.bundles.fileio import named
from bundlerun.runner.history.tags import load_reports, run_extras
from bundlerun.runner.pictures.hud_page import href
from bundlerun.runner.report.safe_text import one_line
from bundlerun.runner.writers.html import render_html

STATE_NAME = ".hud-state.json"
STATE_VERSION = 2  # 2: LLM rows link their per-sequence page (seq/*.html)
WINDOW = 12  # commits per page: bundlerun's own choice, with ROWS it keeps a page well under 2 MB and
ROWS = 200  # what a +100-runs build redraws small (bench/bench_hud.py); rows per page
FIRST_RUN_PAGES = 1000  # run pages a first build renders, newest commits first (bundlerun's own budget:
# a report page costs ~10 ms, one with case plots ~0.3 s; --all-run-pages renders every one)


@dataclass
class State:
    """What a build leaves for the next one (the site's `.hud-state.json`)."""

    key: str  # the options and the layout: another key, another site
    last_uuid: str | None  # the run uuid of data.last_id: a history replaced under the same path is noticed
    data: Compact
    pages: dict[str, str] = field(default_factory=dict)  # file name -> digest of what it shows
    run_pages: set[int] = field(default_factory=set)


@dataclass
class Built:
    """What a build did (the CLI says it; the bench measures it)."""

    index: Path
    grid: Grid
    new_runs: int
    pages_written: int
    pages_kept: int
    run_pages_written: int
    incremental: bool


def _options_key(baseline: str | None, rules: RegressionRules, limit: int | None, all_run_pages: bool,
                 window: int, rows: int) -> str:
    return json.dumps([STATE_VERSION, window, rows, baseline, asdict(rules), limit, all_run_pages], sort_keys=True)


def _load_state(out: Path, key: str, db_path: Any) -> State | None:
    try:
        raw = json.loads((out / STATE_NAME).read_text(encoding="utf-8"))
        if raw.get("key") != key:
            return None
        data = Compact.from_json(raw["data"])
        state = State(key, raw.get("last_uuid"), data, dict(raw.get("pages") or {}),
                      {int(i) for i in raw.get("run_pages") or []})
    except (OSError, ValueError, TypeError, KeyError):
        return None  # no state, or a damaged one: a full build
    if data.last_id:
        still = history.list_runs(db_path, limit=None, ids=[data.last_id])
        if not still or still[0].run_uuid != state.last_uuid:
            return None
    return state


def _save_state(out: Path, state: State) -> None:
    atomic_write_text(out / STATE_NAME, json.dumps(
        {"key": state.key, "last_uuid": state.last_uuid, "data": state.data.to_json(), "pages": state.pages,
         "run_pages": sorted(state.run_pages)}, separators=(",", ":")))


def page_name(window: int, part: int, last_window: int) -> str:
    return "index.html" if (window == last_window and part == 0) else f"w{window:04d}-r{part:03d}.html"


def write_site(db_path: Any, out: str | Path, baseline: str | None = None,
               rules: RegressionRules | None = None, limit: int | None = None,
               all_run_pages: bool = False, window: int = WINDOW, rows_per_page: int = ROWS) -> Built:
    """Bring the site in `out` up to date with the history; see the module's docstring. `window`
    commits x `rows_per_page` rows per page."""

    out = Path(out)
    if not history.exists(db_path):
        raise history.HistoryError(f"no history database at {db_path}")
    rules = rules or RegressionRules()
    window, rows_per_page = max(1, int(window)), max(1, int(rows_per_page))
    key = _options_key(baseline, rules, limit, all_run_pages, window, rows_per_page)
    state = None if limit else _load_state(out, key, db_path)
    incremental = state is not None
    if state is None:
        state = State(key, None, Compact())
        fresh = list(reversed(history.list_runs(db_path, limit=limit or None)))
        extras = run_extras(db_path)
    else:
        fresh = list(reversed(history.list_runs(db_path, limit=None, after_id=state.data.last_id)))
        extras = run_extras(db_path, after_id=state.data.last_id)
    state.data.add(fresh, extras)
    if fresh:
        state.last_uuid = fresh[-1].run_uuid if fresh[-1].id == state.data.last_id else state.last_uuid
    grid = grid_of(state.data, baseline, rules)
    if baseline is not None and not any(c.key == baseline for c in grid.columns):
        raise history.HistoryError(f"baseline label {baseline!r} is not in history {db_path}")
    (out / "runs").mkdir(parents=True, exist_ok=True)

    cols, rows = grid.columns, grid.rows
    windows = [cols[i:i + window] for i in range(0, len(cols), window)] or [[]]
    parts = [rows[j:j + rows_per_page] for j in range(0, len(rows), rows_per_page)] or [[]]
    last = len(windows) - 1
    where = {c.key: (i // window, i) for i, c in enumerate(cols)}
    new_ids = {r.id for r in fresh}

    # Which run pages this build writes: every shown run read as new (or every one asked for); on
    # a first build, those of the newest commits, FIRST_RUN_PAGES of them.
    wanted: list[Cell] = []
    if all_run_pages or incremental:
        wanted = [cell for row in rows for cell in row.cells.values()
                  if cell.run.id not in state.run_pages and (all_run_pages or cell.run.id in new_ids)]
    else:
        for col in reversed(cols):
            if len(wanted) >= FIRST_RUN_PAGES:
                break
            wanted += [row.cells[col.key] for row in rows if col.key in row.cells]
    will_have = state.run_pages | {c.run.id for c in wanted}

    names: dict[str, tuple[int, int]] = {}
    digests: dict[str, str] = {}
    for k in range(len(windows)):
        for j in range(len(parts)):
            name = page_name(k, j, last)
            names[name] = (k, j)
            digests[name] = _digest(grid, windows, parts, k, j, last, where, will_have)
    dirty = [n for n in names if state.pages.get(n) != digests[n] or not (out / n).is_file()]

    drawn = [row.cells[c.key] for n in dirty for row in parts[names[n][1]] for c in windows[names[n][0]]
             if c.key in row.cells]
    fill(db_path, drawn + wanted, known={r.id: r for r in fresh}, known_extras=extras)
    written, tried = _write_run_pages(db_path, out, wanted)
    state.run_pages |= written

    run_pages = {rid: f"runs/{rid}.html" for rid in state.run_pages | tried}
    sequence_pages = {row.key: hud_sequences.page_name(row) for row in rows if hud_sequences.has_sequences(row)}
    originals = {c.run.id: str(Path(c.run.report_path).with_name("report.html")) for c in drawn
                 if c.run.report_path and Path(c.run.report_path).with_name("report.html").is_file()}
    for name in dirty:
        k, j = names[name]
        page = Page(row_offset=j * rows_per_page, col_offset=k * window, nav=_nav(windows, parts, k, j, last, rows_per_page),
                    elsewhere=partial(_elsewhere, part=j, where=where, last=last), sequence_pages=sequence_pages)
        sub = Grid(windows[k], parts[j], grid.baseline_label,
                   sum(row.cells[c.key].runs for row in parts[j] for c in windows[k] if c.key in row.cells),
                   rules, interrupted=grid.interrupted)
        atomic_write_text(out / name, render(sub, out, db_path, run_pages, originals, page))
        state.pages[name] = digests[name]
    seq_names = _write_sequence_pages(db_path, out, state, [r for r in rows if r.key in sequence_pages], cols,
                                      run_pages)
    for gone in set(state.pages) - set(names) - {"pages.html"} - seq_names:
        (out / gone).unlink(missing_ok=True)
        del state.pages[gone]
    if not incremental:  # pages of an earlier site (another history, other options) this one does not have
        for old in out.glob("w[0-9][0-9][0-9][0-9]-r[0-9][0-9][0-9].html"):
            if old.name not in names:
                old.unlink(missing_ok=True)
        for old in out.glob("seq/*.html"):
            if f"seq/{old.name}" not in seq_names:
                old.unlink(missing_ok=True)
    directory = _directory(grid, windows, parts, last)
    if state.pages.get("pages.html") != hashlib.sha256(directory.encode()).hexdigest() or not (out / "pages.html").is_file():
        atomic_write_text(out / "pages.html", directory)
    state.pages["pages.html"] = hashlib.sha256(directory.encode()).hexdigest()
    _save_state(out, state)
    return Built(out / "index.html", grid, len(fresh), len(dirty), len(names) - len(dirty), len(written), incremental)


def _write_sequence_pages(db_path: Any, out: Path, state: State, rows: list[Row], cols: list[Column],
                          run_pages: dict[int, str]) -> set[str]:
    """seq/<row>.html for each LLM row (runner/pictures/hud_sequences.py), rewritten only when what it
    shows changed (its digest: the row's runs and which of them have a run page); the page names."""
    digests = {hud_sequences.page_name(r): (r, hud_sequences.digest(r, cols, set(run_pages))) for r in rows}
    dirty = [(name, r, d) for name, (r, d) in digests.items() if state.pages.get(name) != d or not (out / name).is_file()]
    if dirty:
        (out / "seq").mkdir(parents=True, exist_ok=True)
        figures = history.sequence_figures(db_path, [c.run.id for _, r, _ in dirty for c in r.cells.values()])
        for name, r, d in dirty:
            atomic_write_text(out / name, hud_sequences.render(r, cols, figures, run_pages))
            state.pages[name] = d
    return set(digests)


def _elsewhere(key: str, ri: int, part: int, where: dict[str, tuple[int, int]], last: int) -> str:
    window, ci = where.get(key, (last, 0))
    return f"{page_name(window, part, last)}#r{ri}c{ci}"


def _digest(grid: Grid, windows: list[list[Column]], parts: list[list[Row]], k: int, j: int, last: int,
            where: dict[str, tuple[int, int]], run_pages: set[int]) -> str:
    """What the page shows, as a hash: its columns, rows, cells (a run never changes: its id stands for
    what it shows; the flags and the row's baseline for its judgement) and links; equal digests,
    equal pages."""
    cols = windows[k]
    keys = [c.key for c in cols]
    parts_out = [repr((k == last, k, j, len(parts), k < last, grid.baseline_label, grid.interrupted,
                       [(c.key, c.label, c.first_id, c.started, c.commit_time, c.commit, c.bucket, c.runs)
                        for c in cols]))]
    for row in parts[j]:
        parts_out.append(repr((row.key, row.group, row.operator, row.source, row.backend, row.tag, row.baseline,
                               row.culprit, where.get(row.culprit or "", (None,))[0])))
        cells = row.cells
        for key in keys:
            cell = cells.get(key)
            if cell is not None:
                parts_out.append(f"{cell.run.id},{cell.runs},{cell.worst.id if cell.worst else 0},"
                                 f"{cell.regressed:d}{cell.culprit:d}{cell.baseline:d}{cell.run.id in run_pages:d}")
            else:
                parts_out.append("-")
    return hashlib.sha256("\n".join(parts_out).encode()).hexdigest()


def _span(cols: list[Column]) -> str:
    if not cols:
        return "no commits"
    return f"{cols[0].key[:12]} .. {cols[-1].key[:12]}"


def _nav(windows: list[list[Column]], parts: list[list[Row]], k: int, j: int, last: int, per: int) -> str:
    """Links to the older and newer window (same rows), the other slices of rows (same window) and the
    directory. Only neighbours: a new window rewrites the page before it, not every page."""
    if len(windows) == 1 and len(parts) == 1:
        return ""
    links = [f"commits {_e(_span(windows[k]))} (window {k + 1} of {len(windows)})"]
    if k > 0:
        links.append(f"<a href='{page_name(0, j, last)}'>&laquo; oldest</a>")
        links.append(f"<a href='{page_name(k - 1, j, last)}'>&lsaquo; older</a>")
    if k < last:
        links.append(f"<a href='{page_name(k + 1, j, last)}'>newer &rsaquo;</a>")
        links.append(f"<a href='{page_name(last, j, last)}'>newest &raquo;</a>")
    if len(parts) > 1:
        links.append("rows: " + " ".join(
            f"<b>{i * per + 1}-{i * per + len(p)}</b>" if i == j else
            f"<a href='{page_name(k, i, last)}'>{i * per + 1}-{i * per + len(p)}</a>" for i, p in enumerate(parts)))
    links.append("<a href='pages.html'>every window and row</a>")
    return "<p class='meta nav'>" + " &middot; ".join(links) + "</p>"


def _directory(grid: Grid, windows: list[list[Column]], parts: list[list[Row]], last: int) -> str:
    """pages.html: every window (its commits) and every row (its page in the newest window)."""
    items = [f"<li><a href='{page_name(k, 0, last)}'>window {k + 1}</a>: {_e(_span(w))} ({len(w)} commits)</li>"
             for k, w in enumerate(windows)]
    rows = [f"<li><a href='{page_name(last, j, last)}'>{_e(r.model)}</a> &middot; {_e(r.target)} &middot; "
            f"{_e(r.dtype)} &middot; {_e(r.backend or r.group)}" + (" <b>regressed</b>" if r.culprit else "") + "</li>"
            for j, part in enumerate(parts) for r in part]
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; style-src 'unsafe-inline'\">"
            "<title>bundlerun HUD: every page</title></head><body style='font-family:system-ui,sans-serif'>"
            f"<p><a href='index.html'>&larr; accuracy HUD</a></p><h2>{len(windows)} windows of commits</h2>"
            f"<ol>{''.join(items)}</ol><h2>{len(grid.rows)} rows</h2><ol>{''.join(rows)}</ol></body></html>")


def _write_run_pages(db_path: Any, out: Path, cells: list[Cell]) -> tuple[set[int], set[int]]:
    """runs/<id>.html for these cells' runs, from the stored reports (one damaged run is said on its
    own page, never stops the site, and is tried again next build); (kept, every page written)."""

    todo: dict[int, Cell] = {}
    done: set[int] = set()
    for cell in cells:
        rid = cell.run.id
        marker = _marker(cell.run.run_uuid)
        if _starts_with(out / "runs" / f"{rid}.html", marker):
            done.add(rid)  # a recorded run never changes: its page is kept
        else:
            todo[rid] = cell
    unreadable: dict[int, str] = {}
    reports = load_reports(db_path, list(todo), errors=unreadable)
    for rid, cell in todo.items():
        nav = "<p class='meta'><a href='../index.html'>&larr; accuracy HUD</a>"
        if cell.run.report_path and Path(cell.run.report_path).with_name("report.html").is_file():
            original = Path(cell.run.report_path).with_name("report.html")
            nav += f" &middot; <a href='{_e(href(original, out / 'runs'))}'>original report</a>"
        if rid in reports:
            # the per-case plots for the runs people open to see what went wrong; not for every passing run
            page = (_marker(cell.run.run_uuid)
                    + render_html(reports[rid], case_plots=status(cell) != Verdict.PASS).replace("<body>", "<body>" + nav + "</p>", 1))
            done.add(rid)
        else:
            page = (f"<!doctype html><html><head><meta charset='utf-8'><title>run {rid}</title></head><body>{nav}</p>"
                    f"<p>The stored report of this run cannot be read: {_e(one_line(unreadable.get(rid), 2000))}</p>"
                    "</body></html>")  # not kept: rewritten once the row is repaired
        _write_page(out / "runs" / f"{rid}.html", page)
    return done, set(todo) | done


def _marker(run_uuid: str) -> str:
    return f"<!-- bundlerun run {hashlib.sha256(str(run_uuid).encode()).hexdigest()} -->"


def _starts_with(path: Path, marker: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(len(marker.encode())) == marker.encode()
    except OSError:
        return False


def _write_page(path: Path, text: str) -> None:
    """A run page: derived from the history, rewritten whenever it is missing or stale, so it is
    replaced atomically (a reader never sees half a page) but not fsynced (15,000 fsyncs cost
    minutes at suite scale; the pages of the grid are written with atomic_write_text, synced)."""
    import os

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise named(exc, path) from None
