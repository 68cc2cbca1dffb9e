"""The farm plan: bundles (or zoo models x dtypes to build) x targets (URLs or device pools).

    # plan.toml -- paths are relative to this file
    bundles = ["bundles/*.bpte", "extra/mlp.bpte"]   # files or globs (each must match something)
    models = ["mlp", "tiny-cnn"]                     # zoo models / path.py:factory, built per target
    dtypes = ["fp32", "int8"]                        # default: each target's default dtype
    cases = 4                                        # test cases per built bundle (default 8)
    seed = 0
    targets = [
        "host://xnnpack",                            # a URL: a group of its own
        {url = "tosa://int", concurrency = 2},       # with its own concurrency / options
        {url = "serial+socket://lab:5000", backend = "cortex-m", build_target = "qemu://mps3-an547"},
                                                     # models built with this backend for this URL
        "pool:phones",                               # a device pool by name
        "tag:boards",                                # every pool carrying this tag
    ]
    retries = 2          # infrastructure-error retries per job (the command's --retries wins)
    timeout = 120        # seconds per case
    setup_timeout = 300
    label = "nightly"
    concurrency = 1      # default for a target that is not a pool

    [pools.phones]
    devices = ["adb://A", "adb://B", {url = "adb+tcp://10.0.0.7:5555", resource = "adb:lab-7"}]
    tags = ["android"]
    concurrency = 2      # default: the number of devices
    options = { workspace = "/data/local/tmp/br" }   # target options for every device

A job is one bundle on one group. A pool's job runs on any one device of the pool (and a
retry prefers another); a device runs one job at a time, whatever groups share it. Every key
is checked: an unknown one is an error with a did-you-mean, like bundlerun.toml's.
"""

from __future__ import annotations

import glob as _glob
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bundlerun.bundles.errors import ConfigError
from bundlerun.bundles.limits import (MAX_CASES, MAX_CONCURRENCY, MAX_JOBS, MAX_RETRIES, MAX_SEED,
                                      seconds)
from bundlerun.targets.settings import did_you_mean
from bundlerun.bundles.backends.base import BACKENDS, default_dtype
from bundlerun.bundles.errors import BundlerunError
from bundlerun.runner.shard import parse_shard, select, shard_record
from bundlerun.targets import argv, default_backend, device_key, lowering_info, parse_target_url, target_specs

TOP_KEYS = ("bundles", "models", "dtypes", "backend", "cases", "seed", "targets", "retries", "timeout",
            "setup_timeout", "label", "concurrency", "pools")
POOL_KEYS = ("devices", "tags", "concurrency", "options")
TARGET_KEYS = ("url", "pool", "tag", "concurrency", "options", "resource", "backend", "build_target")
DEVICE_KEYS = ("url", "resource")
DEFAULT_RETRIES = 2


def _device_key(url: str) -> str | None:
    """The device a URL occupies, as its target declares (SPEC.device_key, through wrappers); an
    unknown scheme is reported by the plan check itself, so it occupies nothing here."""

    try:
        return device_key(url)
    except BundlerunError:
        return None


@dataclass(frozen=True)
class Device:
    url: str
    resource: str | None  # the device key (None: a CPU job, no exclusivity)


@dataclass
class TargetGroup:
    """Where a job may run: one URL, or the devices of a pool."""

    name: str  # the URL, or pool:NAME
    devices: list[Device]
    concurrency: int
    options: dict[str, Any] = field(default_factory=dict)
    pool: str | None = None
    tags: list[str] = field(default_factory=list)
    backend: str | None = None  # the plan's models are built with this backend (else the plan's / the default)
    build_target: str | None = None  # ... for this URL (else the group's own URL)

    @property
    def url(self) -> str:
        """The URL jobs run on when the group is not a pool (a pool's first device otherwise)."""
        return self.devices[0].url

    @property
    def build_url(self) -> str:
        """The URL builds and the default backend are chosen from: build_target, else the group's URL."""
        return self.build_target or self.url


@dataclass(frozen=True)
class BuildSpec:
    model: str
    dtype: str | None  # None: the target's default
    backend: str | None
    target: str
    cases: int
    seed: int

    def slug(self) -> str:
        name = Path(self.model.split(":")[0]).stem if ":" in self.model else self.model
        return f"{name}-{self.dtype or 'default'}"


@dataclass
class Job:
    id: str
    group: TargetGroup
    bundle: Path  # for a build: where it will be written
    build: BuildSpec | None = None

    def describe(self) -> dict[str, Any]:
        return {"id": self.id, "bundle": str(self.bundle), "group": self.group.name,
                "devices": [d.url for d in self.group.devices],
                "resources": sorted({d.resource for d in self.group.devices if d.resource}),
                "concurrency": self.group.concurrency,
                "build": None if self.build is None else {"model": self.build.model, "dtype": self.build.dtype,
                                                          "backend": self.build.backend, "target": self.build.target}}


@dataclass
class Plan:
    path: Path
    groups: list[TargetGroup]
    bundle_files: list[Path]
    models: list[str]
    dtypes: list[str | None]
    backend: str | None = None
    cases: int = 8
    seed: int = 0
    retries: int = DEFAULT_RETRIES
    case_timeout_s: float = 120.0
    setup_timeout_s: float = 300.0
    label: str | None = None

    def jobs(self, build_dir: Path) -> list[Job]:
        """Every bundle x every group, in plan order (bundle files first, then builds)."""
        jobs: list[Job] = []
        seen: dict[str, int] = {}

        def add(slug: str, group: TargetGroup, bundle: Path, build: BuildSpec | None) -> None:
            base = f"{slug}@{group.name}"
            seen[base] = seen.get(base, 0) + 1
            jobs.append(Job(base if seen[base] == 1 else f"{base}#{seen[base]}", group, bundle, build))

        for path in self.bundle_files:
            for group in self.groups:
                add(path.stem, group, path, None)
        for model in self.models:
            for dtype in self.dtypes:
                for group in self.groups:
                    chosen, backend, target = dtype, group.backend or self.backend, group.build_url
                    if chosen is None:  # the target's default, named in the job id (mlp-int8@tosa://int)
                        chosen = default_dtype(backend or default_backend(target), lowering_info(target))
                    spec = BuildSpec(model, chosen, backend, target, self.cases, self.seed)
                    # named by what is built: groups building the same bundle share its file
                    name = f"{spec.slug()}-{group.backend}" if group.backend else spec.slug()
                    # + the spec's digest: `x/m.py:f` and `y/m.py:f` (one slug) must not share a file
                    add(spec.slug(), group, Path(build_dir) / f"{name}-{_slug(target)}-{_digest(spec)}.bpte", spec)
        return jobs


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")[:80] or "x"


def _digest(spec: "BuildSpec") -> str:
    """12 hex digits of everything a build depends on: one file per distinct build, whatever the slugs."""
    import hashlib
    import json

    text = json.dumps([spec.model, spec.dtype, spec.backend, spec.target, spec.cases, spec.seed])
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def _check_keys(where: str, data: dict, known: tuple[str, ...]) -> None:
    for key in data:
        if key not in known:
            raise ConfigError(f"{where}: unknown key {key!r}{did_you_mean(str(key), known)}; known: {', '.join(known)}")


def _typed(where: str, value: Any, kind: type | tuple, what: str) -> Any:
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise ConfigError(f"{where}: expected {what}, got {value!r}")
    if not isinstance(value, kind):
        raise ConfigError(f"{where}: expected {what}, got {type(value).__name__} {value!r}")
    return value


def _str_list(where: str, value: Any) -> list[str]:
    if isinstance(value, str):
        value = [value]
    _typed(where, value, list, "a list of strings")
    for item in value:
        _typed(where, item, str, "a list of strings")
    return list(value)


def _positive_int(where: str, value: Any, minimum: int = 1, maximum: int = MAX_CONCURRENCY) -> int:
    """An integer in [minimum, maximum]: every count of a plan is bounded before anything runs
    (bundles/limits.py; `cases = 99999999999999` would otherwise pass --dry-run and then grow)."""
    _typed(where, value, int, "an integer")
    if value < minimum:
        raise ConfigError(f"{where}: must be >= {minimum}, got {value}")
    if value > maximum:
        raise ConfigError(f"{where}: {value} is more than bundlerun's limit of {maximum} (docs/security.md)")
    return value


def _url(where: str, value: Any) -> str:
    _typed(where, value, str, "a target URL")

    try:
        parse_target_url(value)
    except Exception as exc:  # noqa: BLE001 - one line naming the plan key
        raise ConfigError(f"{where}: {exc}") from None
    _no_commands(where, value)
    return value


def _url_chain(url: str) -> list[Any]:
    """The parsed URL and every URL wrapped inside it (ssh://h/<URL>, labgrid://P/<URL>)."""

    chain = []
    while url and len(chain) < 8:
        parsed = parse_target_url(url)
        chain.append(parsed)
        inner = parsed.path.lstrip("/")
        url = inner if "://" in inner else ""
    return chain


def _setting_keys(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    """(shown key, setting name) of a table of target options, nested tables included (fvp's
    per-platform tables), walked without recursion."""
    out, stack = [], [(value, prefix)]
    while stack:
        table, path = stack.pop()
        for key, item in table.items():
            shown = f"{path}.{key}" if path else str(key)
            out.append((shown, str(key).replace("-", "_")))
            if isinstance(item, dict):
                stack.append((item, shown))
    return out


def _no_commands(where: str, url: str, options: dict[str, Any] | None = None) -> None:
    """A farm plan is data from other people: it may name bundles, models and targets, never a
    program to run. A setting a target declares as naming a program, command or code
    (`TargetSpec.command_settings`: ssh's client and options, a serial flash command, an adb
    binary, QEMU, a runner...) is refused in a plan's URL query and its options; it belongs in
    the user's bundlerun.toml or --target-opt (docs/security.md)."""

    try:
        chain = _url_chain(url)
    except Exception as exc:  # noqa: BLE001 - one line naming the plan key
        raise ConfigError(f"{where}: {exc}") from None
    from urllib.parse import unquote

    for u in chain:  # hosts and users reach argvs (ssh, adb): never an option (targets/argv.py, also at run time)
        user, _, hostport = u.netloc.rpartition("@")
        for part, what in ((unquote(user), "user"), (hostport, "host")):
            if part:
                try:
                    argv.word(part, f"{what} of {u.scheme}://", u.raw)
                except Exception as exc:  # noqa: BLE001 - TargetError -> the plan's one-line ConfigError
                    raise ConfigError(f"{where}: {exc}") from None
    specs = [target_specs()[u.scheme] for u in chain]
    banned: dict[str, str] = {}
    folders: dict[str, str] = {}  # TargetSpec.folder_settings: a folder the target creates on this machine
    for spec in specs:
        for name in spec.command_settings:
            banned.setdefault(name, spec.name)
        for name in spec.folder_settings:
            folders.setdefault(name, spec.name)
    keys = [(k, k.replace("-", "_")) for u in chain for k in u.query]
    keys += _setting_keys(options or {})
    for shown, name in keys:
        if name in folders:
            raise ConfigError(f"{where}: {shown!r} names a folder the target creates and writes on this machine "
                              f"({folders[name]}:// setting {name}); a farm plan cannot place it: the default is "
                              f"in the bundlerun cache, or put it in bundlerun.toml [targets.{folders[name]}] or pass "
                              "--target-opt (docs/security.md)")
        base = name[:-1] if name.endswith("s") and name[:-1] in banned else name  # fvp's `runner_elfs` maps
        if base in banned:
            raise ConfigError(f"{where}: {shown!r} names a program or command to run ({banned[base]}:// setting "
                              f"{base}); a farm plan cannot set it: put it in bundlerun.toml [targets."
                              f"{banned[base]}] or pass --target-opt (docs/security.md)")


def _device(where: str, entry: Any) -> Device:
    if isinstance(entry, str):
        return Device(_url(where, entry), _device_key(entry))
    _typed(where, entry, dict, "a URL or {url = ..., resource = ...}")
    _check_keys(where, entry, DEVICE_KEYS)
    if "url" not in entry:
        raise ConfigError(f"{where}: a device needs url")
    url = _url(f"{where}.url", entry["url"])
    resource = entry.get("resource", _device_key(url))
    if resource is not None:
        _typed(f"{where}.resource", resource, str, "a resource name such as adb:SERIAL")
    return Device(url, resource)


def _options(where: str, value: Any) -> dict[str, Any]:
    return dict(_typed(where, value, dict, "a table of target options"))


def _backend(where: str, value: Any) -> str:
    _typed(where, value, str, "a backend name")
    if value not in BACKENDS:
        raise ConfigError(f"{where}: unknown backend {value!r}{did_you_mean(value, BACKENDS)}; "
                          f"known: {', '.join(BACKENDS)}")
    return value


def _check_build(where: str, backend: str | None, build_url: str) -> None:
    """A backend that cannot build for the URL the bundle is built for: one error at plan time
    (the Arm family is checked here without importing torch; the others at build time)."""
    if backend not in ("arm", "cortex-m"):  # None: the target's own default backend, which builds for it
        return

    try:
        kind = lowering_info(build_url).get("arm")
    except BundlerunError as exc:
        raise ConfigError(f"{where}: backend {backend!r} cannot build for {build_url}: {exc}") from None
    if backend == "arm" and kind is None:
        raise ConfigError(f"{where}: backend 'arm' cannot build for {build_url}: it builds for tosa://, fvp:// and "
                          "qemu:// targets")
    if backend == "cortex-m" and kind != "cortex-m":
        raise ConfigError(f"{where}: backend 'cortex-m' cannot build for {build_url}: it builds for "
                          "qemu://mps3-an547 and fvp://corstone-300/cortex-m55 (or cortex-m85); give the "
                          "target build_target = one of those (the run still goes to the target's URL)")


def load_plan(path: str | Path, retries: int | None = None) -> Plan:
    """Read and check PLAN.toml; `retries` (the command's --retries) wins over the plan's. The
    file is read bounded (size, nesting: bundles/toml_read.py): a plan is data from other people."""
    from bundlerun.bundles.toml_read import read_toml  # start-up: loads tomli on use

    path = Path(path)
    return parse_plan(read_toml(path, "plan"), path, retries)


def parse_plan(data: dict[str, Any], path: Path, retries: int | None = None) -> Plan:
    where = str(path)
    _check_keys(where, data, TOP_KEYS)
    base = path.parent
    default_conc = _positive_int(f"{where}: concurrency", data.get("concurrency", 1))

    pools: dict[str, dict[str, Any]] = {}
    raw_pools = _typed(f"{where}: [pools]", data.get("pools", {}), dict, "a table of pools")
    for name, pool in raw_pools.items():
        w = f"{where}: [pools.{name}]"
        _typed(w, pool, dict, "a table")
        _check_keys(w, pool, POOL_KEYS)
        devices = pool.get("devices")
        if not devices:
            raise ConfigError(f"{w}: devices is required and must list at least one device")
        _typed(f"{w}.devices", devices, list, "a list of device URLs")
        devs = [_device(f"{w}.devices[{i}]", d) for i, d in enumerate(devices)]
        urls = [d.url for d in devs]
        dup = sorted({u for u in urls if urls.count(u) > 1})
        if dup:
            raise ConfigError(f"{w}: device {dup[0]} listed twice")
        pools[name] = {"devices": devs, "tags": _str_list(f"{w}.tags", pool.get("tags", [])),
                       "concurrency": _positive_int(f"{w}.concurrency", pool.get("concurrency", len(devs))),
                       "options": _options(f"{w}.options", pool.get("options", {}))}

    def pool_group(name: str, w: str, conc: int | None = None, options: dict | None = None) -> TargetGroup:
        if name not in pools:
            raise ConfigError(f"{w}: no pool {name!r}{did_you_mean(name, pools)}; pools: {', '.join(pools) or 'none'}")
        p = pools[name]
        return TargetGroup(f"pool:{name}", list(p["devices"]), conc or p["concurrency"],
                           {**p["options"], **(options or {})}, name, list(p["tags"]))

    groups: list[TargetGroup] = []
    targets = data.get("targets")
    if not targets:
        raise ConfigError(f"{where}: targets is required (URLs, pool:NAME or tag:TAG)")
    _typed(f"{where}: targets", targets, list, "a list of targets")
    models = _str_list(f"{where}: models", data.get("models", []))
    plan_backend = None if data.get("backend") is None else _backend(f"{where}: backend", data["backend"])
    for i, entry in enumerate(targets):
        w = f"{where}: targets[{i}]"
        conc, options, resource, backend, build_target = None, {}, None, None, None
        if isinstance(entry, dict):
            _check_keys(w, entry, TARGET_KEYS)
            chosen = [k for k in ("url", "pool", "tag") if k in entry]
            if len(chosen) != 1:
                raise ConfigError(f"{w}: give exactly one of url, pool, tag")
            if "concurrency" in entry:
                conc = _positive_int(f"{w}.concurrency", entry["concurrency"])
            options = _options(f"{w}.options", entry.get("options", {}))
            if "resource" in entry:
                if "url" not in entry:
                    raise ConfigError(f"{w}: resource applies to a url entry (pool devices carry their own)")
                resource = _typed(f"{w}.resource", entry["resource"], str, "a resource name")
            if ("backend" in entry or "build_target" in entry) and not models:
                raise ConfigError(f"{w}: backend and build_target apply to models to build; there are none")
            if "backend" in entry:
                backend = _backend(f"{w}.backend", entry["backend"])
            if "build_target" in entry:
                build_target = _url(f"{w}.build_target", entry["build_target"])
            kind = chosen[0]
            text = _typed(f"{w}.{kind}", entry[kind], str, "a string")
        else:
            text = _typed(w, entry, str, "a URL, pool:NAME, tag:TAG or a table")
            kind = "pool" if text.startswith("pool:") else "tag" if text.startswith("tag:") else "url"
            text = text.split(":", 1)[1] if kind != "url" else text
        if kind == "pool":
            new = [pool_group(text, w, conc, options)]
        elif kind == "tag":
            names = [n for n, p in pools.items() if text in p["tags"]]
            if not names:
                tags = sorted({t for p in pools.values() for t in p["tags"]})
                raise ConfigError(f"{w}: no pool has tag {text!r}{did_you_mean(text, tags)}; "
                                  f"tags: {', '.join(tags) or 'none'}")
            new = [pool_group(n, w, conc, options) for n in names]
        else:
            url = _url(w, text)
            dev = Device(url, resource if resource is not None else _device_key(url))
            new = [TargetGroup(url, [dev], conc or (1 if dev.resource else default_conc), options)]
        for group in new:
            for device in group.devices:  # the group's (and its pool's) options, against each device's target
                _no_commands(f"{w}.options" if group.pool is None else f"{where}: [pools.{group.pool}].options",
                             device.url, group.options)
            group.backend, group.build_target = backend, build_target
            if models:
                _check_build(w, backend or plan_backend, group.build_url)
            if any(g.name == group.name for g in groups):
                raise ConfigError(f"{w}: target {group.name} is already in the plan")
            groups.append(group)

    files: list[Path] = []
    for i, pattern in enumerate(_str_list(f"{where}: bundles", data.get("bundles", []))):
        full = pattern if Path(pattern).is_absolute() else str(base / pattern)
        matches = sorted(Path(m) for m in _glob.glob(full)) if _glob.has_magic(pattern) else (
            [Path(full)] if Path(full).is_file() else [])
        if not matches:
            raise ConfigError(f"{where}: bundles[{i}] {pattern!r} matches no file (relative to {base})")
        files += [m.resolve() for m in matches if m.resolve() not in files]
    dtypes: list[str | None] = list(_str_list(f"{where}: dtypes", data.get("dtypes", []))) or [None]
    if not files and not models:
        raise ConfigError(f"{where}: nothing to run: give bundles (paths or globs) or models to build")
    if "dtypes" in data and not models:
        raise ConfigError(f"{where}: dtypes applies to models to build; there are none")
    # finite, positive and bounded: `timeout = nan` passed `timeout <= 0` once (NaN compares false)
    timeout = seconds(data.get("timeout", 120.0), f"{where}: timeout")
    setup = seconds(data.get("setup_timeout", 300.0), f"{where}: setup_timeout")
    plan_retries = _positive_int(f"{where}: retries", data.get("retries", DEFAULT_RETRIES), minimum=0,
                                 maximum=MAX_RETRIES)
    label = data.get("label")
    if label is not None:
        _typed(f"{where}: label", label, str, "a string")
        if len(label) > 1024:
            raise ConfigError(f"{where}: label is {len(label)} characters (at most 1024)")
    cases = _positive_int(f"{where}: cases", data.get("cases", 8), maximum=MAX_CASES)
    seed = _positive_int(f"{where}: seed", data.get("seed", 0), minimum=0, maximum=MAX_SEED)
    jobs = (len(files) + len(models) * len(dtypes)) * len(groups)
    if jobs > MAX_JOBS:
        raise ConfigError(f"{where}: the plan expands to {jobs} jobs; bundlerun's limit is {MAX_JOBS} (docs/security.md)")
    return Plan(path=path, groups=groups, bundle_files=files, models=models, dtypes=dtypes, backend=plan_backend,
                cases=cases, seed=seed,
                retries=plan_retries if retries is None else retries, case_timeout_s=float(timeout),
                setup_timeout_s=float(setup), label=label)


def shard_jobs(jobs: list[Job], shard: Any) -> tuple[list[Job], dict[str, Any] | None]:
    """`--shard i/n` of a farm: (this shard's jobs in plan order, the merged report's "shard"
    record). Jobs are split by their id with the balanced split of runner/shard.py, so every
    shard of a CI matrix computes the same one and `bundlerun merge` finds missing shards."""

    shard = parse_shard(shard)
    if shard is None:
        return list(jobs), None
    keys = [j.id for j in jobs]
    mine = select(keys, shard)
    chosen = set(mine)
    return [j for j in jobs if j.id in chosen], shard_record(shard, "jobs", mine, keys)
