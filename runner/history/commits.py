"""Which commit a run belongs to: the label a run gets when it is given none.

First that is set: `$BUNDLERUN_COMMIT` (`off` turns detection off), a CI's commit variable
(GitHub Actions GITHUB_SHA, GitLab CI_COMMIT_SHA, Buildkite BUILDKITE_COMMIT, CircleCI
CIRCLE_SHA1, Travis TRAVIS_COMMIT, Jenkins GIT_COMMIT, Bitbucket BITBUCKET_COMMIT, AppVeyor
APPVEYOR_REPO_COMMIT, AWS CodeBuild CODEBUILD_RESOLVED_SOURCE_VERSION, Azure Pipelines
BUILD_SOURCEVERSION, Drone DRONE_COMMIT_SHA), then `git rev-parse HEAD` of the working tree
(with whether it has local changes). The commit's time (committer date, for ordering the HUD's
columns) comes from git when the commit is in the repository here. Read once per process.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "BUNDLERUN_COMMIT"
CI_VARS = ("GITHUB_SHA", "CI_COMMIT_SHA", "BUILDKITE_COMMIT", "CIRCLE_SHA1", "TRAVIS_COMMIT", "GIT_COMMIT",
           "BITBUCKET_COMMIT", "APPVEYOR_REPO_COMMIT", "CODEBUILD_RESOLVED_SOURCE_VERSION", "BUILD_SOURCEVERSION",
           "DRONE_COMMIT_SHA")
SHORT = 12  # label length: unique in any repository of a realistic size
_SHA = re.compile(r"[0-9a-fA-F]{7,64}\Z")


@dataclass(frozen=True)
class Commit:
    sha: str
    source: str  # "BUNDLERUN_COMMIT" | the CI variable | "git"
    time: str | None = None  # committer date, ISO-8601
    dirty: bool = False

    @property
    def label(self) -> str:
        return self.sha[:SHORT] if _SHA.match(self.sha) else self.sha


def looks_like_sha(text: str | None) -> bool:
    return bool(text) and bool(_SHA.match(str(text)))


def _git(args: list[str], cwd: Path | None) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=5,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


@functools.lru_cache(maxsize=256)
def commit_time(sha: str, cwd: Path | None = None) -> str | None:
    """Committer date of `sha` when the repository here has it (asked once per process)."""
    if not looks_like_sha(sha):
        return None
    return _git(["show", "-s", "--format=%cI", sha, "--"], cwd)


_CACHE: dict[tuple, Commit | None] = {}


def detect(env: dict[str, str] | None = None, cwd: str | Path | None = None) -> Commit | None:
    """The commit of this run, or None (not in a repository, no CI variable, or turned off)."""
    env = dict(os.environ if env is None else env)
    folder = Path(cwd or os.getcwd())
    key = (tuple((k, env.get(k)) for k in (ENV_VAR, *CI_VARS)), str(folder))
    if key in _CACHE:
        return _CACHE[key]
    found: Commit | None = None
    given = (env.get(ENV_VAR) or "").strip()
    if given.lower() in ("off", "none", "0", "false"):
        found = None
    elif given:
        found = Commit(given, ENV_VAR, commit_time(given, folder))
    else:
        var = next((v for v in CI_VARS if (env.get(v) or "").strip()), None)
        if var:
            sha = env[var].strip()
            found = Commit(sha, var, commit_time(sha, folder))
        else:
            sha = _git(["rev-parse", "HEAD"], folder)
            if sha:
                status = _git(["status", "--porcelain", "--untracked-files=no"], folder)
                found = Commit(sha, "git", commit_time(sha, folder), dirty=bool(status))
    _CACHE[key] = found
    return found
