"""ExecuTorch's backend test suite and its Tester on bundlerun targets (docs/suite.md).

- `device`: the compare step of a Tester run on a target: the stage under test's `run_artifact`
  becomes "bundle the program with these inputs and the Tester's reference, run it on the
  target, return the target's outputs", so the Tester's own compare (and the suite's columns)
  judge what the device computed, and bundlerun judges the same run with the registry.
- `flows`: what a suite flow means for the registry (backend, dtype tier, reference).
- `plugin`: the pytest side, loaded by runner/pytest_plugin.py when --bundlerun-target meets
  the suite's `test_runner` items.
- `columns`: the suite's CSV columns plus bundlerun's, per subtest.
- `tester`: the documented helper for any Tester-based test.

The suite is experimental upstream; this package touches it only through its public pieces
(TestFlow.tester_factory, the `test_runner` fixture's parameters, the Tester's stages and
run_method_and_compare_outputs, reporting's CSV columns) plus two attributes of the suite's
conftest TestRunner that its own JSON hook reads (`_results`, `_subtest`): `compat.py`
holds those and tests/test_suite_plugin.py pins them against the installed wheel.
"""
