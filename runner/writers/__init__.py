"""Derived reports written next to report.json, one registered `Writer` per format.

report.json stays the artifact of record; every format here is derived from the typed `Report`
(plus, for the HTML plots, the saved actual outputs and the bundle's expected outputs when they
are available). Each format is one module of this package that registers itself with the
`writer` decorator (html.py -> report.html, junit.py -> junit.xml, markdown.py -> summary.md,
json_record.py -> report.json, github.py -> the GitHub job's step summary); `write_reports`
imports every module of the package once, so a new format is one new module and nothing else
(docs/report-schema.md, "Adding a report format"). report.json, the record, is written last,
with `files` naming everything written before it; a writer with no file in the report folder
(`filename=None`: GitHub's step summary, a file GitHub names) is not listed in `files`.

A derived report that cannot be written is a warning plus an `unwritten` entry, never a lost
run: `write_reports` returns what it wrote.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping

import numpy as np

from bundlerun.bundles.errors import BundlerunError, BundleFormatError
from bundlerun.bundles.limits import MAX_REPORT_OUTPUTS_BYTES
from bundlerun.runner.report.record import note_unwritten

if TYPE_CHECKING:
    from bundlerun.runner.report.model import Report


class WriterError(BundlerunError):
    """A report format asked for that no module registers, or two modules claiming one name or file."""


@dataclass
class Inputs:
    """What `write_reports` was given beside the report; each writer takes what it needs, and the
    bundle and the saved outputs are read only by a writer that asks (reading a .bpte is not free)."""

    out_dir: Path
    bundle: Any = None  # a Bundle, a .bpte path, or None (then report.bundle["path"])
    outputs: Any = None  # {"method/case/index": array}, an outputs.npz path, or None (out_dir/outputs.npz)
    history_db: Any = None
    regressions: list[dict[str, Any]] | None = None  # None: not compared against a baseline

    def load_bundle(self, report: "Report"):
        return _load_bundle(self.bundle, report)

    def load_outputs(self) -> Mapping[str, np.ndarray] | None:
        return _load_outputs(self.outputs, self.out_dir)


@dataclass(frozen=True)
class Writer:
    """One format: its name (the key in report.files), the file it writes in the report folder
    (None: somewhere else, and `path` is None), and `write(report, path, inputs) -> path or None`
    (None: nothing written, e.g. not in a GitHub job). A failure of a type in `errors` is "not
    written" (`title` names it in the warning); anything else is a bug and propagates. `record`:
    report.json, written after every other format."""

    name: str
    filename: str | None
    write: Callable[["Report", Path | None, Inputs], Path | None]
    title: str = ""
    errors: tuple[type[Exception], ...] = (OSError,)
    record: bool = False


_REGISTRY: dict[str, Writer] = {}
_discovered = False


def register(w: Writer) -> Writer:
    """Add a format; a second writer for the same name or file is refused (one would overwrite the other)."""
    for other in _REGISTRY.values():
        if other.name == w.name or (w.filename is not None and other.filename == w.filename):
            raise WriterError(f"report format {w.name!r} ({w.filename}, {w.write.__module__}) clashes with "
                              f"{other.name!r} ({other.filename}, {other.write.__module__})")
    _REGISTRY[w.name] = w
    return w


def writer(name: str, filename: str | None, title: str, errors: tuple[type[Exception], ...] = (OSError,),
           record: bool = False):
    """Decorator form of `register` for a module's write function."""

    def wrap(fn: Callable[["Report", Path | None, Inputs], Path | None]):
        register(Writer(name, filename, fn, title, errors, record))
        return fn

    return wrap


def registered() -> dict[str, Writer]:
    """Every format, after importing each module of this package once (imports are lazy: the CLI
    imports this package at start-up, the writers only when a report is written)."""
    global _discovered
    if not _discovered:
        for mod in pkgutil.iter_modules(__path__):
            if not mod.name.startswith("_"):
                importlib.import_module(f"{__name__}.{mod.name}")  # already imported: registers nothing again
        _discovered = True
    return dict(_REGISTRY)


class SavedOutputs(Mapping[str, np.ndarray]):
    """A saved outputs.npz read one member at a time (the HTML report's plots, runner/writers/html.py
    PooledArrays): each `[key]` reads that member alone, so a report never holds every case's outputs
    (issue 36: dl3's 16 cases are 135 MB). The whole file was checked when this was made (every
    member's CRC and npy header), so a damaged file still draws no plots at all, as when it was read
    whole."""

    def __init__(self, path: Path, shapes: dict[str, tuple[int, ...]]) -> None:
        self.path = path
        self._shapes = shapes

    @classmethod
    def open(cls, path: Path) -> "SavedOutputs | None":
        """None: not a readable npz of plain arrays, or members that would inflate past PLOT_OUTPUTS_MAX."""
        import zipfile
        import zlib

        try:  # only for plots: a file whose members would inflate past PLOT_OUTPUTS_MAX is left out
            with zipfile.ZipFile(path) as zf:
                infos = zf.infolist()
                if sum(i.file_size for i in infos) > PLOT_OUTPUTS_MAX:
                    return None
                if zf.testzip() is not None:  # a member whose CRC does not match: read as streams, not held
                    return None
                shapes: dict[str, tuple[int, ...]] = {}
                for info in infos:
                    if not info.filename.endswith(".npy"):
                        continue
                    with zf.open(info) as fh:  # zipfile stops each member at its declared size
                        version = np.lib.format.read_magic(fh)  # np.load's own header readers (1.0 is what np.savez writes)
                        read = {(1, 0): np.lib.format.read_array_header_1_0,
                                (2, 0): np.lib.format.read_array_header_2_0}.get(version)
                        if read is None:
                            return None
                        shape, _, dtype = read(fh)
                    if dtype.hasobject:
                        return None
                    shapes[info.filename[:-4]] = tuple(int(n) for n in shape)
        except (OSError, ValueError, EOFError, SyntaxError, TypeError, zipfile.BadZipFile, zlib.error, MemoryError):
            return None
        return cls(path, shapes)

    def shape_of(self, key: str) -> tuple[int, ...] | None:
        """A member's shape from its header (no data read)."""
        return self._shapes.get(key)

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self._shapes:
            raise KeyError(key)
        with np.load(self.path, allow_pickle=False) as npz:
            return npz[key]

    def __contains__(self, key: object) -> bool:
        return key in self._shapes

    def __iter__(self) -> Iterator[str]:
        return iter(self._shapes)

    def __len__(self) -> int:
        return len(self._shapes)


def _load_outputs(outputs: Any, out_dir: Path) -> Mapping[str, np.ndarray] | None:
    if outputs is None:
        candidate = out_dir / "outputs.npz"
        outputs = candidate if candidate.is_file() else None
    if outputs is None or isinstance(outputs, Mapping):
        return outputs
    return SavedOutputs.open(Path(outputs))


PLOT_OUTPUTS_MAX = MAX_REPORT_OUTPUTS_BYTES  # bytes of saved outputs the HTML report's plots read (bundlerun's own bound)


def _load_bundle(bundle: Any, report: "Report"):
    from bundlerun.bundles.bpte import Bundle, read_bundle  # start-up: loads flatbuffers on use

    if isinstance(bundle, Bundle):
        return bundle
    path = bundle if bundle is not None else report.bundle.get("path")
    if not path or not Path(path).is_file():
        return None
    try:
        return read_bundle(path)
    except (BundleFormatError, OSError):
        return None


def _chosen(formats: Iterable[str] | None) -> list[Writer]:
    known = registered()
    if formats is None:
        return list(known.values())
    chosen = []
    for name in formats:
        if name not in known:
            near = difflib.get_close_matches(name, known, n=1)
            raise WriterError(f"unknown report format {name!r}" + (f" (did you mean {near[0]!r}?)" if near else "")
                              + f"; registered: {', '.join(sorted(known))}")
        chosen.append(known[name])
    return chosen


def write_reports(
    report: "Report",
    out_dir: Path,
    bundle: Any = None,
    outputs: Any = None,
    history_db: Any = None,
    regressions: list[dict[str, Any]] | None = None,
    formats: Iterable[str] | None = None,
) -> dict[str, Path]:
    """Write each registered format (or those named in `formats`, in that order; report.json last)
    into `out_dir`, and set `report.files` to what was written there.

    `bundle`, `outputs`: see `Inputs`. `regressions`: shown when given; None takes the report's
    own (`report.regressions`, None when no baseline was checked). Returns {format: path} for what
    was written; a failure is a warning in `report.warnings` and an entry in `report.unwritten`.
    An unknown format name raises WriterError before anything is written.
    """

    chosen = _chosen(formats)
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        note_unwritten(report, out_dir, exc)
        return {}
    inputs = Inputs(out_dir, bundle, outputs, history_db, report.regressions if regressions is None else regressions)
    written: dict[str, Path] = {}
    for w in sorted(chosen, key=lambda w: w.record):  # the record last: it lists the others
        path = out_dir / w.filename if w.filename else None
        if w.record:
            report.files = {**{k: str(v) for k, v in written.items()}, w.name: str(path)}
        try:
            result = w.write(report, path, inputs)
        except w.errors as exc:
            report.warnings.append(f"{w.title} not written: {exc}")
            if isinstance(exc, OSError) and path is not None:
                note_unwritten(report, path, exc)
            continue
        if result is not None and w.filename:
            written[w.name] = result
    report.files = {k: str(v) for k, v in written.items()}
    return written
