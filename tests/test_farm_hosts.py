"""Many hosts, one history (issue 38's done-means): two lab hosts, each its own `bundlerun farm`
process driving its own devices, record into one PostgreSQL history at the same time; one
`bundlerun hud --history postgresql://...` shows both hosts' runs in one grid.

Real: PostgreSQL (Debian's package, a private server: tests/pg_server.py), the bundle (a real
mlp), the farm, the HUD. Test double: the devices (tests/fixtures/sim_device.py, a phone that
sleeps then answers with the expected outputs), as no phone is attached here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pg_server import pg  # noqa: E402,F401 - the fixture

from bundlerun.runner.history import store as history  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "bundlerun.runner.cli"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "BUNDLERUN_TARGETS": "tests.fixtures.sim_device"}


def test_two_lab_hosts_farm_into_one_postgres_history_and_one_hud_grid(pg, bundle_cache, tmp_path):
    url = pg.create_database("two_hosts")
    src = bundle_cache("mlp", backend="portable", cases=2)
    hosts = {}
    for host in ("lab-a", "lab-b"):
        folder = tmp_path / host
        (folder / "bundles").mkdir(parents=True)
        for name in ("m1", "m2", "m3"):
            shutil.copy(src, folder / "bundles" / f"{name}.bpte")
        devices = ", ".join(f'"sim://{host}-phone{i}?sleep=0.2"' for i in (1, 2))
        (folder / "plan.toml").write_text(f'bundles = ["{folder}/bundles/*.bpte"]\ntargets = ["pool:phones"]\n'
                                          f'label = "{host}"\n[pools.phones]\ndevices = [{devices}]\n')
        hosts[host] = folder
    # both hosts at once, each its own process and devices, one history server
    procs = {h: subprocess.Popen([*CLI, "farm", str(f / "plan.toml"), "--report", str(f / "out"), "--history", url,
                                  "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                                 cwd=f)
             for h, f in hosts.items()}
    outs = {}
    for h, p in procs.items():
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, f"{h}: {out[-2000:]}\n{err[-3000:]}"
        assert pg.password not in out + err
        outs[h] = json.loads(out)
    for h, result in outs.items():
        assert len(result["jobs"]) == 3 and all(j["verdict"] == "PASS" for j in result["jobs"])
        assert all(j["history_id"] for j in result["jobs"])  # each job recorded as it finished
    runs = history.list_runs(url, limit=None)
    assert sorted(r.label for r in runs) == ["lab-a"] * 3 + ["lab-b"] * 3  # every job once, both hosts
    ids = {j["history_id"] for r in outs.values() for j in r["jobs"]}
    assert ids == {r.id for r in runs}
    assert len(history.flaky_stats(url)["devices"]) == 0  # no device failed an attempt

    site = tmp_path / "site"
    hud = subprocess.run([*CLI, "hud", "--history", url, "--out", str(site)], capture_output=True, text=True,
                         env=ENV, cwd=tmp_path, timeout=900)
    assert hud.returncode == 0, hud.stdout[-2000:] + hud.stderr[-3000:]
    index = (site / "index.html").read_text()
    # one grid: a row per device of both hosts, a column per host's label, each cell linking to the
    # latest run of its device (a device that ran two of its host's three jobs shows the later one)
    for host in hosts:
        assert f"{host}-phone1" in index and f"{host}-phone2" in index and f">{host}<" in index
    shown = {int(x) for x in re.findall(r"runs/(\d+)\.html", index)}
    label = {r.id: r.label for r in runs}
    assert len(shown) == 4 and shown <= ids and {label[i] for i in shown} == set(hosts)
    assert all((site / "runs" / f"{i}.html").is_file() for i in shown)
    for text in (hud.stdout, hud.stderr, *(p.read_text() for p in site.rglob("*.html"))):
        assert pg.password not in text
