"""Issue 33: files bundlerun takes from outside (golden folders, a restored runner cache, an ICD
json, a farm plan) never hang, exhaust or crash it, and never lead it outside their folder.

Generated hostile inputs, seeded (tests/security_fuzz.py's values and JSON mutations): FIFOs,
links to /dev/zero and out of the folder, sparse files of gigabytes, trees 1,100 folders deep,
wrong sizes, garbage bytes, every runner.json field with every wrong type. The many generated cases
are in-process calls of the readers; a few go end to end through the real CLI in a fresh process.
Each asserts: one line, the right exit code or error class, no traceback / "internal error", no
hang (pytest-timeout), and nothing from outside the folder in a bundle. No doubles: the golden
program is a real ExecuTorch program (the portable mlp bundle's).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import security_fuzz  # noqa: E402

from bundlerun.bundles.errors import BundlerunError, ConfigError  # noqa: E402
from bundlerun.bundles.safe_read import (  # noqa: E402
    UnsafeFileError,
    load_json_bounded,
    loads_json_bounded,
    read_bounded,
    walk_files,
)

SEED = 33  # the number: every run sees the same inputs
SECRET = b"OUTSIDE-SECRET-"  # bytes of a file outside the folder: never in a bundle
GIB = 1 << 30


def _cli(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """The real CLI in a fresh process (python -m bundlerun.runner.cli), bounded in time."""
    return subprocess.run([sys.executable, "-m", "bundlerun.runner.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


def _clean(text: str) -> None:
    assert "Traceback" not in text and "internal error" not in text, text[-2000:]


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert text and "\n" not in text, repr(text)
    return text


def _deep_tree(root: Path, depth: int) -> Path:
    """`depth` nested folders under root, made without recursion (os.makedirs recurses). The
    caller removes them with `_remove_tree`: pytest's own cleanup of old temp folders (shutil.rmtree,
    recursive) would fail on them, in every later session on this machine."""
    here = root
    for _ in range(depth):
        here = here / "d"
        os.mkdir(here)
    return here


def _remove_tree(top: Path) -> None:
    """rm -r without recursion: files first, then folders deepest first."""
    folders, stack = [], [str(top)]
    while stack:
        folder = stack.pop()
        folders.append(folder)
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                else:
                    os.unlink(entry.path)
    for folder in reversed(folders):
        os.rmdir(folder)


# ------------------------------------------------------------------ the reader itself


@pytest.mark.timeout(60)
def test_the_bounded_reader_refuses_what_is_not_a_small_regular_file_inside(tmp_path):
    inside_dir = tmp_path / "in"
    inside_dir.mkdir()
    (tmp_path / "outside.txt").write_bytes(SECRET)
    (inside_dir / "ok.json").write_text('{"a": [1, 2.5, "x"]}')
    os.mkfifo(inside_dir / "fifo")
    (inside_dir / "zero").symlink_to("/dev/zero")
    (inside_dir / "escape").symlink_to(tmp_path / "outside.txt")
    (inside_dir / "near").symlink_to("ok.json")  # a link that stays inside: allowed
    (inside_dir / "folder").mkdir()
    with open(inside_dir / "sparse", "wb") as fh:
        fh.truncate(6 * GIB)
    assert load_json_bounded(inside_dir / "near", 100, root=inside_dir) == {"a": [1, 2.5, "x"]}
    cases = {"fifo": "a FIFO, not a regular file", "zero": "outside", "escape": "outside", "folder": "a folder",
             "sparse": "6442450944 bytes; bundlerun reads at most", "missing": "missing"}
    for name, why in cases.items():
        with pytest.raises(UnsafeFileError) as info:
            read_bounded(inside_dir / name, 1 << 20, root=inside_dir)
        assert _one_line(info.value).startswith(f"{inside_dir / name}: ") and why in str(info.value)
    for device in ("/dev/zero", "/dev/null"):
        with pytest.raises(UnsafeFileError, match="character device"):
            read_bounded(device, 1 << 20)
    with pytest.raises(UnsafeFileError, match="a symlink, not followed"):
        read_bounded(inside_dir / "near", 100, follow=False)
    with pytest.raises(UnsafeFileError, match="expected 4 for the x"):
        read_bounded(inside_dir / "ok.json", 100, exact=4, what="for the x")


@pytest.mark.timeout(60)
def test_hostile_json_is_one_line_never_a_crash():
    rng = random.Random(SEED)
    texts = ["[" * 100_000 + "]" * 100_000, '{"a":' * 5000 + "1" + "}" * 5000, "[1e999]", "[-1e400]", "[NaN]",
             "[Infinity]", "[-Infinity]", "1" * 5000, "[" + "9" * 30 + "]", '"' + "a" * (2 << 20) + '"', "",
             "{", "\xff", '{"a": "\\ud800"}', '["\\u0000"]']
    texts += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))).decode("latin-1") for _ in range(200)]
    refused = 0
    for text in texts:
        try:
            value = loads_json_bounded(text.encode("utf-8", "surrogatepass"), "x.json")
        except UnsafeFileError as exc:
            assert _one_line(exc).startswith("x.json: ")
            refused += 1
            continue
        json.dumps(value, allow_nan=False)  # what was accepted is finite JSON
    assert refused >= 12  # every hand-written hostile text but the two harmless strings


@pytest.mark.timeout(60)
def test_the_walk_is_bounded_in_depth_and_never_enters_linked_folders(tmp_path):
    (tmp_path / "deep").mkdir()
    try:
        (_deep_tree(tmp_path / "deep", 1100) / "x.pte").write_bytes(b"x")
        with pytest.raises(UnsafeFileError, match="folders nested deeper than 64 levels") as info:
            list(walk_files(tmp_path / "deep"))
    finally:
        _remove_tree(tmp_path / "deep")
    _one_line(info.value)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.pte").write_bytes(SECRET)
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "link").symlink_to(tmp_path / "outside")
    (tmp_path / "tree" / "loop").symlink_to(tmp_path / "tree")
    assert sorted(p.name for p in walk_files(tmp_path / "tree")) == ["link", "loop"]  # listed, never entered


# ------------------------------------------------------------------ golden folders


@pytest.fixture(scope="module")
def golden(bundle_cache, tmp_path_factory) -> dict:
    """A real golden: the portable mlp program, its input and its expected output, as the suite writes them."""
    from bundlerun.bundles.bpte import read_bundle

    bundle = read_bundle(bundle_cache("mlp", cases=1, backend="portable", target="host://portable"))
    case = bundle.method_test_suites[0].test_cases[0]
    return {"mlp.pte": bundle.program, "mlp_input.bin": case.inputs[0].data,
            "mlp_expected_output.bin": case.expected_outputs[0].data}


def _flow(root: Path, name: str, files: dict[str, bytes]) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    for file, data in files.items():
        (folder / file).write_bytes(data)
    return folder


def _hostile_flows(root: Path, golden: dict, outside: Path) -> dict[str, str]:
    """One flow folder per hostile golden under root; flow -> what its one error line must say."""
    want = {}

    def flow(name: str, why: str) -> Path:
        want[name] = why
        return _flow(root, name, golden)

    os.unlink(flow("fifo_pte", "a FIFO, not a regular file") / "mlp.pte")
    os.mkfifo(root / "fifo_pte" / "mlp.pte")
    os.unlink(flow("fifo_bin", "a FIFO, not a regular file") / "mlp_input.bin")
    os.mkfifo(root / "fifo_bin" / "mlp_input.bin")
    os.unlink(flow("zero_pte", "resolves to /dev/zero, outside") / "mlp.pte")
    (root / "zero_pte" / "mlp.pte").symlink_to("/dev/zero")
    with open(flow("sparse_bin", "6442450944 bytes, expected 128") / "mlp_input.bin", "wb") as fh:
        fh.truncate(6 * GIB)
    with open(flow("sparse_pte", f"bytes; bundlerun reads at most {2**31 - 1}") / "mlp.pte", "wb") as fh:
        fh.truncate(3 * GIB)
    secret = outside / "secret.bin"
    secret.write_bytes((SECRET * 100)[:len(golden["mlp_input.bin"])])  # exactly the size the input needs
    os.unlink(flow("escape_bin", "outside") / "mlp_input.bin")
    (root / "escape_bin" / "mlp_input.bin").symlink_to(secret)
    flow("short_bin", "bytes, expected 40 for the program's float32[1, 10] tensor")
    (root / "short_bin" / "mlp_expected_output.bin").write_bytes(b"\0" * 7)
    flow("garbage_pte", "not an ExecuTorch program")
    (root / "garbage_pte" / "mlp.pte").write_bytes(b"PK\x03\x04" + bytes(range(256)))
    return want


@pytest.mark.timeout(120)
def test_import_goldens_end_to_end_refuses_each_hostile_golden_by_name(golden, tmp_path):
    root, outside = tmp_path / "g", tmp_path / "outside"
    outside.mkdir()
    _flow(root, "portable", golden)  # the intact one is imported
    want = _hostile_flows(root, golden, outside)
    res = _cli("import-goldens", str(root), "-o", str(tmp_path / "out"))
    _clean(res.stdout + res.stderr)
    assert res.returncode == 2, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == len(want), res.stderr
    for flow, why in want.items():
        assert any(line.startswith(f"error: {root / flow}/") and why in line for line in errors), (flow, res.stderr)
    assert f"imported 1 of {len(want) + 1} golden(s)" in res.stdout
    built = list((tmp_path / "out").rglob("*.bpte"))
    assert [p.parent.name for p in built] == ["portable"]
    assert SECRET not in built[0].read_bytes()


@pytest.mark.timeout(60)
def test_import_goldens_of_a_tree_1100_folders_deep_is_one_line(tmp_path):
    (tmp_path / "deep").mkdir()
    try:
        (_deep_tree(tmp_path / "deep", 1100) / "x.pte").write_bytes(b"x")
        res = _cli("import-goldens", str(tmp_path / "deep"), "-o", str(tmp_path / "out"))
    finally:
        _remove_tree(tmp_path / "deep")
    _clean(res.stdout + res.stderr)
    assert res.returncode == 2 and "folders nested deeper than 64 levels" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.timeout(120)
def test_generated_hostile_golden_folders_in_process(golden, tmp_path):
    """Hundreds of goldens: mutated programs, wrong sizes, files replaced by what is not a file.
    read_golden gives the arrays or one GoldenError-class line naming a file in the folder."""
    from bundlerun.bundles.goldens import find_goldens, read_golden

    rng = random.Random(SEED)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.bin").write_bytes((SECRET * 100)[:128])
    program = golden["mlp.pte"]
    counts = {"ok": 0, "refused": 0}
    for i in range(300):
        root = tmp_path / f"g{i}"
        files = dict(golden)
        op = rng.randrange(6)
        if op == 0:  # a mutated program: bytes flipped, cut or grown
            data = bytearray(program)
            for _ in range(rng.randrange(1, 8)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            files["mlp.pte"] = bytes(data[: rng.choice([len(data), rng.randrange(len(data))])])
        elif op == 1:  # wrong sizes
            key = rng.choice(["mlp_input.bin", "mlp_expected_output.bin"])
            files[key] = files[key][: rng.randrange(len(files[key]))] + os.urandom(rng.randrange(3))
        elif op == 2:  # garbage everywhere
            files = {k: os.urandom(rng.randrange(0, 300)) for k in files}
        folder = _flow(root, "flow", files)
        victim = folder / rng.choice(sorted(files))
        if op == 3:
            victim.unlink()
            os.mkfifo(victim)
        elif op == 4:
            victim.unlink()
            victim.symlink_to(rng.choice(["/dev/zero", "/dev/urandom", str(outside / "secret.bin"),
                                          str(tmp_path / "absent")]))
        elif op == 5:
            with open(victim, "r+b") as fh:
                fh.truncate(rng.choice([3, 5, 7]) * GIB)
        try:
            goldens, problems = find_goldens(root)
            assert not problems and len(goldens) == 1
            _, inputs, outputs = read_golden(goldens[0])
        except BundlerunError as exc:
            assert _one_line(exc).startswith(str(root)), str(exc)
            counts["refused"] += 1
            continue
        assert all(SECRET not in a.tobytes() for a in inputs + outputs)
        counts["ok"] += 1
    assert counts["refused"] >= 150 and counts["ok"] >= 20, counts  # both paths exercised


# ------------------------------------------------------------------ the runner cache


def _runner_entry(cache: Path, key: str = "0123456789abcdef0123", **fields) -> Path:
    folder = cache / "runners" / key
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "executor_runner").write_bytes(b"#!/bin/sh\nexit 0\n")
    (folder / "executor_runner").chmod(0o755)
    record = {"kind": "mlx_executor_runner", "arch": "x86_64", "binary": str(folder / "executor_runner"),
              "kernels": ["portable"], "backends": ["mlx"], "flags": [], "patches": [],
              "mlx": {"version": "0.29", "library": str(folder / "mlx" / "lib" / "libmlx.so")},
              "sources": {"path": str(cache / "src" / "x"), "fingerprint": "abc"}, "built_at": "2026-12-03T00:00:00Z",
              "build_seconds": 100, "jobs": 2, "static": False, "etdump": True, **fields}
    (folder / "runner.json").write_text(json.dumps(record))
    return folder


def _readers(kind: str) -> None:
    """Every reader of the cache a target, `doctor` or `run` goes through (no process started)."""
    from bundlerun.targets import mlx_runner, qemu_user
    from bundlerun.targets.arm import qemu as arm_qemu
    from bundlerun.targets.runner_cache import cached_runners, find_runner

    for record in cached_runners(kind):
        assert Path(record["elf" if kind == "arm-qemu" else "binary"]).is_absolute()  # required, made absolute
    find_runner(kind, "binary", arch="x86_64")
    mlx_runner.cached_mlx_runners()
    qemu_user.cached_runner("aarch64")
    qemu_user.cached_runner("x86_64")
    arm_qemu.pick_cached_runner({"aten::add.out"}, "semihosting")


@pytest.mark.timeout(120)
def test_generated_runner_entries_are_trusted_only_when_whole(tmp_path, monkeypatch):
    """Every field with every wrong value (security_fuzz.VALUES), random mutations of whole records,
    for the four kinds: the readers return a typed record naming only files inside the entry, or
    one RunnerEntryError line with the rebuild command. Never another exception."""
    from bundlerun.targets.runner_cache import EXECUTED, FIELDS, RunnerEntryError, read_record

    rng = random.Random(SEED)
    cache = tmp_path / "cache"
    monkeypatch.setenv("BUNDLERUN_CACHE", str(cache))
    base = json.loads((_runner_entry(cache) / "runner.json").read_text())
    variants = []
    for kind in ("mlx_executor_runner", "executor_runner", "debug_runner", "arm-qemu"):
        for key in [k for k in FIELDS if "." not in k] + ["mlx", "flags"]:
            for value in security_fuzz.VALUES:
                variants.append((kind, {**base, "kind": kind, key: value}))
        for _ in range(60):
            doc, _ = security_fuzz.mutate_json({**base, "kind": kind, "flags": {"fault": "none"} if
                                                kind == "arm-qemu" else []}, rng, rng.randrange(1, 4))
            variants.append((kind, doc))
    counts = {"ok": 0, "damaged": 0}
    for i, (kind, doc) in enumerate(variants):
        folder = cache / "runners" / "0123456789abcdef0123"
        (folder / "runner.json").write_text(json.dumps(doc))  # NaN, Infinity and 10**400 written as Python does
        try:
            record = read_record(folder)
            _readers(kind)
        except RunnerEntryError as exc:
            text = _one_line(exc)
            assert text.startswith(f"runner entry damaged: {folder}/runner.json: ") and "; rebuild with " in text
            counts["damaged"] += 1
            continue
        assert record is not None and record["dir"] == str(folder)
        for key in EXECUTED:
            parent = record
            for part in key.split("."):
                parent = parent.get(part) if isinstance(parent, dict) else None
            if parent is not None:
                assert Path(os.path.realpath(parent)).is_relative_to(os.path.realpath(folder)), (i, key, parent)
        counts["ok"] += 1
    assert counts["damaged"] > len(variants) // 2 and counts["ok"] > 20, counts


@pytest.mark.timeout(60)
def test_runner_entries_that_name_files_outside_or_are_not_files(tmp_path, monkeypatch):
    from bundlerun.targets.runner_cache import RunnerEntryError, find_runner, read_record

    cache = tmp_path / "cache"
    monkeypatch.setenv("BUNDLERUN_CACHE", str(cache))
    folder = _runner_entry(cache)
    (tmp_path / "evil").write_bytes(b"#!/bin/sh\n")
    (folder / "linked").symlink_to(tmp_path / "evil")
    outside = {"dotdot": str(folder / ".." / ".." / ".." / "evil"), "absolute": "/bin/true",
               "relative": "../../../evil", "link": str(folder / "linked"),
               "stale old root": f"{tmp_path}/old-cache/runners/ffffffffffffffffffff/executor_runner"}
    for what, binary in outside.items():
        _runner_entry(cache, binary=binary)
        with pytest.raises(RunnerEntryError, match="binary .* lies outside the entry") as info:
            find_runner("mlx_executor_runner", "binary", arch="x86_64")
        assert "rebuild with bash firmware_scripts/mlx/build_mlx_runner.sh --rebuild" in _one_line(info.value), what
    _runner_entry(cache, binary="executor_runner")  # relative to the entry: its own file
    assert read_record(folder)["binary"] == str(folder / "executor_runner")
    _runner_entry(cache, binary=f"{tmp_path}/old-cache/runners/{folder.name}/executor_runner")  # moved: still works
    assert find_runner("mlx_executor_runner", "binary", arch="x86_64") == folder / "executor_runner"
    meta = folder / "runner.json"
    for setup, why in ((lambda: os.mkfifo(meta), "a FIFO"), (lambda: meta.symlink_to("/dev/zero"), "outside"),
                       (lambda: meta.write_text("[" * 5000 + "]" * 5000), "nested deeper"),
                       (lambda: open(meta, "wb").truncate(GIB), "bytes; bundlerun reads at most")):
        meta.unlink()
        setup()
        with pytest.raises(RunnerEntryError, match=why) as info:
            read_record(folder)
        _one_line(info.value)
    # a damaged entry of another kind is left to its own target; one in progress (<key>.partial) is not an entry
    meta.unlink()
    _runner_entry(cache, kind="arm-qemu", elf="/bin/true")
    _runner_entry(cache, key="1111111111aaaaaaaaaa.partial", mlx="x")
    assert find_runner("mlx_executor_runner", "binary", arch="x86_64") is None


@pytest.mark.timeout(180)
def test_a_damaged_runner_cache_end_to_end(tmp_path, bundle_cache):
    """doctor with a FIFO runner.json finishes; `run` on mlx:// with "mlx": "x" and on qemu-user://
    with "kernels": [1, null] is exit 2 with the one line, not an internal error."""
    bundle = bundle_cache("mlp", cases=1, backend="portable", target="host://portable")
    cache = tmp_path / "cache"
    env = {"BUNDLERUN_CACHE": str(cache)}
    folder = _runner_entry(cache)
    (folder / "runner.json").unlink()
    os.mkfifo(folder / "runner.json")
    res = _cli("doctor", env=env, timeout=120)
    _clean(res.stdout + res.stderr)
    assert res.returncode in (0, 1, 2) and "runner entry damaged" in res.stdout.replace("\n", " ") + res.stderr
    (folder / "runner.json").unlink()
    for url, fields in (("mlx://cpu?runtime=delegate", {"mlx": "x"}),
                        ("qemu-user://aarch64", {"kind": "executor_runner", "arch": "aarch64", "kernels": [1, None]})):
        _runner_entry(cache, **fields)
        res = _cli("run", str(bundle), "--target", url, "--no-history", "--report", str(tmp_path / "r"), env=env)
        _clean(res.stdout + res.stderr)
        assert res.returncode == 2, res.stdout + res.stderr
        assert f"runner entry damaged: {folder}/runner.json: " in res.stdout + res.stderr, res.stdout + res.stderr


# ------------------------------------------------------------------ runner binaries, ICD json, shader cache


@pytest.mark.timeout(60)
def test_a_runner_binary_that_cannot_start_is_said_as_such(tmp_path):
    from bundlerun.bundles.errors import TargetError
    from bundlerun.targets.runner_cache import runner_binary

    plain = tmp_path / "plain"
    plain.write_bytes(b"x")
    plain.chmod(0o644)
    for path, why in ((tmp_path / "absent", "missing"), ("relative/absent", "missing"), (tmp_path, "not a regular file")):
        with pytest.raises(TargetError, match=f"runner binary .* {why}; hint") as info:
            runner_binary(path, "the X", "hint")
        assert "could not write" not in _one_line(info.value)
    if os.geteuid() != 0:  # root may execute a file without x bits' checks only when some x bit is set
        with pytest.raises(TargetError, match="not executable"):
            runner_binary(plain, "the X", "hint")
    assert runner_binary(plain, "the X", "hint", executable=False) == plain


@pytest.mark.timeout(120)
def test_vulkan_runner_and_icd_that_are_not_files_end_to_end(tmp_path, bundle_cache):
    bundle = bundle_cache("mlp", cases=1, backend="portable", target="host://portable")
    env = {"BUNDLERUN_CACHE": str(tmp_path / "cache")}
    fake = tmp_path / "not-a-program"
    fake.write_bytes(b"\x00\x01 not an executable")
    fake.chmod(0o755)
    cases = [(["runner=relative/executor_runner"], "runner binary relative/executor_runner"),
             ([f"runner={fake}"], f"runner binary {fake} cannot be started: Exec format error"),
             ([f"runner={fake}", "icd=/dev/zero"], "/dev/zero: a character device, not a regular file")]
    for opts, said in cases:
        args = [a for o in opts for a in ("--target-opt", o)]
        res = _cli("run", str(bundle), "--target", "vulkan://lavapipe", *args, "--no-history",
                   "--report", str(tmp_path / "r"), env=env)
        _clean(res.stdout + res.stderr)
        assert res.returncode == 2 and said in res.stdout + res.stderr, res.stdout + res.stderr
        assert "could not write the run's files" not in res.stderr + res.stdout


@pytest.mark.timeout(60)
def test_generated_icd_jsons_are_one_reason_never_a_crash(tmp_path):
    from bundlerun.targets.vulkan import icd_library

    rng = random.Random(SEED)
    good = {"file_format_version": "1.0.0", "ICD": {"library_path": "libvulkan_lvp.so", "api_version": "1.3.0"}}
    paths = []
    for i in range(200):
        doc, _ = security_fuzz.mutate_json(good, rng, rng.randrange(1, 3))
        path = tmp_path / f"icd{i}.json"
        path.write_text(json.dumps(doc))
        paths.append(path)
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    (tmp_path / "deep.json").write_text("[" * 100_000)
    with open(tmp_path / "sparse.json", "wb") as fh:
        fh.truncate(8 * GIB)
    hostile = [tmp_path / n for n in ("fifo.json", "zero.json", "deep.json", "sparse.json", "absent.json")]
    usable = 0
    for path in paths + hostile + [Path("/dev/zero"), tmp_path]:
        lib, why = icd_library(path)
        assert (lib is None) == bool(why) and "\n" not in why
        usable += lib is not None
    assert all(icd_library(p)[0] is None for p in hostile)
    assert 0 < usable < len(paths)


@pytest.mark.timeout(60)
def test_a_plan_cannot_place_the_shader_cache(tmp_path):
    from bundlerun.bundles.toml_read import loads_toml
    from bundlerun.runner.farm.plan import parse_plan

    target = tmp_path / "made-by-a-plan"
    plans = [f'targets = ["vulkan://lavapipe?shader_cache={target}"]',
             f'targets = [{{url = "vulkan://lavapipe", options = {{shader_cache = "{target}"}}}}]',
             f'targets = [{{url = "vulkan://lavapipe", options = {{shader-cache = "{target}"}}}}]',
             f'targets = ["pool:p"]\n[pools.p]\ndevices = ["vulkan://lavapipe"]\noptions = {{shader_cache = "{target}"}}',
             f'targets = ["ssh://lab/vulkan://lavapipe?shader_cache={target}"]']
    for text in plans:
        with pytest.raises(ConfigError, match="names a folder the target creates and writes .*shader_cache") as info:
            parse_plan(loads_toml(f'bundles = ["a.bpte"]\n{text}\n', "plan.toml"), tmp_path / "plan.toml")
        _one_line(info.value)
    assert not target.exists()
    plan = tmp_path / "plan.toml"
    plan.write_text(f'bundles = ["a.bpte"]\ntargets = [{{url = "vulkan://lavapipe", options = '
                    f'{{shader_cache = "{target}"}}}}]\n')
    res = _cli("farm", str(plan), "--dry-run")
    _clean(res.stdout + res.stderr)
    assert res.returncode == 2 and "a farm plan cannot place it" in res.stderr and not target.exists()
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    res = _cli("farm", str(fifo), "--dry-run")
    _clean(res.stdout + res.stderr)
    assert res.returncode == 2 and "a FIFO, not a regular file" in res.stderr
