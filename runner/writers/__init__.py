"""Derived reports written next to report.json: JUnit XML, Markdown, HTML.

report.json stays the artifact of record; everything here is derived from it
(plus, for the HTML plots, the saved actual outputs and the bundle's expected
outputs when they are available). A derived report that cannot be written is a
warning, never a lost run: the function returns what it wrote.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np


def _load_outputs(outputs: Any, out_dir: Path) -> Mapping[str, np.ndarray] | None:
    if outputs is None:
        candidate = out_dir / "outputs.npz"
        outputs = candidate if candidate.is_file() else None
    if outputs is None or isinstance(outputs, Mapping):
        return outputs
    import zipfile
    import zlib

    try:  # only for plots: a file whose members would inflate past PLOT_OUTPUTS_MAX is left out
        with zipfile.ZipFile(outputs) as zf:
            if sum(i.file_size for i in zf.infolist()) > PLOT_OUTPUTS_MAX:
                return None
        with np.load(outputs, allow_pickle=False) as npz:  # zipfile stops each member at its declared size
            return {k: npz[k] for k in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, MemoryError):
        return None


PLOT_OUTPUTS_MAX = 1 << 30  # bytes of saved outputs the HTML report's plots read (bundlerun's own bound)


def _load_bundle(bundle: Any, report: dict[str, Any]):
    from bundlerun.bundles.bpte import Bundle, read_bundle
    from bundlerun.bundles.errors import BundleFormatError

    if isinstance(bundle, Bundle):
        return bundle
    path = bundle if bundle is not None else (report.get("bundle") or {}).get("path")
    if not path or not Path(path).is_file():
        return None
    try:
        return read_bundle(path)
    except (BundleFormatError, OSError):
        return None


def write_reports(
    report: dict[str, Any],
    out_dir: Path,
    bundle: Any = None,
    outputs: Any = None,
    history_db: str | Path | None = None,
    regressions: list[Any] | None = None,
    formats: tuple[str, ...] = ("junit", "markdown", "html"),
) -> dict[str, Path]:
    """Write junit.xml, summary.md and report.html into `out_dir`.

    `bundle`: a Bundle, a .bpte path, or None (then report["bundle"]["path"]).
    `outputs`: {"method/case/index": array}, an outputs.npz path, or None (then
    out_dir/outputs.npz if present). `regressions`: from find_regressions, shown
    when given. Returns {format: path} for what was written; failures land in
    report["warnings"].
    """
    from bundlerun.runner.report.record import note_unwritten

    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        note_unwritten(report, out_dir, exc)
        return {}
    if regressions is None and "regressions" in report:
        regressions = report.get("regressions") or []
    written: dict[str, Path] = {}
    warnings = report.setdefault("warnings", [])
    if "junit" in formats:
        from bundlerun.runner.writers.junit import write_junit

        try:
            written["junit"] = write_junit(report, out_dir / "junit.xml")
        except OSError as exc:
            warnings.append(f"JUnit report not written: {exc}")
            note_unwritten(report, out_dir / "junit.xml", exc)
    if "markdown" in formats:
        from bundlerun.runner.writers.markdown import write_markdown

        try:
            written["markdown"] = write_markdown(report, out_dir / "summary.md", regressions)
        except OSError as exc:
            warnings.append(f"Markdown summary not written: {exc}")
            note_unwritten(report, out_dir / "summary.md", exc)
    if "html" in formats:
        from bundlerun.runner.writers.html import write_html

        try:
            written["html"] = write_html(
                report,
                out_dir / "report.html",
                bundle=_load_bundle(bundle, report),
                outputs=_load_outputs(outputs, out_dir),
                history_db=history_db,
                regressions=regressions,
            )
        except (OSError, ValueError) as exc:
            warnings.append(f"HTML report not written: {exc}")
            if isinstance(exc, OSError):
                note_unwritten(report, out_dir / "report.html", exc)
    return written
