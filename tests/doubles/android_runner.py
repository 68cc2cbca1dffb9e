"""Stand-ins for ExecuTorch's Android runners, run "on" the emulated device.

They honour the real command lines and file names (examples/portable/executor_runner/executor_runner.cpp and
examples/qualcomm/executor_runner/qnn_executor_runner.cpp at the pinned ExecuTorch commit):

executor_runner      --model_path --method_name --bundleio_rtol --bundleio_atol
                     --num_executions --cpu_threads --output_file PREFIX
                     --print_output --etdump_path; loads a BundleIO .bpte, runs
                     test case 0, writes PREFIX-<i>.bin per tensor output, prints
                     the BundleIO verdict lines, returns 1 on a failed verification.
qnn_executor_runner  --model_path (plain .pte) --input_list_path --output_folder_path
                     --method_index --iteration --etdump_path --shared_buffer; one
                     inference per input_list line, writes
                     output_<inference>_<output>.raw; dlopens libQnnHtp.so and
                     libQnnSystem.so from LD_LIBRARY_PATH like the real one.
                     --dump_intermediate_outputs --debug_output_path --debug_buffer_size:
                     as the real one, the runtime runs with ETDumpGen + a debug buffer of
                     that size (the pybindings' own ETDumpGen) and writes the ETDump to
                     --etdump_path and the buffer to --debug_output_path.

The numerics come from the host ExecuTorch runtime (pybindings). Faults are read
from the device's fault file (tests/doubles/adbd.py FAULT_FILE): segv, hang,
missing_lib, short_output, exit_code, missing_flags.

`make_runner_binary(path, profile)` writes the "binary" a test pushes: a script
whose interpreter is this Python, importing this module.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def make_runner_binary(path: Path, profile: str = "executor-runner") -> Path:
    path = Path(path)
    path.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from tests.doubles.android_runner import main\n"
        f"sys.exit(main({profile!r}, sys.argv[1:]))\n"
    )
    path.chmod(0o755)
    return path


def _log(level: str, msg: str, line: int = 0) -> None:
    """The posix PAL's log format (stderr)."""
    t = time.monotonic()
    sys.stderr.write(f"{level} 00:00:{t % 60:09.6f} executorch:executor_runner.cpp:{line}] {msg}\n")
    sys.stderr.flush()


def _parse_flags(argv: list[str], known: dict[str, str], bools: tuple[str, ...] = ()) -> dict[str, str] | str:
    flags = dict(known)
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            return f"Extra commandline args: {' '.join(argv[i:])}"
        name, eq, value = arg[2:].partition("=")
        if name not in flags:
            return f"ERROR: unknown command line flag '{name}'"
        if not eq and name in bools:  # gflags: a bare --flag sets a bool flag
            value = "true"
        elif not eq:
            i += 1
            if i >= len(argv):
                return f"ERROR: flag '--{name}' is missing its argument"
            value = argv[i]
        flags[name] = value
        i += 1
    return flags


def _faults() -> dict:
    root = os.environ.get("BUNDLERUN_FAKE_DEVICE_ROOT")
    if not root:
        return {}
    try:
        return json.loads((Path(root) / ".bundlerun_faults.json").read_text() or "{}")
    except (OSError, ValueError):
        return {}


def _apply_early_faults(faults: dict) -> None:
    if faults.get("missing_lib"):
        sys.stderr.write(f'E executorch: dlopen failed: library "{faults["missing_lib"]}" not found\n')
        sys.stderr.flush()
        sys.exit(1)
    if faults.get("segv"):
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGSEGV)
    if faults.get("hang"):
        while True:
            time.sleep(1)


def _tensor_bytes(t) -> bytes:
    return t.detach().contiguous().cpu().numpy().tobytes()


def executor_runner(argv: list[str]) -> int:
    known = {
        "model_path": "model.pte", "data_path": "", "inputs": "", "output_file": "", "print_output": "summary",
        "num_executions": "1", "method_name": "", "etdump_path": "model.etdump", "cpu_threads": "-1",
        "bundleio_rtol": "0.01", "bundleio_atol": "0.01",
    }
    for name in _faults().get("missing_flags", []):  # a runner built without e.g. the event tracer
        known.pop(name, None)
    flags = _parse_flags(argv, known)
    if isinstance(flags, str):
        sys.stderr.write(flags + "\n")  # gflags' own message, before any ET_LOG
        return 1
    if flags["print_output"] not in ("none", "summary", "all"):
        _log("E", f"Unknown --print_output mode '{flags['print_output']}'. Expected 'none', 'summary', or 'all'.")
        return 1
    faults = _faults()
    _apply_early_faults(faults)
    try:
        data = Path(flags["model_path"]).read_bytes()
    except OSError:
        _log("F", f"Could not open file '{flags['model_path']}'")
        os.kill(os.getpid(), signal.SIGABRT)
    if data[4:8] != b"BP08":
        _log("E", "this stand-in only runs BundleIO programs")
        return 1
    import torch  # noqa: F401  (_C links torch's libraries; portable_lib would import all of exir, ~4 s)
    from executorch.extension.pybindings._C import _load_bundled_program_from_buffer

    bundled = _load_bundled_program_from_buffer(data)
    sys.path.insert(0, str(REPO))
    from bundlerun.bundles.bpte import parse_bundle

    suites = [s.method_name for s in parse_bundle(data).method_test_suites]
    method = flags["method_name"] or suites[0]
    if method not in suites:
        _log("F", f"Loading of method {method} failed with status 0x12")
        os.kill(os.getpid(), signal.SIGABRT)
    rtol, atol = float(flags["bundleio_rtol"]), float(flags["bundleio_atol"])
    t0 = time.perf_counter()
    ok, outputs = True, []
    for _ in range(max(1, int(flags["num_executions"]))):
        try:
            outputs = bundled.verify_result_with_bundled_expected_output(method, 0, rtol, atol)
        except RuntimeError:
            ok = False
            # the run happened; fetch its outputs without the tolerance check
            outputs = bundled.verify_result_with_bundled_expected_output(method, 0, 1e30, 1e30)
    ms = (time.perf_counter() - t0) * 1000
    _log("I", f"Model executed successfully {flags['num_executions']} time(s) in {ms:f} ms.")
    _log("I", f"{len(outputs)} outputs: ")
    if flags["output_file"]:
        for i, out in enumerate(outputs):
            if hasattr(out, "numpy"):
                raw = _tensor_bytes(out)
                if faults.get("short_output"):
                    raw = raw[: len(raw) // 2]
                name = f"{flags['output_file']}-{i}.bin"
                _log("I", f"Writing output to file: {name}")
                Path(name).write_bytes(raw)
    if ok:
        _log("I", "Model output match expected BundleIO bpte ref data.")
        _log("I", "TEST: BundleIO index[0] Test_result: PASS")
        return int(faults.get("exit_code", 0))
    _log("E", f"Model output don't match expected BundleIO bpte ref data. rtol={rtol:f} atol={atol:f}")
    _log("E", "TEST: BundleIO index[0] Test_result: FAIL")
    _log("E", "Bundle verification failed with status 0x12")
    return 1


def qnn_executor_runner(argv: list[str]) -> int:
    flags = _parse_flags(argv, {
        "model_path": "", "input_list_path": "input_list.txt", "output_folder_path": "outputs",
        "method_index": "0", "iteration": "1", "etdump_path": "etdump.etdp", "shared_buffer": "false",
        "dump_intermediate_outputs": "false", "debug_output_path": "debug_output.bin",
        "debug_buffer_size": "100000000",
    }, bools=("shared_buffer", "dump_intermediate_outputs"))
    if isinstance(flags, str):
        _log("E", flags)
        return 1
    faults = _faults()
    for lib in ("libQnnHtp.so", "libQnnSystem.so"):
        dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
        if not any(Path(d, lib).is_file() for d in dirs):
            _log("E", f'[Qnn ExecuTorch]: Cannot Open QNN library {lib}, with error: dlopen failed: library "{lib}" not found')
            return 1
    _apply_early_faults(faults)
    data = Path(flags["model_path"]).read_bytes()
    if data[4:6] != b"ET":
        _log("E", "not an ExecuTorch program")
        return 1
    import torch
    from executorch.extension.pybindings._C import _load_for_executorch_from_buffer

    dump = flags["dump_intermediate_outputs"].lower() in ("true", "1", "yes")
    if dump:
        module = _load_for_executorch_from_buffer(data, enable_etdump=True,
                                                  debug_buffer_size=int(flags["debug_buffer_size"]))
    else:
        module = _load_for_executorch_from_buffer(data)
    method = module.method_names()[int(flags["method_index"])] if int(flags["method_index"]) else "forward"
    meta = module.method_meta(method)
    out_dir = Path(flags["output_folder_path"])
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = [l.split() for l in Path(flags["input_list_path"]).read_text().splitlines() if l.strip()]
    dtypes = {6: torch.float32, 5: torch.float16, 1: torch.int8, 0: torch.uint8, 3: torch.int32, 4: torch.int64, 11: torch.bool}
    for inference, files in enumerate(lines):
        inputs = []
        for j, fname in enumerate(files):
            tmeta = meta.input_tensor_meta(j)
            raw = Path(fname).read_bytes()
            dtype = dtypes[int(tmeta.dtype())]
            inputs.append(torch.frombuffer(bytearray(raw), dtype=dtype).reshape(tuple(tmeta.sizes())))
        outputs = module.run_method(method, inputs)
        for k, out in enumerate(outputs):
            raw = _tensor_bytes(out)
            if faults.get("short_output"):
                raw = raw[:-4]
            (out_dir / f"output_{inference}_{k}.raw").write_bytes(raw)
        _log("I", f"[Qnn ExecuTorch]: inference {inference} done")
    if dump:
        module.write_etdump_result_to_file(flags["etdump_path"], flags["debug_output_path"])
        _log("I", f"Write etdump to {flags['etdump_path']}")
        _log("I", f"Write debug output binary to {flags['debug_output_path']}, Size = {flags['debug_buffer_size']}")
    return int(faults.get("exit_code", 0))


def main(profile: str, argv: list[str]) -> int:
    if profile == "qnn-executor-runner":
        return qnn_executor_runner(argv)
    return executor_runner(argv)


if __name__ == "__main__":
    sys.exit(main(os.environ.get("RUNNER_PROFILE", "executor-runner"), sys.argv[1:]))
