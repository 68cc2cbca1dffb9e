"""`--require-seal / --no-require-seal`: judge sealed bundles only.

A bundle's seal (bundles/integrity.py) records the sha256 of its program, of every test case and
of its manifest, and every reader checks them. A bundle without one (its `"integrity": {...}`
section blanked out, or a stock ExecuTorch BundledProgram) is read with a warning, because
nothing in it can show it was not edited; a CI lane should not accept that. So the commands that
judge (`run`, `validate`, `judge`, `farm`) refuse unsealed bundles when asked, and by default
whenever the `CI` environment variable is set to anything but empty, `0`, `false` or `no` (GitHub
Actions, GitLab CI, Buildkite, CircleCI, Travis and Jenkins' plugins set `CI=true`).
`--no-require-seal` judges them anyway, with the warning. docs/security.md says what the seal
does and does not protect against.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping

import click

META_KEY = "bundlerun.require_seal"
HELP = ("Refuse bundles without an integrity seal (default: on when $CI is set; --no-require-seal judges "
        "them anyway, with a warning).")


def ci_default(env: Mapping[str, str] | None = None) -> bool:
    """True when $CI says this is a CI job."""
    value = (os.environ if env is None else env).get("CI", "")
    return value.strip().lower() not in ("", "0", "false", "no", "off")


def _store(ctx: click.Context, _param: Any, value: bool | None) -> bool:
    chosen = ci_default() if value is None else bool(value)
    ctx.meta[META_KEY] = chosen
    return chosen


def option(f: Callable) -> Callable:
    """The option, stored in the click context (read back with `required()`)."""
    return click.option("--require-seal/--no-require-seal", "require_seal", default=None, expose_value=False,
                        callback=_store, help=HELP)(f)


def required() -> bool:
    """The running command's choice; outside a command (the Python API) the $CI default."""
    ctx = click.get_current_context(silent=True)
    while ctx is not None:
        if META_KEY in ctx.meta:
            return bool(ctx.meta[META_KEY])
        ctx = ctx.parent
    return ci_default()
