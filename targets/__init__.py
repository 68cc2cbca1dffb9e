"""Targets, named by URL (like pyserial's serial_for_url), each declared by its own module.

A target module exposes `SPEC = TargetSpec(...)`: its URL schemes, a one-line
summary, example URLs, its settings dataclass (strict: an unknown option is an
error with a did-you-mean), its default backend and a `doctor` probe, plus
`create(url, config) -> Target`. The CLI help, URL parsing, `doctor` and the
build's default backend are all generated from these declarations, so a new
target is one new module plus its line in `BUILTIN_TARGETS` (or an entry point
in the `bundlerun.targets` group, or a module named in $BUNDLERUN_TARGETS).

Target modules keep heavy imports (torch, executorch, adb-shell) inside functions:
declarations are read at CLI start-up.
"""

from __future__ import annotations

import functools
import importlib
import os
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

from bundlerun.bundles.errors import TargetError
from bundlerun.targets.base import PerfKind, Target
from bundlerun.targets.failures import FailureKind
from bundlerun.targets.settings import did_you_mean

BUILTIN_TARGETS: tuple[str, ...] = (
    "bundlerun.targets.host",
    "bundlerun.targets.tosa",
    "bundlerun.targets.arm.fvp",
    "bundlerun.targets.arm.qemu",
    "bundlerun.targets.arm.serial",
    "bundlerun.targets.android",
    "bundlerun.targets.qemu_user",
    "bundlerun.targets.vulkan",
    "bundlerun.targets.qnn",
    "bundlerun.targets.mlx",
    "bundlerun.targets.ssh",
    "bundlerun.targets.labgrid",
)
# Each builtin scheme and the module that declares it (its SPEC.schemes; tests/test_target_registry.py
# holds the two equal), so a URL with a builtin scheme resolves by importing that one module: not the
# eleven others, nor the entry-point scan of every installed distribution (together 0.1-0.15 s of a
# `bundlerun run`'s start at load 6 on this 2-core machine, bundlerun's own measurement). A plugin
# cannot take a builtin scheme anyway: builtins register first and the first declaration of a scheme wins.
BUILTIN_SCHEMES: dict[str, str] = {
    "host": "bundlerun.targets.host",
    "tosa": "bundlerun.targets.tosa",
    "fvp": "bundlerun.targets.arm.fvp",
    "qemu": "bundlerun.targets.arm.qemu",
    "serial": "bundlerun.targets.arm.serial",
    "serial+socket": "bundlerun.targets.arm.serial",
    "rfc2217": "bundlerun.targets.arm.serial",
    "adb": "bundlerun.targets.android",
    "adb+tcp": "bundlerun.targets.android",
    "adb+usb": "bundlerun.targets.android",
    "qemu-user": "bundlerun.targets.qemu_user",
    "vulkan": "bundlerun.targets.vulkan",
    "qnn": "bundlerun.targets.qnn",
    "mlx": "bundlerun.targets.mlx",
    "ssh": "bundlerun.targets.ssh",
    "labgrid": "bundlerun.targets.labgrid",
}
ENTRY_POINT_GROUP = "bundlerun.targets"
DEFAULT_TARGET = "host://xnnpack"


@dataclass(frozen=True)
class Check:
    """One `doctor` row: is a component of a target here, and where."""

    component: str
    ok: bool | None  # None: not applicable / nothing configured
    detail: str
    where: str = ""


@dataclass(frozen=True)
class TargetURL:
    """A parsed target URL. `netloc`+`path` keep their raw form; `query` is flattened."""

    raw: str
    scheme: str
    netloc: str
    path: str
    query: dict[str, str] = field(default_factory=dict)

    @property
    def family(self) -> str:
        return self.scheme.split("+")[0]

    @property
    def rest(self) -> str:
        """What follows `scheme://`, without the query: `xnnpack`, `corstone-300/ethos-u55-128`."""
        return (self.netloc + self.path).strip("/")


@dataclass(frozen=True)
class ElapsedClock:
    """How a case's `elapsed_s` reads on a target, as the perf figure the report labels it with."""

    name: str  # figure name, e.g. "execution_wall_time"
    kind: PerfKind
    source: str  # what measured it, in words
    phased: bool = False  # one warm process runs every case: a method's first case is "first", the rest "warm"


# Where a target declares nothing: the whole runner session on the host's wall clock (tool start-up,
# transfers and simulator boot included), which is never device latency.
SESSION_CLOCK = ElapsedClock("session_wall_time", PerfKind.HOST_WALL,
                             "host wall clock of the whole runner session (elapsed_s)")

# `capture(url, config, bundle_path, method, case, work_dir, timeout_s, debug_buffer_mb) -> IntermediateRun`
CaptureFn = Callable[[str, dict, Any, str, int, Any, float, int], Any]


@dataclass(frozen=True)
class TargetSpec:
    """What a target module declares about itself: everything bundlerun does with a target's
    scheme beyond `create(url, config).run(...)` is read from here, never from tables elsewhere.

    The capability fields are optional; leaving one out says the target cannot do it."""

    name: str  # family, also the config section [targets.<name>]
    schemes: tuple[str, ...]
    summary: str
    examples: tuple[str, ...]
    default_backend: Callable[[TargetURL], str] | str = "xnnpack"
    # dtype -> the backend a build in that dtype takes by default instead of `default_backend`: a target
    # whose plain default is not what its users ship for that dtype (qemu-user://aarch64: fp32 checks the
    # portable kernels, int8 is XNNPACK's, the delegate the aarch64 runner links). `--backend` still wins
    dtype_backends: dict[str, str] = field(default_factory=dict)
    settings: type | None = None  # strict settings dataclass, documented by its fields
    doctor: Callable[[dict[str, Any]], list[Check]] | None = None  # gets the [targets.<name>] section
    module: str = ""  # filled in at registration
    # --- capabilities
    capture: CaptureFn | None = None  # `bundlerun debug`: every intermediate output of one case
    capture_note: str = ""  # without `capture`: one line saying what it would need
    # `capture(..., prefix=(cases...))` runs those cases first on the same loaded method (a stateful
    # sequence's earlier steps, bundles/sequence.py) and returns the intermediates of the last case only
    capture_prefix: bool = False
    device_key: Callable[[TargetURL], str | None] | None = None  # the device a URL occupies (farm locks, Ray)
    lowering: Callable[[TargetURL], dict[str, Any]] | None = None  # what a recipe lowers for (LoweringRequest.target_info)
    elapsed: ElapsedClock = SESSION_CLOCK  # what a case's elapsed_s measures here
    repeat: bool = False  # honours RunOptions.repeat (`--repeat N` measured executions per case)
    # honours RunOptions.replay (`--replay N`): runs each case N times in one process or boot, returning
    # CaseResult.replays; without it the runner repeats the whole run (runner/judging/replay.py)
    replay: bool = False
    # runs a bundle's selected cases in suite order on ONE loaded method, so a program's state (an LLM's
    # KV cache, bundles/sequence.py) carries from case to case; without it a bundle with a stateful
    # sequence is refused (bad-config), never run step by step on fresh state (runner/stateful.py)
    stateful: bool = False
    # threads a sequence whose KV cache is the program's inputs and outputs (`state: "io"`, QNN's static
    # llama): each step's listed outputs written into the next step's inputs (targets/workers/io_state.py);
    # without it such a bundle is refused (bad-config, runner/stateful.py)
    io_state: bool = False
    inner: Callable[[TargetURL], str | None] | None = None  # a wrapper's inner URL (ssh://h/<URL>, labgrid://P/<URL>)
    keep_open: bool = False  # worth keeping open across a command's bundles (a connection, a booted device)
    # the target's `prestart(data, method, work_dir)` spawns its runtime on the bundle's bytes before the host
    # has read and verified them and returns it (None: not this way), and `run` adopts it only for the bundle
    # vouched for as verified from those bytes (runner/session.py's early start; targets/et_runner/server.py
    # Prestarted); `close` kills what was not adopted
    prestart: bool = False
    # settings that name a program, command, code or tool options to run (here, on a remote host or a
    # device): only the user's own config and --target-opt may set them, never a farm plan (docs/security.md)
    command_settings: tuple[str, ...] = ()
    # settings that name a folder on this machine the target creates and writes (vulkan's Mesa
    # shader cache): only the user's own config and --target-opt may set them, never a farm plan
    folder_settings: tuple[str, ...] = ()

    def backend_for(self, url: TargetURL, dtype: str | None = None) -> str:
        if dtype is not None and dtype in self.dtype_backends:
            return self.dtype_backends[dtype]
        chooser = self.default_backend
        if not callable(chooser):
            return chooser
        if getattr(chooser, "takes_dtype", False):  # a wrapper asks its inner URL (inner_default_backend)
            return chooser(url, dtype)  # type: ignore[call-arg]
        return chooser(url)


_SPECS: dict[str, TargetSpec] | None = None  # scheme -> spec, loaded once


def _registered_modules() -> list[str]:
    modules = list(BUILTIN_TARGETS)
    try:
        from importlib.metadata import entry_points

        modules += [ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)]
    except Exception:  # noqa: BLE001 - a broken third-party distribution must not stop the CLI
        pass
    modules += [m.strip() for m in os.environ.get("BUNDLERUN_TARGETS", "").replace(":", ",").split(",") if m.strip()]
    return list(dict.fromkeys(modules))


_MODULE_SPECS: dict[str, TargetSpec | None] = {}  # module name -> its declaration (None: not installed)


def _module_spec(name: str) -> TargetSpec | None:
    """The declaration of target module `name`, read once (one object however it is reached);
    None when the module is listed but absent from this installation."""
    if name not in _MODULE_SPECS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name or name.startswith(f"{exc.name}."):
                _MODULE_SPECS[name] = None  # listed but absent from this installation
                return None
            raise
        spec = getattr(module, "SPEC", None)
        if not isinstance(spec, TargetSpec):
            raise TargetError(f"target module {name} declares no SPEC = TargetSpec(...)")
        _MODULE_SPECS[name] = TargetSpec(**{**spec.__dict__, "module": name})
    return _MODULE_SPECS[name]


def target_specs() -> dict[str, TargetSpec]:
    """Every registered target, by URL scheme."""
    global _SPECS
    if _SPECS is None:
        specs: dict[str, TargetSpec] = {}
        for name in _registered_modules():
            spec = _module_spec(name)
            if spec is None:
                continue
            for scheme in spec.schemes:
                specs.setdefault(scheme, spec)
        _SPECS = specs
    return _SPECS


def _scheme_spec(scheme: str) -> TargetSpec | None:
    """The declaration of `scheme`, as `target_specs()` has it: a builtin scheme from its own module
    alone (BUILTIN_SCHEMES), any other from every registered module."""
    if _SPECS is None and scheme in BUILTIN_SCHEMES:
        spec = _module_spec(BUILTIN_SCHEMES[scheme])
        if spec is not None and scheme in spec.schemes:
            return spec
    return target_specs().get(scheme)


def reset_registry() -> None:
    """Forget the loaded declarations (tests that register a module through the environment)."""
    global _SPECS
    _SPECS = None
    _MODULE_SPECS.clear()


def families() -> list[TargetSpec]:
    """One spec per target family, in registration order."""
    return list({spec.name: spec for spec in target_specs().values()}.values())


@dataclass(frozen=True)
class TargetConfig(TargetURL):
    """A target URL resolved once (`resolve_target`) and passed down CLI -> session -> target: the
    URL's parts (a `TargetURL`: `raw`, `scheme`, `variant`, `settings`) and the declaration of the
    target it names (`spec`). A wrapper's inner target (`ssh://HOST/<inner URL>`) is resolved on
    first use (`inner`), so a bad inner URL is the wrapper's to report, as before. Each target's
    `create()` still validates its own settings."""

    spec: TargetSpec | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return self.raw

    @property
    def variant(self) -> str:
        """What follows `scheme://` without the query: `xnnpack`, `corstone-300/ethos-u55-128`."""
        return self.rest

    @property
    def settings(self) -> dict[str, str]:
        """The URL's query options (`?key=value`), last value wins."""
        return self.query

    @property
    def declared(self) -> TargetSpec:
        assert self.spec is not None  # resolve_target always sets it
        return self.spec

    @functools.cached_property
    def inner_url(self) -> str | None:
        """The URL a wrapper target runs its cases on, or None (not a wrapper, or no inner URL)."""
        return self.declared.inner(self) if self.declared.inner is not None else None

    @functools.cached_property
    def inner(self) -> "TargetConfig | None":
        """The wrapper's inner target, resolved once (raises the inner URL's TargetError)."""
        return resolve_target(self.inner_url) if self.inner_url else None


def parse_target_url(url: str) -> TargetConfig:
    """Parse `url` (the one parse of a target URL; `resolve_target` reuses a parsed one)."""
    if "://" not in url:
        examples = ", ".join(s.examples[0] for s in families() if s.examples)
        raise TargetError(f"target {url!r} is not a URL; expected e.g. {examples}", kind=FailureKind.BAD_CONFIG)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    spec = _scheme_spec(scheme)
    if spec is None:
        specs = target_specs()
        raise TargetError(f"unknown target scheme {scheme!r} in {url!r}{did_you_mean(scheme, specs)}; "
                          f"known: {', '.join(sorted(specs))}", kind=FailureKind.BAD_CONFIG)
    query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    return TargetConfig(raw=url, scheme=scheme, netloc=parts.netloc, path=parts.path, query=query, spec=spec)


def resolve_target(url: "str | TargetURL") -> TargetConfig:
    """`url` as a `TargetConfig`: parsed now if it is a string, as it is if already resolved."""
    if isinstance(url, TargetConfig):
        return url
    if isinstance(url, TargetURL):
        spec = _scheme_spec(url.scheme)
        if spec is None:
            raise KeyError(url.scheme)  # as target_specs()[scheme] raised
        return TargetConfig(**{**url.__dict__, "spec": spec})
    return parse_target_url(url)


def spec_for(url: str | TargetURL) -> TargetSpec:
    return resolve_target(url).declared


def default_backend(url: str | TargetURL, dtype: str | None = None) -> str:
    """The lowering backend a bundle built for `url` (in `dtype`, when the caller knows it) uses by
    default: the target declares it (`TargetSpec.default_backend`, `dtype_backends`)."""
    resolved = resolve_target(url)
    return resolved.declared.backend_for(resolved, dtype)


def inner_default_backend(fallback: str) -> Callable[[TargetURL], str]:
    """For a target that wraps another (`ssh://host/<inner URL>`, `labgrid://PLACE/<inner URL>`):
    the inner URL's default backend, or `fallback` when there is no (valid) inner URL."""

    def backend(url: TargetURL, dtype: str | None = None) -> str:
        try:
            inner = resolve_target(url).inner  # the wrapper's inner target, parsed once
            return default_backend(inner, dtype) if inner else fallback
        except Exception:  # noqa: BLE001 - a bad inner URL is reported by the run
            return fallback

    backend.takes_dtype = True  # type: ignore[attr-defined]  # TargetSpec.backend_for passes the dtype on
    return backend


def lazy(ref: str) -> Callable[..., Any]:
    """`"package.module:function"` as a callable that imports its module on the first call, so a
    SPEC can declare a capability whose code is heavy (torch, executorch) at no start-up cost."""
    module_name, _, attr = ref.partition(":")

    def call(*args: Any, **kw: Any) -> Any:
        return getattr(importlib.import_module(module_name), attr)(*args, **kw)

    call.__qualname__ = call.__name__ = attr
    call.__doc__ = f"{ref} (imported on first use)"
    return call


def path_inner_url(url: TargetURL) -> str | None:
    """`inner` for wrappers that carry a whole target URL as their path (ssh://HOST/<inner URL>)."""
    inner = url.path.lstrip("/")
    return inner if "://" in inner else None


def inner_of(url: str | TargetURL) -> str | None:
    """The URL a wrapper target runs its cases on, or None (not a wrapper, or no inner URL)."""
    return resolve_target(url).inner_url


def _declared(url: str | TargetURL, pick: Callable[[TargetSpec], Any]) -> tuple[TargetSpec, TargetURL] | None:
    """The first spec along the wrapper chain (outer first) for which `pick` holds."""
    resolved: TargetConfig | None = resolve_target(url)
    seen = 0
    while resolved is not None and seen < 8:  # wrappers of wrappers are refused by the targets; this bounds it
        if pick(resolved.declared):
            return resolved.declared, resolved
        resolved = resolved.inner
        seen += 1
    return None


def lowering_info(url: str | TargetURL) -> dict[str, Any]:
    """What a backend recipe lowers for when building for `url` (the target, or the target a wrapper
    runs its cases on, declares it: e.g. {"kind": "tosa", "tosa_spec": "TOSA-1.0+INT"}); {} if none."""
    found = _declared(url, lambda s: s.lowering is not None)
    return dict(found[0].lowering(found[1])) if found else {}


def device_key(url: str | TargetURL) -> str | None:
    """The physical device `url` occupies (a farm runs one job at a time on it), None for a CPU job."""
    found = _declared(url, lambda s: s.device_key is not None)
    return found[0].device_key(found[1]) if found else None


def elapsed_clock(url: str | TargetURL) -> ElapsedClock:
    """What a case's elapsed_s measures on `url`: the clock of the process that ran the case (a
    wrapper's inner target), the whole session's host wall clock where nothing is declared."""
    try:
        found = _declared(url, lambda s: s.elapsed is not SESSION_CLOCK or s.inner is None)
    except TargetError:  # a report from a target this installation does not have
        return SESSION_CLOCK
    return found[0].elapsed if found else SESSION_CLOCK


def repeat_schemes() -> list[str]:
    """The schemes whose targets honour `--repeat N` (they declare `repeat=True`)."""
    return [scheme for scheme, spec in target_specs().items() if spec.repeat]


def capture_schemes() -> list[str]:
    """The target families that can return every intermediate output (`bundlerun debug`)."""
    return [f"{spec.name}://" for spec in families() if spec.capture is not None]


def open_target(url: str | TargetURL, config: dict | None = None):
    """Instantiate the target for `url` with its config section. What `create` returns must be a
    `targets.base.Target` (run + close; deriving from `TargetBase` gives a no-op close)."""
    parsed = resolve_target(url)
    spec = parsed.declared
    target = importlib.import_module(spec.module).create(parsed, dict(config or {}))
    if not isinstance(target, Target):
        raise TargetError(f"target module {spec.module}: create() returned {type(target).__name__}, which lacks "
                          "run()/close() (derive it from bundlerun.targets.base.TargetBase)")
    return target


def url_help() -> str:
    """The target table of `bundlerun --help`, generated from the declarations."""
    lines = []
    for spec in families():
        lines.append(f"  {', '.join(spec.examples)}")
        lines.append(f"      {spec.summary}")
    return "\n".join(lines)
