"""Error types shared by every layer.

A `BundlerunError` is an expected failure caused by input or infrastructure
(bad file, missing tool, unreachable device). The CLI prints its message on one
line and exits with code 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class BundlerunError(Exception):
    """Expected failure with a one-line, user-facing message. `kind` names the class of refusal,
    the same from the CLI and from `bundlerun.api` (docs/api.md lists them)."""

    exit_code = 2
    kind = "error"


class BundleError(BundlerunError):
    """A bundle is unreadable, inconsistent or tampered with: never run, never judged.

    Every reader (`inspect`, `run`, `judge`, targets) gets this one class from
    `bundles.bpte.read_bundle`; the message is one line naming the file and the cause.
    """

    kind = "bad-bundle"


# The historical name: every `except BundleFormatError` also catches the subclasses below.
BundleFormatError = BundleError


class ManifestError(BundleError):
    """The embedded manifest breaks its schema (type, range, unknown key, no criterion)."""


class IntegrityError(BundleError):
    """The program, a test case or the manifest changed after the bundle was sealed."""


class ModelSourceError(BundlerunError):
    """A model could not be found, imported or instantiated."""

    kind = "bad-model"


class BuildError(BundlerunError):
    """Export, quantization or lowering failed."""

    kind = "build-failed"


class TargetError(BundlerunError):
    """A target could not be reached, configured or driven. `kind` is the report's
    error_kind for every case it stops (targets.failures): a missing tool by default,
    "unsupported" when this target cannot run this bundle."""

    def __init__(self, message: str, kind: str = "tool-missing"):
        super().__init__(message)
        self.kind = kind


class ConfigError(BundlerunError):
    """A configuration value (an option, an argument of bundlerun.api, a config file) is invalid."""

    kind = "bad-config"
