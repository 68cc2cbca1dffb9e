"""Seeded fuzzing of the bundle reader over a real sealed mlp bundle.

Every mutated file must either be refused with one clean one-line BundleError, or
read back as exactly the bundle that was sealed (same program, cases and criteria):
no internal error (TypeError, IndexError, struct.error, RecursionError...), and a
tampered program or criterion can never be read as valid. Each family runs >= 1,000
inputs in a few seconds.
"""

from __future__ import annotations

import copy
import json
import math
import random
import time

import pytest

from bundlerun.bundles.bpte import load_bundle, serialize_bundle
from bundlerun.bundles.errors import BundleError
from bundlerun.bundles.flatbuf import FlatReader, FlatTable
from bundlerun.bundles.integrity import case_digest, program_digest, seal
from bundlerun.bundles.manifest import CRITERIA_FIELDS

N = 1000
BUDGET_S = 30.0  # per family on a loaded 2-core CI machine; typically 1-3 s


@pytest.fixture(scope="module")
def sealed(bundle_cache):
    data = bundle_cache("mlp", cases=2).read_bytes()
    return data, load_bundle(data, "mlp.bpte")


class Outcome:
    def __init__(self) -> None:
        self.refused = self.accepted = 0
        self.started = time.perf_counter()

    def done(self, n: int) -> None:
        assert self.refused + self.accepted == n
        assert time.perf_counter() - self.started < BUDGET_S


def _check(data: bytes, original, outcome: Outcome, resealed: bool = False) -> None:
    """The fuzz invariant for one input."""
    try:
        bundle = load_bundle(data, "fuzz.bpte")
    except BundleError as exc:
        message = str(exc)
        assert message.startswith("fuzz.bpte: ") and "\n" not in message and len(message) < 1000, message
        outcome.refused += 1
        return
    outcome.accepted += 1
    if original.manifest is not None:
        assert bundle.manifest is not None, "a mutation stripped the manifest unnoticed"
        assert bundle.manifest_json["integrity"]["program"] == program_digest(bundle.program)
        for suite in bundle.method_test_suites:
            assert [case_digest(c) for c in suite.test_cases] == bundle.manifest_json["integrity"]["cases"][suite.method_name]
        for method in bundle.manifest_json["methods"].values():
            for out in method["outputs"]:
                crit = out["criteria"]
                values = [crit.get(k) for k in CRITERIA_FIELDS]
                assert all(v is None or (math.isfinite(v) and v >= 0) for v in values), crit
                assert crit.get("exact") or any(v is not None for v in values), crit
        if not resealed:  # an outside edit that still reads must have changed nothing that matters
            assert bundle.program == original.program and bundle.manifest_json == original.manifest_json
            for a, b in zip(bundle.method_test_suites, original.method_test_suites):
                assert [case_digest(c) for c in a.test_cases] == [case_digest(c) for c in b.test_cases]


def test_bit_flips(sealed):
    data, original = sealed
    rng, out = random.Random(1401), Outcome()
    for _ in range(N + 500):
        buf = bytearray(data)
        for _ in range(rng.choice((1, 1, 2, 4))):
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        _check(bytes(buf), original, out)
    out.done(N + 500)
    assert out.refused > N  # the program and manifest dominate the file: nearly every flip is caught


def test_bit_flips_and_cuts_read_from_a_file(sealed, tmp_path):
    """The reader `bundlerun run` uses (bundles/on_file.py: the file read into a writable buffer, each value
    kept as a span found by its address with ctypes): the same invariant, and an accepted file's values
    read back from their spans are the sealed ones."""
    from bundlerun.bundles.on_file import read_bundle_on_file

    data, original = sealed
    rng, out = random.Random(1404), Outcome()
    path = tmp_path / "fuzz.bpte"
    for i in range(N):
        buf = bytearray(data)
        if i % 4 == 3:
            del buf[rng.randrange(len(buf)):]
        for _ in range(rng.choice((1, 1, 2))):
            if buf:
                buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(buf))
        try:
            bundle = read_bundle_on_file(path)
        except BundleError as exc:
            message = str(exc)
            assert message.startswith(f"{path}: ") and "\n" not in message and len(message) < 1000, message
            out.refused += 1
            continue
        out.accepted += 1
        assert bundle.manifest_json == original.manifest_json and bundle.program == original.program
        for a, b in zip(bundle.method_test_suites, original.method_test_suites):
            assert [case_digest(c) for c in a.test_cases] == [case_digest(c) for c in b.test_cases]
    out.done(N)
    assert out.refused > N // 2


def test_bit_flips_in_a_stock_bundle_without_manifest(sealed):
    """No integrity to lean on here: only the parser's and the program check's robustness."""
    _, original = sealed
    stock = copy.deepcopy(original)
    stock.manifest_json = None
    data = serialize_bundle(stock)
    rng, out = random.Random(1402), Outcome()
    for _ in range(N):
        buf = bytearray(data)
        # aim at the structure (tables, vtables, offsets) outside the big program blob
        pos = rng.randrange(len(buf))
        buf[pos] ^= 1 << rng.randrange(8)
        _check(bytes(buf), stock, out)
    out.done(N)


def test_truncation(sealed):
    data, original = sealed
    rng, out = random.Random(1403), Outcome()
    cuts = [rng.randrange(len(data)) for _ in range(N)] + list(range(0, 64))
    for cut in cuts:
        _check(data[:cut], original, out)
    out.done(len(cuts))
    assert out.accepted == 0


def test_byte_range_overwrite(sealed):
    data, original = sealed
    rng, out = random.Random(1404), Outcome()
    for _ in range(N):
        buf = bytearray(data)
        start = rng.randrange(len(buf))
        length = rng.choice((1, 2, 4, 8, 64, 512))
        fill = rng.choice((b"\x00", b"\xff", None))
        chunk = (fill * length) if fill else bytes(rng.randrange(256) for _ in range(length))
        buf[start : start + length] = chunk[: len(buf) - start]
        _check(bytes(buf), original, out)
    out.done(N)


def _structure(data: bytes) -> tuple[list[int], list[int]]:
    """Positions of every vtable entry and every vector length word the reader visits."""
    reader = FlatReader(data, "walk")
    vtable_words: list[int] = []
    vector_lengths: list[int] = []

    def visit(tab: FlatTable) -> FlatTable:
        vtable_words.extend(range(tab.vtable, tab.vtable + tab.vtable_size, 2))
        return tab

    def vec(tab: FlatTable, slot: int) -> None:
        pos = tab.field(slot, 4)
        if pos:
            vector_lengths.append(reader.indirect(pos, "vector"))

    root = visit(reader.root("bundle"))
    for slot in (1, 2, 3):
        vec(root, slot)
    for suite in root.tables(1, "suites"):
        visit(suite)
        vec(suite, 0)
        vec(suite, 1)
        for case in suite.tables(1, "cases"):
            visit(case)
            for slot in (0, 1):
                vec(case, slot)
                for value in case.tables(slot, "values"):
                    inner = visit(value).table(1, "inner")
                    if inner is not None:
                        visit(inner)
                        for s in (1, 2, 3):
                            vec(inner, s)
    return sorted(set(vtable_words)), vector_lengths


def test_vtable_corruption(sealed):
    data, original = sealed
    words, _ = _structure(data)
    assert len(words) >= 16  # FlatBuffers shares identical vtables: few, but every table uses one
    rng, out = random.Random(1405), Outcome()
    for _ in range(N):
        buf = bytearray(data)
        pos = rng.choice(words)
        value = rng.choice((0, 1, 2, 3, 4, 5, 0xFFFF, 0x8000, rng.randrange(0x10000),
                            int.from_bytes(buf[pos:pos + 2], "little") + rng.choice((-4, -2, 2, 4))))
        buf[pos:pos + 2] = (value % 0x10000).to_bytes(2, "little")
        _check(bytes(buf), original, out)
    out.done(N)


def test_huge_and_wrong_vector_lengths(sealed):
    data, original = sealed
    _, lengths = _structure(data)
    assert len(lengths) > 10
    rng, out = random.Random(1406), Outcome()
    for _ in range(N):
        buf = bytearray(data)
        pos = rng.choice(lengths)
        old = int.from_bytes(buf[pos:pos + 4], "little")
        value = rng.choice((0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, len(data), len(data) // 4 + 1,
                            old + 1, max(old - 1, 0), old * 2 + 1, rng.randrange(1 << 32)))
        buf[pos:pos + 4] = value.to_bytes(4, "little")
        _check(bytes(buf), original, out)
    out.done(N)


_HOSTILE = [float("nan"), float("inf"), -float("inf"), None, -1, -1e-9, 0, "0.001", "", [], {}, [0.1], {"v": 1},
            True, False, 2**70, 1e308, "x" * 70_000, "[/x]\x1b[31m"]


def _paths(obj, prefix=()):
    """Every (container, key) in a JSON tree."""
    if isinstance(obj, dict):
        for key in list(obj):
            yield obj, key
            yield from _paths(obj[key], prefix + (key,))
    elif isinstance(obj, list):
        for i in range(len(obj)):
            yield obj, i
            yield from _paths(obj[i], prefix + (i,))


def _nest(depth: int):
    value: object = 1
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def _mutate_manifest(manifest: dict, rng: random.Random) -> dict:
    m = copy.deepcopy(manifest)
    for _ in range(rng.choice((1, 1, 2, 3))):
        slots = list(_paths(m))
        crit_slots = [(c, k) for c, k in slots if isinstance(c, dict) and k in CRITERIA_FIELDS + ("scale", "exact")]
        container, key = rng.choice(crit_slots if crit_slots and rng.random() < 0.5 else slots)
        action = rng.random()
        if action < 0.55:
            container[key] = rng.choice(_HOSTILE)
        elif action < 0.65:
            container[key] = _nest(rng.choice((31, 33, 60, 200)))
        elif action < 0.75 and isinstance(container, dict):
            del container[key]
        elif action < 0.85 and isinstance(container, dict):
            container[key + rng.choice(("x", "_", "s"))] = container.pop(key)  # a misspelled key
        elif isinstance(container[key], (int, float)) and not isinstance(container[key], bool):
            container[key] = container[key] * rng.choice((-1, 10, 0.5, 1e300))
        else:
            container[key] = rng.choice(_HOSTILE)
    return m


@pytest.mark.parametrize("reseal", [True, False], ids=["attacker-reseals", "outside-edit"])
def test_manifest_mutations(sealed, reseal):
    """Type confusion, NaN/Inf/null, negatives, unknown keys, deep nesting, huge strings.
    Re-sealed: the strict schema alone must hold. Not re-sealed: the manifest digest catches any change."""
    _, original = sealed
    rng, out = random.Random(1407 + reseal), Outcome()
    for _ in range(N):
        bundle = copy.copy(original)
        bundle.manifest_json = _mutate_manifest(original.manifest_json, rng)
        if reseal:
            bundle = seal(bundle)
        _check(serialize_bundle(bundle), original, out, resealed=reseal)
    out.done(N)
    if not reseal:
        assert out.accepted <= N // 20  # only no-op mutations (e.g. x * 1 on a value) may read back
    else:
        assert out.refused > N // 2


def test_manifest_text_byte_flips(sealed):
    """Flips inside the manifest's JSON text: bad JSON, bad schema or a digest mismatch, never a new criterion."""
    data, original = sealed
    text = json.dumps(original.manifest_json, sort_keys=True, separators=(",", ":")).encode()
    start = data.find(text)
    assert start > 0
    rng, out = random.Random(1408), Outcome()
    for _ in range(N):
        buf = bytearray(data)
        pos = start + rng.randrange(len(text))
        buf[pos] = rng.choice((buf[pos] ^ (1 << rng.randrange(8)), ord(rng.choice('0123456789.-e"{}[],:NIn'))))
        _check(bytes(buf), original, out)
    out.done(N)
    assert out.accepted <= N // 50
