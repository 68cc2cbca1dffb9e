"""The few places bundlerun reads the backend test suite beyond its documented pieces.

Kept in one module so an upstream change shows up in one place, and pinned by
tests/test_suite_plugin.py against the installed wheel:

- the `test_runner` fixture parameter of a suite item is its TestFlow (suite/conftest.py
  `test_runner` fixture; the suite's own collection hook reads `item.callspec.params` too);
- the conftest's TestRunner keeps each subtest's TestCaseSummary in `_results` and counts
  subtests in `_subtest` (the suite's `pytest_json_runtest_metadata` reads `_results`);
- reporting.py's CSV columns (`CSV_FIELD_NAMES`, `write_csv_row`, `MAX_LOGGED_MODEL_OUTPUTS`).

Nothing here imports the suite: it is used only once the suite's conftest has loaded it.
"""

from __future__ import annotations

import csv
import io
import sys
from typing import Any

FLOW_MODULE = "executorch.backends.test.suite.flow"
REPORTING_MODULE = "executorch.backends.test.suite.reporting"


def flow_of(item: Any) -> Any | None:
    """The suite TestFlow an item runs, or None for any other test."""
    module = sys.modules.get(FLOW_MODULE)
    callspec = getattr(item, "callspec", None)
    if module is None or callspec is None:
        return None
    flow = callspec.params.get("test_runner")
    return flow if isinstance(flow, module.TestFlow) else None


def suite_runner(item: Any) -> Any | None:
    return (getattr(item, "funcargs", None) or {}).get("test_runner")


def current_subtest(item: Any) -> int:
    """Index of the subtest the item's TestRunner is running now (0 before the first)."""
    runner = suite_runner(item)
    return int(getattr(runner, "_subtest", 0) or 0)


def results(item: Any) -> list[Any]:
    """The item's TestCaseSummary records, one per `lower_and_run_model` call."""
    runner = suite_runner(item)
    return list(getattr(runner, "_results", None) or [])


def csv_row(summary: Any) -> dict[str, str]:
    """The suite's own CSV row for one TestCaseSummary (reporting.write_csv_row), every output's
    statistics included: the suite writes only the first MAX_LOGGED_MODEL_OUTPUTS, bundlerun
    adds the rest with the same formatting."""
    reporting = sys.modules[REPORTING_MODULE]
    buf = io.StringIO()
    reporting.write_csv_row(summary, buf)
    values = next(csv.reader(io.StringIO(buf.getvalue())))
    row = dict(zip(reporting.CSV_FIELD_NAMES, values))
    for i, stats in enumerate(summary.tensor_error_statistics or []):
        if i < reporting.MAX_LOGGED_MODEL_OUTPUTS:
            continue
        row[f"Output {i} Error Max"] = f"{stats.error_max:.3f}"
        row[f"Output {i} Error MAE"] = f"{stats.error_mae:.3f}"
        row[f"Output {i} SNR"] = f"{stats.sqnr:.3f}"
    return row


def csv_fields() -> list[str]:
    return list(sys.modules[REPORTING_MODULE].CSV_FIELD_NAMES)
