"""--shard i/n on run/validate and `bundlerun merge`: the shards of a real bundle, run on the
real host runtime, merge into the same cases, verdicts and exit code as one unsharded run;
missing, overlapping and foreign shards are refused with the cases named."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bundlerun.bundles.bpte import read_bundle, write_bundle
from bundlerun.runner.shard import (ShardError, Shard, assignment, case_key, in_shard, parse_shard, select,
                                    stable_hash)


# ---------------------------------------------------------------------------- assignment


def test_parse_shard():
    assert parse_shard("2/4") == Shard(2, 4) and str(parse_shard(" 1 / 1 ")) == "1/1"
    assert parse_shard(None) is None and parse_shard("") is None
    for bad in ("0/4", "5/4", "1/0", "2", "a/b", "-1/3", "1/2/3"):
        with pytest.raises(ShardError, match="--shard"):
            parse_shard(bad)


def test_stable_hash_is_sha256_not_python_hash():
    assert stable_hash("forward/3") == int.from_bytes(hashlib.sha256(b"forward/3").digest()[:8], "big")
    # the same split in a process with another hash seed (Python's hash() would differ)
    code = ("from bundlerun.runner.shard import select; "
            "print(select([f'forward/{i}' for i in range(40)], '2/3'), hash('forward/1'))")
    outs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout.split("] ") for seed in ("1", "2")]
    assert outs[0][0] == outs[1][0]
    assert outs[0][1] != outs[1][1]  # the control: hash() really did change between the two processes
    # and a golden value, so a change of the algorithm cannot pass unnoticed
    assert select([f"forward/{i}" for i in range(6)], "1/3") == ["forward/1", "forward/3"]


@pytest.mark.parametrize("n_keys,count", [(1, 1), (5, 3), (16, 4), (7, 7), (3, 5), (100, 6)])
def test_balanced_split_is_a_partition(n_keys, count):
    keys = [f"m{i % 3}/{i}" for i in range(n_keys)]
    parts = [select(keys, f"{i}/{count}") for i in range(1, count + 1)]
    flat = [k for p in parts for k in p]
    assert sorted(flat) == sorted(keys) and len(flat) == len(set(flat))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    for i, part in enumerate(parts, 1):
        assert part == [k for k in keys if k in part]  # input order kept
        assert all(in_shard(k, f"{i}/{count}", keys=keys) for k in part)
        assert all(assignment(keys, count)[k] == i for k in part)
    # the order keys are listed in does not change the split
    assert select(list(reversed(keys)), f"1/{count}") == list(reversed(parts[0]))


def test_unbalanced_in_shard_is_hash_mod_n():
    keys = [f"k{i}" for i in range(200)]
    for key in keys[:20]:
        hits = [i for i in range(1, 5) if in_shard(key, f"{i}/4")]
        assert hits == [stable_hash(key) % 4 + 1]
    with pytest.raises(ShardError):
        in_shard("absent", "1/2", keys=keys)


# ---------------------------------------------------------------------------- real runs

BUNDLERUN = [sys.executable, "-c", "from bundlerun.runner.cli import main; main()"]


def _cli(*args, env=None, cwd=None):
    return subprocess.run([*BUNDLERUN, *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})}, cwd=cwd)


def _load(path):
    return json.loads(Path(path, "report.json").read_text())


def _verdicts(report):
    return [(c["method"], c["case"], c["verdict"], [o["verdict"] for o in c["outputs"]]) for c in report["cases"]]


@pytest.fixture(scope="module")
def shards(bundle_cache, tmp_path_factory):
    """A 5-case mlp bundle whose case 2 fails (expected output moved), run whole and in 3 shards."""
    tmp = tmp_path_factory.mktemp("shards")
    bundle = read_bundle(bundle_cache("mlp", cases=5))
    values = bundle.suite("forward").test_cases[2].expected_outputs[0].to_array().copy()
    values[0, 4] += 0.5
    bundle.suite("forward").test_cases[2].expected_outputs[0].data = values.tobytes()
    path = write_bundle(bundle, tmp / "perturbed.bpte")
    runs = {"full": _cli("run", str(path), "--report", str(tmp / "full"), "--no-history", "--quiet")}
    for i in (1, 2, 3):
        runs[f"s{i}"] = _cli("run", str(path), "--shard", f"{i}/3", "--report", str(tmp / f"s{i}"), "--no-history",
                             "--quiet")
    return tmp, path, runs


def test_shards_run_their_cases_and_merge_to_the_unsharded_run(shards):
    tmp, _path, runs = shards
    assert runs["full"].returncode == 1, runs["full"].stderr[-2000:]
    full = _load(tmp / "full")
    held = []
    for i in (1, 2, 3):
        report = _load(tmp / f"s{i}")
        assert report["shard"]["spec"] == f"{i}/3" and report["shard"]["axis"] == "cases"
        keys = [case_key(c["method"], c["case"]) for c in report["cases"]]
        assert keys == report["shard"]["keys"] == select([f"forward/{k}" for k in range(5)], f"{i}/3")
        # a shard's exit code is its own cases' verdict: only the shard holding case 2 fails
        assert runs[f"s{i}"].returncode == (1 if "forward/2" in keys else 0), runs[f"s{i}"].stderr[-2000:]
        held += keys
    assert sorted(held) == [f"forward/{k}" for k in range(5)]
    r = _cli("merge", *(str(tmp / f"s{i}" / "report.json") for i in (3, 1, 2)), "--report", str(tmp / "merged"))
    assert r.returncode == 1, r.stdout + r.stderr
    merged = _load(tmp / "merged")
    assert _verdicts(merged) == _verdicts(full)
    assert merged["summary"] == full["summary"] and merged["summary"]["counts"]["FAIL"] == 1
    assert merged["merged"]["complete"] is True and len(merged["merged"]["from"]) == 3
    assert merged["bundle"]["sha256"] == full["bundle"]["sha256"]
    stats = lambda rep: [o["stats"]["error_max"] for c in rep["cases"] for o in c["outputs"]]  # noqa: E731
    assert stats(merged) == stats(full)
    for name in ("junit.xml", "summary.md", "report.html"):
        assert (tmp / "merged" / name).is_file(), name
    junit = (tmp / "merged" / "junit.xml").read_text()
    assert junit.count("<testcase") == 5 and junit.count("<failure") == 1


def test_missing_shard_is_refused_naming_its_cases(shards):
    tmp, _path, _runs = shards
    r = _cli("merge", str(tmp / "s1"), str(tmp / "s2"), "--report", str(tmp / "partial"))
    assert r.returncode == 2
    missing = select([f"forward/{k}" for k in range(5)], "3/3")
    assert "missing shards" in r.stderr and f"shard 3/3: {', '.join(missing)}" in r.stderr, r.stderr
    assert not (tmp / "partial" / "report.json").exists()
    r = _cli("merge", str(tmp / "s1"), str(tmp / "s2"), "--report", str(tmp / "partial"), "--allow-partial")
    report = _load(tmp / "partial")
    not_run = [case_key(c["method"], c["case"]) for c in report["cases"] if c.get("error_kind") == "not-run"]
    assert not_run == missing and report["merged"]["complete"] is False
    assert len(report["cases"]) == 5
    # case 2 (the numerical failure) is in shard 3 or not: FAIL wins over ERROR, else ERROR -> 2
    assert r.returncode == (2 if "forward/2" in missing else 1), r.stderr


def test_overlapping_shards_are_refused(shards):
    tmp, _path, _runs = shards
    r = _cli("merge", str(tmp / "s1"), str(tmp / "s2"), str(tmp / "s3"), str(tmp / "full"),
             "--report", str(tmp / "overlap"))
    assert r.returncode == 2 and "overlapping shards" in r.stderr and "forward/0" in r.stderr, r.stderr
    r = _cli("merge", str(tmp / "full"), str(tmp / "s1"), "--report", str(tmp / "overlap"), "--force")
    assert r.returncode == 1, r.stderr
    assert _verdicts(_load(tmp / "overlap")) == _verdicts(_load(tmp / "full"))


def test_shards_of_another_bundle_are_refused_unless_forced(shards, bundle_cache):
    from bundlerun.runner.report.merge import MergeError, MergeOptions, merge_reports
    from bundlerun.runner.report.model import Report

    def merged_json(docs, options=None):
        return merge_reports([Report.from_json(d) for d in docs], options).to_json()

    tmp, _path, _runs = shards
    other = bundle_cache("mlp", cases=2)
    r = _cli("run", str(other), "--report", str(tmp / "other"), "--no-history", "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    reports = [_load(tmp / "full"), _load(tmp / "other")]
    with pytest.raises(MergeError, match="2 different bundles/targets"):
        merged_json(reports)
    forced = merged_json(reports, MergeOptions(force=True))
    assert len(forced["cases"]) == 7 and forced["merged"]["mode"] == "jobs"
    # two builds of one model-dtype on one target: the one duplicate-suffix rule, #2 in input order
    jobs = [c["method"].rsplit("/", 1)[0] for c in forced["cases"]]
    assert jobs == ["mlp-fp32@host://xnnpack"] * 5 + ["mlp-fp32@host://xnnpack#2"] * 2, jobs
    assert [j["name"] for j in forced["jobs"]] == ["mlp-fp32@host://xnnpack", "mlp-fp32@host://xnnpack#2"]
    assert len({(c["method"], c["case"]) for c in forced["cases"]}) == 7
    assert {c["extra"]["method"] for c in forced["cases"]} == {"forward"}
    assert forced["summary"]["exit_code"] == 1
    # another target, same bundle: refused as well
    retarget = _load(tmp / "s1")
    retarget["target"]["url"] = "host://portable"
    with pytest.raises(MergeError, match="different bundles/targets"):
        merged_json([retarget, _load(tmp / "s2"), _load(tmp / "s3")])


def test_more_shards_than_cases_gives_empty_shards_that_merge(bundle_cache, tmp_path):
    path = bundle_cache("mlp", cases=2)
    codes = {}
    for i in (1, 2, 3):
        codes[i] = _cli("run", str(path), "--shard", f"{i}/3", "--report", str(tmp_path / f"e{i}"), "--no-history",
                        "--quiet").returncode
    empty = [i for i in (1, 2, 3) if not _load(tmp_path / f"e{i}")["cases"]]
    assert len(empty) == 1 and set(codes.values()) == {0}, codes
    report = _load(tmp_path / f"e{empty[0]}")
    assert report["summary"]["verdict"] == "SKIP" and "nothing ran" in report["warnings"][0]
    r = _cli("merge", *(str(tmp_path / f"e{i}") for i in (1, 2, 3)), "--report", str(tmp_path / "m"), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["summary"]["verdict"] == "PASS" and out["summary"]["cases"] == 2


def test_bad_shard_value_is_one_line_exit_2(bundle_cache, tmp_path):
    r = _cli("run", str(bundle_cache("mlp", cases=2)), "--shard", "4/3", "--report", str(tmp_path / "x"),
             "--no-history")
    assert r.returncode == 2 and "--shard '4/3'" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_validate_shards_models_x_dtypes_and_merge(tmp_path):
    outs = {}
    for i in (1, 2):
        r = _cli("validate", "mlp", "tiny-gru", "--dtype", "fp32,fp16", "--cases", "2", "--shard", f"{i}/2",
                 "--report", str(tmp_path / f"v{i}"), "--no-history", "--json")
        outs[i] = json.loads(r.stdout)
        assert r.returncode == outs[i]["exit_code"] == 0, r.stderr[-2000:]
    universe = ["mlp-fp32", "mlp-fp16", "tiny-gru-fp32", "tiny-gru-fp16"]
    ran = {i: [run["run"] for run in outs[i]["runs"]] for i in (1, 2)}
    assert ran[1] == select(universe, "1/2") and ran[2] == select(universe, "2/2")
    reports = sorted(str(p) for p in tmp_path.glob("v*/*/report.json"))
    assert len(reports) == 4
    r = _cli("merge", *reports, "--report", str(tmp_path / "m"))
    assert r.returncode == 2 and "different bundles" in r.stderr
    r = _cli("merge", *reports[:3], "--report", str(tmp_path / "m"), "--force")
    absent = Path(reports[3]).parent.name
    assert r.returncode == 2 and f"no report for {absent}" in r.stderr, r.stderr
    r = _cli("merge", *reports, "--report", str(tmp_path / "m"), "--force")
    assert r.returncode == 0, r.stderr
    merged = _load(tmp_path / "m")
    assert merged["summary"]["cases"] == 8 and merged["merged"]["models"] == universe
    assert {c["method"].split("@")[0] for c in merged["cases"]} == set(universe)
