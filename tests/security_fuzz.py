"""Seeded mutations of the files bundlerun reads back, and a driver that runs the real CLI on them.

Used by tests/test_security_readers.py. The driver is a real process (`python security_fuzz.py
CASES.json`) that calls the `bundlerun` entry point (`runner.cli.main`) once per case and prints
one JSON line per case: exit code, stdout, stderr. One process for many inputs keeps a few
hundred runs within the CI budget; the per-item tests run the console script itself.
"""

from __future__ import annotations

import copy
import io
import json
import random
import sqlite3
import struct
import sys
import zipfile
from pathlib import Path
from typing import Any

# Values a hostile or corrupted file puts where another type belongs.
VALUES: list[Any] = [None, True, False, 0, -1, 7, 2**31, 2**63, 10**400, -1e308, 1.5, float("nan"), float("inf"), "",
                     "x", "inf", "nan", "PASS", "FAIL", "[red]x[/red]\n\u202e\x1b[2J", "a" * 3000, [], [1, "a"], {},
                     {"a": 1}, [[[[[[]]]]]], {"verdict": "PASS"}]


def _paths(obj: Any, prefix: tuple = (), limit: int = 6) -> list[tuple]:
    out, stack = [], [(obj, prefix)]
    while stack:
        value, path = stack.pop()
        if path:
            out.append(path)
        if isinstance(value, dict):
            stack.extend((v, path + (k,)) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, path + (i,)) for i, v in enumerate(value[:limit]))
    return out


def mutate_json(doc: Any, rng: random.Random, edits: int = 1) -> tuple[Any, list[str]]:
    """`doc` with `edits` random edits (a value replaced by one of VALUES, a key deleted, a list
    emptied or truncated); returns the new document and what was done."""
    doc = copy.deepcopy(doc)
    done = []
    for _ in range(edits):
        paths = _paths(doc)
        if not paths:
            break
        path = rng.choice(sorted(paths, key=repr))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        op = rng.random()
        if op < 0.15 and isinstance(parent, dict):
            del parent[path[-1]]
            done.append(f"del {path}")
        elif op < 0.25 and isinstance(parent[path[-1]], list):
            parent[path[-1]] = parent[path[-1]][: rng.randrange(0, max(1, len(parent[path[-1]])))]
            done.append(f"cut {path}")
        else:
            value = copy.deepcopy(rng.choice(VALUES))
            parent[path[-1]] = value
            done.append(f"set {path} = {repr(value)[:40]}")
    return doc, done


def _npy(dtype: str, shape: tuple, data: bytes, header_extra: str = "") -> bytes:
    head = f"{{'descr': '{dtype}', 'fortran_order': False, 'shape': {shape}, {header_extra}}}".encode()
    pad = 64 - (10 + len(head) + 1) % 64
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head) + pad + 1) + head + b" " * pad + b"\n" + data


def mutate_npz(src: bytes, keys: list[str], rng: random.Random) -> tuple[bytes, str]:
    """A damaged or hostile outputs.npz made from the real one `src` (members `keys`)."""
    kind = rng.choice(["flip", "truncate", "garbage", "empty", "dtype", "object", "shape", "bomb", "extra", "dup",
                       "header", "fortran", "negative"])
    if kind == "flip":
        data = bytearray(src)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return bytes(data), kind
    if kind == "truncate":
        return src[: rng.randrange(len(src))], kind
    if kind == "garbage":
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 200))), kind
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        key = rng.choice(keys)
        if kind == "empty":
            pass
        elif kind == "dtype":
            zf.writestr(key + ".npy", _npy("<f8", (1, 10), b"\0" * 80))
        elif kind == "object":
            zf.writestr(key + ".npy", _npy("|O", (1,), b"\0" * 8))
        elif kind == "shape":
            zf.writestr(key + ".npy", _npy("<f4", (100000, 10), b"\0" * 40))
        elif kind == "bomb":  # inflates to 256 MiB from ~260 KB
            with zf.open(key + ".npy", "w", force_zip64=True) as fh:
                fh.write(_npy("<f4", (1, 1 << 26), b""))
                for _ in range(16):
                    fh.write(b"\0" * (1 << 24))
        elif kind == "extra":
            zf.writestr("forward/99999999/0.npy", _npy("<f4", (1, 10), b"\0" * 40))
        elif kind == "dup":
            zf.writestr(key + ".npy", _npy("<f4", (1, 10), b"\0" * 40))
            zf.writestr(key + ".npy", _npy("<f4", (1, 10), b"\0" * 40))
        elif kind == "header":
            zf.writestr(key + ".npy", b"\x93NUMPY\x01\x00\xff\xff" + b"{" * 200)
        elif kind == "fortran":
            zf.writestr(key + ".npy", _npy("<f4", (1, 10), b"\0" * 40).replace(b"False", b"True "))
        elif kind == "negative":
            zf.writestr(key + ".npy", _npy("<f4", (-1, 10), b"\0" * 40))
    return buf.getvalue(), kind


def corrupt_history(db: Path, rng: random.Random) -> str:
    """One corruption of a real history database's content (its file stays a valid SQLite file)."""
    table, column = rng.choice([("runs", "report_json"), ("runs", "report_json"), ("runs", "started"),
                                ("runs", "verdict"), ("runs", "exit_code"), ("runs", "n_pass"), ("runs", "model"),
                                ("runs", "label"), ("case_outputs", "sqnr"), ("case_outputs", "error_mae"),
                                ("perf_figures", "value"), ("perf_figures", "phase"), ("datasets", "top1"),
                                ("runs", "status"), ("runs", "inputs_sha256"), ("runs", "criteria_sha256")])
    value = rng.choice(["[1,2]", "{not json", "null", "5", "abc", "", "1e999", "-inf", "\u202e", b"\xff\xfe",
                        3.5, 7, None, '{"schema": "bundlerun.report/2", "summary": []}',
                        '{"schema": "bundlerun.report/2", "summary": {"verdict": "PASS", "exit_code": 0, '
                        '"counts": {}}, "cases": "x"}'])
    conn = sqlite3.connect(str(db))
    try:
        if table == "datasets":
            conn.execute("INSERT OR REPLACE INTO datasets (run_id, name, top1) VALUES (1, 'd', ?)", (value,))
        else:
            key = "id" if table == "runs" else "run_id"
            conn.execute(f"UPDATE {table} SET {column} = ? WHERE {key} = 1", (value,))
        conn.commit()
    finally:
        conn.close()
    return f"{table}.{column} = {repr(value)[:40]}"


def run_main(*argv: str) -> tuple[Any, str, str]:
    """bundlerun's entry point (runner.cli.main) in this process: (exit code, stdout, stderr).
    For hostile inputs by the hundred, where a process each would cost minutes."""
    import contextlib

    from bundlerun.runner.cli import main

    out, err = io.StringIO(), io.StringIO()
    code: Any = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(argv))
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def drive(cases: list[dict[str, Any]]) -> None:
    """Run each case's argv through bundlerun's entry point; one JSON result line per case."""
    import contextlib

    from bundlerun.runner.cli import main

    for case in cases:
        out, err = io.StringIO(), io.StringIO()
        code: Any = None
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(list(case["argv"]))
            except SystemExit as exc:
                code = exc.code
            except BaseException as exc:  # noqa: BLE001 - recorded: the test fails on it
                code = f"raised {type(exc).__name__}: {exc}"
        print(json.dumps({"id": case["id"], "code": code, "stdout": out.getvalue()[-4000:],
                          "stderr": err.getvalue()[-4000:]}), flush=True)


if __name__ == "__main__":
    drive(json.loads(Path(sys.argv[1]).read_text()))
