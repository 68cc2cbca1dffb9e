"""Several report.json documents -> one bundlerun.report/2 document: the one merge of bundlerun.

`merge_reports(reports, MergeOptions(...))` is behind `bundlerun merge` (runner/commands/merge.py,
which only reads, writes and sets the exit code) and `bundlerun farm` (runner/farm/run.py).

The inputs are grouped by bundle x target. Within a group the reports are shards of one run:
their cases are put back together in bundle order (the `shard` section written by
runner/shard.py gives that order and the full set), and checked:

- **overlapping shards**: a case in more than one report is refused (`force`: the first kept);
- **missing shards**: cases of the split in no report are refused, named with the shard they
  belong to (`allow_partial`: each becomes an ERROR of kind `not-run`).

One group (and not `jobs`) gives the **shards** shape: the report of one unsharded run, with
that bundle and target. Several groups are refused (different bundles or targets, or judged with
different `--override`) unless `force`; with `force`, or with `jobs` (the farm: its jobs are
different bundles by design, and each report is a job of its own), the result has the **jobs**
shape: every case's `method` is `JOB/METHOD` (so JUnit, Markdown and HTML list each job's cases
apart), JOB being the given name or `model-dtype@target`; the same name twice gets `#2`, `#3`,
... in input order (the rule farm plans use for job ids); the original method, job, bundle and
target are in the case's `extra`; `bundle` and `target` describe the set, and a top-level `jobs`
list holds one entry per job.

Reports that are themselves a jobs merge (a farm's report) contribute their jobs as they are:
the shards of a farm (`bundlerun farm --shard i/n`, `shard` axis `jobs`) merge back into the
farm's report, with a job in more than one report an overlap and a job of the split in none a
missing shard. `validate --shard` reports (axis `models`, one model x dtype each, so `force`)
are checked the same way for missing model x dtypes.

Either way the summary is recomputed from the merged cases with the rule of one run (a numerical
failure wins over errors; exit 0/1/2); an input whose own exit code was 1 without a FAIL case (a
baseline regression) keeps the merged exit code at 1, one whose exit code was 2 without an error
case (a job that could not start) keeps it at least 2, an interrupted one makes it 130; and
`merged` names the inputs. LLM reports' per-sequence records go along (runner/report/merge_sequences.py:
each step from the shard that ran it, the figures recomputed; a job's named `JOB/METHOD`). The result passes `Report.from_json`, so every reader and writer of
reports takes it. Refusals raise `MergeError` (one line, exit code 2).
"""

from __future__ import annotations

import copy
import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from bundlerun.runner.report.model import SCHEMA, CaseRecord, Report, ReportError
from bundlerun.runner.shard import assignment, case_key
from bundlerun.targets.base import CaseStatus, Verdict
from bundlerun.runner.judging.outcome import EXIT_INTERRUPTED, STOPPED_CODES, combine_exit_codes


class MergeError(ReportError):
    """Reports that cannot be merged as asked; one line, exit code 2."""


@dataclass(frozen=True)
class MergeOptions:
    """How to merge. `force`: merge different bundles/targets/overrides (jobs shape) and keep the
    first of overlapping cases or jobs; `allow_partial`: merge with missing shards, their cases as
    ERROR not-run; `jobs`: every report is a job of its own, kept apart and never refused for
    being another bundle (the farm); `names`: one job name per report (default
    `model-dtype@target`); `paths`: how the reports are named in messages."""

    force: bool = False
    allow_partial: bool = False
    jobs: bool = False
    names: Sequence[str] | None = None
    paths: Sequence[str] | None = None


# ---------------------------------------------------------------------------- naming


def job_name(report: dict[str, Any]) -> str:
    """`model-dtype@target` for a report: the default JOB of a jobs merge."""
    bundle = report.get("bundle") or {}
    model = bundle.get("model") or Path(str(bundle.get("path") or "bundle")).stem
    dtype = bundle.get("dtype")
    url = (report.get("target") or {}).get("url") or "target"
    return f"{model}{'-' + dtype if dtype else ''}@{url}"


def unique_names(bases: Sequence[str], taken: Sequence[str] = ()) -> list[str]:
    """The one duplicate-suffix rule: a name already used gets `#2`, `#3`, ... in order."""
    chosen: list[str] = list(taken)
    out: list[str] = []
    for base in bases:
        name, n = base, 1
        while name in chosen:
            n += 1
            name = f"{base}#{n}"
        chosen.append(name)
        out.append(name)
    return out


def _identity(report: dict[str, Any]) -> tuple:
    b = report.get("bundle") or {}
    if b.get("program_sha256") and b.get("inputs_sha256"):
        bundle = ("program", b["program_sha256"], b["inputs_sha256"])
    else:
        bundle = ("file", b.get("sha256") or b.get("path"))
    return bundle, str((report.get("target") or {}).get("url") or "?")


def _overlapping(message: str, opts: "MergeOptions", notes: list[str]) -> None:
    """Shards that both hold a result: refused, or with --force the first report's kept and said."""
    if not opts.force:
        raise MergeError(message + " (--force keeps the first)")
    notes.append(message + "; the first report's result kept")


def _list(items: Sequence[str], limit: int = 12) -> str:
    items = list(items)
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _is_jobset(report: dict[str, Any]) -> bool:
    return isinstance(report.get("jobs"), list) and (report.get("merged") or {}).get("mode") == "jobs"


# ---------------------------------------------------------------------------- sections


def _when(text: Any) -> datetime | None:
    try:
        when = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except (TypeError, ValueError):
        return None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def _run_section(reports: list[dict[str, Any]]) -> dict[str, Any]:
    runs = [r.get("run") or {} for r in reports]
    starts = [(w, r["started"]) for r in runs if (w := _when(r.get("started")))]
    ends = [(w, r["finished"]) for r in runs if (w := _when(r.get("finished")))]
    labels = list(dict.fromkeys(r.get("label") for r in runs if r.get("label")))
    duration = ((max(ends)[0] - min(starts)[0]).total_seconds() if starts and ends
                else sum(float(r.get("duration_s") or 0.0) for r in runs))
    out: dict[str, Any] = {
        "id": uuid.uuid4().hex,
        "label": labels[0] if len(labels) == 1 else (", ".join(labels) if labels else None),
        "started": min(starts)[1] if starts else None,
        "finished": max(ends)[1] if ends else None,
        "duration_s": duration,
        "command": ["bundlerun", "merge"],
    }
    hosts = [r.get("host") for r in runs if r.get("host")]
    if hosts and all(h == hosts[0] for h in hosts):
        out["host"] = hosts[0]
    return out


def _unique(items: list[Any]) -> list[Any]:
    seen, out = set(), []
    for item in items:
        key = json.dumps(item, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            out.append(item)
    return out


def _summary(cases: list[dict[str, Any]], reports: list[dict[str, Any]]) -> dict[str, Any]:
    from bundlerun.runner.judging.judge import summarize  # start-up: not loaded by `bundlerun --help`

    return _summary_adjusted(summarize([CaseRecord.from_json(c) for c in cases]).to_json(),
                             [r.get("summary") or {} for r in reports])


def _summary_adjusted(summary: dict[str, Any], summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """The cases' summary with what the inputs' own summaries add (a regression, a job that could
    not start, an interruption): merge_reports' rule, also folded job by job (merge_jobs.py)."""
    codes = [s.get("exit_code") for s in summaries]
    if summary["exit_code"] != 1 and 1 in codes:
        summary.update(verdict=Verdict.FAIL, exit_code=1)  # a regression against a baseline in one input
    elif summary["exit_code"] == 0 and 2 in codes:
        summary.update(verdict=Verdict.ERROR, exit_code=2)  # an input that could not run, with no case saying so
    stopped = [s.get("exit_code") for s in summaries if s.get("interrupted")]
    if stopped:  # 130 Ctrl-C, 143 SIGTERM (runner/judging/outcome.py)
        summary.update(interrupted=True, exit_code=combine_exit_codes([c for c in stopped if c in STOPPED_CODES]
                                                                      or [EXIT_INTERRUPTED]))
    return summary


def _missing_case(method: str, index: int, shard: int | None, count: int | None) -> dict[str, Any]:
    where = f"shard {shard}/{count}" if shard else "a shard"
    return {"method": method, "case": index, "status": CaseStatus.ERROR, "verdict": Verdict.ERROR, "outputs": [],
            "elapsed_s": None, "error": f"not run: the report of {where} was not given to merge",
            "error_kind": "not-run", "log_excerpt": [], "log_path": None, "device_verdict": None, "perf": []}


# ---------------------------------------------------------------------------- checks


def _check_split(records: list[tuple[dict, str]], what: str) -> tuple[list[str] | None, int | None]:
    """(universe, count) of the shard records of reports that must come from one split."""
    if not records:
        return None, None
    universes = {tuple(rec.get("universe") or ()) for rec, _ in records}
    counts = {rec.get("count") for rec, _ in records}
    axes = {rec.get("axis") for rec, _ in records}
    if len(universes) > 1 or len(counts) > 1 or len(axes) > 1:
        shown = sorted(f"{p}: {rec.get('spec')} of {len(rec.get('universe') or [])}" for rec, p in records)
        raise MergeError(f"{what}: the reports come from different shard splits ({_list(shown)})")
    return list(universes.pop()), counts.pop()


def _sort_cases(cases: list[dict], universe: list[str] | None) -> list[dict]:
    if universe:
        order = {k: i for i, k in enumerate(universe)}
        return sorted(cases, key=lambda c: (order.get(case_key(c["method"], c["case"]), len(order)), c["method"],
                                            c["case"]))
    methods: dict[str, int] = {}
    for c in cases:
        methods.setdefault(c["method"], len(methods))
    return sorted(cases, key=lambda c: (methods[c["method"]], c["case"]))


def _merge_group(group: list[tuple[dict, str]], opts: MergeOptions, notes: list[str]) -> tuple[list[dict], dict]:
    """The reports of one bundle x target (shards of one run): (cases in bundle order, merge info)."""
    what = job_name(group[0][0])
    records = [(r["shard"], p) for r, p in group if isinstance(r.get("shard"), dict)]
    universe, count = _check_split(records, what)
    axis = records[0][0].get("axis") if records else None
    seen: dict[str, str] = {}
    overlaps: list[str] = []
    cases: list[dict] = []
    for report, path in group:
        for case in report.get("cases") or []:
            key = case_key(case["method"], case["case"])
            if key in seen:
                overlaps.append(f"{key} ({seen[key]} and {path})")
                continue
            seen[key] = path
            cases.append(copy.deepcopy(case))
    if overlaps:
        _overlapping(f"{what}: overlapping shards: {_list(overlaps)} in more than one report", opts, notes)
    missing: list[str] = []
    if universe is not None and axis == "cases":
        shard_of = assignment(universe, count)
        missing = [k for k in universe if k not in seen]
        if missing:
            by_shard: dict[int, list[str]] = {}
            for k in missing:
                by_shard.setdefault(shard_of[k], []).append(k)
            detail = "; ".join(f"shard {s}/{count}: {_list(keys)}" for s, keys in sorted(by_shard.items()))
            message = f"{what}: missing shards: {len(missing)} of {len(universe)} cases are in no report ({detail})"
            if not opts.allow_partial:
                raise MergeError(message + " (--allow-partial merges anyway, the missing cases as errors)")
            notes.append(message + "; merged as ERROR (not-run)")
            for k in missing:
                method, _, index = k.rpartition("/")
                cases.append(_missing_case(method, int(index), shard_of[k], count))
        unknown = [k for k in seen if k not in set(universe)]
        if unknown:
            raise MergeError(f"{what}: cases {_list(unknown)} are not in the sharded set the reports name")
    info = {"label": what, "shard_count": count, "missing": missing, "overlaps": overlaps,
            "shards": sorted({rec["spec"] for rec, _ in records if rec.get("spec")})}
    return _sort_cases(cases, universe if axis == "cases" else None), info


def _missing_units(docs: list[dict], axis: str, opts: MergeOptions, notes: list[str],
                   present_jobs: set[str]) -> tuple[list[str], list[tuple[str, dict, dict]]]:
    """Split over whole reports (validate: axis models; farm: axis jobs): (universe, one (name,
    not-run case, job entry) per missing key). Refused without allow_partial."""
    records = [d["shard"] for d in docs if isinstance(d.get("shard"), dict) and d["shard"].get("axis") == axis]
    if not records:
        return [], []
    universe = list(dict.fromkeys(k for rec in records for k in rec.get("universe") or []))
    present = ({rec.get("key") for rec in records} if axis == "models"
               else {k for rec in records for k in rec.get("keys") or []} & present_jobs)
    count = records[0].get("count") or 1
    missing = [k for k in universe if k not in present]
    if not missing:
        return universe, []
    shard_of = assignment(universe, count)
    detail = "; ".join(f"{k} (shard {shard_of[k]}/{count})" for k in missing)
    message = f"missing shards: no report for {detail}"
    if not opts.allow_partial:
        raise MergeError(message + " (--allow-partial merges anyway, each missing one as an error)")
    notes.append(message + "; merged as ERROR (not-run)")
    out = []
    for k in missing:
        case = _missing_case("missing", 0, shard_of[k], count)
        case["error"] = f"not run: no report for {k} (shard {shard_of[k]}/{count}) was given to merge"
        out.append((k, case, {"name": k, "missing": True, "shard": f"{shard_of[k]}/{count}",
                              "summary": {"verdict": Verdict.ERROR, "exit_code": 2}}))
    return universe, out


# ---------------------------------------------------------------------------- the merge


def merge_reports(reports: Sequence[Report], options: MergeOptions | None = None) -> Report:
    """Merge reports as `options` say; raises MergeError for what the checks refuse (see the module
    docstring). The merge itself works on each report's JSON form: shards are files, and this is
    the one place that rewrites case records across reports (job-prefixed methods, missing cases)."""
    opts = options or MergeOptions()
    if not reports:
        raise MergeError("nothing to merge: give at least one report.json")
    if opts.names is not None and len(opts.names) != len(reports):
        raise MergeError(f"{len(opts.names)} names for {len(reports)} reports")
    if opts.paths is not None and len(opts.paths) != len(reports):
        raise MergeError(f"{len(opts.paths)} paths for {len(reports)} reports")
    docs = [copy.deepcopy(r.to_json()) for r in reports]
    paths = [str(p) for p in (opts.paths or [f"report {i + 1}" for i in range(len(docs))])]
    notes: list[str] = []

    # -- which reports are one job each, which merge by bundle x target, which bring their jobs
    jobsets = [(d, p) for d, p in zip(docs, paths) if _is_jobset(d) and not opts.jobs]
    plain = [(d, p) for d, p in zip(docs, paths) if not (_is_jobset(d) and not opts.jobs)]
    if opts.jobs:
        units = [[(d, p)] for d, p in plain]
        bases = list(opts.names) if opts.names else [job_name(d) for d, _ in plain]
    else:
        groups: dict[tuple, list[tuple[dict, str]]] = {}
        for d, p in plain:
            groups.setdefault(_identity(d), []).append((d, p))
        units = list(groups.values())
        bases = [job_name(g[0][0]) for g in units]
        if opts.names:
            given = dict(zip(map(id, docs), opts.names))
            bases = [given[id(g[0][0])] for g in units]
        parts = [f"{b} ({_list([p for _, p in g], 3)})" for b, g in zip(bases, units)]
        farm_records = [(d["shard"], p) for d, p in jobsets
                        if isinstance(d.get("shard"), dict) and d["shard"].get("axis") == "jobs"]
        one_farm = len(jobsets) <= 1 or (len(farm_records) == len(jobsets)
                                         and _check_split(farm_records, "farm shards")[0] is not None)
        kinds = len(units) + (1 if jobsets and one_farm else len(jobsets))
        if kinds > 1:
            parts += [f"{len(d.get('jobs') or [])} jobs ({p})" for d, p in jobsets]
            message = f"the reports are of {kinds} different bundles/targets: {_list(parts, 6)}"
            if not opts.force:
                raise MergeError(message + " (--force merges them into one report, each case named JOB/METHOD "
                                           "with JOB = model-dtype@target)")
            notes.append(message + "; merged into one report with --force")
        override_sets = {repr(sorted(map(repr, d.get("overrides") or []))) for d in docs if d.get("cases")}
        if len(override_sets) > 1:
            message = "the reports were judged with different --override criteria, so their verdicts do not compare"
            if not opts.force:
                raise MergeError(message + " (--force merges anyway)")
            notes.append(message)

    # -- the jobs the job-set reports bring (farm shards): a job in two reports is an overlap
    carried: list[tuple[str, list[dict], dict]] = []
    owner: dict[str, str] = {}
    overlaps: list[str] = []
    # start-up: token_metrics loads numpy, and `bundlerun --help` imports this module
    from bundlerun.runner.report.merge_sequences import job_sequences, merge_shard_sequences

    sequences: list[dict] = []  # LLM reports' per-sequence records (runner/report/merge_sequences.py)
    for doc, path in jobsets:
        by_job: dict[str, list[dict]] = {}
        for case in doc.get("cases") or []:
            by_job.setdefault(str((case.get("extra") or {}).get("job")), []).append(copy.deepcopy(case))
        for entry in doc.get("jobs") or []:
            name = str(entry.get("name"))
            if name in owner:
                overlaps.append(f"{name} ({owner[name]} and {path})")
                continue
            owner[name] = path
            carried.append((name, by_job.get(name, []), copy.deepcopy(entry)))
            sequences += [copy.deepcopy(q) for q in doc.get("sequences") or []
                          if str(q.get("method", "")).split("/", 1)[0] == name]
    if overlaps:
        _overlapping(f"overlapping shards: jobs {_list(overlaps)} in more than one report", opts, notes)

    # -- each bundle x target (or each job of a farm) merged with the shard checks
    infos: list[dict] = []
    merged_units: list[tuple[list[dict], dict]] = []
    for group in units:
        merged_units.append(_merge_group(group, opts, notes))
    names = unique_names(bases, taken=[n for n, _, _ in carried])
    for (_, info), name in zip(merged_units, names):
        info["label"] = name
        infos.append(info)

    # -- splits over whole reports: validate's models x dtypes, a farm's jobs
    model_universe, missing_models = _missing_units(docs, "models", opts, notes, set())
    job_universe, missing_jobs = _missing_units([d for d, _ in jobsets], "jobs", opts, notes, set(owner))

    shards_shape = not opts.jobs and not jobsets and len(units) == 1 and not missing_models
    warnings: list[str] = []
    if shards_shape:
        cases = merged_units[0][0]
        for d in docs:
            warnings += [w for w in d.get("warnings") or [] if w not in warnings]
        first = docs[0]
        bundle, target = copy.deepcopy(first.get("bundle") or {}), copy.deepcopy(first.get("target") or {})
        jobs_list = None
        sequences = merge_shard_sequences(docs)
    else:
        entries: list[tuple[str, list[dict], dict]] = list(carried)
        for (group_cases, _info), name, group in zip(merged_units, names, units):
            doc = group[0][0]
            b, t = doc.get("bundle") or {}, doc.get("target") or {}
            for case in group_cases:
                case["extra"] = {**(case.get("extra") or {}), "job": name, "method": case["method"],
                                 "bundle": b.get("path"), "target": t.get("url")}
                case["method"] = f"{name}/{case['method']}"
            for d, _ in group:
                warnings += [f"{name}: {w}" for w in d.get("warnings") or [] if f"{name}: {w}" not in warnings]
            sequences += job_sequences({"sequences": merge_shard_sequences([d for d, _ in group])}, name)
            entries.append((name, group_cases, {
                "name": name, "run_id": (doc.get("run") or {}).get("id"), "bundle": b.get("path"),
                "model": b.get("model"), "dtype": b.get("dtype"), "backend": b.get("backend"),
                "sha256": b.get("sha256"), "target": t.get("url"),
                "summary": _summary(group_cases, [d for d, _ in group])}))
        for d, _ in jobsets:
            warnings += [w for w in d.get("warnings") or [] if w not in warnings]
        for name, case, entry in missing_models + missing_jobs:
            case["extra"] = {"job": name, "method": case["method"], "bundle": None, "target": None}
            case["method"] = f"{name}/{case['method']}"
            entries.append((name, [case], entry))
        order = {k: i for i, k in enumerate(job_universe or model_universe)}
        if order:  # a split's jobs in the order of the split (the farm plan's, validate's)
            entries.sort(key=lambda e: order.get(e[0], len(order)))
        cases = [c for _, cs, _ in entries for c in cs]
        jobs_list = [e for _, _, e in entries]
        models = sorted({str(j["model"]) for j in jobs_list if j.get("model")})
        targets = list(dict.fromkeys(str(j["target"]) for j in jobs_list if j.get("target")))
        bundle = {"model": models[0] if len(models) == 1 else f"{len(jobs_list)} jobs", "path": None, "sha256": None,
                  "models": models}
        target = {"url": targets[0] if len(targets) == 1 else f"{len(targets)} targets", "targets": targets}
    warnings += notes
    datasets = [d["dataset"] for d in docs if d.get("dataset")]
    if datasets and len(docs) > 1:
        warnings.append("dataset accuracy is per report and is not merged; see each report")
    regressions = [reg for d in docs for reg in d.get("regressions") or []]
    complete = (not any(i["missing"] for i in infos) and not missing_models and not missing_jobs)
    merged: dict[str, Any] = {
        "schema": SCHEMA, "tool": docs[0].get("tool") or {}, "run": _run_section(docs),
        "bundle": bundle, "target": target,
        "overrides": _unique([o for d in docs for o in d.get("overrides") or []]),
        "warnings": warnings, "summary": _summary(cases, docs), "cases": cases,
        "dataset": datasets[0] if len(docs) == 1 and datasets else None,
        "merged": {
            "mode": "shards" if shards_shape else "jobs", "reports": len(docs),
            "run_ids": [(d.get("run") or {}).get("id") for d in docs],
            "from": [{"report": p, "run_id": (d.get("run") or {}).get("id"),
                      "shard": (d.get("shard") or {}).get("spec"), "cases": len(d.get("cases") or [])}
                     for d, p in zip(docs, paths)],
            "groups": infos,
            **({"models": model_universe} if model_universe else {}),
            **({"farm_jobs": job_universe} if job_universe else {}),
            "complete": complete,
        },
    }
    if jobs_list is not None:
        merged["jobs"] = jobs_list
    if sequences:  # LLM reports only: every other merge stays as it was
        merged["sequences"] = sequences
    if regressions:
        merged["regressions"] = regressions
    return Report.from_json(merged)  # checked as every reader checks a report
