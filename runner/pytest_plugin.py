"""pytest plugin: bundles and zoo models as test items, verdicts as pytest outcomes.

Installed as the `bundlerun` pytest11 entry point (or `pytest -p bundlerun.runner.pytest_plugin`).
It does nothing unless a `--bundlerun-*` option is given: without one no item is added and
nothing beyond this module (pytest + the standard library) is imported.

    pytest --bundlerun-target host://xnnpack --bundlerun-bundles 'bundles/*.bpte'
    pytest --bundlerun-target host://xnnpack --bundlerun-models mlp,tiny-cnn --bundlerun-dtype fp32,int8
    pytest --bundlerun-plan farm.toml                        # the farm's plan: bundles/models x targets/pools
    pytest -n 2 --bundlerun-target adb://A,adb://B ...       # a pool: gw0 leases adb://A, gw1 adb://B

Items: one per bundle (or model x dtype, built on first use through the build cache) x target,
named `bundlerun::<bundle>[<target>]`. The run is judged by bundlerun as on the command line:

  * PASS -> passed; numerical FAIL -> failed, the message naming the worst output with its
    numbers (failed criterion, measured vs limit, error statistics, worst element);
  * infrastructure ERROR/TIMEOUT (exit code 2) -> a pytest *error* (in setup), with the cause;
  * every case is also reported as a subtest (`forward[3]`), shown with -v or when it fails
    (`--bundlerun-no-subtests` turns that off);
  * the report folder (report.json, junit.xml, summary.md, report.html) is in the item's
    user_properties (`bundlerun_report`, `bundlerun_target`, `bundlerun_verdict`), which
    `--junitxml` writes as <property> elements of the testcase.

`--bundlerun-target` takes one target per use (repeat it for several targets); a comma list
`URL1,URL2,...` or `pool:NAME` (a pool of a --bundlerun-plan) is a pool of equivalent devices.
Under pytest-xdist worker gwN leases device N of each pool (mod its size; without xdist the
first), so two workers on a two-device pool never share a device.

Fixture `bundlerun_target`: the leased target of the first --bundlerun-target for this
worker: `.url`, `.worker`, `.pool`, and `.run(bundle, **options) -> report dict`.

ExecuTorch's backend test suite (`pytest --pyargs executorch.backends.test.suite.operators
--bundlerun-target URL`): its tests keep their lowering and run their compare step on the
target (runner/suite/plugin.py, docs/suite.md); fixture `bundlerun_tester(tester)` does the
same for any Tester-based test.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from bundlerun.runner.farm.plan import BuildSpec
from bundlerun.runner.judging.outcome import EXIT_FAIL, EXIT_INFRA, EXIT_PASS
from bundlerun.runner.suite.item_messages import error_kind_text, error_message, failure_message
from bundlerun.targets.base import Verdict

if TYPE_CHECKING:
    from bundlerun.runner.report.model import Report

PLUGIN_NAME = "bundlerun-runner"
OPTIONS = ("bundlerun_target", "bundlerun_plan", "bundlerun_bundles", "bundlerun_models")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("bundlerun", "bundlerun: ExecuTorch BundleIO bundles as test items")
    group.addoption("--bundlerun-target", action="append", default=[], metavar="URL[,URL...]",
                    help="Target URL to run bundles on (repeatable: one item per bundle x target). A comma list "
                         "or pool:NAME is a pool of devices; xdist worker gwN leases device N.")
    group.addoption("--bundlerun-plan", default=None, metavar="PLAN.toml",
                    help="A `bundlerun farm` plan: its bundles/models x targets/pools become items.")
    group.addoption("--bundlerun-bundles", action="append", default=[], metavar="GLOB",
                    help="Bundle files (.bpte) to collect (repeatable glob, relative to the invocation folder).")
    group.addoption("--bundlerun-models", default=None, metavar="M1,M2",
                    help="Zoo models (or path.py:factory) to build and run, e.g. mlp,tiny-cnn.")
    group.addoption("--bundlerun-dtype", default=None, metavar="D1,D2",
                    help="dtypes of --bundlerun-models, e.g. fp32,int8 (default: the target's).")
    group.addoption("--bundlerun-cases", type=int, default=4, help="Test cases per built bundle (default 4).")
    group.addoption("--bundlerun-report", default=None, metavar="DIR",
                    help="Where each item's report folder goes (default: pytest's temporary folder).")
    group.addoption("--bundlerun-timeout", type=float, default=120.0, help="Seconds per test case (default 120).")
    group.addoption("--bundlerun-no-subtests", action="store_true", default=False,
                    help="Do not report each case as a subtest.")
    group.addoption("--bundlerun-strict", action="store_true", default=False,
                    help="Backend test suite / Tester: a FAIL by the registry's numbers fails the test too "
                         "(default: the Tester's own compare decides; bundlerun's verdict is recorded).")
    group.addoption("--bundlerun-backend", default=None, metavar="NAME",
                    help="Backend test suite: the registry backend whose numbers judge every flow "
                         "(default: each flow's own backend).")


def _active(config: pytest.Config) -> bool:
    return any(config.getoption(name, default=None) for name in OPTIONS)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "bundlerun: a bundle x target item collected by the bundlerun plugin")
    if _active(config) and not config.pluginmanager.has_plugin(PLUGIN_NAME):
        config.pluginmanager.register(BundlerunPlugin(config), PLUGIN_NAME)
        if config.getoption("bundlerun_target"):  # ExecuTorch's backend test suite on the target (docs/suite.md)
            from bundlerun.runner.suite.plugin import SuitePlugin  # start-up: pytest loads this plugin in every session

            config.pluginmanager.register(SuitePlugin(config.pluginmanager.get_plugin(PLUGIN_NAME)), SuitePlugin.name)


def worker_index(config: pytest.Config) -> tuple[str, int]:
    """('gw1', 1) on an xdist worker; ('master', 0) otherwise."""
    workerinput = getattr(config, "workerinput", None)
    wid = (workerinput or {}).get("workerid") or os.environ.get("PYTEST_XDIST_WORKER") or "master"
    m = re.search(r"(\d+)$", wid)
    return wid, int(m.group(1)) if m else 0


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.@-]+", "_", text).strip("_")[:120] or "x"


# ---------------------------------------------------------------------------- what to run


@dataclass
class Pool:
    """One --bundlerun-target (or a plan's target group): its name and its devices."""

    name: str
    urls: list[str]
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Spec:
    """One item: a bundle file or a build, on a pool."""

    name: str
    pool: Pool
    bundle: Path | None = None
    build: "BuildSpec | None" = None  # target "": build for the leased device's URL


# ---------------------------------------------------------------------------- the leased target


@dataclass
class LeasedTarget:
    """A device of a pool leased to this pytest worker; `run` runs a bundle on it and returns its report."""

    url: str
    worker: str
    pool: list[str]
    options: dict[str, Any]
    plugin: "BundlerunPlugin" = field(repr=False)

    def run(self, bundle: str | Path, report_dir: str | Path | None = None, *, timeout: float | None = None,
            overrides: list[str] | None = None, cases: list[int] | None = None) -> dict[str, Any]:
        """Run and judge `bundle` here; the report (also written to report_dir) as the dict of its
        report.json: the fixture's documented contract (docs/ci.md), kept as it was. The typed
        Report of the same run is `bundlerun.api.run`'s."""
        bundle = Path(bundle)
        report_dir = Path(report_dir) if report_dir else self.plugin.report_root / f"{_safe(bundle.stem)}@{_safe(self.url)}"
        return self.plugin.run_bundle(bundle, self.url, report_dir, options=self.options, timeout=timeout,
                                      overrides=overrides or [], cases=cases).to_json()


class BundlerunPlugin:
    """Registered only when a --bundlerun-* option is given."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.worker, self.index = worker_index(config)
        self._session = None
        self._plan = None
        self._report_root: Path | None = None

    # ------------------------------------------------------------------ configuration

    @property
    def report_root(self) -> Path:
        if self._report_root is None:
            given = self.config.getoption("bundlerun_report")
            if given:
                root = Path(given).resolve() / self.worker
            else:
                factory = getattr(self.config, "_tmp_path_factory", None)
                if factory is not None:
                    root = factory.getbasetemp() / "bundlerun"
                else:
                    import tempfile

                    root = Path(tempfile.mkdtemp(prefix="bundlerun-pytest-"))
            root.mkdir(parents=True, exist_ok=True)
            self._report_root = root
        return self._report_root

    def plan(self):
        if self._plan is None and self.config.getoption("bundlerun_plan"):
            from bundlerun.runner.farm.plan import load_plan  # start-up: pytest loads this plugin in every session

            self._plan = load_plan(self.config.getoption("bundlerun_plan"))
        return self._plan

    def pools(self) -> list[Pool]:
        pools: list[Pool] = []
        for value in self.config.getoption("bundlerun_target") or []:
            value = value.strip()
            if value.startswith(("pool:", "tag:")):
                plan = self.plan()
                groups = [g for g in (plan.groups if plan else [])
                          if g.name == value or (value.startswith("pool:") and g.pool == value[5:])]
                if not groups:
                    raise pytest.UsageError(f"--bundlerun-target {value}: no such pool (pools come from --bundlerun-plan)")
                pools += [Pool(value, [d.url for d in g.devices], dict(g.options)) for g in groups[:1]]
            else:
                urls = [u.strip() for u in value.split(",") if u.strip()]
                if not urls:
                    raise pytest.UsageError("--bundlerun-target: give a target URL, e.g. host://xnnpack")
                pools.append(Pool(value, urls))
        return pools

    def lease(self, pool: Pool) -> LeasedTarget:
        """Worker gwN gets device N (mod the pool's size) of the pool."""
        url = pool.urls[self.index % len(pool.urls)]
        return LeasedTarget(url, self.worker, list(pool.urls), dict(pool.options), self)

    def specs(self) -> list[Spec]:
        config = self.config
        pools = self.pools()
        specs: list[Spec] = []
        plan = self.plan()
        if plan is not None:
            for job in plan.jobs(self.report_root / "builds"):
                pool = Pool(job.group.name, [d.url for d in job.group.devices], dict(job.group.options))
                build = job.build  # with the plan's backend and build_target, as the farm builds it
                specs.append(Spec(job.id, pool, bundle=None if build else Path(job.bundle), build=build))
            if not pools:
                return specs
        if (config.getoption("bundlerun_bundles") or config.getoption("bundlerun_models")) and not pools:
            pools = [Pool("host://xnnpack", ["host://xnnpack"])]
        files: list[Path] = []
        for pattern in config.getoption("bundlerun_bundles") or []:
            matched = sorted(glob.glob(os.path.expanduser(pattern), recursive=True))
            if not matched:
                raise pytest.UsageError(f"--bundlerun-bundles {pattern!r} matches no file")
            files += [Path(m) for m in matched if Path(m).resolve() not in {f.resolve() for f in files}]
        models = [m.strip() for m in (config.getoption("bundlerun_models") or "").split(",") if m.strip()]
        dtypes = [d.strip() for d in (config.getoption("bundlerun_dtype") or "").split(",") if d.strip()] or [None]
        stems: dict[Path, str] = {}
        for path in files:  # item names without dots (pytest shows a dot in a name as ::)
            stem, n = _safe(path.stem).replace(".", "_"), 1
            while (stem if n == 1 else f"{stem}#{n}") in stems.values():
                n += 1
            stems[path] = stem if n == 1 else f"{stem}#{n}"
        for pool in pools:
            for path in files:
                specs.append(Spec(f"{stems[path]}[{pool.name}]", pool, bundle=path))
            for model in models:
                for dtype in dtypes:
                    build = BuildSpec(model, dtype, None, "", config.getoption("bundlerun_cases"), 0)
                    specs.append(Spec(f"{build.slug()}[{pool.name}]", pool, build=build))
        return specs

    # ------------------------------------------------------------------ running

    def session(self):
        if self._session is None:
            from bundlerun.runner.session import Session  # start-up: pytest loads this plugin in every session

            self._session = Session.load(None, no_history=True).open()
        return self._session

    def build(self, build: "BuildSpec", url: str) -> Path:
        """Build for the spec's build target (a plan's `build_target`), else for the device's URL."""
        from bundlerun.bundles.builder import BuildRequest, build_bundle  # start-up: pytest loads this plugin in every session
        from bundlerun.runner.cli import resolve_backend_dtype  # start-up: pytest loads this plugin in every session
        from bundlerun.targets import lowering_info  # start-up: pytest loads this plugin in every session

        target = build.target or url
        backend, dtype = resolve_backend_dtype(target, build.backend, build.dtype)
        out = self.report_root / "builds" / f"{build.slug()}-{_safe(target)}.bpte"
        result = build_bundle(BuildRequest(model=build.model, output=out, backend=backend, target=target,
                                           target_info=lowering_info(target), dtype=dtype,
                                           cases=build.cases, seed=build.seed, registry=self.session().registry,
                                           cache=True))
        return result.path

    def run_bundle(self, bundle: Path, url: str, report_dir: Path, options: dict[str, Any] | None = None,
                   timeout: float | None = None, overrides: list[str] | None = None,
                   cases: list[int] | None = None) -> dict[str, Any]:
        from bundlerun.runner.session import RunRequest  # start-up: pytest loads this plugin in every session

        session = self.session()
        config = {**session.target_config(url), **(options or {})}
        return session.run(RunRequest(bundle_path=Path(bundle), target=url, report_dir=Path(report_dir),
                                      case_timeout_s=timeout or self.config.getoption("bundlerun_timeout"),
                                      overrides=list(overrides or []), cases=cases, target_config=config,
                                      label=os.environ.get("BUNDLERUN_LABEL")))

    # ------------------------------------------------------------------ hooks

    @pytest.hookimpl(tryfirst=True)  # before -k / -m deselection, so they apply to these items too
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        collector = BundlerunCollector.from_parent(session, name="bundlerun", nodeid="bundlerun")
        items.extend(collector.collect())

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        return [f"bundlerun: worker {self.worker}, targets: "
                + ", ".join(f"{p.name} -> {self.lease(p).url}" for p in self.pools()) if self.pools() else
                f"bundlerun: worker {self.worker}"]

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.close()  # every warm runtime worker reaped


class BundlerunCollector(pytest.Collector):
    def collect(self):
        plugin: BundlerunPlugin = self.config.pluginmanager.get_plugin(PLUGIN_NAME)
        return [BundleItem.from_parent(self, name=spec.name, spec=spec) for spec in plugin.specs()]


class BundleItem(pytest.Item):
    def __init__(self, *, spec: Spec, **kw: Any) -> None:
        super().__init__(**kw)
        self.spec = spec
        self.report: Report | None = None
        self.fixturenames: list[str] = []  # no fixtures; other plugins (labgrid's) look at this
        self.add_marker("bundlerun")

    def reportinfo(self):
        return self.path, None, f"bundlerun::{self.name}"

    def setup(self) -> None:
        plugin: BundlerunPlugin = self.config.pluginmanager.get_plugin(PLUGIN_NAME)
        leased = plugin.lease(self.spec.pool)
        report_dir = plugin.report_root / _safe(self.name)
        self.user_properties += [("bundlerun_target", leased.url), ("bundlerun_worker", leased.worker),
                                 ("bundlerun_report", str(report_dir))]
        from bundlerun.bundles.errors import BundlerunError  # start-up: pytest loads this plugin in every session

        try:
            bundle = self.spec.bundle or plugin.build(self.spec.build, leased.url)
            self.report = plugin.run_bundle(Path(bundle), leased.url, report_dir, options=leased.options)
        except BundlerunError as exc:  # bad bundle, failed build, bad target URL: could not run
            self.user_properties.append(("bundlerun_verdict", Verdict.ERROR.value))  # plain str: xdist (execnet) sends it
            pytest.fail(f"bundlerun ERROR: {exc}", pytrace=False)
        summary = self.report.summary
        self.user_properties.append(("bundlerun_verdict", Verdict(summary.verdict).value))
        if summary.exit_code == EXIT_INFRA:
            pytest.fail(error_message(self.report, report_dir), pytrace=False)

    def runtest(self) -> None:
        report = self.report
        assert report is not None, "setup() ran the bundle"
        self._subtests()
        if report.summary.exit_code == EXIT_FAIL:
            report_dir = Path(dict(self.user_properties)["bundlerun_report"])
            pytest.fail(failure_message(report, report_dir), pytrace=False)
        if report.summary.exit_code not in (EXIT_PASS, EXIT_FAIL):
            pytest.fail(f"bundlerun exit code {report.summary.exit_code}", pytrace=False)

    def _subtests(self) -> None:
        """Each case as a subtest report (pytest >= 9's subtests), once per item."""
        if getattr(self, "_subtests_done", False) or self.config.getoption("bundlerun_no_subtests"):
            return
        self._subtests_done = True
        try:
            from _pytest.reports import TestReport
            from _pytest.subtests import SubtestContext, SubtestReport
        except ImportError:  # an older pytest: the item's own verdict still says everything
            return
        from bundlerun.runner.writers.junit import failure_text  # lazy: numpy, on a failure only

        for case in self.report.cases if self.report else []:
            verdict = case.verdict
            outcome, longrepr = "passed", None
            if verdict == Verdict.FAIL:
                outcome = "failed"
                longrepr = "\n".join(f"{o.name}: {failure_text(o)[1]}" for o in case.outputs if o.verdict == Verdict.FAIL)
            elif verdict in (Verdict.ERROR, Verdict.TIMEOUT):
                outcome = "failed"
                longrepr = f"{verdict} ({error_kind_text(case)}): {case.error}"
            elif verdict == Verdict.SKIP:
                outcome, longrepr = "skipped", (str(self.path), 0, f"Skipped: {case.error or 'skipped'}")
            elapsed = float(case.elapsed_s or 0.0)
            base = TestReport(self.nodeid, self.location, {}, outcome, longrepr, "call", duration=elapsed,
                              user_properties=[("bundlerun_case", f"{case.method}[{case.case}]")])
            report = SubtestReport._new(base, SubtestContext(msg=f"{case.method}[{case.case}]",
                                                             kwargs={"verdict": Verdict(verdict).value}), None, None)
            self.ihook.pytest_runtest_logreport(report=report)


@pytest.fixture
def bundlerun_tester(request: pytest.FixtureRequest):
    """`bundlerun_tester(tester)`: the Tester's compare step runs on the leased target of the first
    --bundlerun-target (runner/suite/tester.py; the session's warm runtime). Skips without one."""
    plugin = request.config.pluginmanager.get_plugin(PLUGIN_NAME)
    pools = plugin.pools() if plugin is not None else []
    if not pools:
        pytest.skip("the bundlerun_tester fixture needs --bundlerun-target URL")
    from bundlerun.runner.suite.tester import TargetRunner, attach_target, detach  # start-up: pytest loads this plugin in every session

    leased = plugin.lease(pools[0])
    runner = TargetRunner(leased.url, plugin.report_root, timeout_s=request.config.getoption("bundlerun_timeout"),
                          session_provider=plugin.session, target_config=leased.options,
                          strict=request.config.getoption("bundlerun_strict"),
                          backend=request.config.getoption("bundlerun_backend"))
    attached: list = []

    def attach(tester, name: str | None = None):
        attached.append(tester)
        return attach_target(tester, runner, name or _safe(request.node.name) + (f"-{len(attached)}" if attached[1:] else ""))

    yield attach
    for tester in attached:
        detach(tester)


@pytest.fixture(scope="session")
def bundlerun_target(request: pytest.FixtureRequest) -> LeasedTarget:
    """The target this worker leases from the first --bundlerun-target (gwN: device N of the pool)."""
    plugin = request.config.pluginmanager.get_plugin(PLUGIN_NAME)
    pools = plugin.pools() if plugin is not None else []
    if not pools:
        pytest.skip("the bundlerun_target fixture needs --bundlerun-target URL")
    return plugin.lease(pools[0])
