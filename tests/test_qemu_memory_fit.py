"""A model too big for the Cortex-M55 runner's memory is refused before QEMU starts, in one line
naming the sizes (targets/arm/memory_fit.py). The pure parts (the ELF symbol reader, the fit
rule) run on synthetic ELFs and sizes; the end-to-end tests use the real runner built by
firmware_scripts/arm/build_qemu_runner.sh, real bundles and the real qemu-system-arm. No doubles."""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path

import pytest

from bundlerun.targets.arm import memory_fit
from bundlerun.targets.arm.memory_fit import RunnerMemory, check_fit, elf_symbols, planned_need
from tests.conftest import run_cli

URL = "qemu://mps3-an547"
MiB = 1 << 20


def _elf32(symbols: dict[str, tuple[int, int]]) -> bytes:
    """A minimal little-endian ELF32 with a .symtab and .strtab holding `symbols` {name: (value, size)}."""
    strtab = b"\0"
    entries = [b"\0" * 16]
    for name, (value, size) in symbols.items():
        entries.append(struct.pack("<IIIBBH", len(strtab), value, size, 0x11, 0, 1))
        strtab += name.encode() + b"\0"
    symtab = b"".join(entries)
    shstr = b"\0.symtab\0.strtab\0"
    body_off = 52
    sym_off, str_off = body_off, body_off + len(symtab)
    shstr_off = str_off + len(strtab)
    sh_off = shstr_off + len(shstr)
    sections = [
        (0,) * 10,
        (1, 2, 0, 0, sym_off, len(symtab), 2, 1, 4, 16),
        (9, 3, 0, 0, str_off, len(strtab), 0, 0, 1, 0),
        (17, 3, 0, 0, shstr_off, len(shstr), 0, 0, 1, 0),
    ]
    header = bytearray(52)
    header[:6] = b"\x7fELF\x01\x01"
    struct.pack_into("<I", header, 0x20, sh_off)
    struct.pack_into("<HHH", header, 0x2E, 40, len(sections), 3)  # shentsize, shnum, shstrndx
    return bytes(header) + symtab + strtab + shstr + b"".join(struct.pack("<10I", *s) for s in sections)


POOLS = {"input_file_allocation_pool": (0x700F5BF0, 32 * MiB), "method_allocation_pool": (0x720F5BF0, 64 * MiB),
         "temp_allocation_pool": (0x760F5BF0, 2 * MiB), "__bundle_size": (0x04000000, 0)}


def test_pool_sizes_are_read_from_the_elf_symbols(tmp_path):
    elf = tmp_path / "runner.elf"
    elf.write_bytes(_elf32({"main": (0x70000001, 100), **POOLS}))
    mem = memory_fit.runner_memory(elf)
    assert mem == RunnerMemory(elf, 32 * MiB, 64 * MiB, 2 * MiB, 64 * MiB)
    assert mem.describe() == "method pool 64.0 MiB, file pool 32.0 MiB, scratch pool 2.0 MiB"
    elf.write_bytes(_elf32({"main": (0x70000001, 100)}))  # no pool symbols: nothing to check against
    assert memory_fit.runner_memory(elf) is None


def test_elf_reader_fuzz_never_raises(tmp_path):
    """The runner ELF can be the user's (runner_elf=): truncated, flipped or foreign bytes give {}
    or some symbols, never an exception."""
    good = _elf32(POOLS)
    rng = random.Random(36)
    elf = tmp_path / "f.elf"
    for i in range(400):
        data = bytearray(good)
        if i % 3 == 0:
            data = data[: rng.randrange(len(data))]
        for _ in range(rng.randrange(1, 8)):
            if data:
                data[rng.randrange(len(data))] = rng.randrange(256)
        if i % 7 == 0:
            data = bytearray(rng.randbytes(rng.randrange(200)))
        elf.write_bytes(bytes(data))
        found = elf_symbols(elf, tuple(POOLS))
        assert isinstance(found, dict) and set(found) <= set(POOLS)
    assert elf_symbols(tmp_path / "missing.elf", tuple(POOLS)) == {}


def test_fit_rule_names_each_size():
    mem = RunnerMemory(Path("r.elf"), 32 * MiB, 64 * MiB, 2 * MiB, 64 * MiB)
    assert check_fit(mem, {"forward": [1000, 2 * MiB]}, 5 * MiB, "semihosting", "m") is None
    too_big = check_fit(mem, {"forward": [40 * MiB, 30 * MiB]}, 33 * MiB, "semihosting", "dl3")
    assert too_big is not None
    msg = too_big.message
    assert "\n" not in msg and msg.startswith("dl3 does not fit the runner's memory")
    assert "33.0 MiB (34603008 B)" in msg and "input_file_allocation_pool of 32.0 MiB (33554432 B)" in msg
    assert "plans 70.0 MiB (73400320 B)" in msg and "method_allocation_pool holds 64.0 MiB" in msg
    # uart: the bundle stays where QEMU's loader put it (no file pool), bounded by the linker script's region
    assert check_fit(mem, {}, 40 * MiB, "uart", "m") is None
    assert "bundle region holds 64.0 MiB" in check_fit(mem, {}, 65 * MiB, "uart", "m").message
    assert planned_need([1, 16, 17]) == 16 + 16 + 32  # each buffer 16-byte aligned, as the runner allocates


def test_planned_buffers_are_read_from_the_program(bundle_cache):
    from bundlerun.bundles.bpte import read_bundle
    from bundlerun.bundles.program_meta import planned_buffer_sizes

    program = read_bundle(bundle_cache("tiny-cnn", "fp32", backend="portable", cases=1,
                                       target=URL)).program
    sizes = planned_buffer_sizes(program)
    assert list(sizes) == ["forward"] and len(sizes["forward"]) == 1 and sizes["forward"][0] > 0
    assert planned_buffer_sizes(b"not a program") == {}


@pytest.fixture(scope="module")
def default_runner(qemu_runner):
    return qemu_runner()


def _no_qemu_ran(report_dir: Path) -> bool:
    return not list((report_dir / "work").glob("qemu/*/model.bpte")) and not list((report_dir / "work").glob("logs/*"))


def test_a_model_too_big_for_the_file_pool_is_one_line_before_qemu(default_runner, bundle_cache, tmp_path):
    """et:resnet18 fp32 (11.7 M parameters, a 45 MiB bundle) against the runner's 32 MiB file pool."""
    bundle = bundle_cache("et:resnet18", "fp32", backend="portable", cases=1, target=URL)
    res = run_cli("run", str(bundle), "--target", URL, "--report", str(tmp_path / "r"), "--no-history")
    assert res.returncode == 2, res.stdout[-2000:]
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    (case,) = report["cases"]
    assert case["verdict"] == "ERROR" and case["error_kind"] == "allocation-failure"
    assert "\n" not in case["error"] and case["error"].startswith("resnet18 does not fit the runner's memory")
    assert "input_file_allocation_pool of 32.0 MiB (33554432 B)" in case["error"]
    assert _no_qemu_ran(tmp_path / "r")
    assert str(default_runner / "arm_executor_runner.elf") in case["error"]  # where the sizes were read


def test_planned_buffers_over_the_method_pool_and_the_runtime_oom_line(qemu_runner, bundle_cache, tmp_path):
    """A runner linked with a 4 KiB method pool: refused before QEMU with the planned size; with
    memory_check=false the real runner runs out of it and the cause line names the pools."""
    bundle = bundle_cache("tiny-cnn", "fp32", backend="portable", cases=2)
    elf = qemu_runner("--method-pool-size", "4096") / "arm_executor_runner.elf"
    res = run_cli("run", str(bundle), "--target", URL, "--report", str(tmp_path / "a"), "--no-history",
                  "--target-opt", f"runner_elf={elf}")
    assert res.returncode == 2
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    for case in report["cases"]:
        assert case["error_kind"] == "allocation-failure"
        assert "method 'forward' plans 64.0 KiB (65536 B) of buffers" in case["error"]
        assert "method_allocation_pool holds 4.0 KiB (4096 B" in case["error"]
    assert _no_qemu_ran(tmp_path / "a")
    res = run_cli("run", str(bundle), "--target", URL, "--report", str(tmp_path / "b"), "--no-history",
                  "--target-opt", f"runner_elf={elf}", "--target-opt", "memory_check=false")
    assert res.returncode == 2
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    for case in report["cases"]:
        assert case["error_kind"] == "allocation-failure" and "65536 B requested, 4096 B available" in case["error"]
        assert case["error"].endswith("the runner's pools: method pool 4.0 KiB, file pool 32.0 MiB, scratch pool 2.0 MiB")
