"""pytest side of the suite on a target: registered by runner/pytest_plugin.py with --bundlerun-target.

    pytest --pyargs executorch.backends.test.suite.operators -m flow_xnnpack \\
        --bundlerun-target qemu-user://aarch64 --bundlerun-report out/ --json-report

Every suite item (a test whose `test_runner` parameter is a TestFlow) keeps the suite's own
lowering: at collection each flow's `tester_factory` is wrapped so the Tester it makes runs
its compare step on the leased target (runner/suite/device.py). Per subtest bundlerun writes

- `<report>/<worker>/<test>/sub<k>/`: the bundle and bundlerun's report of the device run;
- `<report>/<worker>/suite.csv`: the suite's CSV columns (reporting.py, every output) plus
  bundlerun's verdict, the registry's numbers, the failure kind and the report path;
- the same bundlerun columns in the suite's JSON metadata (`--json-report`: each
  `metadata.subtests[k]`), and on the item (`bundlerun_verdict`, ... user properties).

A test whose lowering fails never reaches the compare step: the suite records it as it
always does (Lowering Failed) and bundlerun's columns stay empty.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bundlerun.runner.suite import compat
from bundlerun.targets.base import Verdict
from bundlerun.bundles.fileio import atomic_write_text
from bundlerun.runner.suite.device import CompareSpec, DeviceRecord, TargetRunner, attach, safe

VERDICT_ORDER = {Verdict.PASS: 0, Verdict.SKIP: 1, Verdict.TIMEOUT: 2, Verdict.ERROR: 3, Verdict.FAIL: 4}


class SuitePlugin:
    """Wraps the suite's flows and collects bundlerun's record of every subtest."""

    name = "bundlerun-suite"

    def __init__(self, host: Any) -> None:
        self.host = host  # runner/pytest_plugin.BundlerunPlugin: leases, the Session, the report root
        self.wrapped: set[int] = set()
        self.current: Any = None
        self.records: dict[str, dict[int, Any]] = {}  # nodeid -> subtest -> DeviceRecord
        self.rows: list[dict[str, Any]] = []
        self._runner = None

    # ------------------------------------------------------------------ the target

    def runner(self):
        if self._runner is None:
            pools = self.host.pools()
            leased = self.host.lease(pools[0])
            cfg = self.host.config
            self._runner = TargetRunner(leased.url, self.host.report_root, timeout_s=cfg.getoption("bundlerun_timeout"),
                                        session_provider=self.host.session, target_config=leased.options,
                                        strict=cfg.getoption("bundlerun_strict"),
                                        backend=cfg.getoption("bundlerun_backend"))
        return self._runner

    # ------------------------------------------------------------------ hooks

    @pytest.hookimpl(trylast=True)  # after the suite's own hook marked its skips and xfails
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        for item in items:
            flow = compat.flow_of(item)
            if flow is not None and id(flow) not in self.wrapped:
                self.wrapped.add(id(flow))
                flow.tester_factory = _DeviceFactory(flow.tester_factory, self, flow)

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        return ["bundlerun: the backend test suite's compare steps run on "
                + ", ".join(self.host.lease(p).url for p in self.host.pools())]

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item):
        self.current = item
        try:
            yield
        finally:
            self.current = None
            if compat.flow_of(item) is not None:
                self._finish(item)

    @pytest.hookimpl(hookwrapper=True, optionalhook=True)
    def pytest_json_runtest_metadata(self, item: pytest.Item, call: Any):
        """Add bundlerun's columns to each of the suite's subtest entries (pytest-json-report)."""
        outcome = yield
        records = self.records.get(item.nodeid)
        if not records:
            return
        for metadata in outcome.get_result() or []:
            for sub in (metadata or {}).get("subtests") or []:
                record = records.get(sub.get("Subtest"))
                if record is not None:
                    sub.update(record.columns())

    # ------------------------------------------------------------------ per item

    def record(self, item: Any, subtest: int, record: Any) -> None:
        self.records.setdefault(item.nodeid, {})[subtest] = record

    def report_dir(self, item: Any, subtest: int) -> Path:
        return self.host.report_root / safe(item.name) / f"sub{subtest}"

    def _finish(self, item: pytest.Item) -> None:
        records = self.records.get(item.nodeid, {})
        for rec in records.values():
            if rec.report_dir is not None:
                item.user_properties.append(("bundlerun_report", str(rec.report_dir)))
        if records:
            worst = max(records.values(), key=lambda r: VERDICT_ORDER.get(r.verdict, 0))
            item.user_properties += [("bundlerun_target", worst.target), ("bundlerun_verdict", Verdict(worst.verdict).value)]  # plain str: xdist (execnet) sends it
            if worst.failure_kind:
                item.user_properties.append(("bundlerun_failure_kind", getattr(worst.failure_kind, "value", worst.failure_kind)))
        for k, summary in enumerate(compat.results(item)):
            try:
                row = compat.csv_row(summary)
            except Exception as exc:  # noqa: BLE001 - the suite's own writer failed on this record
                row = {"Test ID": getattr(summary, "name", item.name), "Error": f"row not written: {exc}"}
            row["Test Node"] = item.nodeid
            index = getattr(summary, "subtest_index", k)
            record = records.get(index)
            if record is not None:
                row.update(record.columns())
            self.rows.append(row)
        self._write_csv()

    def _write_csv(self) -> None:
        """Rewritten after every test (atomically): an interrupted session keeps its rows."""
        import csv
        import io

        fields = compat.csv_fields()
        extra_outputs = sorted({k for r in self.rows for k in r if k.startswith("Output ") and k not in fields},
                               key=lambda k: (int(k.split()[1]), ("Error Max", "Error MAE", "SNR").index(k.split(" ", 2)[2])))
        error_at = fields.index("Error") if "Error" in fields else len(fields)
        bundlerun = list(DeviceRecord("", "", None, "", "", "", 0).columns())
        header = fields[:error_at] + extra_outputs + fields[error_at:] + bundlerun + ["Test Node"]
        buf = io.StringIO()
        writer = csv.DictWriter(buf, header, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(self.rows)
        atomic_write_text(self.host.report_root / "suite.csv", buf.getvalue())

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.close()  # the host plugin's session is closed by the host plugin


class _DeviceFactory:
    """A flow's tester_factory whose Testers compare on the bundlerun target."""

    def __init__(self, original: Any, plugin: SuitePlugin, flow: Any) -> None:
        self.original, self.plugin, self.flow = original, plugin, flow

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tester = self.original(*args, **kwargs)
        item = self.plugin.current
        if item is None:  # a Tester made outside a test's call phase: leave it alone
            return tester
        subtest = compat.current_subtest(item)
        name = item.name if subtest == 0 else f"{item.name}#{subtest}"
        spec = CompareSpec(
            name=name, report_dir=self.plugin.report_dir(item, subtest), flow=self.flow.name,
            suite_backend=self.flow.backend, quantized=bool(self.flow.quantize),
            extra={"suite": {"test": item.name, "node": item.nodeid, "subtest": subtest, "flow": self.flow.name,
                             "backend": self.flow.backend}},
            on_record=lambda record: self.plugin.record(item, subtest, record))
        return attach(tester, self.plugin.runner(), spec)

    def __getattr__(self, name: str) -> Any:  # anything else the suite asks of the factory
        return getattr(self.original, name)
