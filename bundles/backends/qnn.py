"""Qualcomm QNN recipe (HTP): ExecuTorch's own Qualcomm AOT, fp16 or int8 (QnnQuantizer PTQ), for one SoC.

The executorch wheel ships the AOT (`PyQnnManagerAdaptor`), which `dlopen`s Qualcomm's x86_64
`libQnnHtp.so` (the HTP compiler) by name. Those libraries come from `$QNN_SDK_ROOT`
(lib/x86_64-linux-clang) when it names an SDK, else from the simulator folder that
firmware_scripts/qnn/install_htp_sim.sh fills (QNN 2.49.40 from PyPI's onnxruntime-qnn 2.5.0,
the one build whose HTP device config matches executorch 1.5.1). The compile runs in a warm child
process (`python -m bundlerun.bundles.backends.qnn --serve`) with that folder on LD_LIBRARY_PATH and
QNN_SDK_ROOT set (empty when unset, so ExecuTorch does not try to download an SDK); this process
exports, quantizes and calibrates, and hands the child the ExportedProgram.

fp16: HTP fp16 precision with fp32 program I/O (ExecuTorch's QNN tests lower the fp32 module with
`use_fp16=True`); int8: QnnQuantizer 8a8w PTQ as ExecuTorch's `make_quantizer` sets it up
(backends/qualcomm/export_utils.py:652-672: per-channel conv weights, per-tensor linear,
MovingAverageMinMaxObserver, asymmetric activations), fp32 I/O. HTP has no fp32 compute.

The SoC is req.options["soc"] when a caller sets it, else the target's (`qnn://htp-sim?soc=SM8550`,
via the target's `lowering` capability: LoweringRequest.target_info["soc"]), else SM8650; it is recorded in the
manifest (build.lowering: soc_model, htp_arch, qnn_version). The program is the same whether it runs on
qnn://htp-sim or on a phone's qnn_executor_runner (the Android qnn-executor-runner profile).

Why a child: libQnnHtp is opened RTLD_GLOBAL and its bundled libc++abi then captures the C++ symbols
of any C++ extension bound after it (the pybindings imported after a lowering crash on their first
exception; torch imported after it aborts with "Pure virtual function called!"). In the child torch
and the AOT are bound first and nothing else comes after; the build process (the CLI, a test run)
never loads libQnnHtp at all. Programs run in children that import the pybindings first
(targets/qnn.py).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from bundlerun.bundles.backends.base import LoweringRequest, LoweringResult
from bundlerun.bundles.backends.common import delegation_summary, export_model, graph_ops, output_qparams, quantize_pt2e
from bundlerun.bundles.errors import BuildError
from bundlerun.bundles.backends.common import quiet_framework_logs
from bundlerun.bundles.cache_dirs import cache_dir
from bundlerun.bundles.partition_control import spec

DEFAULT_SOC = "SM8650"
# The SoCs whose lowering and simulator run were checked with QNN 2.49.40 (docs/qnn.md).
SOCS = ("SM8450", "SM8550", "SM8650", "SM8750", "SM8850")
QNN_VERSION = "2.49.40"  # what firmware_scripts/qnn/install_htp_sim.sh installs
# The five files the AOT and the simulator need (libQnnHtp/libQnnSystem find their libc++ by $ORIGIN).
QNN_LIBRARIES = ("libQnnHtp.so", "libQnnSystem.so", "libc++-71bc274c.so.1.0", "libc++abi-0539aa51.so.1.0",
                 "libunwind-6b740a46.so.1.0")
INSTALL_COMMAND = "bash firmware_scripts/qnn/install_htp_sim.sh"


def simulator_dir() -> Path:
    """`$BUNDLERUN_CACHE/qnn/<QNN version>/` (qnn.json + lib/), beside builds/ and runners/."""

    return cache_dir("qnn") / QNN_VERSION


def simulator_record() -> dict[str, Any] | None:
    """The installed simulator's qnn.json when every library it lists is there at its size."""
    folder = simulator_dir()
    try:
        record = json.loads((folder / "qnn.json").read_text())
    except (OSError, ValueError):
        return None
    files = record.get("files") if isinstance(record, dict) else None
    if not files:
        return None
    for f in files:
        path = folder / "lib" / str(f.get("name", ""))
        if not path.is_file() or path.stat().st_size != f.get("size"):
            return None
    return record


def qnn_lib_dir() -> tuple[Path, str]:
    """(folder holding libQnnHtp.so for x86_64, what it is), from a QNN SDK or the simulator cache."""
    root = os.environ.get("QNN_SDK_ROOT")
    if root:
        lib = Path(root) / "lib" / "x86_64-linux-clang"
        if not (lib / "libQnnHtp.so").is_file():
            raise BuildError(f"QNN_SDK_ROOT={root} does not look like a QNN SDK (no lib/x86_64-linux-clang/libQnnHtp.so); "
                             f"unset it to use the HTP simulator libraries ({INSTALL_COMMAND})")
        return lib, f"QNN SDK {root}"
    record = simulator_record()
    if record is None:
        raise BuildError(f"the qnn backend needs Qualcomm's x86_64 QNN libraries: run `{INSTALL_COMMAND}` "
                         "(scripts/setup.sh does), or set QNN_SDK_ROOT to a QNN SDK")
    return simulator_dir() / "lib", f"QNN {record.get('qnn_version', QNN_VERSION)} ({record.get('wheel', 'simulator')})"


@contextlib.contextmanager
def _sdk_left_to_us() -> Iterator[None]:
    """QNN_SDK_ROOT set (empty when unset) while ExecuTorch's Qualcomm code runs here: unset, its
    setup_qnn_sdk() (called by QnnQuantizer's op-info lookup) would try to download an SDK. Its
    warnings about the SDK's absent op-info module, and its prints ("No quant config is implemented
    for op ..."), are noise on a build's console (and would break `--json`)."""
    import io
    import logging

    before, disabled = os.environ.get("QNN_SDK_ROOT"), logging.root.manager.disable
    os.environ["QNN_SDK_ROOT"] = before or ""
    logging.disable(max(disabled, logging.WARNING))
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logging.disable(disabled)
        if before is None:
            os.environ.pop("QNN_SDK_ROOT", None)


def _chipset(soc: str) -> tuple[Any, Any]:
    """(QcomChipset member, its SocInfo) from the wheel's pure-Python schema."""
    try:
        from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset, _soc_info_table
    except Exception as exc:  # noqa: BLE001 - an executorch build without the Qualcomm AOT
        raise BuildError(f"this executorch build has no Qualcomm AOT ({type(exc).__name__}: {exc})") from None
    chipset = getattr(QcomChipset, soc)
    return chipset, _soc_info_table[chipset]


def soc_of(req: LoweringRequest) -> str:
    """The SoC to compile for: the request's options (a caller's explicit choice), else what the
    target declares (its SPEC.lowering, in LoweringRequest.target_info: qnn://htp-sim?soc=...),
    else SM8650."""
    soc = str(req.options.get("soc") or req.options.get("soc_model") or req.target_info.get("soc") or DEFAULT_SOC)
    return soc.upper()


def default_dtype(_target_info: dict) -> str:
    """HTP computes in fp16 or integer: fp16 unless asked otherwise."""
    return "fp16"


def _qnn_error_line(log: Path) -> str:
    """The first error QNN logged during the lowering, if any."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    for line in lines:
        if "[ERROR]" in line or "<E>" in line:
            return " ".join(line.split())[:300]
    return ""


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _quantizer(chipset: Any):
    """QnnQuantizer 8a8w PTQ as ExecuTorch's make_quantizer builds it (export_utils.py:652-672)."""
    from executorch.backends.qualcomm.quantizer.quantizer import QnnQuantizer, QuantDtype
    from torchao.quantization.pt2e import MovingAverageMinMaxObserver

    quantizer = QnnQuantizer(soc_model=chipset)
    quantizer.set_default_quant_config(QuantDtype.use_8a8w, is_qat=False, is_conv_per_channel=True,
                                       is_linear_per_channel=False, act_observer=MovingAverageMinMaxObserver)
    return quantizer


@dataclass
class EmittedProgram:
    """The program the AOT child emitted, with what the builder asks of a program manager: its
    bytes and the exported program it was lowered from (same outputs, dtypes included)."""

    buffer: bytes
    exported: Any

    def exported_program(self, method_name: str = "forward") -> Any:
        return self.exported


def _recipe_quantizer(chipset: Any, recipe: Any):
    """A QuantRecipe (QNN's static LLM recipes) on the quantizer llm_wrappers.py:703-704 builds:
    make_quantizer(soc_model=...) then set_recipe. make_quantizer's defaults are spelled out here
    (export_utils.py:652-680): its module imports pydot for a debugger bundlerun does not use."""
    from executorch.backends.qualcomm.quantizer.quantizer import QnnQuantizer, QuantDtype
    from torchao.quantization.pt2e import MovingAverageMinMaxObserver

    quantizer = QnnQuantizer(soc_model=chipset)
    quantizer.set_default_quant_config(QuantDtype.use_8a8w, is_qat=False, is_conv_per_channel=True,
                                       is_linear_per_channel=False, is_embedding_per_channel=False,
                                       act_observer=MovingAverageMinMaxObserver, act_symmetric=False, eps=None)
    quantizer.set_recipe(recipe)
    return quantizer


def lower(req: LoweringRequest) -> LoweringResult:
    recipe = req.options.get("qnn_recipe")
    if req.dtype not in ("fp16", "int8") and not (req.dtype == "int16" and recipe is not None):
        raise BuildError(f"dtype {req.dtype!r} is not supported by the qnn recipe (fp16, int8): QNN HTP computes "
                         "in fp16 or integer (fp16 keeps fp32 program inputs and outputs)")
    soc = soc_of(req)
    if soc not in SOCS:
        raise BuildError(f"unknown Qualcomm SoC {soc!r} for the qnn recipe; choose one of {', '.join(SOCS)}")
    lib, libraries = qnn_lib_dir()
    chipset, soc_info = _chipset(soc)
    import torch

    examples = tuple(req.example_inputs)
    exported = export_model(req.model, examples)
    to_lower, qparams, reference, scheme = exported, [], None, None
    if req.dtype in ("int8", "int16"):
        with _sdk_left_to_us():
            quantizer = _quantizer(chipset) if recipe is None else _recipe_quantizer(chipset, recipe)
            converted = quantize_pt2e(exported, quantizer, req.calibration_inputs)
        qparams, reference = output_qparams(converted), converted
        scheme = "qnn-ptq-8a8w-per-channel-conv" if recipe is None else "qnn-static-llm-recipe"
        to_lower = export_model(converted, examples)
    with tempfile.TemporaryDirectory(prefix="bundlerun-qnn-") as tmp:
        folder = Path(tmp)
        try:
            torch.export.save(to_lower, folder / "model.pt2")
        except Exception as exc:  # noqa: BLE001 - the AOT child gets the model as a saved ExportedProgram
            raise BuildError(f"cannot hand the exported model to the QNN compiler: {_one_line(exc)}") from None
        torch.save(examples, folder / "inputs.pt")
        reply = _AOT.lower(lib, {"model": str(folder / "model.pt2"), "inputs": str(folder / "inputs.pt"),
                                 "soc": soc, "fp16": req.dtype == "fp16", "out": str(folder / "program.pte"),
                                 "log": str(folder / "qnn-lowering.log"), "imports": _model_sources(req.model),
                                 "partition_control": _partition_spec()})  # `bisect`: bundles/partition_control.py
        buffer = (folder / "program.pte").read_bytes()
    summary = dict(reply.get("summary") or {})
    summary.update(partitioner="QnnPartitioner", soc_model=soc, htp_arch=f"v{int(soc_info.htp_info.htp_arch)}",
                   vtcm_mb=int(soc_info.htp_info.vtcm_size_in_mb),
                   precision="fp16" if req.dtype == "fp16" else "quantized", qnn_libraries=libraries,
                   qnn_version=_lib_version(libraries))
    if not summary.get("delegate_calls"):
        summary.setdefault("warnings", []).append("QNN delegated nothing; the program runs on portable kernels")
    return LoweringResult(EmittedProgram(buffer, to_lower), [x.dtype for x in examples], quantized_reference=reference,
                          output_qparams=qparams, ops=graph_ops(exported), quantization=scheme, info=summary)


# --------------------------------------------------------------------------- the AOT child

LOWER_TIMEOUT_S = 1800.0  # one model's QNN compile; the zoo's take seconds


class _AotChild:
    """One warm `python -m bundlerun.bundles.backends.qnn --serve` per build process: Qualcomm's
    AOT runs there, never here, so libQnnHtp (RTLD_GLOBAL, its own libc++abi) never enters a process
    that later binds C++ extensions, and a crash or hang of the QNN compiler is one BuildError.
    torch and the AOT are imported once per process; requests are one JSON line each way."""

    def __init__(self) -> None:
        self._proc: Any = None
        self._lib: Path | None = None
        self._lock = threading.Lock()

    def lower(self, lib: Path, request: dict[str, Any], timeout_s: float = LOWER_TIMEOUT_S) -> dict[str, Any]:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None or self._lib != lib:
                self._start(lib)
            log = Path(request["log"])
            try:
                self._proc.stdin.write((json.dumps(request) + "\n").encode())
                self._proc.stdin.flush()
            except OSError:
                self.close()
                raise BuildError("the QNN compiler process died before it took the model") from None
            line = self._reply(timeout_s)
            if line is None:
                self.close()
                raise BuildError(f"the QNN compiler did not finish within {timeout_s:g} s (stopped)")
            if not line:
                code = self._proc.wait()
                self.close()
                said = _qnn_error_line(log) or _last_line(log)
                how = f"signal {-code}" if code < 0 else f"exit code {code}"
                raise BuildError(f"the QNN compiler crashed ({how})" + (f": {said}" if said else ""))
            reply = json.loads(line)
            if not reply.get("ok"):
                raise BuildError(str(reply.get("error") or "QNN lowering failed"))
            return reply

    def _reply(self, timeout_s: float) -> bytes | None:
        """The child's answer line; b"" when it died, None on timeout."""
        import select

        fd = self._proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        buf = b""
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            readable, _, _ = select.select([fd], [], [], min(left, 1.0))
            if readable:
                chunk = os.read(fd, 65536)
                if not chunk:
                    return b""
                buf += chunk
        return buf.split(b"\n", 1)[0]

    def _start(self, lib: Path) -> None:
        import subprocess
        import sys

        self.close()
        env = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(filter(None, [str(lib), os.environ.get("LD_LIBRARY_PATH")])),
               "QNN_SDK_ROOT": os.environ.get("QNN_SDK_ROOT", ""), "PYTHONWARNINGS": "ignore"}
        self._proc = subprocess.Popen([sys.executable, "-m", "bundlerun.bundles.backends.qnn", "--serve"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      start_new_session=True, env=env)
        self._lib = lib

    def close(self) -> None:
        import signal

        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()

    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None


_AOT = _AotChild()
atexit.register(_AOT.close)


def _partition_spec() -> dict[str, Any] | None:
    """The active `bisect` restriction, which the AOT child applies (bundles/partition_control.py)."""

    return spec()


def _last_line(log: Path) -> str:
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def _serve() -> int:
    """Child side: import torch and the AOT first (their C++ symbols bound before libQnnHtp comes
    in), then lower one request per stdin line. fd 1 carries only the replies: QNN's progress
    bars and log go to the request's log file."""
    import sys

    reply_stream = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    import torch
    import torchao.quantization.pt2e  # noqa: F401 - quantized_decomposed ops of int8 models
    from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset
    from executorch.backends.qualcomm.utils.utils import (
        generate_htp_compiler_spec,
        generate_qnn_executorch_compiler_spec,
        to_edge_transform_and_lower_to_qnn,
    )

    quiet_framework_logs()
    for line in sys.stdin:
        try:
            request = json.loads(line)
        except ValueError:
            continue
        fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        try:
            _import_sources(request.get("imports") or [])
            module = torch.export.load(request["model"]).module()
            inputs = tuple(torch.load(request["inputs"]))
            specs = generate_qnn_executorch_compiler_spec(
                soc_model=getattr(QcomChipset, request["soc"]),
                backend_options=generate_htp_compiler_spec(use_fp16=bool(request["fp16"])))
            from bundlerun.bundles.partition_control import applied  # `bisect`: the delegate restricted

            with applied(request.get("partition_control")):
                edge = to_edge_transform_and_lower_to_qnn(module, inputs, specs)
            summary = delegation_summary(edge)
            Path(request["out"]).write_bytes(bytes(edge.to_executorch().buffer))
            reply = {"ok": True, "summary": summary}
        except Exception as exc:  # noqa: BLE001 - one line, with what QNN itself said
            said = _qnn_error_line(Path(request["log"]))
            reply = {"ok": False, "error": f"QNN lowering for {request.get('soc')} failed: {_one_line(exc)}"
                                           + (f" (QNN: {said})" if said else "")}
        reply_stream.write(json.dumps(reply) + "\n")
    return 0


def _model_sources(model: Any) -> list[list[str]]:
    """[module name, file] of the user modules defining the model's classes: the AOT child imports
    them before loading the ExportedProgram, so custom ops they register (torch.library) resolve."""
    import sys

    skip = ("torch", "torchao", "executorch", "builtins", "bundlerun")
    found: dict[str, str] = {}
    for sub in getattr(model, "modules", lambda: [model])():
        name = type(sub).__module__
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if name.split(".")[0] not in skip and path and path.endswith(".py"):
            found.setdefault(name, path)
    return [[name, path] for name, path in found.items()]


def _import_sources(sources: list[list[str]]) -> None:
    """Child side of _model_sources: import each by name, else from its file."""
    import importlib
    import importlib.util
    import sys

    for name, path in sources:
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
            continue
        except Exception:  # noqa: BLE001 - not importable by name (a path.py:factory file): by path
            pass
        try:
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        except Exception:  # noqa: BLE001 - the model's load then says what is missing
            sys.modules.pop(name, None)


def _lib_version(libraries: str) -> str | None:
    """The QNN version the program was compiled with (a newer context binary fails on an older runtime)."""
    if libraries.startswith("QNN SDK "):
        return None
    return (simulator_record() or {}).get("qnn_version")


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--serve"]:
        sys.exit("usage: python -m bundlerun.bundles.backends.qnn --serve (the QNN AOT child of a build)")
    from bundlerun.bundles.stack_room import call_with_stack_room  # python -m: no chunk thrash

    sys.exit(call_with_stack_room(_serve))
