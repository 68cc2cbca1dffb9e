"""Issue 26 items 5, 6 and 8: no internal error on any file bundlerun reads back, bounds before
work starts, and farm job folders that never collide.

Fuzz-style, seeded and bounded: real artifacts (reports of a passing run, a failing run with a
baseline, a farm and a merge; the saved outputs.npz; a history database with recorded runs) are
made by the real CLI on the real host runtime, then mutated (tests/security_fuzz.py) and read back
by `judge`, `compare`, `merge`, `hud`, `trend`, `history` and `farm --dry-run` in a real process.
Every reader class must give 0 internal errors, 0 tracebacks, an exit code of 0, 1 or 2, a
one-line error naming the file when it refuses, and never a PASS for a failing run. No doubles.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import run_cli  # noqa: E402

import security_fuzz  # noqa: E402

from bundlerun.bundles.bpte import read_bundle, write_bundle  # noqa: E402

DRIVER = Path(__file__).with_name("security_fuzz.py")
SEED = 26  # the number; every run sees the same inputs


@pytest.fixture(scope="module")
def art(bundle_cache, tmp_path_factory):
    """Real artifacts: PASS and FAIL runs (saved outputs, history, a baseline), a farm, a merge."""
    import copy

    import numpy as np

    root = tmp_path_factory.mktemp("artifacts")
    mlp = bundle_cache("mlp", cases=2)
    bad = copy.deepcopy(read_bundle(mlp))
    value = bad.method_test_suites[0].test_cases[0].expected_outputs[0]
    value.data = (value.to_array() + np.float32(1.0)).tobytes()
    write_bundle(bad, root / "fail.bpte")
    db = root / "history.sqlite"
    runs = {"pass": (mlp, ["--label", "v1"]), "fail": (root / "fail.bpte", ["--baseline", "v1", "--label", "v2"])}
    for name, (bundle, extra) in runs.items():
        r = run_cli("run", str(bundle), "--report", str(root / name), "--save-outputs", "--history", str(db),
                    "--quiet", *extra)
        assert r.returncode == (0 if name == "pass" else 1), r.stderr
    shutil.copy(mlp, root / "a b.bpte")
    shutil.copy(root / "fail.bpte", root / "a_b.bpte")
    (root / "farm.toml").write_text('bundles = ["a b.bpte", "a_b.bpte"]\ntargets = ["host://portable"]\n')
    r = run_cli("farm", str(root / "farm.toml"), "--report", str(root / "farm"), "--no-history", "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    r = run_cli("merge", str(root / "pass"), str(root / "fail"), "--force", "--report", str(root / "merged"))
    assert r.returncode == 1, r.stderr
    return {"root": root, "db": db, "mlp": mlp}


def _drive(tmp_path: Path, cases: list[dict]) -> list[dict]:
    spec = tmp_path / "cases.json"
    spec.write_text(json.dumps(cases))
    proc = subprocess.run([sys.executable, str(DRIVER), str(spec)], capture_output=True, text=True, timeout=3000)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(cases), proc.stderr[-3000:]
    return results


def _check(results: list[dict], cases: list[dict]) -> None:
    """0 internal errors, exit codes that mean something, one error line naming the file."""
    by_id = {c["id"]: c for c in cases}
    problems = []
    for res in results:
        case = by_id[res["id"]]
        text = res["stdout"] + res["stderr"]
        if res["code"] not in (0, 1, 2) or "internal error" in text or "Traceback" in text:
            problems.append(f"{case['what']}: exit {res['code']}: {res['stderr'][-300:]}")
            continue
        errors = [line for line in res["stderr"].splitlines() if line.startswith(("bundlerun: error:", "Error:"))]
        if res["code"] == 2 and errors:
            if len(errors) != 1 or not any(name in errors[0] for name in case["names"]):
                problems.append(f"{case['what']}: not one line naming the file: {errors}")
        if case.get("fails") and res["code"] == 0 and case["argv"][0] in ("judge", "merge"):
            problems.append(f"{case['what']}: a failing run read back as PASS")
    assert not problems, "\n".join(problems[:20]) + f"\n({len(problems)} of {len(results)})"


def test_mutated_reports_in_judge_compare_merge(art, tmp_path):
    rng = random.Random(SEED)
    root = art["root"]
    cases = []
    sources = {"pass": root / "pass", "fail": root / "fail", "farm": root / "farm", "merged": root / "merged"}
    for i in range(120):
        name = rng.choice(sorted(sources))
        doc, edits = security_fuzz.mutate_json(json.loads((sources[name] / "report.json").read_text()), rng,
                                               edits=rng.choice((1, 1, 2, 3)))
        folder = tmp_path / f"r{i}"
        folder.mkdir()
        for extra in ("outputs.npz",):
            if (sources[name] / extra).exists():
                shutil.copy(sources[name] / extra, folder / extra)
        (folder / "report.json").write_text(json.dumps(doc, allow_nan=True))
        what = f"{name} report {edits}"
        names = [str(folder), "history"]
        fails = name != "pass"
        cases += [
            {"id": f"{i}j", "argv": ["judge", str(folder), "--quiet", "--no-require-seal"], "what": what,
             "names": names, "fails": name == "fail"},
            {"id": f"{i}c", "argv": ["compare", str(root / "pass"), str(folder / "report.json"), "--force"],
             "what": what, "names": names},
            {"id": f"{i}m", "argv": ["merge", str(folder / "report.json"), "--force", "--report", str(tmp_path / f"m{i}")],
             "what": what, "names": names, "fails": fails},
        ]
    _check(_drive(tmp_path, cases), cases)


def test_damaged_outputs_npz_in_judge(art, tmp_path):
    rng = random.Random(SEED)
    root = art["root"]
    cases = []
    for i in range(40):
        name = rng.choice(("pass", "fail"))
        folder = tmp_path / f"o{i}"
        shutil.copytree(root / name, folder, ignore=shutil.ignore_patterns("work"))
        src = (folder / "outputs.npz").read_bytes()
        data, kind = security_fuzz.mutate_npz(src, ["forward/0/0", "forward/1/0"], rng)
        (folder / "outputs.npz").write_bytes(data)
        if rng.random() < 0.5:  # a careful attacker also updates the recorded sha256
            from bundlerun.bundles.fileio import file_sha256

            report = json.loads((folder / "report.json").read_text())
            report["outputs_sha256"] = file_sha256(folder / "outputs.npz")
            (folder / "report.json").write_text(json.dumps(report))
        cases.append({"id": str(i), "argv": ["judge", str(folder), "--quiet"], "what": f"{name} npz {kind}",
                      "names": [str(folder)], "fails": name == "fail"})
    _check(_drive(tmp_path, cases), cases)


def test_outputs_swapped_for_the_expected_values_are_refused(art, tmp_path):
    """The issue's FAIL-turned-PASS: outputs.npz replaced by the bundle's own expected outputs."""
    import io

    import numpy as np

    folder = tmp_path / "swap"
    shutil.copytree(art["root"] / "fail", folder, ignore=shutil.ignore_patterns("work"))
    bundle = read_bundle(art["root"] / "fail.bpte")
    expected = {f"forward/{i}/0": c.expected_outputs[0].to_array() for i, c in enumerate(bundle.suite("forward").test_cases)}
    buf = io.BytesIO()
    np.savez_compressed(buf, **expected)
    (folder / "outputs.npz").write_bytes(buf.getvalue())
    r = run_cli("judge", str(folder))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "not the outputs the run saved" in r.stderr and str(folder) in r.stderr


def test_an_inflating_member_is_refused_before_it_is_inflated(art, tmp_path):
    """4 MB of zip that inflates to 1 GiB once took 4.2 GB RSS: the declared size is checked first."""
    import zipfile

    folder = tmp_path / "bomb"
    shutil.copytree(art["root"] / "pass", folder, ignore=shutil.ignore_patterns("work"))
    with zipfile.ZipFile(folder / "outputs.npz", "w", zipfile.ZIP_DEFLATED) as zf:
        with zf.open("forward/0/0.npy", "w", force_zip64=True) as fh:
            fh.write(security_fuzz._npy("<f4", (1, 1 << 28), b""))
            for _ in range(64):
                fh.write(b"\0" * (1 << 24))  # 1 GiB of data
    assert (folder / "outputs.npz").stat().st_size < 8 << 20
    from bundlerun.bundles.fileio import file_sha256

    report = json.loads((folder / "report.json").read_text())
    report["outputs_sha256"] = file_sha256(folder / "outputs.npz")
    (folder / "report.json").write_text(json.dumps(report))
    # the judge is the only child of this wrapper, so RUSAGE_CHILDREN is its peak RSS
    probe = ("import resource, subprocess, sys; p = subprocess.run([sys.executable, '-c', "
             "'from bundlerun.runner.cli import main; main()', 'judge', sys.argv[1]], capture_output=True, text=True); "
             "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); print(p.stderr)")
    out = subprocess.run([sys.executable, "-c", probe, str(folder)], capture_output=True, text=True, timeout=600).stdout
    code, rss_kib = map(int, out.split()[:2])
    assert code == 2 and "inflates to" in out, out
    assert rss_kib < 600 * 1024, f"peak RSS {rss_kib / 1024:.0f} MiB while refusing a 1 GiB member"
    print(f"\nrefused the 1 GiB member with a peak RSS of {rss_kib / 1024:.0f} MiB")


def test_corrupted_history_content_in_hud_compare_trend_history(art, tmp_path):
    rng = random.Random(SEED)
    cases = []
    for i in range(40):
        db = tmp_path / f"h{i}.sqlite"
        shutil.copy(art["db"], db)
        cases += _history_cases(str(i), db, security_fuzz.corrupt_history(db, rng), tmp_path)
    _check(_drive(tmp_path, cases), cases)


def _history_cases(i: str, db: Path, what: str, tmp_path: Path) -> list[dict]:
    """hud, compare, trend and history on one database."""
    names = [str(db)]
    return [
        {"id": f"{i}h", "argv": ["hud", "--out", str(tmp_path / f"site{i}"), "--db", str(db)], "what": what,
         "names": names},
        {"id": f"{i}c", "argv": ["compare", "1", "2", "--history", str(db)], "what": what, "names": names},
        {"id": f"{i}t", "argv": ["trend", "mlp", "-o", str(tmp_path / f"t{i}.png"), "--history", str(db)],
         "what": what, "names": names + ["no recorded runs"]},
        {"id": f"{i}l", "argv": ["history", "--history", str(db)], "what": what, "names": names},
    ]


def test_version_1_history_with_corrupted_reports_is_migrated_in_hud_compare_trend_history(art, tmp_path):
    """A version-1 database (no series columns: runner/history/store.py _migrate fills them from each stored
    report on open) whose report_json holds hostile content: every command opens it, no internal error."""
    import sqlite3

    from bundlerun.runner.history.store import SERIES_COLUMNS

    rng = random.Random(SEED + 1)
    cases = []
    for i in range(12):
        db = tmp_path / f"v1-{i}.sqlite"
        shutil.copy(art["db"], db)
        what = "version 1, " + security_fuzz.corrupt_history(db, rng) if i % 4 else "version 1, intact"
        conn = sqlite3.connect(str(db))
        for column in SERIES_COLUMNS:
            conn.execute(f"ALTER TABLE runs DROP COLUMN {column}")
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
        conn.execute("DROP TABLE alembic_version")  # version 1 was written before Alembic managed the schema
        conn.commit()
        conn.close()
        cases += _history_cases(f"v1-{i}", db, what, tmp_path)
    results = _drive(tmp_path, cases)
    _check(results, cases)
    intact = next(r for r in results if r["id"] == "v1-0l")
    assert intact["code"] == 0, intact
    conn = sqlite3.connect(str(tmp_path / "v1-0.sqlite"))  # the commands migrated it: version 2, columns filled
    assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == "2"
    filled = conn.execute("SELECT COUNT(*) FROM runs WHERE inputs_sha256 IS NOT NULL AND status IS NOT NULL")
    assert filled.fetchone()[0] == conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0] > 0
    conn.close()


def _deep(n: int) -> str:
    return "x = " + "[" * n + "1" + "]" * n


@pytest.mark.parametrize("body, needle", [
    ('targets = ["host://xnnpack"]\ncases = 99999999999999\n', "cases"),
    ('targets = ["host://xnnpack"]\ntimeout = nan\n', "timeout"),
    ('targets = ["host://xnnpack"]\ntimeout = inf\n', "timeout"),
    ('targets = ["host://xnnpack"]\nsetup_timeout = 1e300\n', "setup_timeout"),
    ('targets = ["host://xnnpack"]\nretries = 99999999\n', "retries"),
    ('targets = [{url = "host://xnnpack", concurrency = 99999999}]\n', "concurrency"),
    ('targets = ["host://xnnpack"]\nseed = -1\n', "seed"),
    ('targets = ["host://xnnpack"]\n' + _deep(5000) + "\n", "nested"),
    ('targets = ["host://xnnpack"]\n[' + ".".join(["a"] * 2000) + "]\nb = 1\n", "nested"),
])
def test_plan_bounds_before_anything_runs(art, tmp_path, body, needle):
    plan = tmp_path / "plan.toml"
    plan.write_text(f'bundles = ["{art["mlp"]}"]\n' + body)
    r = run_cli("farm", str(plan), "--dry-run")
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("bundlerun: error:")]
    assert len(lines) == 1 and needle in lines[0] and str(plan) in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_random_plans_and_configs_are_one_line(art, tmp_path):
    rng = random.Random(SEED)
    base = {"bundles": [str(art["mlp"])], "targets": ["host://xnnpack", {"url": "tosa://int", "concurrency": 2}],
            "retries": 1, "timeout": 10, "label": "x", "pools": {"p": {"devices": ["adb://A"], "tags": ["t"]}}}
    cases = []
    for i in range(40):
        doc, edits = security_fuzz.mutate_json(base, rng, edits=rng.choice((1, 2)))
        lines = []
        for key, value in doc.items() if isinstance(doc, dict) else []:
            if isinstance(value, dict):
                continue
            lines.append(f"{json.dumps(str(key))} = {_toml(value)}")
        for key, value in (doc.items() if isinstance(doc, dict) else []):
            if isinstance(value, dict):
                for sub, table in value.items():
                    lines.append(f"[{json.dumps(str(key))}.{json.dumps(str(sub))}]")
                    for k, v in (table.items() if isinstance(table, dict) else []):
                        lines.append(f"{json.dumps(str(k))} = {_toml(v)}")
        plan = tmp_path / f"plan{i}.toml"
        plan.write_text("\n".join(lines) + "\n")
        cases.append({"id": f"{i}p", "argv": ["farm", str(plan), "--dry-run", "--json"], "what": f"plan {edits}",
                      "names": [str(plan)]})
    _check(_drive(tmp_path, cases), cases)


def _toml(value) -> str:
    """A TOML value for the fuzzed plans (non-TOML values become strings: the plan is still text)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        text = repr(value)
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(text, text if abs(value) < 2**63 else json.dumps(text))
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value if v is not None) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml(v)}" for k, v in value.items() if v is not None) + "}"
    return json.dumps("" if value is None else str(value))


@pytest.mark.parametrize("args, needle", [
    (("--select", "0-99999999999"), "--select"),
    (("--select", "9" * 5000), "--select"),
    (("--select", "1,3-" + "9" * 4000), "--select"),
    (("--shard", "1/99999999999999999999999"), "--shard"),
    (("--timeout", "1e300"), "--timeout"),
    (("--timeout", "nan"), "--timeout"),
    (("--repeat", "99999999999"), "--repeat"),
])
def test_run_bounds_before_anything_runs(art, tmp_path, args, needle):
    r = run_cli("run", str(art["mlp"]), "--report", str(tmp_path / "r"), "--no-history", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    assert not (tmp_path / "r" / "report.json").exists()


def test_build_cases_bound(tmp_path):
    r = run_cli("build", "mlp", "--cases", "99999999999", "-o", str(tmp_path / "x.bpte"))
    assert r.returncode == 2 and "--cases" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_farm_job_folders_never_collide(art):
    """`a b.bpte` (PASS) and `a_b.bpte` (FAIL) once shared jobs/a_b@host_portable/attempt-1."""
    report = json.loads((art["root"] / "farm" / "report.json").read_text())
    jobs = {j["job"]: j for j in report["farm"]["jobs"]}
    assert set(jobs) == {"a b@host://portable", "a_b@host://portable"}
    folders = {Path(j["report"]).parent.parent for j in jobs.values()}
    assert len(folders) == 2 and all(f.is_dir() for f in folders)
    for name, verdict in (("a b@host://portable", "PASS"), ("a_b@host://portable", "FAIL")):
        job = jobs[name]
        linked = json.loads(Path(job["report"]).read_text())
        assert job["verdict"] == verdict == linked["summary"]["verdict"], (name, job, linked["summary"])
        assert Path(linked["bundle"]["path"]).name == name.split("@")[0] + ".bpte"


def test_farm_builds_of_one_slug_get_their_own_files(tmp_path):
    """`x/m.py:make` and `y/m.py:make` (one slug `m`) must not share a built bundle."""
    for sub in ("x", "y"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "m.py").write_text("def make():\n    raise SystemExit('never built by --dry-run')\n")
    plan = tmp_path / "plan.toml"
    plan.write_text('models = ["x/m.py:make", "y/m.py:make"]\ndtypes = ["fp32"]\ntargets = ["host://xnnpack"]\n')
    r = run_cli("farm", str(plan), "--dry-run", "--json", "--report", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    jobs = json.loads(r.stdout)["jobs"]
    assert len(jobs) == 2 and len({j["bundle"] for j in jobs}) == 2 and len({j["id"] for j in jobs}) == 2
