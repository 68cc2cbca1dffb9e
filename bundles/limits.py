"""bundlerun's own bounds on every count, size and time a user, a config or a farm plan gives.

They are checked before any work starts, so a typo or a hostile plan (`cases = 99999999999999`,
`timeout = nan`, `--select 0-99999999999`) is a one-line error, never a process that grows
without limit or a timer that overflows. The numbers are bundlerun's own (no ExecuTorch source
sets them): each is far above any real use and far below what would exhaust a machine.
Documented in docs/security.md ("Bounds").
"""

from __future__ import annotations

import math
from typing import Any

from bundlerun.bundles.errors import ConfigError

MAX_CASES = 100_000  # test cases per method in a built bundle, and per --select
MAX_SEED = 2**63 - 1  # numpy's PCG64 takes any non-negative int; int64 keeps it in SQLite and JSON
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # one week: longer waits overflow some OS timers and are never meant
MAX_REPEAT = 100_000  # --repeat N measured executions per case
MAX_REPLAY = 100  # --replay N: every run's outputs are kept in memory to be compared (runner/judging/replay.py)
MAX_RETRIES = 100  # farm retries of infrastructure errors per job
MAX_CONCURRENCY = 1024  # farm concurrency per target / pool, and --jobs
MAX_JOBS = 1_000_000  # jobs one farm plan expands to (bundles x models x dtypes x targets)
MAX_SHARDS = 100_000  # N of --shard I/N
MAX_FILE_BYTES = 64 << 20  # a config file, farm plan or report.json read whole into memory
MAX_TOML_DEPTH = 32  # nesting of a TOML file (tomllib recurses: deeper raises RecursionError)
MAX_JSON_DEPTH = 32  # nesting of a JSON file from outside (json.loads recurses; runner.json and ICD json use 3)
MAX_JSON_STRING = 1 << 20  # characters of one JSON string from outside (paths, flags: far below this)
MAX_RECORD_BYTES = 4 << 20  # a runner.json or ICD json: a few KiB in practice
MAX_WALK_DEPTH = 64  # folders nested under a folder bundlerun walks (golden artifacts are 1-2 deep)
MAX_WALK_ENTRIES = 1_000_000  # files and folders listed under such a folder
# A report.json is read whole (runner/report/model.py, `read_report`): 100,000 cases with full stats
# are ~150 MB. Here, with bundles/ below runner/, so a build can tell a run will not fit (bundles/report_fit.py).
MAX_REPORT_BYTES = 512 << 20
# The raw outputs one report keeps (`run --save-outputs`: outputs.npz). Every reader of that file holds
# it whole in memory: `judge` and `tolerance suggest` (runner/history/saved_outputs.py) and the HTML
# report's plots (runner/writers/__init__.py, PLOT_OUTPUTS_MAX, this bound); a run past it keeps none.
MAX_REPORT_OUTPUTS_BYTES = 1 << 30
MAX_PROGRAM_BYTES = 2**31 - 1  # a .pte read whole: a bundle is one flatbuffer, at most 2 GiB - 1 bytes
# (flatbuffers' Python builder, flatbuffers/builder.py: Builder.MAX_BUFFER_SIZE = 2**31)


def count(value: Any, what: str, lo: int, hi: int) -> int:
    """An integer in [lo, hi] (not a bool, not a float), or ConfigError naming `what`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{what}: expected a whole number, got {type(value).__name__} {value!r}"[:300])
    if not lo <= value <= hi:
        raise ConfigError(f"{what}: {value} is outside [{lo}, {hi}] (bundlerun's limit, docs/security.md)"[:300])
    return value


def seconds(value: Any, what: str, allow_zero: bool = False, hi: float = MAX_TIMEOUT_S) -> float:
    """A finite number of seconds in (0, hi] ([0, hi] with allow_zero), or ConfigError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{what}: expected a number of seconds, got {type(value).__name__} {value!r}"[:300])
    number = float(value) if not isinstance(value, int) or abs(value) <= 2**1023 else math.inf
    if not math.isfinite(number) or number < 0 or (number == 0 and not allow_zero) or number > hi:
        bound, kind = ("[0", "finite") if allow_zero else ("(0", "positive")
        raise ConfigError(f"{what}: {value!r} is not a {kind} number of seconds in {bound}, {hi:g}] "
                          "(bundlerun's limit, docs/security.md)")
    return number
