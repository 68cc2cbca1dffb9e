"""The settings of one command: the project config (read once), `--target-opt`, each target's
options and the tolerance registry builds use.

Apart from the Session (runner/session.py, which runs and judges bundles and so imports numpy,
flatbuffers and the runtime's plumbing), so that a command that only sends work elsewhere starts
without them: `bundlerun farm`'s coordinator reads its settings here, and a second farm command
against a running cluster reaches its first job without importing numpy or SQLAlchemy (the farm
command's imports before its first job: 0.49-0.60 s with the Session and the history store, 0.12-0.13 s
with these settings, at load 5.8 on 2 cores, 2026-12-05)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bundlerun.bundles.errors import BundlerunError, ConfigError
from bundlerun.targets import TargetConfig, TargetURL, resolve_target

_S = TypeVar("_S", bound="Settings")


@dataclass
class Settings:
    """The project config (read once), --target-opt, and what is derived from them on use."""

    project: dict[str, Any] = field(default_factory=dict)
    target_opts: tuple[str, ...] = ()
    _registry: Any = None

    @classmethod
    def load(cls: type[_S], config_path: Path | None = None, **kw: Any) -> _S:
        from bundlerun.bundles.project_config import load_project_config  # start-up: loads tomli on use

        return cls(project=load_project_config(config_path) or {}, **kw)

    @property
    def registry(self):
        """The tolerance registry builds use: built-in data + these settings' [tolerances]."""
        if self._registry is None:
            from bundlerun.bundles.registry import project_registry  # start-up: loads tomli on use

            self._registry = project_registry(self.project)
        return self._registry

    def target_config(self, url: str | TargetURL) -> dict[str, Any]:
        """[targets.<family>] + [targets.<scheme>] of the project config, then --target-opt KEY=VALUE."""
        scheme = str(url).split("://", 1)[0].lower()
        family = scheme.split("+")[0]
        try:
            url = resolve_target(url)
            family = url.declared.name
        except BundlerunError:
            pass  # the run reports the bad URL itself
        tables = self.project.get("targets", {}) or {}
        section = dict(tables.get(family, {}) or {})
        if scheme != family:
            section.update(tables.get(scheme, {}) or {})
        for item in self.target_opts:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise ConfigError(f"--target-opt {item!r}: expected KEY=VALUE")
            section[key] = value
        inner: str | TargetConfig | None = None
        if isinstance(url, TargetConfig) and url.inner_url:
            try:
                inner = url.inner  # resolved once, kept by the wrapper's config
            except BundlerunError:
                inner = url.inner_url  # the wrapper reports its bad inner URL; its sections are read by scheme
        if inner:
            # a wrapper (ssh://HOST/<inner URL>, labgrid://PLACE/<inner URL>): the inner target's own
            # [targets.<inner>] section goes with it (--target-opt stays with the wrapper; inner
            # options go in the inner URL)
            inner_section = self._sections(inner)
            if inner_section:
                section["inner_config"] = inner_section
        return section

    def _sections(self, url: str | TargetURL) -> dict[str, Any]:
        """[targets.<family>] + [targets.<scheme>] of the project config for `url` (no --target-opt)."""
        saved, self.target_opts = self.target_opts, ()
        try:
            return self.target_config(url)
        finally:
            self.target_opts = saved
