"""The order in which `pytest -n 2 --dist loadfile` hands test files to its two workers: heaviest first.

Why: xdist gives each worker one file at a time and the next file when it runs dry, in the order of the
work queue. By default (`--loadscope-reorder`) it sorts that queue by the number of tests per file, so a
file of 3 tests that takes 4 minutes (tests/test_llm_bisect_lanes.py: two LLM bisections, 8 export_llama
lowerings each) was queued 129th of 145 and could start when the other worker had only small files left:
that worker then idled for the rest of it. Handing the files that take longest first (the classic
longest-processing-time rule) leaves only short files for the end, where they fill both workers evenly.

FILE_SECONDS holds bundlerun's own measurement: the sum of each file's tests among the 20 slowest of a
full `bash scripts/test.sh` (2026-12-05, 2 cores at load 2-3, runners cached, build cache cold for the
tree; /tmp/final.log), a lower bound of the file's time. Files it does not name keep xdist's own order
after them (most tests first). A stale figure costs balance, never a test: every file still runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

FILE_SECONDS: dict[str, float] = {
    # bisect llm:llama3 on vulkan://lavapipe (185 s) and qnn://htp-sim (73 s): 16 cold lowerings
    "test_llm_bisect_lanes.py": 258.0,
    # the Vulkan zoo validate (151 s, module fixture) and its second driver (42 s)
    "test_vulkan_lane.py": 193.0,
    # bisect llm:llama3 on host://xnnpack (130 s; its --case 3 test reuses those candidates from the cache)
    "test_llm_bisect.py": 130.0,
    # bisect llm:llama3 on qemu-user://aarch64 (129 s), split from test_llm_bisect.py to run beside it
    "test_llm_bisect_aarch64.py": 129.0,
    # four of its first-diverging-operation cases at 29-31 s each
    "test_export_divergence.py": 120.0,
    "test_bisect.py": 70.0,  # the planted conv on vulkan://lavapipe (40 s) and TOSA int (30 s)
    "test_qemu_user_target.py": 62.0,  # the XNNPACK zoo on qemu-user://aarch64
    "test_vulkan_llm.py": 48.0,  # llama3's fixture: export_llama for Vulkan
    "test_mnist_resnet8.py": 48.0,  # trains (cached) and validates ResNet-8 fp32 on host
    "test_llm_build.py": 47.0,  # 8da4w llama3 on host
    "test_shard_merge.py": 40.0,  # models x dtypes sharded and merged
    "test_farm.py": 37.0,  # the zoo plan on host, TOSA and the emulated phone, local and on Ray
    "test_debug.py": 32.0,  # debug-on-fail and debug-from-history
}


def heaviest_files_first(items: list[pytest.Item]) -> None:
    """pytest_collection_modifyitems: reorder `items` in place, whole files at a time (each file's own
    tests keep their order, its module fixtures their one setup): FILE_SECONDS' files, longest first,
    then the others by test count, most first (xdist's default order, which conftest.py turns off
    because it would undo this one)."""
    counts: dict[Path, int] = {}
    for item in items:
        counts[item.path] = counts.get(item.path, 0) + 1
    first_seen = {path: i for i, path in enumerate(counts)}

    def rank(path: Path) -> tuple[float, int, int]:
        return (-FILE_SECONDS.get(path.name, 0.0), -counts[path], first_seen[path])

    order = {path: i for i, path in enumerate(sorted(counts, key=rank))}
    items.sort(key=lambda item: order[item.path])  # stable: a file's tests keep their order
