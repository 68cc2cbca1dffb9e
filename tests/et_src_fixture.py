"""The pinned ExecuTorch source for tests that read it (provenance, source table, audit).

Found the way bundlerun finds it (executorch.tar.xz in $BUNDLERUN_THIRD_PARTY or
../shared/third_party) and extracted into this session's temp folder: a fresh machine checks the
same tree. No tarball = the test FAILS with the reason (nothing could be checked)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bundlerun.bundles import et_source


@pytest.fixture(scope="session")
def executorch_src(tmp_path_factory) -> Path:
    tarball = et_source.find_tarball()
    assert tarball is not None, ("executorch.tar.xz not found (set BUNDLERUN_THIRD_PARTY to the folder holding it, "
                                 "see /work/shared/third_party/SOURCES.md): the registry's citations cannot be checked")
    return et_source.extract_backends(tarball, tmp_path_factory.getbasetemp() / "et-src")
