"""The report of record on disk: the sections of a run, report.json (schema `bundlerun.report/2`,
docs/report-schema.md) written atomically even when every case errored, and the saved outputs.
The typed Report (runner/report/model.py) is what flows; JSON exists only here, at the edge.
The terminal view is runner/report/console.py."""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from numpy.lib import format as npy

from bundlerun.bundles.manifest_records import BuildInfo
from bundlerun.bundles.fileio import _umask, atomic_write_chunks, atomic_write_text, file_sha256
from bundlerun.bundles.manifest import Manifest
from bundlerun.runner.report.model import REPORT_FILE, Report
from bundlerun.targets.base import CaseResult, TargetRun, Verdict
from bundlerun._version import __version__
from bundlerun.bundles.integrity import inputs_digest, program_sha256
from bundlerun.bundles.manifest import describe_inputs
from bundlerun.bundles.sequence import sequence_set_digest
from bundlerun.runner.report.check import CaseChecker, check_report
from bundlerun.runner.report.model import Summary

OUTPUTS_FILE = "outputs.npz"


def tool_version() -> str:
    return __version__


def bundle_section(path: Path, manifest: Manifest | None, bundle: Any = None) -> dict[str, Any]:
    build = manifest.build if manifest else BuildInfo()

    return {
        "program_sha256": program_sha256(manifest, bundle),  # what `compare` tells builds apart by
        "inputs_sha256": inputs_digest(bundle) if bundle is not None else None,  # which cases these are
        "path": str(path.resolve()),
        "sha256": file_sha256(path),
        "size": path.stat().st_size,
        "has_manifest": manifest is not None,
        "model": manifest.model.id if manifest else None,
        "backend": build.backend,
        "dtype": build.dtype,
        "built_for": build.target,
        "reference": build.reference,
        "quantization": build.quantization,
        "seed": build.seed,
        "versions": manifest.versions if manifest else {},
        **({"inputs_used": used} if (used := _inputs_used(manifest)) else {}),
        # LLM bundles: the bundle-set (model, weights, prompts) whatever the lane lowered it for (compare's lanes)
        **({"sequence_set": digest} if (digest := sequence_set_digest(manifest)) else {}),
    }


def _inputs_used(manifest: Manifest | None) -> list[str]:
    """Which weights and inputs the bundle was built with (et: sources, --inputs), in words. An llm: bundle
    says its weights in build.llm (seeded, or the user's checkpoint by sha256): every report names them."""
    if manifest is None:
        return []
    lines = describe_inputs(manifest.model, manifest.build)
    llm = manifest.build.llm
    if llm is not None and llm.weights and not any(line.startswith("weights:") for line in lines):
        lines.insert(0, f"weights: {llm.weights}")
    return lines


def target_section(run: TargetRun | None, url: str) -> dict[str, Any]:
    if run is None:
        return {"url": url, "info": {}, "logs": {}, "setup_s": None}
    return {"url": run.target, "info": run.info, "logs": run.logs, "setup_s": run.setup_s}


def host_section() -> dict[str, str]:
    return {"machine": platform.machine(), "system": platform.system(), "python": platform.python_version(),
            "node": platform.node()}


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)


def _sanitize(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: _sanitize(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_sanitize(v) for v in obj]
    return obj


def _non_finite(obj: Any) -> bool:
    """A float that is nan or infinite anywhere in `obj` (what _sanitize would change)."""
    if isinstance(obj, float):
        return not math.isfinite(obj)
    if isinstance(obj, dict):
        return any(_non_finite(v) for v in obj.values())
    if getattr(obj, "sanitized", False):  # a farm's per-job list: sanitised as it was spooled (merge_jobs.py)
        return False
    if isinstance(obj, (list, tuple)):
        return any(_non_finite(v) for v in obj)
    return False


def write_report(report: Report, out_dir: Path) -> Path:
    """report.json from the typed report, checked as every reader checks it (runner/report/check.py):
    what we write is what every reader accepts."""

    if hasattr(report.cases, "dicts"):  # a farm's merged report: its cases stream from disk (merge_jobs.py)
        return _write_streamed(report, Path(out_dir) / REPORT_FILE)
    data = report.to_json(for_writing=True)
    check_report(data)
    return atomic_write_text(Path(out_dir) / REPORT_FILE, _report_text(data) + "\n")


def _dumps(obj: Any, indent: int | None = 2) -> str:
    """report.json's encoding of `obj`; non-finite floats as the strings "nan", "inf", "-inf" (sanitised
    only when there is one: a report rarely has any, and walking it all costs a pass over every case)."""
    try:
        return json.dumps(obj, indent=indent, default=_json_default, allow_nan=False)
    except ValueError:
        return json.dumps(_sanitize(obj), indent=indent, default=_json_default, allow_nan=False)


_TRAIL_HERE = "\x00bundlerun: a criteria trail\x00"
_TRAIL_JSON = json.dumps(_TRAIL_HERE)


def _case_line(case: Any, trails: dict[int, tuple[Any, str]] | None = None) -> str:
    """One case record as report.json lays it out: on one line. json's indented encoder is Python code
    and its compact one C: the 192-step tiny llama run's cases took 27-29 ms indented, 9 ms on a line each
    (2.0 -> 1.4 MB). `trails`: each output's criteria trail (most of a case's bytes, and the same object
    in every output the same criteria judged) is encoded once per object and spliced in: 9 -> 6 ms."""
    outputs = case.get("outputs") if type(case) is dict else None
    if trails is None or type(outputs) is not list:
        return _dumps(case, indent=None)
    held: list[Any] = []
    marked = []
    for out in outputs:
        crit = out.get("criteria") if type(out) is dict else None
        if type(crit) is dict and type(crit.get("trail")) is dict:
            held.append(crit["trail"])
            out = {**out, "criteria": {**crit, "trail": _TRAIL_HERE}}
        marked.append(out)
    if not held:
        return _dumps(case, indent=None)
    parts = _dumps({**case, "outputs": marked}, indent=None).split(_TRAIL_JSON)
    if len(parts) != len(held) + 1:  # the marker also inside some other string: the plain encoding
        return _dumps(case, indent=None)
    text = [parts[0]]
    for trail, part in zip(held, parts[1:]):
        known = trails.get(id(trail))
        if known is None or known[0] is not trail:
            known = trails[id(trail)] = (trail, _dumps(trail, indent=None))  # held: its id stays its own
        text += [known[1], part]
    return "".join(text)


def _report_text(data: dict[str, Any]) -> str:
    """report.json's text of `data`: indented by 2, but each record of its long lists (the cases, each LLM
    sequence's steps) on one line of its own."""
    lists: list[list[Any]] = []

    def marked(items: Any) -> Any:
        if not isinstance(items, list) or not items:
            return items
        lists.append(items)
        return f"{_CASES_HERE}{len(lists) - 1}"

    doc = {**data, "cases": marked(data.get("cases"))} if "cases" in data else dict(data)
    if isinstance(data.get("sequences"), list):
        doc["sequences"] = [{**seq, "steps": marked(seq.get("steps"))} if isinstance(seq, dict) and "steps" in seq
                            else seq for seq in data["sequences"]]
    if not lists:
        return _dumps(data)
    head = _dumps(doc)  # small: every long list is a marker in it
    places = []
    for i in range(len(lists)):
        marker = json.dumps(f"{_CASES_HERE}{i}")
        if head.count(marker) != 1:  # a marker also inside some other string: all of it indented
            return _dumps(data)
        places.append((head.index(marker), len(marker), i))
    trails: dict[int, tuple[Any, str]] = {}
    pieces, done = [], 0
    for at, size, i in sorted(places):
        line = head[head.rfind("\n", 0, at) + 1:at]
        indent = " " * (len(line) - len(line.lstrip()))
        pieces += [head[done:at], f"[\n{indent}  ",
                   f",\n{indent}  ".join(_case_line(item, trails) for item in lists[i]), f"\n{indent}]"]
        done = at + size
    pieces.append(head[done:])
    return "".join(pieces)


_CASES_HERE = "\x00bundlerun: the cases\x00"


def _write_streamed(report: Report, path: Path) -> Path:
    """report.json with the cases read back one at a time (never all in memory), each checked as
    check_report checks it, laid out as `_report_text` lays out a whole document."""
    data = report.to_json(cases=False)
    check_report(data)
    checker = CaseChecker(data["summary"])
    data["cases"] = _CASES_HERE
    if _non_finite(data):  # sanitised only when it must be: a copy of a 2,000-job farm's document is ~10 MB
        data = _sanitize(data)
    marker = json.dumps(_CASES_HERE)
    # the document around the cases is encoded piece by piece (the encoder json.dumps(indent=2) uses,
    # so the same bytes), never as one string: a 2,000-job farm's head is megabytes, and the string, its
    # halves and their bytes grew the coordinator's peak memory with the jobs (bench_farm_scale.py)
    parts = json.JSONEncoder(indent=2, default=_json_default, allow_nan=False).iterencode(data)

    def pieces(until: str | None) -> Iterator[bytes]:
        buf: list[str] = []
        size = 0
        for part in parts:
            if part == until:
                break
            buf.append(part)
            size += len(part)
            if size >= 1 << 16:
                yield "".join(buf).encode("utf-8")
                buf, size = [], 0
        else:
            if until is not None:
                raise RuntimeError("report.json: the cases' place was not found in the document")
        yield "".join(buf).encode("utf-8")

    trails: dict[int, tuple[Any, str]] = {}

    def chunks() -> Iterator[bytes]:
        yield from pieces(marker)
        for case in report.cases.dicts():  # type: ignore[attr-defined]
            checker.check(case)  # a bad case raises before the file replaces anything
            yield (("[\n    " if checker.seen == 1 else ",\n    ") + _case_line(case, trails)).encode("utf-8")
        checker.done()
        yield b"[]" if checker.seen == 0 else b"\n  ]"
        yield from pieces(None)
        yield b"\n"

    return atomic_write_chunks(path, chunks())


def write_record(report: Report, out_dir: Path) -> Path | None:
    """report.json, written atomically; None when the folder refuses it (a full disk, a folder gone).
    The file and the reason then go to `report.unwritten`, so the command still prints its verdict
    and exits with its code: a disk problem never takes a run's result with it."""
    try:
        return write_report(report, out_dir)
    except OSError as exc:
        note_unwritten(report, Path(out_dir) / REPORT_FILE, exc)
        return None


def note_unwritten(report: Report, path: Path, exc: OSError) -> None:
    """Record that `path` could not be written, and why (once per file)."""
    entry = {"file": str(path), "error": exc.strerror or str(exc)}
    if entry not in report.unwritten:
        report.unwritten.append(entry)


class OutputsWriter:
    """outputs.npz written as the cases come (`run --save-outputs`), so no run holds every case's
    outputs to save them: each output is one `.npy` member of a deflated zip, the file
    `np.savez_compressed` writes (at zlib level 1: float outputs barely compress, dl3's to 0.837 of their
    size at level 1 and 0.831 at numpy's 6, in 70% of the time), as `{method}/{case}/{index}` (bfloat16
    as uint16 words). The zip grows in a temp file beside the report; `close()` renames it into place
    (atomic, as every report file). A case written again (a lane that gave a result new outputs after
    it was saved) supersedes what was written of it; `close(final)` keeps only the outputs of the
    results the run ends with, copying the zip member by member if anything was superseded."""

    def __init__(self, out_dir: Path) -> None:
        self.path = Path(out_dir) / OUTPUTS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{OUTPUTS_FILE}.", suffix=".tmp", dir=self.path.parent)
        self._tmp = Path(tmp)
        self._fh = os.fdopen(fd, "w+b")
        self._zip: zipfile.ZipFile | None = self._open(self._fh)
        # (member name, "{method}/{case}/{index}", the result it came from): the results are held, so their
        # identity means the same one at close (their outputs are let go)
        self._members: list[tuple[str, str, CaseResult]] = []
        self._names: set[str] = set()
        self._current: dict[str, int] = {}  # key -> index in _members of what is written of it last
        self._by_case: dict[tuple[str, int], list[str]] = {}  # the keys last written of each case

    @staticmethod
    def _open(fh: Any) -> zipfile.ZipFile:
        return zipfile.ZipFile(fh, "w", zipfile.ZIP_DEFLATED, allowZip64=True, compresslevel=1)

    def add(self, case: CaseResult) -> None:
        """The case's outputs; what was written of the same case before is superseded. Malformed
        bytes (judged ERROR by the judge) are not saved."""
        if self._zip is None:
            return
        for key in self._by_case.pop((case.method, case.case_index), []):
            self._current.pop(key, None)
        keys = self._by_case[(case.method, case.case_index)] = []
        for j, raw in enumerate(case.outputs):
            key = f"{case.method}/{case.case_index}/{j}"
            try:
                array = raw.to_array()
            except (ValueError, TypeError, OverflowError):
                continue
            name = key + ".npy" if key + ".npy" not in self._names else f"{key}.npy.{len(self._members)}"
            with self._zip.open(name, "w", force_zip64=True) as member:
                npy.write_array(member, np.ascontiguousarray(array), allow_pickle=False)
            self._current[key] = len(self._members)
            keys.append(key)
            self._members.append((name, key, case))
            self._names.add(name)

    def close(self, final: list[CaseResult] | None = None) -> Path:
        """Finish the zip and put it in place; the path of outputs.npz. `final`: the run's results,
        whose outputs alone are kept (None: everything added)."""
        try:
            assert self._zip is not None, "closed twice"
            self._zip.close()
            self._zip = None
            if final is not None:
                ends = {id(r) for r in final}
                keep = [self._members[i][:2] for i in sorted(self._current.values()) if id(self._members[i][2]) in ends]
                if len(keep) != len(self._members) or any(n != k + ".npy" for n, k in keep):
                    self._rewrite(keep)
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
            os.chmod(self._tmp, 0o666 & ~_umask())
            os.replace(self._tmp, self.path)
        except BaseException:
            self.abandon()
            raise
        return self.path

    def _rewrite(self, keep: list[tuple[str, str]]) -> None:
        """The zip again with only `keep`'s members, each under its case's name, one member at a time."""
        fd, tmp = tempfile.mkstemp(prefix=f".{OUTPUTS_FILE}.", suffix=".tmp", dir=self.path.parent)
        fh = os.fdopen(fd, "w+b")
        try:
            self._fh.seek(0)
            with zipfile.ZipFile(self._fh, "r") as src, self._open(fh) as dst:
                for name, key in keep:
                    with src.open(name) as i, dst.open(key + ".npy", "w", force_zip64=True) as o:
                        shutil.copyfileobj(i, o, 1 << 20)
        except BaseException:
            fh.close()
            Path(tmp).unlink(missing_ok=True)
            raise
        self._fh.close()
        self._tmp.unlink(missing_ok=True)
        self._fh, self._tmp = fh, Path(tmp)

    def abandon(self) -> None:
        """Nothing is kept: the temp file goes, outputs.npz is not written."""
        try:
            if self._zip is not None:
                self._zip.close()
        except (OSError, ValueError):
            pass
        self._zip = None
        try:
            self._fh.close()
        except OSError:
            pass
        self._tmp.unlink(missing_ok=True)


def save_outputs(run: TargetRun, out_dir: Path) -> Path:
    """Every case's outputs of `run` into outputs.npz (OutputsWriter, one case at a time)."""
    writer = OutputsWriter(out_dir)
    try:
        for case in run.cases:
            writer.add(case)
    except BaseException:
        writer.abandon()
        raise
    return writer.close()


def build_failure_report(model: str, target: str, message: str, label: str | None = None) -> Report:
    """The report of a model whose bundle could not be built (`validate`): verdict ERROR, exit
    code 2, the reason in its warnings, so the folder says what happened to that model."""
    import uuid
    from datetime import datetime, timezone

    now = datetime.now(timezone.utc).isoformat()
    return Report(summary=Summary(Verdict.ERROR, 2, {}, 0, 0), cases=[], tool={"name": "bundlerun", "version": tool_version()},
                  run={"id": uuid.uuid4().hex, "label": label, "started": now, "finished": now, "duration_s": 0.0,
                       "host": host_section()},
                  bundle={"path": None, "model": model, "built_for": target, "has_manifest": False},
                  target={"url": target, "info": {}}, warnings=[f"build failed: {message}"])
