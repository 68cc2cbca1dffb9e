"""Error types shared by every layer.

A `BundlerunError` is an expected failure caused by input or infrastructure
(bad file, missing tool, unreachable device). The CLI prints its message on one
line and exits with code 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class BundlerunError(Exception):
    """Expected failure with a one-line, user-facing message."""

    exit_code = 2


class BundleFormatError(BundlerunError):
    """The file is not a readable BundleIO program."""


class ModelSourceError(BundlerunError):
    """A model could not be found, imported or instantiated."""


class BuildError(BundlerunError):
    """Export, quantization or lowering failed."""


class TargetError(BundlerunError):
    """A target could not be reached, configured or driven."""


class ConfigError(BundlerunError):
    """A configuration value is invalid."""
