"""Find the processes one test started, on a machine where other test runs start the same
programs: each test puts a unique tag in its environment, which every child inherits."""

from __future__ import annotations

import os
import time
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


def mine(needle: bytes) -> list[int]:
    """Live processes of the running test (tests/conftest.py tags each test) whose command line
    contains `needle`: a "nothing left running" check that other test runs cannot disturb."""
    return tagged(os.environ[TAG_VAR], needle)


def settled(probe, within_s: float = 30.0):
    """`probe()` until it returns something empty (the processes are gone) or `within_s` passes;
    its last value. A condition, not a guess of how fast the machine reaps: usually at once."""
    deadline = time.monotonic() + within_s
    while (left := probe()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left
