"""Find the processes one test started, on a machine where other test runs start the same
programs: each test puts a unique tag in its environment, which every child inherits."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

TAG_VAR = "BUNDLERUN_TEST_PROC_TAG"


def new_tag() -> str:
    return uuid.uuid4().hex


def tagged(tag: str, needle: bytes) -> list[int]:
    """Live processes whose command line contains `needle` and whose environment carries `tag`."""
    found = []
    marker = f"{TAG_VAR}={tag}".encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if needle not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
            if marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.append(int(pid))
        except OSError:
            continue
    return found
