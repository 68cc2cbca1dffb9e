"""Seeded input generation, independent of torch's RNG so bundles are reproducible
across torch versions and machines.

A distribution is written as text so it can live in the manifest and on the CLI:
`randn`, `rand` ([0, 1)), `uniform(-1,1)`, `normal(0,0.5)`, `randint(0,255)`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
from bundlerun.bundles.errors import ConfigError
from bundlerun.bundles.registry_schema import suggest

_FORM = re.compile(r"^\s*(randn|rand|uniform|normal|randint)\s*(?:\(([^)]*)\))?\s*$")


@dataclass(frozen=True)
class Distribution:
    kind: str
    params: tuple[float, ...] = ()

    @classmethod
    def parse(cls, text: str) -> "Distribution":
        match = _FORM.match(text)
        if not match:
            raise ValueError(
                f"unknown input distribution {text!r}; use randn, rand, uniform(lo,hi), normal(mean,std) or randint(lo,hi)"
            )
        kind, args = match.group(1), match.group(2)
        try:
            params = tuple(float(a) for a in args.split(",")) if args else ()
        except ValueError:
            raise ValueError(f"distribution {kind}({args}) has a parameter that is not a number") from None
        expected = {"randn": 0, "rand": 0, "uniform": 2, "normal": 2, "randint": 2}[kind]
        if len(params) != expected:
            raise ValueError(f"distribution {kind} takes {expected} parameters, got {len(params)}")
        if not all(math.isfinite(p) and abs(p) <= 2**62 for p in params):  # numpy's randint bounds are int64
            raise ValueError(f"distribution {kind} needs finite parameters within +-2**62, got {args}")
        if kind == "uniform" and not params[0] < params[1]:
            raise ValueError(f"uniform(lo,hi) needs lo < hi, got {args}")
        if kind == "randint" and not (params[0] <= params[1] and params[0] == int(params[0]) and params[1] == int(params[1])):
            raise ValueError(f"randint(lo,hi) needs whole numbers lo <= hi, got {args}")
        if kind == "normal" and not params[1] >= 0:
            raise ValueError(f"normal(mean,std) needs std >= 0, got {args}")
        return cls(kind, params)

    def __str__(self) -> str:
        if not self.params:
            return self.kind
        return f"{self.kind}({','.join(f'{p:g}' for p in self.params)})"

    def sample(self, rng: np.random.Generator, shape: tuple[int, ...], dtype: str = "float32") -> np.ndarray:
        if self.kind == "randn":
            out = rng.standard_normal(shape)
        elif self.kind == "rand":
            out = rng.random(shape)
        elif self.kind == "uniform":
            out = rng.uniform(self.params[0], self.params[1], shape)
        elif self.kind == "normal":
            out = rng.normal(self.params[0], self.params[1], shape)
        else:
            out = rng.integers(int(self.params[0]), int(self.params[1]), shape, endpoint=True)
        return np.asarray(out).astype(dtype)


KINDS = ("randn", "rand", "uniform", "normal", "randint")


def infer_distribution(values: np.ndarray) -> str:
    """The distribution an example tensor was most likely drawn from, from its range and moments, so
    generated cases look like the model's own example: ExecuTorch's MLPerf Tiny examples are
    `torch.rand(...) * 2 - 1` (examples/models/mlperf_tiny/resnet8.py:93), not randn. Rules
    (bundlerun's own): integers -> randint(min,max); all in [0,1) -> rand; all in [-1,1] ->
    uniform(-1,1); else a mean within 0.25 and a std within 0.75..1.25, or under 64 values -> randn; else
    normal(mean,std) when the tails pass 2 std, uniform(min,max) otherwise."""
    a = np.asarray(values)
    if a.size == 0:
        return "randn"
    if a.dtype == np.bool_:
        return "randint(0,1)"
    if np.issubdtype(a.dtype, np.integer):
        return f"randint({int(a.min())},{int(a.max())})"
    a = a.astype(np.float64)
    if not np.all(np.isfinite(a)):
        return "randn"
    lo, hi, mean, std = float(a.min()), float(a.max()), float(a.mean()), float(a.std())
    if lo >= 0.0 and hi < 1.0:
        return "rand"
    if lo >= -1.0 and hi <= 1.0:
        return "uniform(-1,1)"
    if (abs(mean) <= 0.25 and 0.75 <= std <= 1.25) or a.size < 64:  # too few values to fit anything else
        return "randn"
    if std > 0 and max(hi - mean, mean - lo) > 2 * std:
        return f"normal({mean:.4g},{std:.4g})"
    return f"uniform({lo:.4g},{hi:.4g})" if lo < hi else f"normal({mean:.4g},0)"


def check_distribution(text: Any, what: str = "--distribution") -> str:
    """A distribution given by a user (`--distribution`, `api.build(distribution=)`), parsed before
    any model is imported or built: its text, or ConfigError (one line, exit 2) naming `what`."""

    if not isinstance(text, str) or len(text) > 200:
        raise ConfigError(f"{what}: expected text such as randn or uniform(-1,1), got {type(text).__name__} "
                          f"{str(text)[:40]!r}")
    try:
        Distribution.parse(text)
    except ValueError as exc:
        kind = text.split("(")[0].strip()
        if kind not in KINDS:
            raise ConfigError(f"unknown input distribution {text!r}{suggest(kind, KINDS)}; use randn, "
                              "rand, uniform(lo,hi), normal(mean,std) or randint(lo,hi)") from None
        raise ConfigError(f"{what} {text!r}: {exc}") from None
    return text


def case_rng(seed: int, stream: str, index: int) -> np.random.Generator:
    """Independent generator per (seed, purpose, case): case k is the same whatever N is."""
    key = [seed, index] + list(stream.encode())
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(key)))


def generate_cases(
    specs: list[tuple[tuple[int, ...], str, Distribution]],
    count: int,
    seed: int,
    stream: str = "cases",
) -> list[list[np.ndarray]]:
    """`count` cases, each a list of arrays matching `specs` = [(shape, dtype, distribution)]."""
    cases = []
    for i in range(count):
        rng = case_rng(seed, stream, i)
        cases.append([dist.sample(rng, shape, dtype) for shape, dtype, dist in specs])
    return cases
