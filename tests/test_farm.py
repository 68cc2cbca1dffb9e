"""`bundlerun farm`: plans, the local process pool, a real two-node Ray cluster, retries, merge.

Devices are simulated (tests/fixtures/sim_device.py, registered through $BUNDLERUN_TARGETS):
each sleeps, answers with the expected outputs and logs its busy interval, so exclusivity and
placement are checked from what the devices saw, not from what the farm says it did. The
bundle is a real mlp built once. The Ray tests start a real cluster (head + a second node
process) and need Ray installed: without it they fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from bundlerun.bundles.errors import ConfigError
from bundlerun.runner.farm.plan import load_plan
from bundlerun.runner.farm.scheduler import retryable
from bundlerun.runner.report.merge import MergeError, MergeOptions, merge_reports
from bundlerun.runner.report.model import Report
from bundlerun.targets.base import Verdict

ROOT = Path(__file__).resolve().parents[1]
# RAY_AUTH_MODE: the test clusters run without token auth, and so must their drivers (tests/ray_fixture.py)
ENV = {"PYTHONPATH": str(ROOT), "BUNDLERUN_TARGETS": "tests.fixtures.sim_device,tests.fixtures.echo_target",
       "RAY_AUTH_MODE": "disabled"}


@pytest.fixture(scope="module")
def bundles(bundle_cache, tmp_path_factory):
    """Six copies of one real mlp bundle (six jobs per target)."""
    src = bundle_cache("mlp", backend="portable", cases=2)
    folder = tmp_path_factory.mktemp("farm-bundles")
    for name in "abcdef":
        shutil.copy(src, folder / f"{name}.bpte")
    return folder


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _intervals(log: Path) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = {}
    for line in log.read_text().splitlines():
        name, _pid, start, end = line.split()
        out.setdefault(name, []).append((float(start), float(end)))
    return out


def _overlaps(spans: list[tuple[float, float]]) -> bool:
    spans = sorted(spans)
    return any(b[0] < a[1] for a, b in zip(spans, spans[1:]))


# ---------------------------------------------------------------- the plan


def test_plan_is_strict_with_did_you_mean(tmp_path):
    (tmp_path / "a.bpte").write_bytes(b"x")
    base = 'bundles = ["a.bpte"]\ntargets = ["pool:phones"]\n[pools.phones]\ndevices = ["adb://A", "adb://B"]\n'
    plan = load_plan(_write(tmp_path / "ok.toml", base))
    assert [d.resource for d in plan.groups[0].devices] == ["adb:A", "adb:B"] and plan.groups[0].concurrency == 2
    cases = {
        'bundels = ["a.bpte"]\ntargets = ["host://xnnpack"]\n': "did you mean 'bundles'",
        base.replace("devices =", "device ="): "did you mean 'devices'",
        base.replace('"pool:phones"', '"pool:phnes"'): "did you mean 'phones'",
        base.replace('"pool:phones"', '{url = "host://xnnpack", concurency = 2}'): "did you mean 'concurrency'",
        base.replace('"pool:phones"', '"tag:android"'): "no pool has tag 'android'",
        base.replace('"a.bpte"', '"nothing/*.bpte"'): "matches no file",
        base.replace('"pool:phones"', '"hots://xnnpack"'): "did you mean 'host'",
        base.replace('"adb://B"', '"adb://A"'): "listed twice",
        "retries = -1\n" + base: "must be >= 0",
        'targets = ["host://xnnpack"]\n': "nothing to run",
    }
    for i, (text, message) in enumerate(cases.items()):
        with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
            load_plan(_write(tmp_path / f"bad{i}.toml", text))


def test_plan_target_backend_and_build_target(tmp_path):
    """A target may name the backend and the URL its models are built for (a board on a serial
    line runs a bundle built for qemu://mps3-an547); both are checked strictly, at plan time."""
    board = '{url = "serial+socket://127.0.0.1:5555", backend = "cortex-m", build_target = "qemu://mps3-an547"}'
    base = f'models = ["mlp"]\ndtypes = ["int8"]\ntargets = ["host://xnnpack", {board}]\n'
    plan = load_plan(_write(tmp_path / "ok.toml", base))
    host, serial = plan.groups
    assert (host.backend, host.build_url) == (None, "host://xnnpack")
    assert (serial.backend, serial.build_url, serial.url) == ("cortex-m", "qemu://mps3-an547", "serial+socket://127.0.0.1:5555")
    jobs = {j.id: j for j in plan.jobs(tmp_path / "built")}
    assert list(jobs) == ["mlp-int8@host://xnnpack", "mlp-int8@serial+socket://127.0.0.1:5555"]
    built = jobs["mlp-int8@serial+socket://127.0.0.1:5555"]
    assert (built.build.backend, built.build.target, built.build.dtype) == ("cortex-m", "qemu://mps3-an547", "int8")
    # named by what is built, plus the build's digest (runner/farm/plan.py: one slug never shares a file)
    assert re.fullmatch(r"mlp-int8-cortex-m-qemu_mps3-an547-[0-9a-f]{12}\.bpte", built.bundle.name), built.bundle.name
    assert built.group.url.startswith("serial+socket")
    assert jobs["mlp-int8@host://xnnpack"].build.backend is None  # the target's default, as before
    # no dtypes: the default dtype of the backend for the build target (int8 for Cortex-M)
    only = load_plan(_write(tmp_path / "nodtype.toml", base.replace('dtypes = ["int8"]\n', "")))
    assert [j.id for j in only.jobs(tmp_path / "built")][1] == "mlp-int8@serial+socket://127.0.0.1:5555"
    (tmp_path / "a.bpte").write_bytes(b"x")
    cases = {
        base.replace("backend =", "backnd ="): "did you mean 'backend'",
        base.replace("build_target =", "build_targt ="): "did you mean 'build_target'",
        base.replace('"cortex-m"', '"cortex-n"'): "unknown backend 'cortex-n' (did you mean 'cortex-m'?)",
        base.replace('"qemu://mps3-an547"', '"qemo://mps3-an547"'): ("targets[1].build_target: ", "did you mean 'qemu'"),
        base.replace(', build_target = "qemu://mps3-an547"', ""):
            "backend 'cortex-m' cannot build for serial+socket://127.0.0.1:5555",
        base.replace('"qemu://mps3-an547"', '"tosa://int"'): "backend 'cortex-m' cannot build for tosa://int",
        base.replace('"qemu://mps3-an547"', '"qemu://mps3-an999"'): "unknown QEMU machine 'mps3-an999'",
        'backend = "arm"\n' + base.replace(board, '"host://xnnpack"').replace('"host://xnnpack", ', ""):
            "backend 'arm' cannot build for host://xnnpack",
        'backend = "xnpack"\n' + base: "unknown backend 'xnpack' (did you mean 'xnnpack'?)",
        base.replace('models = ["mlp"]\ndtypes = ["int8"]', 'bundles = ["a.bpte"]'): "apply to models to build",
    }
    for i, (text, message) in enumerate(cases.items()):
        with pytest.raises(ConfigError) as err:
            load_plan(_write(tmp_path / f"bad{i}.toml", text))
        assert all(part in str(err.value) for part in ([message] if isinstance(message, str) else message)), err.value


def test_dry_run_expands_bundles_builds_pools_and_tags(cli, tmp_path):
    (tmp_path / "b").mkdir()
    for name in ("x.bpte", "y.bpte"):
        (tmp_path / "b" / name).write_bytes(b"not read by a dry run")
    plan = _write(tmp_path / "plan.toml", """
bundles = ["b/*.bpte"]
models = ["mlp"]
dtypes = ["fp32", "int8"]
targets = ["host://xnnpack", {url = "tosa://int", concurrency = 2}, "tag:android"]
[pools.phones]
devices = ["adb://A", {url = "adb+tcp://10.0.0.7:5555", resource = "adb:lab-7"}]
tags = ["android"]
[pools.boards]
devices = ["serial:///dev/ttyACM0"]
tags = ["android"]
""")
    r = cli("farm", str(plan), "--dry-run", "--json", "--report", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    jobs = json.loads(r.stdout)["jobs"]
    # (2 files + 1 model x 2 dtypes) x (2 URLs + 2 pools by tag)
    assert len(jobs) == 16
    ids = [j["id"] for j in jobs]
    assert ids[:4] == ["x@host://xnnpack", "x@tosa://int", "x@pool:phones", "x@pool:boards"]
    assert "mlp-int8@pool:phones" in ids and len(set(ids)) == 16
    phones = next(j for j in jobs if j["id"] == "x@pool:phones")
    assert phones["resources"] == ["adb:A", "adb:lab-7"] and phones["concurrency"] == 2
    assert next(j for j in jobs if j["id"] == "x@pool:boards")["resources"] == ["board:/dev/ttyACM0"]
    tosa = next(j for j in jobs if j["id"] == "mlp-fp32@tosa://int")
    assert tosa["resources"] == [] and tosa["concurrency"] == 2
    assert tosa["build"] == {"model": "mlp", "dtype": "fp32", "backend": None, "target": "tosa://int"}
    r = cli("farm", str(plan), "--dry-run", "--report", str(tmp_path / "out"))
    assert r.returncode == 0 and "mlp-int8@pool:boards" in r.stdout and "adb:lab-7" in r.stdout
    assert not (tmp_path / "out").exists()  # a dry run runs and builds nothing


def test_farm_command_does_not_import_ray_or_torch():
    """Nor, on the way to its first job (plan, settings, the history's location, the coordinator, the
    gateway's client), numpy or SQLAlchemy: a second command against a cluster starts at once."""
    code = ("import sys\nfrom bundlerun.runner.cli import main\n"
            "try:\n    main(['farm', '--help'])\nexcept SystemExit as e:\n    assert e.code in (0, None)\n"
            "print('HEAVY', [m for m in ('ray', 'torch', 'executorch') if m in sys.modules])\n"
            "import bundlerun.runner.farm.run, bundlerun.runner.settings, bundlerun.runner.history.location\n"
            "import bundlerun.runner.report.merge_jobs, bundlerun.runner.farm.gateway, bundlerun.runner.farm.executors\n"
            "print('BEFORE-FIRST-JOB', [m for m in ('numpy', 'sqlalchemy', 'flatbuffers', 'ray', 'torch') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "HEAVY []" in out.stdout and "--executor" in out.stdout, out.stdout + out.stderr
    assert "BEFORE-FIRST-JOB []" in out.stdout, out.stdout + out.stderr


def test_retry_rule_by_failure_kind():
    assert retryable(2, ["transport"]) and retryable(2, ["crash", "not-run"]) and retryable(2, [])
    assert retryable(2, ["host-timeout", "missing-operator"])  # one transient kind is enough
    assert not retryable(1, ["transport"])  # a numerical failure wins: never retried
    assert not retryable(0, [])
    assert not retryable(2, ["bad-bundle"]) and not retryable(2, ["tool-missing", "not-run"])


# ---------------------------------------------------------------- the local executor


def test_local_farm_exclusive_devices_retries_flaky_history(cli, bundles, tmp_path):
    log, state, db = tmp_path / "devices.log", tmp_path / "state", tmp_path / "history.sqlite"
    plan = _write(tmp_path / "plan.toml", f"""
bundles = ["{bundles}/*.bpte"]
targets = ["pool:phones", "sim://bad?sleep=0.05&scale=2&log={log}", "echo://cpu"]
retries = 2
[pools.phones]
devices = ["sim://emu-1?sleep=0.25&fail_first=1&state={state}&log={log}", "sim://emu-2?sleep=0.25&log={log}"]
""")
    r = cli("farm", str(plan), "--report", str(tmp_path / "out"), "--history", str(db), "--json", env=ENV)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]  # sim://bad fails numerically
    result = json.loads(r.stdout)
    jobs = {j["job"]: j for j in result["jobs"]}
    assert len(jobs) == 18
    # a device ran one job at a time; the two phones ran side by side
    spans = _intervals(log)
    assert sum(len(v) for v in spans.values()) == 6 + 1 + 6  # 6 pool jobs + 1 retry + 6 on sim://bad
    assert not any(_overlaps(v) for v in spans.values())
    assert any(a[0] < b[1] and b[0] < a[1] for a in spans["emu-1"] for b in spans["emu-2"])
    # the first job on emu-1 lost its device: retried on the other phone, passed, flaky
    flaky = [j for j in jobs.values() if j["flaky"]]
    assert len(flaky) == 1 and flaky[0]["verdict"] == "PASS"
    first, second = flaky[0]["attempts"]
    assert (first["device"], first["exit_code"], first["error_kinds"], first["retried"]) == (
        "adb:emu-1", 2, ["transport"], True)
    assert (second["device"], second["exit_code"]) == ("adb:emu-2", 0)
    # the retry was sent once the first attempt was back (bench/bench_farm_scale.py's breakdown reads these)
    assert second["submitted_unix"] >= first["submitted_unix"] + first["elapsed_s"] - 0.01
    assert result["flaky_jobs"] == [flaky[0]["job"]]
    # numerical failures are never retried
    bad = [j for j in jobs.values() if "sim://bad" in j["job"]]
    assert len(bad) == 6 and all(j["exit_code"] == 1 and len(j["attempts"]) == 1 for j in bad)
    assert all(j["verdict"] == "PASS" for j in jobs.values() if j["job"].endswith("@echo://cpu"))
    # one merged report that every reader takes, every attempt in it
    merged = json.loads((tmp_path / "out" / "report.json").read_text())
    Report.from_json(merged)
    assert merged["summary"]["exit_code"] == 1 and merged["summary"]["counts"]["FAIL"] == 12
    assert merged["summary"]["counts"]["PASS"] == 24 and len(merged["cases"]) == 36
    assert sum(len(j["attempts"]) for j in merged["farm"]["jobs"]) == 19
    assert 1 <= merged["farm"]["results"]["peak_backlog"] <= 18  # jobs queued for the results thread at once
    start = merged["farm"]["started_unix"]
    assert all(start <= a["submitted_unix"] <= start + merged["farm"]["makespan_s"]
               for j in merged["farm"]["jobs"] for a in j["attempts"])
    # each job's final attempt report is on disk with its history id (written once, by the results thread)
    final = json.loads(Path(flaky[0]["report"]).read_text())
    assert final["run"]["history_id"] == next(j for j in merged["farm"]["jobs"] if j["job"] == flaky[0]["job"])["history_id"]
    assert merged["farm"]["flaky_devices"] == [d["url"] for d in merged["farm"]["devices"] if "emu-1" in d["url"]]
    junit = (tmp_path / "out" / "junit.xml").read_text()
    assert junit.count("<testcase ") == 36 and junit.count("<failure ") == 12
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert f"| {flaky[0]['job']} | PASS | 2 | adb:emu-1, adb:emu-2 | flaky |" in summary
    assert "- adb:emu-1: 1 of" in summary and (tmp_path / "out" / "report.html").is_file()
    attempt_reports = sorted((tmp_path / "out" / "jobs").glob("*/attempt-*/report.json"))
    assert len(attempt_reports) == 19
    # history: one run per job, one row per attempt; --flaky names the device and the job
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 18
        assert conn.execute("SELECT COUNT(*) FROM farm_attempts").fetchone()[0] == 19
        assert conn.execute("SELECT COUNT(*) FROM farm_attempts WHERE flaky = 1").fetchone()[0] == 1
    r = cli("history", "--flaky", "--history", str(db), "--json")
    stats = json.loads(r.stdout)
    on_emu1 = sum(1 for j in jobs.values() for a in j["attempts"] if a["device"] == "adb:emu-1")
    assert [(d["device"], d["attempts"], d["infra_failures"]) for d in stats["devices"]] == [("adb:emu-1", on_emu1, 1)]
    assert [(j["job"], j["flaky"], j["runs"]) for j in stats["jobs"]] == [(flaky[0]["job"], 1, 1)]
    r = cli("history", "--flaky", "--history", str(db))
    assert r.returncode == 0 and "adb:emu-1" in r.stdout and f"{100 / on_emu1:.0f}%" in r.stdout


def test_ctrl_c_writes_the_merged_report_and_keeps_finished_jobs(bundles, tmp_path):
    """A real SIGINT to `bundlerun farm` once a job has finished: exit 130, the merged report is
    written and says interrupted, finished jobs keep their verdicts, the rest are `interrupted`,
    and no history row is made for a job that never ran."""
    import signal
    import threading
    import time

    log, db = tmp_path / "devices.log", tmp_path / "history.sqlite"
    plan = _write(tmp_path / "plan.toml", f"""
bundles = ["{bundles}/*.bpte"]
targets = ["sim://emu-1?sleep=1.5&log={log}"]
""")
    proc = subprocess.Popen(
        [sys.executable, "-c", "from bundlerun.runner.cli import main; main()", "farm", str(plan),
         "--report", str(tmp_path / "out"), "--history", str(db)],
        cwd=ROOT, env={**os.environ, **ENV}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + 300
    while not any("attempt 1" in line and "PASS" in line for line in said):  # the farm has one job's result
        assert proc.poll() is None, proc.stdout.read() + "".join(said)
        assert time.monotonic() < deadline, "no job finished"
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out = proc.stdout.read()
    proc.wait(timeout=120)
    reader.join(timeout=10)
    err = "".join(said)
    assert proc.returncode == 130, out[-2000:] + err[-2000:]
    assert "interrupted" in err
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["summary"]["interrupted"] is True and report["summary"]["exit_code"] == 130
    jobs = report["farm"]["jobs"]
    assert len(jobs) == 6
    finished = [j for j in jobs if j["attempts"]]
    assert 1 <= len(finished) < 6 and all(j["verdict"] == "PASS" for j in finished)
    kinds = {c["error_kind"] for c in report["cases"] if c["verdict"] != "PASS"}
    assert kinds == {"interrupted"}, kinds
    assert (tmp_path / "out" / "junit.xml").is_file() and (tmp_path / "out" / "summary.md").is_file()
    with sqlite3.connect(db) as con:
        recorded = con.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    assert recorded == len(finished)


def test_exhausted_retries_end_with_an_error_verdict(cli, bundles, tmp_path):
    plan = _write(tmp_path / "plan.toml", f"""
bundles = ["{bundles}/a.bpte"]
targets = ["sim://dead?sleep=0.01&fail_first=99&state={tmp_path / 'state'}"]
""")
    r = cli("farm", str(plan), "--report", str(tmp_path / "out"), "--no-history", "--retries", "1", "--json", env=ENV)
    assert r.returncode == 2, r.stderr[-3000:]
    (job,) = json.loads(r.stdout)["jobs"]
    assert [a["exit_code"] for a in job["attempts"]] == [2, 2] and job["verdict"] == "ERROR" and not job["flaky"]
    assert [a["retried"] for a in job["attempts"]] == [True, False]


# ---------------------------------------------------------------- merge


@pytest.fixture(scope="module")
def echo_reports(bundles, tmp_path_factory):
    """Real reports of the echo target: one passing (scale 1), one failing numerically (scale 2)."""
    from bundlerun.runner.session import RunRequest, execute_run
    from bundlerun.targets import reset_registry

    old = os.environ.get("BUNDLERUN_TARGETS")
    os.environ["BUNDLERUN_TARGETS"] = "tests.fixtures.echo_target"
    reset_registry()
    try:
        out = tmp_path_factory.mktemp("echo")
        good = execute_run(RunRequest(bundles / "a.bpte", "echo://x", out / "good"), write=False)
        bad = execute_run(RunRequest(bundles / "b.bpte", "echo://y", out / "bad", target_config={"scale": 2.0}),
                          write=False)
    finally:
        if old is None:
            os.environ.pop("BUNDLERUN_TARGETS")
        else:
            os.environ["BUNDLERUN_TARGETS"] = old
        reset_registry()
    return good.to_json(), bad.to_json()  # the JSON of record: the tests below edit it as a shard file would be


def _merge(docs: list[dict], options: MergeOptions | None = None) -> dict:
    """merge_reports on reports as read from their files; the merged report's JSON."""
    return merge_reports([Report.from_json(d) for d in docs], options).to_json()


def test_merge_of_shards_equals_the_unsharded_run(echo_reports):
    good, bad = echo_reports
    whole = bad
    shard0, shard1 = json.loads(json.dumps(whole)), json.loads(json.dumps(whole))
    shard0["cases"], shard1["cases"] = whole["cases"][1:], whole["cases"][:1]  # out of order on purpose
    for shard in (shard0, shard1):
        shard["run"]["id"] = os.urandom(8).hex()
    merged = _merge([shard0, shard1])
    strip = lambda cases: [(c["method"], c["case"], c["verdict"], [o["verdict"] for o in c["outputs"]]) for c in cases]
    assert strip(merged["cases"]) == strip(whole["cases"])
    assert merged["summary"] == whole["summary"] and merged["summary"]["exit_code"] == 1
    assert merged["bundle"] == whole["bundle"] and merged["merged"]["mode"] == "shards"
    assert merged["merged"]["run_ids"] == [shard0["run"]["id"], shard1["run"]["id"]]


def test_merge_of_jobs_keeps_each_jobs_cases_apart(echo_reports):
    good, bad = echo_reports
    with pytest.raises(MergeError, match="2 different bundles/targets"):
        _merge([good, bad])  # the checks: different targets are refused unless forced or a jobs merge
    merged = _merge([good, bad], MergeOptions(jobs=True))  # the farm's mode
    forced = _merge([good, bad], MergeOptions(force=True))  # `bundlerun merge --force`: the same naming
    assert [c["method"] for c in forced["cases"]] == [c["method"] for c in merged["cases"]]
    assert merged["merged"]["mode"] == "jobs" and [j["target"] for j in merged["jobs"]] == ["echo://x", "echo://y"]
    assert [c["method"] for c in merged["cases"]] == ["mlp-fp32@echo://x/forward"] * 2 + ["mlp-fp32@echo://y/forward"] * 2
    assert [c["extra"]["method"] for c in merged["cases"]] == ["forward"] * 4
    assert merged["summary"]["counts"]["PASS"] == 2 and merged["summary"]["counts"]["FAIL"] == 2
    assert merged["summary"]["exit_code"] == 1 and merged["target"]["targets"] == ["echo://x", "echo://y"]
    same = _merge([good, good], MergeOptions(jobs=True, names=["j", "j"]))  # names made unique
    assert [j["name"] for j in same["jobs"]] == ["j", "j#2"] and len(same["cases"]) == 4
    assert same["summary"]["exit_code"] == 0
    with pytest.raises(MergeError, match="overlapping shards"):
        _merge([good, good])  # same bundle and target: shards, and every case is in both
    again = _merge([good, good], MergeOptions(force=True))  # forced: the first kept, each case once
    assert again["merged"]["mode"] == "shards" and len(again["cases"]) == 2
    assert any("overlapping shards" in w for w in again["warnings"])
    from bundlerun.runner.writers.junit import junit_bytes

    xml = junit_bytes(Report.from_json(merged)).decode()
    assert xml.count("<testcase ") == 4 and xml.count("<failure ") == 2
    assert 'classname="mlp/2 targets/mlp-fp32@echo://y/forward"' in xml


def test_jobs_folded_one_by_one_equal_merge_reports(echo_reports, tmp_path):
    """The farm's merged report is folded job by job as jobs finish, in any order, its cases on disk
    (runner/report/merge_jobs.py): the same document as merge_reports' jobs mode, and report.json
    streamed from the spool is the file write_record writes for merge_reports' result."""
    from bundlerun.runner.report.merge_jobs import JobsMerge
    from bundlerun.runner.report.record import write_record

    good, bad = echo_reports
    names = ["g1", "b", "g2"]
    docs = [good, bad, good]
    fold = JobsMerge(names, tmp_path / "spool.jsonl")
    for i in (2, 0, 1):  # the order jobs finish in is not the plan's
        fold.add(names[i], Report.from_json(docs[i]))
    streamed = fold.report()
    whole = merge_reports([Report.from_json(d) for d in docs], MergeOptions(jobs=True, names=names))
    assert len(streamed.cases) == 6 and [c.verdict for c in streamed.cases] == [c.verdict for c in whole.cases]
    streamed.run["id"] = whole.run["id"]  # a new id each merge
    assert streamed.to_json() == whole.to_json() and streamed.summary.exit_code == 1
    write_record(whole, tmp_path / "whole")
    write_record(streamed, tmp_path / "streamed")
    assert (tmp_path / "streamed/report.json").read_bytes() == (tmp_path / "whole/report.json").read_bytes()
    with pytest.raises(TypeError, match="read back from disk"):
        streamed.cases.append(whole.cases[0])
    streamed.summary.verdict, streamed.summary.exit_code = Verdict.PASS, 0  # a PASS over a failing case: refused
    with pytest.raises(ValueError, match="but a case is FAIL"):
        write_record(streamed, tmp_path / "streamed")
    assert json.loads((tmp_path / "streamed/report.json").read_text())["summary"]["exit_code"] == 1  # old file kept
    fold.discard()
    assert not (tmp_path / "spool.jsonl").exists()


def test_farm_shards_merged_equal_the_unsharded_farm(cli, bundles, tmp_path):
    """`farm --shard i/n` runs a stable part of the jobs; `bundlerun merge` of the shards' reports
    gives the unsharded farm's cases and verdicts, and names the jobs of a missing shard."""
    from bundlerun.runner.shard import select

    plan = _write(tmp_path / "plan.toml", f"""
bundles = ["{bundles}/a.bpte", "{bundles}/b.bpte", "{bundles}/c.bpte"]
targets = ["echo://cpu", "sim://bad?sleep=0.01&scale=2"]
""")
    r = cli("farm", str(plan), "--report", str(tmp_path / "whole"), "--no-history", "--json", env=ENV)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]  # sim://bad fails numerically
    whole = json.loads((tmp_path / "whole" / "report.json").read_text())
    ids = [j["job"] for j in whole["farm"]["jobs"]]
    assert len(ids) == 6 and "shard" not in whole
    held = []
    for i in (1, 2):
        r = cli("farm", str(plan), "--shard", f"{i}/2", "--report", str(tmp_path / f"s{i}"), "--no-history", "--json",
                env=ENV)
        report = json.loads((tmp_path / f"s{i}" / "report.json").read_text())
        mine = [j["job"] for j in report["farm"]["jobs"]]
        assert mine == select(ids, f"{i}/2") == report["shard"]["keys"] and report["shard"]["universe"] == ids
        assert report["shard"]["axis"] == "jobs" and report["shard"]["spec"] == f"{i}/2"
        assert r.returncode == (1 if any("sim://bad" in j for j in mine) else 0), r.stderr[-3000:]
        held += mine
    assert sorted(held) == sorted(ids)
    r = cli("merge", str(tmp_path / "s2"), str(tmp_path / "s1"), "--report", str(tmp_path / "merged"), env=ENV)
    assert r.returncode == whole["summary"]["exit_code"] == 1, r.stdout + r.stderr
    merged = json.loads((tmp_path / "merged" / "report.json").read_text())
    Report.from_json(merged)

    def verdicts(report):
        return [(c["method"], c["extra"]["job"], c["extra"]["method"], c["case"], c["verdict"],
                 [o["verdict"] for o in c["outputs"]]) for c in report["cases"]]

    assert verdicts(merged) == verdicts(whole) and len(merged["cases"]) == 12  # plan order, not shard order
    assert merged["summary"] == whole["summary"] and merged["summary"]["counts"]["FAIL"] == 6
    assert [j["name"] for j in merged["jobs"]] == [j["name"] for j in whole["jobs"]] == ids
    assert merged["merged"]["complete"] is True and merged["merged"]["farm_jobs"] == ids
    assert (tmp_path / "merged" / "junit.xml").read_text().count("<testcase ") == 12
    # a missing farm shard is refused, its jobs named with their shard; --allow-partial merges them as not-run
    r = cli("merge", str(tmp_path / "s1"), "--report", str(tmp_path / "partial"), env=ENV)
    absent = select(ids, "2/2")
    assert r.returncode == 2 and "missing shards" in r.stderr, r.stderr
    assert all(f"{job} (shard 2/2)" in r.stderr for job in absent), r.stderr
    assert not (tmp_path / "partial" / "report.json").exists()
    r = cli("merge", str(tmp_path / "s1"), "--report", str(tmp_path / "partial"), "--allow-partial", env=ENV)
    partial = json.loads((tmp_path / "partial" / "report.json").read_text())
    not_run = [c["extra"]["job"] for c in partial["cases"] if c.get("error_kind") == "not-run"]
    assert not_run == absent and partial["merged"]["complete"] is False
    assert r.returncode == (1 if partial["summary"]["counts"]["FAIL"] else 2), r.stderr
    # the same shard twice overlaps; a plain run's report is another bundle
    r = cli("merge", str(tmp_path / "s1"), str(tmp_path / "s1"), str(tmp_path / "s2"), "--report",
            str(tmp_path / "overlap"), env=ENV)
    assert r.returncode == 2 and "overlapping shards" in r.stderr and select(ids, "1/2")[0] in r.stderr, r.stderr
    r = cli("merge", str(tmp_path / "s1"), str(tmp_path / "whole"), "--report", str(tmp_path / "mixed"), env=ENV)
    assert r.returncode == 2 and "different bundles/targets" in r.stderr, r.stderr


def test_farm_more_shards_than_jobs_gives_an_empty_shard_that_merges(cli, bundles, tmp_path):
    plan = _write(tmp_path / "plan.toml", f'bundles = ["{bundles}/a.bpte"]\ntargets = ["echo://cpu"]\n')
    codes = {i: cli("farm", str(plan), "--shard", f"{i}/2", "--report", str(tmp_path / f"s{i}"), "--no-history",
                    "--json", env=ENV).returncode for i in (1, 2)}
    reports = {i: json.loads((tmp_path / f"s{i}" / "report.json").read_text()) for i in (1, 2)}
    empty = [i for i in (1, 2) if not reports[i]["cases"]]
    assert len(empty) == 1 and codes == {1: 0, 2: 0}, codes
    assert reports[empty[0]]["summary"]["verdict"] == "SKIP" and "nothing ran" in reports[empty[0]]["warnings"][0]
    r = cli("merge", str(tmp_path / "s1"), str(tmp_path / "s2"), "--report", str(tmp_path / "m"), "--json", env=ENV)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["summary"]["verdict"] == "PASS"
    r = cli("farm", str(plan), "--shard", "3/2", "--report", str(tmp_path / "bad"), env=ENV)
    assert r.returncode == 2 and "--shard '3/2'" in r.stderr and "Traceback" not in r.stderr, r.stderr


# ---------------------------------------------------------------- Ray


BOARD = "board:qemu-an547"  # the QEMU UART board's device resource (a Ray custom resource of the second node)


@pytest.fixture(scope="module")
def ray_cluster():
    """Head with device adb:emu-1, a second node with adb:emu-2 and the QEMU board board:qemu-an547
    (each 1 CPU)."""
    from ray_fixture import RayCluster

    cluster = RayCluster(ENV, cpus_per_node=1)
    try:
        cluster.start({"adb:emu-1": 1}, [{"adb:emu-2": 1, BOARD: 1}])
        yield cluster
    finally:
        left = cluster.stop()
        assert left == [], f"Ray processes left running: {left}"


def _ray_plan(tmp_path: Path, bundles: Path, tag: str) -> Path:
    log, state = tmp_path / f"{tag}.log", tmp_path / f"{tag}-state"
    return _write(tmp_path / f"{tag}.toml", f"""
bundles = ["{bundles}/a.bpte", "{bundles}/b.bpte", "{bundles}/c.bpte", "{bundles}/d.bpte"]
targets = ["pool:phones", {{url = "sim://emu-1?sleep=0.05&scale=2", options = {{log = "{log}"}}}}, "echo://cpu"]
[pools.phones]
devices = ["sim://emu-1?sleep=0.2", "sim://emu-2?sleep=0.2&fail_first=1"]
options = {{log = "{log}", state = "{state}"}}
""")


def test_ray_jobs_run_on_the_node_holding_their_device(cli, bundles, ray_cluster, tmp_path):
    nodes = ray_cluster.nodes()
    assert len(nodes) == 2
    holder = {res: node for node, resources in nodes.items() for res in resources if res.startswith("adb:")}
    assert set(holder) == {"adb:emu-1", "adb:emu-2"} and holder["adb:emu-1"] != holder["adb:emu-2"]
    plan = _ray_plan(tmp_path, bundles, "ray")
    r = cli("farm", str(plan), "--executor", f"ray:{ray_cluster.address}", "--report", str(tmp_path / "ray"),
            "--no-history", "--json", env=ENV, timeout=900)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads(r.stdout)
    attempts = [a for j in result["jobs"] for a in j["attempts"]]
    assert len(result["jobs"]) == 12 and len(attempts) == 13  # one retry: emu-2's first job
    for a in attempts:
        assert a["node"]["ray_node_id"] in nodes
        if a["device"]:
            assert a["node"]["ray_node_id"] == holder[a["device"]], a  # the task ran where the device is
    placed = {a["device"] for a in attempts}
    assert placed == {"adb:emu-1", "adb:emu-2", None}
    spans = _intervals(tmp_path / "ray.log")  # emu-1 is shared by the pool and its own URL group
    assert len(spans["emu-1"]) >= 4 and not any(_overlaps(v) for v in spans.values())
    (flaky,) = [j for j in result["jobs"] if j["flaky"]]
    assert [a["device"] for a in flaky["attempts"]] == ["adb:emu-2", "adb:emu-1"]
    merged = json.loads((tmp_path / "ray" / "report.json").read_text())
    assert merged["farm"]["executor"]["name"] == "ray" and len(merged["farm"]["executor"]["nodes"]) == 2
    assert len(list((tmp_path / "ray" / "jobs").glob("*/attempt-*/report.json"))) == 13

    # the same plan on the local executor: the same merged verdicts
    plan = _ray_plan(tmp_path, bundles, "local")
    r = cli("farm", str(plan), "--report", str(tmp_path / "local"), "--no-history", "--json", env=ENV)
    assert r.returncode == 1, r.stderr[-3000:]
    local = json.loads((tmp_path / "local" / "report.json").read_text())

    def verdicts(report):
        return sorted((c["extra"]["job"], c["extra"]["method"], c["case"], c["verdict"]) for c in report["cases"])

    assert verdicts(local) == verdicts(merged) and local["summary"] == merged["summary"]
    assert {(j["job"], j["verdict"]) for j in local["farm"]["jobs"]} == {(j["job"], j["verdict"]) for j in merged["farm"]["jobs"]}


def test_ray_client_address_runs_the_plan_on_the_cluster(cli, bundles, ray_cluster, tmp_path):
    """`--executor ray://HOST:PORT`: the driver is a Ray Client of the head's client server (no
    Ray runtime in the farm process); jobs still land on the node holding their device."""
    nodes = ray_cluster.nodes()
    holder = {res: node for node, resources in nodes.items() for res in resources if res.startswith("adb:")}
    plan = _ray_plan(tmp_path, bundles, "client")
    r = cli("farm", str(plan), "--executor", ray_cluster.client_address, "--report", str(tmp_path / "client"),
            "--no-history", "--json", env=ENV, timeout=900)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]  # the scale=2 group fails numerically
    result = json.loads(r.stdout)
    attempts = [a for j in result["jobs"] for a in j["attempts"]]
    assert len(result["jobs"]) == 12 and len(attempts) == 13
    for a in attempts:
        if a["device"]:
            assert a["node"]["ray_node_id"] == holder[a["device"]], a
    merged = json.loads((tmp_path / "client" / "report.json").read_text())
    assert merged["farm"]["executor"]["address"] == ray_cluster.client_address
    assert len(merged["farm"]["executor"]["nodes"]) == 2
    assert len(list((tmp_path / "client" / "jobs").glob("*/attempt-*/report.json"))) == 13


def test_ray_device_missing_from_cluster_is_an_error_not_a_hang(cli, bundles, ray_cluster, tmp_path):
    plan = _write(tmp_path / "plan.toml", f"""
bundles = ["{bundles}/a.bpte"]
targets = ["sim://emu-9?sleep=0.01", "sim://emu-1?sleep=0.01"]
""")
    r = cli("farm", str(plan), "--executor", f"ray:{ray_cluster.address}", "--report", str(tmp_path / "out"),
            "--no-history", "--json", env=ENV, timeout=600)
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-3000:]
    jobs = {j["job"]: j for j in json.loads(r.stdout)["jobs"]}
    assert jobs["a@sim://emu-1?sleep=0.01"]["verdict"] == "PASS"
    missing = jobs["a@sim://emu-9?sleep=0.01"]
    assert missing["verdict"] == "ERROR" and missing["attempts"] == [] and "adb:emu-9" in missing["error"]


@pytest.mark.slow
def test_zoo_plan_on_host_tosa_and_emulated_phone_same_verdicts_local_and_ray(cli, device, home, ray_cluster,
                                                                              tmp_path):
    """The real thing: a zoo model built per target (host, TOSA INT, an emulated phone over the ADB
    protocol) run on the local executor and on the Ray cluster, with the same verdicts."""
    from doubles.android_env import runner_binaries

    runners = runner_binaries(tmp_path / "runners")
    plan = _write(tmp_path / "zoo.toml", f"""
models = ["mlp"]
cases = 2
targets = ["host://xnnpack", "tosa://int", {{url = "adb+tcp://127.0.0.1:{device.port}", resource = "adb:emu-1", options = {{workspace = "/data/local/tmp/farm"}}}}]
""")
    # the runner binary is a program: the user's config names it, a plan cannot (docs/security.md)
    config = _write(tmp_path / "bundlerun.toml", f'[targets.adb]\nrunner = "{runners["executor-runner"]}"\n')
    results = {}
    for executor in ("local", f"ray:{ray_cluster.address}"):
        out = tmp_path / executor.split(":")[0]
        r = cli("farm", str(plan), "--executor", executor, "--report", str(out), "--no-history", "--json",
                "--config", str(config), env=ENV, timeout=1800)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        merged = json.loads((out / "report.json").read_text())
        results[executor.split(":")[0]] = merged
        jobs = {j["job"]: j for j in merged["farm"]["jobs"]}
        assert set(jobs) == {"mlp-fp32@host://xnnpack", "mlp-int8@tosa://int", f"mlp-fp32@adb+tcp://127.0.0.1:{device.port}"}
        assert all(j["verdict"] == "PASS" for j in jobs.values()) and merged["summary"]["counts"]["PASS"] == 6
    ray = results["ray"]
    phone = next(j for j in ray["farm"]["jobs"] if j["job"].startswith("mlp-fp32@adb"))
    (attempt,) = phone["attempts"]
    head = next(n for n, res in ray_cluster.nodes().items() if "adb:emu-1" in res)
    assert attempt["device"] == "adb:emu-1" and attempt["node"]["ray_node_id"] == head

    def verdicts(report):
        return sorted((c["extra"]["job"], c["case"], c["verdict"], tuple(o["verdict"] for o in c["outputs"]))
                      for c in report["cases"])

    assert verdicts(results["local"]) == verdicts(ray)


@pytest.mark.slow
def test_cortex_m_board_on_a_serial_line_same_verdicts_local_and_ray(cli, qemu_runner, ray_cluster, tmp_path):
    """The board lane: a zoo mlp built by ONE plan for the host and, with the target's own
    backend = "cortex-m" / build_target = "qemu://mps3-an547", as an int8 Cortex-M (CMSIS-NN)
    bundle for a real board on a serial line -- ExecuTorch's arm_executor_runner (uart build) on
    qemu-system-arm, its UART0 a TCP server, launched per case by the serial target -- a device
    `board:qemu-an547` of the plan, on the local executor and on the Ray cluster (whose second node
    holds that resource), with the same verdicts, every case judged on the host, and no QEMU left."""
    from ray_fixture import free_port

    from bundlerun.runner.farm.run import job_dir_name

    elf = qemu_runner("--mode", "uart") / "arm_executor_runner.elf"
    port = free_port()
    url = f"serial+socket://127.0.0.1:{port}"
    launch = ("qemu-system-arm -M mps3-an547 -nographic -monitor none -serial tcp:{host}:{tcp_port},server=on,wait=on "
              "-device loader,file={case_bundle},addr=0x7C000000 -kernel {elf}")
    plan = _write(tmp_path / "board.toml", f"""
models = ["mlp"]
dtypes = ["int8"]
cases = 2
timeout = 60
targets = ["host://xnnpack", {{url = "{url}", resource = "{BOARD}", backend = "cortex-m", build_target = "qemu://mps3-an547"}}]
""")
    # the launch command and the firmware it runs are the user's config, never the plan's (docs/security.md)
    config = _write(tmp_path / "bundlerun.toml", f"[targets.serial]\nelf = {json.dumps(str(elf))}\n"
                                                 f"launch = {json.dumps(launch)}\n")
    job, host_job = f"mlp-int8@{url}", "mlp-int8@host://xnnpack"

    def qemus() -> list[str]:  # this test's boards only: others' QEMU runs are not ours to count
        out = subprocess.run(["ps", "-ww", "-eo", "pid=,stat=,args="], capture_output=True, text=True).stdout
        return [ln for ln in out.splitlines() if "qemu-system-arm" in ln and f"tcp:127.0.0.1:{port}," in ln
                and " Z" not in ln[:12]]

    r = cli("farm", str(plan), "--dry-run", "--json", "--report", str(tmp_path / "dry"))
    planned = {j["id"]: j for j in json.loads(r.stdout)["jobs"]}
    assert list(planned) == [host_job, job], planned
    board = planned[job]
    assert board["resources"] == [BOARD] and board["concurrency"] == 1, board
    assert board["build"] == {"model": "mlp", "dtype": "int8", "backend": "cortex-m", "target": "qemu://mps3-an547"}
    assert planned[host_job]["build"]["backend"] is None and planned[host_job]["build"]["target"] == "host://xnnpack"
    results = {}
    for executor in ("local", f"ray:{ray_cluster.address}"):
        name = executor.split(":")[0]
        r = cli("farm", str(plan), "--executor", executor, "--report", str(tmp_path / name), "--no-history", "--json",
                "--config", str(config), env=ENV, timeout=900)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        merged = json.loads((tmp_path / name / "report.json").read_text())
        Report.from_json(merged)
        results[name] = merged
        jobs = {j["job"]: j for j in merged["farm"]["jobs"]}
        assert list(jobs) == [host_job, job], jobs
        assert all(j["verdict"] == "PASS" and not j["flaky"] for j in jobs.values()), jobs
        (attempt,) = jobs[job]["attempts"]
        assert attempt["device"] == BOARD and attempt["exit_code"] == 0, attempt
        assert merged["summary"]["counts"]["PASS"] == 4 and merged["summary"]["outputs"] == 4, merged["summary"]
        on_board = [c for c in merged["cases"] if c["extra"]["job"] == job]
        assert [c["case"] for c in on_board] == [0, 1]
        for case in on_board:  # every case ran on its own board and was judged on the host
            assert case["verdict"] == "PASS", case
            assert case["extra"]["outputs_from"] == "printed" and case["device_verdict"]["verdict"] == "PASS", case
            assert case["outputs"] and all(o["verdict"] == "PASS" and o["stats"]["sqnr"] > 20 for o in case["outputs"])
        (own,) = (tmp_path / name / "jobs" / job_dir_name(job)).glob("attempt-*/report.json")  # the attempt's own
        own = json.loads(own.read_text())
        assert own["target"]["info"]["per_case_launch"] is True  # a fresh QEMU per case
        assert not qemus(), qemus()
    holder = next(n for n, res in ray_cluster.nodes().items() if BOARD in res)
    (attempt,) = next(j for j in results["ray"]["farm"]["jobs"] if j["job"] == job)["attempts"]
    assert attempt["node"]["ray_node_id"] == holder  # the task ran on the node the board is attached to

    def verdicts(report):
        return sorted((c["extra"]["job"], c["case"], c["verdict"], tuple(o["verdict"] for o in c["outputs"]))
                      for c in report["cases"])

    assert verdicts(results["local"]) == verdicts(results["ray"]) and results["local"]["summary"] == results["ray"]["summary"]
    assert not qemus()


def test_ray_started_by_the_command_holds_the_plans_devices(cli, bundles, tmp_path):
    """`--executor ray` without an address: a Ray of its own for the command (the plan's devices as
    resources of this node), gone when the command ends."""
    plan = _write(tmp_path / "plan.toml", f"""
bundles = ["{bundles}/a.bpte", "{bundles}/b.bpte"]
targets = ["pool:phones"]
[pools.phones]
devices = ["sim://emu-1?sleep=0.05", "sim://emu-2?sleep=0.05&fail_first=1"]
options = {{state = "{tmp_path / 'state'}"}}
""")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(ENV, RAY_ADDRESS="")
    r = cli("farm", str(plan), "--executor", "ray", "--jobs", "1", "--report", str(tmp_path / "out"), "--no-history",
            "--json", env=env, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    merged = json.loads((tmp_path / "out" / "report.json").read_text())
    executor = merged["farm"]["executor"]
    assert executor["name"] == "ray" and executor["address"] == "local" and len(executor["nodes"]) == 1
    assert executor["nodes"][0]["devices"] == ["adb:emu-1", "adb:emu-2"]
    attempts = [a for j in merged["farm"]["jobs"] for a in j["attempts"]]
    assert len(attempts) == 3 and {a["node"]["ray_node_id"] for a in attempts} == {executor["nodes"][0]["node_id"]}
    assert [j["flaky"] for j in merged["farm"]["jobs"]].count(True) == 1


def _wait_for_begin(begin: Path, job: int, proc: subprocess.Popen, said: list[str], timeout: float = 300) -> int:
    """The pid of the process that started the device's job number `job` (tests/fixtures/sim_device.py
    `begin=`): with `hold=job` it stays in that job until killed, so the kill lands mid-job."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        lines = begin.read_text().split("\n") if begin.exists() else []
        for line in lines:
            parts = line.split()
            if len(parts) == 3 and parts[2] == str(job):
                return int(parts[1])
        assert proc.poll() is None, "".join(said)
        assert time.monotonic() < deadline, f"job {job} did not start: {''.join(said)[-3000:]}"
        time.sleep(0.05)


def test_a_killed_local_worker_is_replaced_and_its_attempt_retried(bundles, tmp_path):
    """A real SIGKILL to the pool's worker process while it holds a job (what the OOM killer does):
    that attempt is a crash and is retried, a new pool takes over, and every job still passes. The
    device holds its second job until the kill (sim `hold=1`), so the kill always lands mid-job."""
    import signal
    import threading

    log, begin = tmp_path / "devices.log", tmp_path / "begin.log"
    plan = _write(tmp_path / "plan.toml", f"""
bundles = ["{bundles}/*.bpte"]
targets = ["sim://emu-k?sleep=0.2&log={log}&begin={begin}&hold=1&state={tmp_path / 'state'}"]
""")
    proc = subprocess.Popen(
        [sys.executable, "-c", "from bundlerun.runner.cli import main; main()", "farm", str(plan),
         "--report", str(tmp_path / "out"), "--no-history", "--jobs", "1"],
        cwd=ROOT, env={**os.environ, **ENV}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()
    worker = _wait_for_begin(begin, 1, proc, said)
    workers = subprocess.run(["ps", "-o", "pid=", "--ppid", str(proc.pid)], capture_output=True,
                             text=True).stdout.split()
    assert workers == [str(worker)], workers  # --jobs 1: one pool process, the one in the held job
    os.kill(worker, signal.SIGKILL)
    out = proc.stdout.read()
    proc.wait(timeout=300)
    reader.join(timeout=10)
    err = "".join(said)
    assert proc.returncode == 0, out[-2000:] + err[-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["farm"]["executor"]["pools_replaced"] == 1
    jobs = report["farm"]["jobs"]
    assert len(jobs) == 6 and all(j["verdict"] == "PASS" for j in jobs)
    crashed = [a for j in jobs for a in j["attempts"] if a["exit_code"] != 0]
    assert len(crashed) == 1 and crashed[0]["retried"] is True
    assert sum("attempt 1" in line and "ERROR [crash] -> retry" in line for line in said) == 1, err[-3000:]
    attempt_reports = sorted((tmp_path / "out" / "jobs").glob("*/attempt-*/report.json"))
    assert len(attempt_reports) == 7  # six jobs, one retried: every attempt folder holds its report
    died = [p for p in attempt_reports if "the attempt's worker died" in p.read_text()]
    assert len(died) == 1 and died[0].parent.name == "attempt-1"
    assert sum(1 for j in jobs if j["flaky"]) == 1


def _ray_farm(tmp_path: Path, bundles: Path, address: str, tag: str, *extra: str, device: str = "sim://emu-1?sleep=0.1"):
    plan = _write(tmp_path / f"{tag}.toml", f'bundles = ["{bundles}/a.bpte", "{bundles}/b.bpte"]\n'
                                              f'targets = ["{device}"]\n')
    return subprocess.run([sys.executable, "-c", "from bundlerun.runner.cli import main; main()", "farm", str(plan),
                           "--executor", f"ray:{address}", "--report", str(tmp_path / tag), "--no-history", "--json",
                           *extra], cwd=ROOT, env={**os.environ, **ENV}, capture_output=True, text=True, timeout=900)


def test_ray_device_workers_outlive_the_command_and_are_released(bundles, ray_cluster, tmp_path):
    """A device's jobs run in its detached actor (runner/farm/ray_workers.py): the second command
    finds it (the same process runs its jobs) and starts nothing; --release-workers kills it, so
    the next command starts a new one."""
    runs = {}
    for tag, extra in (("first", ()), ("second", ("--release-workers",)), ("third", ())):
        r = _ray_farm(tmp_path, bundles, ray_cluster.address, tag, *extra)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        merged = json.loads((tmp_path / tag / "report.json").read_text())
        pids = {a["node"]["pid"] for j in merged["farm"]["jobs"] for a in j["attempts"]}
        runs[tag] = (merged["farm"]["executor"], pids)
    (first, first_pids), (second, second_pids), (third, third_pids) = runs["first"], runs["second"], runs["third"]
    assert first["workers"]["code"] == second["workers"]["code"] and len(first["workers"]["code"]) == 12
    assert "adb:emu-1" in first["workers"]["created"] + first["workers"]["reused"]
    assert second["workers"]["reused"] == ["adb:emu-1"] and second["workers"]["created"] == []
    assert len(first_pids) == 1 and second_pids == first_pids  # one warm process, kept between commands
    assert second["workers"]["released"] is True
    assert third["workers"]["created"] == ["adb:emu-1"] and third_pids != second_pids
    # the farm gateway (runner/farm/gateway.py): the first command started it, the second used it
    # (no import ray, no connect in the command); --release-workers ended it, the third started another
    assert first["gateway"]["pid"] == second["gateway"]["pid"] != third["gateway"]["pid"]
    assert second["gateway"]["started_by_this_command"] is False and third["gateway"]["started_by_this_command"]
    assert {"import_ray_s", "connect_s"} <= set(second["gateway"]["startup"])
    assert {"gateway_s", "first_actor_lookup_s"} <= set(second["timing"])


def test_ray_actors_of_other_code_are_never_used(bundles, ray_cluster, tmp_path, monkeypatch):
    """An actor named for another code hash (a checkout before this one) holds the device: the
    next command kills it and starts its own, so no job runs on stale code."""
    code = (f"import ray; from bundlerun.runner.farm.ray_workers import DeviceWorker, NAMESPACE; "
            f"ray.init(address={ray_cluster.address!r}, namespace=NAMESPACE, log_to_driver=False); "
            f"a = ray.remote(DeviceWorker).options(name='000000000000:adb:emu-2', lifetime='detached', num_cpus=0, "
            f"resources={{'adb:emu-2': 1}}).remote('adb:emu-2'); print(ray.get(a.pid.remote()))")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, **ENV}, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    stale = int(res.stdout.split()[-1])
    r = _ray_farm(tmp_path, bundles, ray_cluster.address, "fresh", device="sim://emu-2?sleep=0.1")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    merged = json.loads((tmp_path / "fresh" / "report.json").read_text())
    assert "000000000000:adb:emu-2" in merged["farm"]["executor"]["workers"]["stale_killed"]
    assert stale not in {a["node"]["pid"] for j in merged["farm"]["jobs"] for a in j["attempts"]}


def test_a_killed_ray_device_worker_fails_its_attempt_which_is_retried(bundles, ray_cluster, tmp_path):
    """A real SIGKILL to the device's actor process in the middle of a job (the device holds its
    second job until then: sim `hold=1`): that attempt is a crash, retried; Ray restarts the actor
    for the retry and every job passes."""
    import signal
    import threading

    begin, state = tmp_path / "begin.log", tmp_path / "state"
    plan = _write(tmp_path / "killed.toml", f"""
bundles = ["{bundles}/*.bpte"]
targets = ["sim://emu-2?sleep=0.1&begin={begin}&hold=1&state={state}"]
""")
    proc = subprocess.Popen(
        [sys.executable, "-c", "from bundlerun.runner.cli import main; main()", "farm", str(plan), "--executor",
         f"ray:{ray_cluster.address}", "--report", str(tmp_path / "out"), "--no-history", "--json"],
        cwd=ROOT, env={**os.environ, **ENV}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()
    try:
        actor = _wait_for_begin(begin, 1, proc, said)
        os.kill(actor, signal.SIGKILL)  # a process of the cluster this module started
        out = proc.stdout.read()
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    assert proc.returncode == 0, out[-2000:] + "".join(said)[-3000:]
    jobs = json.loads(out)["jobs"]
    assert len(jobs) == 6 and all(j["verdict"] == "PASS" for j in jobs)
    crashed = [a for j in jobs for a in j["attempts"] if a["exit_code"] != 0]
    assert len(crashed) == 1 and crashed[0]["retried"] is True and "crash" in crashed[0]["error_kinds"]
    pids = {int(line.split()[1]) for line in begin.read_text().splitlines()}
    assert actor in pids and len(pids) == 2  # the killed actor, then the one Ray restarted


def test_results_queue_holds_no_report_objects(echo_reports, tmp_path):
    """The jobs waiting for the results thread (it fell 887 jobs behind 50 devices on a loaded
    machine) wait as pickles in a spool file, not as Report objects: a 2,000-job farm's coordinator
    grew from 114 to 180 MB of peak RSS with them held (bench/bench_farm_scale.py). Here the thread is
    held in its first job while 150 more come in: the live Reports stay within one batch; every job is
    then written and folded exactly once, in the order it came, and the spool is removed."""
    import gc
    import threading

    from bundlerun.runner.farm import results

    good, _ = echo_reports
    gate, folded = threading.Event(), []

    def fold(job: str, report: Report, record: dict) -> None:
        gate.wait(60)
        folded.append((job, report.extras["n"]))

    spool = tmp_path / ".results-queue.bin"
    writer = results.ResultWriter(None, "farm", fold=fold, spool=spool)
    try:
        for n in range(150):
            report = Report.from_json(good)
            report.extras["n"] = n
            writer.add(f"job{n}", report, tmp_path / "jobs" / f"job{n}", [], {"job": f"job{n}"}, [])
            del report
        gc.collect()
        live = sum(type(o) is Report for o in gc.get_objects())  # type(): isinstance wakes lazy modules (torch warns)
        assert live <= results.BATCH + 2, f"{live} Report objects held for 150 queued jobs"
        assert spool.stat().st_size > 150 * 1000  # the reports are on disk
    finally:
        gate.set()
        writer.close()
    assert folded == [(f"job{n}", n) for n in range(150)]
    assert all((tmp_path / "jobs" / f"job{n}" / "report.json").is_file() for n in range(150))
    assert not spool.exists()
