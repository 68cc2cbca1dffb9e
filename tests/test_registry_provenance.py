"""Every number of the registry data is where it says it is in ExecuTorch's source.

The pinned tree comes from `executorch.tar.xz` (found the way bundlerun finds it:
$BUNDLERUN_THIRD_PARTY or ../shared/third_party), extracted by this test into its own temp
folder, so a fresh machine checks the same thing as a developer's. A missing tarball FAILS
with the reason: without the source nothing here can be checked.
"""

from __future__ import annotations

import copy

import pytest

from bundlerun.bundles import et_source
from bundlerun.bundles.registry import BUILTIN_DIR, Layer, Registry
from bundlerun.bundles.registry_schema import parse_citation
from bundlerun.bundles.tolerance_audit import (CitedValue, Citation, check_citations, check_value, cited_values, held,
                                               numbers_in, scan)
from tests.et_src_fixture import executorch_src  # noqa: F401  (fixture)


@pytest.fixture(scope="session")
def registry() -> Registry:
    return Registry.builtin(BUILTIN_DIR)


def test_every_cited_range_holds_its_value(executorch_src, registry):
    checked, problems = check_citations(registry, executorch_src)
    assert not problems, "\n".join(problems[:30])
    assert checked > 2000  # the data cites this many (value, line range) pairs
    assert registry.commit == et_source.PINNED_COMMIT


def test_a_wrong_citation_or_a_changed_value_fails(executorch_src, registry):
    cache: dict = {}
    good = CitedValue("t", "atol", 0.04, "backends/xnnpack/test/ops/test_conv1d.py:146")
    assert check_value(executorch_src, good, cache) is None
    for bad in (CitedValue("t", "atol", 0.05, good.citation),  # the number drifted
                CitedValue("t", "atol", 0.04, "backends/xnnpack/test/ops/test_conv1d.py:150"),  # the line moved
                CitedValue("t", "atol", 0.04, "backends/xnnpack/test/ops/test_nope.py:1"),
                CitedValue("t", "atol", 0.04, "backends/xnnpack/test/ops/test_conv1d.py:99999"),
                CitedValue("t", "rel_frobenius_max", None, "backends/arm/test/tester/test_pipeline.py:471"),  # no None
                CitedValue("t", "nan", "fail", "backends/test/harness/tester.py:454-460"),  # equal_nan=True there
                CitedValue("t", "top1", True, "backends/cortex_m/test/models/test_mobilenet_v2.py:79")):
        assert check_value(executorch_src, bad, cache), bad
    # and the same through the data: a registry whose conv1d atol changed no longer checks out
    layers = [Layer(l.file, copy.deepcopy(l.data), l.label) for l in registry.layers]
    xnn = next(l for l in layers if l.file.endswith("tolerances.xnnpack.toml"))
    next(r for r in xnn.data["op_rules"] if r["name"] == "xnnpack-int8-conv1d")["atol"] = 0.05
    _, problems = check_citations(Registry(layers), executorch_src)
    assert len(problems) == 2 and all("xnnpack-int8-conv1d.atol = 0.05" in p for p in problems)


def test_library_defaults_and_booleans_are_checked_for_what_they_are(executorch_src):
    ok = CitedValue("t", "rtol", 1e-5, "backends/nxp/tests/model_output_comparator.py:122 (numpy.allclose default)")
    assert check_value(executorch_src, ok) is None
    assert check_value(executorch_src, CitedValue("t", "rtol", 1e-3, ok.citation))
    flag = CitedValue("t", "qtol", 1, "backends/xnnpack/test/ops/test_linear.py:335 (bool)")
    assert check_value(executorch_src, flag) is None
    assert check_value(executorch_src, CitedValue("t", "qtol", 2, flag.citation))


def test_numbers_in_reads_literals_strings_and_simple_arithmetic():
    assert 1e-3 in numbers_in(["atol=1e-03,  # 5e-2 in a comment does not count"])
    assert 5e-2 not in numbers_in(["atol=1e-03,  # 5e-2 in a comment does not count"])
    assert 1e-4 in numbers_in(['test_suite.atol = "1e-4"'])
    assert any(abs(v - 1.001) < 1e-12 for v in numbers_in(["atol=1.0 + 1e-03"]))
    assert 2 ** -16 in numbers_in(["epsilon: float = 2**-16,"])


def test_audit_scanner_finds_the_lines_that_set_tolerances(executorch_src, registry):
    result = scan(executorch_src)
    where = {(s.path, s.line, s.kind): s for s in result.sites}
    # keyword defaults, keywords, attribute assignments, presets, metric comparisons, tables
    assert where[("backends/test/harness/tester.py", 321, "atol")].values == (1e-3,)
    assert where[("backends/test/suite/runner.py", 220, "rtol")].values == (4e-2,)
    assert where[("backends/xnnpack/test/ops/test_conv1d.py", 146, "atol")].values == (0.04, 1e-3)
    assert where[("backends/qualcomm/tests/test_qnn_delegate.py", 3031, "rtol")].values == (1.0,)
    assert where[("backends/mlx/test/test_utils.py", 57, "atol")].values == (1e-3,)
    assert where[("backends/arm/test/models/test_mobilenet_v2_arm.py", 98, "frobenius")].values == (None,)
    assert where[("backends/xnnpack/test/recipes/test_xnnpack_recipes.py", 276, "sqnr")].values == (10.0,)
    assert where[("backends/nxp/tests/generic_tests/test_cifarnet.py", 57, "mse")].values == (1.53e-5,)
    assert not any(s.path.startswith("backends/transforms/") for s in result.sites)  # not a backend
    backends = {s.backend for s in result.sites}
    assert {"xnnpack", "arm", "cortex-m", "qnn", "vulkan", "mlx", "metal", "coreml", "mps", "nxp", "samsung",
            "openvino", "cadence", "webgpu", "harness", "suite"} <= backends
    # every backend whose tests set tolerances is in the registry (the harness and suite are global)
    assert backends - {"harness", "suite", "coreai"} <= set(registry.backends())
    cites = [Citation(*parse_citation(c)[:3]) for c, _ in registry.citations()]
    marks = held(result.sites, cites)
    coverage = sum(marks) / len(marks)
    assert len(result.sites) > 1500 and coverage > 0.75, coverage
    for backend in ("cortex-m", "samsung", "openvino", "cadence", "suite"):
        sub = [m for s, m in zip(result.sites, marks) if s.backend == backend]
        assert all(sub), backend


def test_cited_values_include_merged_tighter_values(registry):
    merged = [v for v in cited_values(registry) if v.where.endswith("(merged)")]
    assert any(v.citation == "backends/arm/test/ops/test_add.py:137" and v.key == "qtol" and v.value == 0 for v in merged)
