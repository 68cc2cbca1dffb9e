"""Per-target "give me every intermediate output of one case" (for `bundlerun debug`).

A target that can returns an `IntermediateRun`: the case's final outputs and, in
execution order, one `Intermediate` per executed KernelCall / DelegateCall with
its instruction index (the runtime's instruction id, which the ETRecord's debug
handle map keys) and raw output arrays - and, where the delegate's inside is
visible, one `Intermediate` of kind "delegate-op" per operator inside the call
(listed before the call's own row, carrying the call's chain / instruction, its
operator index in the payload, its output tensor's name). Like a normal run it
returns raw data and never judges; runner/debug/localize.py maps and compares.

Which targets can, and how, is declared by each target module (`SPEC.capture`, or
`SPEC.capture_note` saying what it would need); `bundlerun debug --target help` lists them:
host:// (the real runtime with ETDump + a debug buffer, targets/workers/debug.py), tosa:// and
mlx:// (the program walker with an observer; inside TOSA delegates one row per TOSA operator,
inside MLX delegates one per instruction), qemu://, fvp:// and serial (arm_executor_runner
built with --etdump, targets/arm/intermediates.py), adb:// and qemu-user:// (bundlerun's debug
runner or the device's qnn_executor_runner, targets/android/intermediates.py).
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bundlerun.bundles.errors import TargetError
from bundlerun.targets import capture_schemes, parse_target_url, spec_for
from bundlerun.targets.program.walker import tensor_to_numpy

DEFAULT_DEBUG_BUFFER_MB = 64


class IntermediatesUnsupported(TargetError):
    """This target cannot return intermediate outputs (yet); the message says what it needs."""


class IntermediatesFailed(TargetError):
    """The target could not run the case with intermediates (crash, timeout, runtime error)."""


@dataclass
class Intermediate:
    index: int  # execution order
    chain: int
    instruction: int  # instruction index within its chain = the runtime's instruction id
    kind: str  # "kernel" | "delegate" | "delegate-op" (an operator inside the delegate call `instruction`)
    op: str  # "aten::convolution.out", "delegate:XnnpackBackend", "tosa.CONV2D", "mlx.Addmm", or the ETDump event name
    outputs: list[np.ndarray] = field(default_factory=list)
    delegate_op: int | None = None  # kind "delegate-op": the operator's / instruction's index inside the payload
    name: str | None = None  # kind "delegate-op": its output tensor's name (TOSA) or slot (MLX "chain 0 #5")
    info: dict[str, Any] = field(default_factory=dict)  # kind "delegate-op": backend, digest, tensor names, dtypes


@dataclass
class IntermediateRun:
    target: str
    method: str
    case: int
    granularity: str  # what one row is, in words
    intermediates: list[Intermediate]
    outputs: list[np.ndarray]
    notes: list[str] = field(default_factory=list)


def unsupported_message(url: str) -> str:
    """Why `url` cannot return intermediates (its SPEC's capture_note), which targets can, and
    the way to find a failing delegated operator without them (`bundlerun bisect`)."""

    why = "this target has no way to dump intermediates"
    try:
        why = spec_for(parse_target_url(url)).capture_note or why
    except TargetError:
        pass
    return (f"{url}: cannot return intermediate outputs (yet): {why}; {', '.join(capture_schemes())} can. "
            f"To find the delegated operator that makes a case fail here without them: bundlerun bisect MODEL "
            f"--target {url} --case N (re-lowers with the delegate restricted, docs/debugging.md)")


def supports_capture(url: str) -> bool:
    """Whether the URL's target declares `capture` (checked before anything else is loaded)."""

    try:
        return spec_for(parse_target_url(url)).capture is not None
    except TargetError:  # an unknown URL is reported by capture itself
        return True


def capture(url: str, bundle_path: str | Path, method: str, case: int, work_dir: str | Path,
            timeout_s: float = 600.0, debug_buffer_mb: int = DEFAULT_DEBUG_BUFFER_MB,
            config: dict[str, Any] | None = None, prefix: tuple[int, ...] = ()) -> IntermediateRun:
    """Run `method`[`case`] of the bundle on `url` (with its `[targets.X]` config) with every
    intermediate output: the target's declared `capture` (targets/__init__.py TargetSpec).
    `prefix`: cases run first on the same loaded method (a stateful sequence's earlier steps); a
    target whose capture cannot replay them refuses, so a decode step is never captured on a fresh cache."""

    spec = spec_for(parse_target_url(url))
    if spec.capture is None:
        raise IntermediatesUnsupported(unsupported_message(url))
    if prefix and not spec.capture_prefix:
        raise IntermediatesUnsupported(
            f"{url}: its debug run loads the program for one case and cannot replay the {len(prefix)} earlier "
            f"step(s) of case {case}'s sequence first, and a decode step on a fresh KV cache is not the step that "
            "failed; debug it on a lane that replays the prefix (host://xnnpack)")
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    if prefix:  # a keyword only the captures with capture_prefix take (CaptureFn does not declare it)
        with_prefix: Any = spec.capture
        return with_prefix(url, dict(config or {}), Path(bundle_path), method, case, Path(work_dir), timeout_s,
                            debug_buffer_mb, prefix=tuple(prefix))
    return spec.capture(url, dict(config or {}), Path(bundle_path), method, case, Path(work_dir), timeout_s,
                        debug_buffer_mb)


def run_worker(url: str, mode: str, bundle_path: str | Path, method: str, case: int, work_dir: str | Path,
               timeout_s: float, debug_buffer_mb: int, granularity: str,
               extra_args: tuple[str, ...] = (), prefix: tuple[int, ...] = ()) -> IntermediateRun:
    """Run targets/workers/debug.py `mode` in a child process (a crash or hang kills only it) and load
    its intermediates.{json,npz}."""
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "bundlerun.targets.workers.debug", mode, str(Path(bundle_path).resolve()), method,
            str(case), str(work.resolve()), "--debug-buffer-mb", str(debug_buffer_mb), *extra_args]
    if prefix:
        args += ["--prefix", ",".join(str(int(c)) for c in prefix)]
    log = work / "debug-worker.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(args, stdout=err, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise IntermediatesFailed(f"{url}: the case did not finish within {timeout_s:g} s (log: {log})") from None
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    result = work / "intermediates.json"
    if rc != 0 or not result.is_file():
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.is_file() else []
        why = f"exit code {rc}" if rc >= 0 else f"killed by signal {-rc}"
        raise IntermediatesFailed(f"{url}: the debug run failed ({why}): {' '.join(tail) or 'no output'} (log: {log})")
    meta = json.loads(result.read_text())
    if meta.get("error"):
        raise IntermediatesFailed(f"{url}: {meta['error']}")
    items, outputs = load(work)
    notes = list(meta.get("notes", []))
    dump = meta.get("etdump")
    if dump:  # host: the runtime's ETDump + debug buffer, read here (the worker loads no devtools)
        etdump = work / Path(str(dump["file"])).name
        debug_buffer = work / Path(str(dump["debug_buffer"])).name
        try:
            if dump.get("replayed"):
                keep_last_run(etdump)
            items, parse_notes = parse_etdump(etdump, debug_buffer if debug_buffer.is_file() else None,
                                              str(dump["buffer_size"]), str(dump["hint"]))
        except Exception as exc:  # noqa: BLE001 - one line, as the worker's own errors (ExecuTorch's reader raising)
            first = (str(exc).splitlines() or [""])[0][:300]
            raise IntermediatesFailed(f"{url}: cannot read the runtime's ETDump {etdump}: {type(exc).__name__}: "
                                      f"{first}") from None
        notes += parse_notes
    return IntermediateRun(url, method, case, granularity, items, outputs, notes)


def load(work_dir: Path) -> tuple[list[Intermediate], list[np.ndarray]]:
    """Read what `save` wrote: the intermediates and the case's outputs."""
    meta = json.loads((Path(work_dir) / "intermediates.json").read_text())
    with np.load(Path(work_dir) / "intermediates.npz", allow_pickle=False) as arrays:
        items = []
        for rec in meta["intermediates"]:
            items.append(Intermediate(rec["index"], rec["chain"], rec["instruction"], rec["kind"], rec["op"],
                                      [arrays[k] for k in rec["outputs"]], rec.get("delegate_op"), rec.get("name"),
                                      dict(rec.get("info") or {})))
        outputs = [arrays[k] for k in meta["outputs"]]
    return items, outputs


# ------------------------------------------------------------------ helpers for the worker

# ETDump events that carry no operator output of their own
_NOT_OPERATORS = ("OPERATOR_CALL", "Method::execute", "Method::init", "Program::load_method")


def intermediate_array(value: Any) -> np.ndarray:
    """An intermediate as numpy for comparison: bfloat16 widened to float32 (numpy has no bfloat16,
    and the raw uint16 words `tensor_to_numpy` keeps for bit-exact outputs would compare as integers)."""
    import torch

    if isinstance(value, torch.Tensor):
        return tensor_to_numpy(value.float() if value.dtype == torch.bfloat16 else value)
    return np.asarray(value)


def keep_last_run(etdump: str | Path) -> int:
    """Rewrite an ETDump to hold only its last run (the captured step after a replayed prefix); returns
    how many runs were dropped. The Inspector groups runs of one signature and asserts their debug
    values agree (devtools/inspector/_inspector.py:652), which steps of a sequence do not."""
    from executorch.devtools.etdump.serialize import deserialize_from_etdump_flatcc, serialize_to_etdump_flatcc

    path = Path(etdump)
    dump = deserialize_from_etdump_flatcc(path.read_bytes())
    dropped = len(dump.run_data) - 1
    if dropped > 0:
        dump.run_data = dump.run_data[-1:]
        data = serialize_to_etdump_flatcc(dump)  # flatc writes it without the size prefix the reader expects
        path.write_bytes(struct.pack("<I", len(data)) + data)
    return max(dropped, 0)


def parse_etdump(etdump: str | Path, debug_buffer: str | Path | None, buffer_size: str,
                 larger_hint: str) -> tuple[list[Intermediate], list[str]]:
    """Every operator / delegate output an ETDump + its debug buffer hold, in execution order.

    Read with ExecuTorch's own Inspector (no ETRecord: the caller maps instruction ids to the
    eager graph). `buffer_size` and `larger_hint` word the note when events came back without
    data (a debug buffer too small for every intermediate)."""
    from executorch.devtools import Inspector

    inspector = Inspector(etdump_path=str(etdump), debug_buffer_path=str(debug_buffer) if debug_buffer else None)
    items: list[Intermediate] = []
    notes: list[str] = []
    missing = inside = 0
    for block in inspector.event_blocks:
        for event in block.events:
            if event.name in _NOT_OPERATORS or event._instruction_id is None:
                continue
            if not event.debug_data:
                if event.is_delegated_op:
                    inside += 1  # a delegate's own per-operator event (profiling only)
                else:
                    missing += 1
                continue
            arrays = [intermediate_array(t) for t in event.debug_data]
            kind = "delegate" if event.name == "DELEGATE_CALL" or event.is_delegated_op else "kernel"
            op = event.name[len("native_call_"):] if event.name.startswith("native_call_") else event.name
            items.append(Intermediate(len(items), 0, int(event._instruction_id), kind, op, arrays))
    if inside:
        notes.append(f"{inside} operator events inside delegates carry no output data (the delegate logs timings "
                     "only): each delegate call is one row")
    if missing:
        notes.append(f"{missing} operator events came back without data: the debug buffer ({buffer_size}) may be "
                     f"too small; {larger_hint}")
    return items, notes



def walker_observer(walker: Any, sink: list[Intermediate]):
    """An observer for ProgramWalker that appends every kernel / delegate output to `sink`, and for a
    delegate whose runner records its inside (`capture_inner`, turned on here), one "delegate-op"
    row per operator of the call first (in the payload's order), then the call's own row."""
    import torch
    from executorch.exir import schema as S

    for runner in walker.delegate_runners.values():
        if hasattr(runner, "capture_inner"):
            runner.capture_inner = True

    def to_arrays(values: list[Any]) -> list[np.ndarray]:
        out = []
        for v in values:
            if isinstance(v, (list, tuple)):
                out.extend(to_arrays(list(v)))
            elif isinstance(v, torch.Tensor):
                out.append(intermediate_array(v.clone()))
            elif isinstance(v, (int, float, bool)):
                out.append(np.asarray(v))
        return out

    def observe(method: str, chain: int, pc: int, ins: Any, frame: Any) -> None:
        plan = frame.plan
        if isinstance(ins, S.KernelCall):
            kernel = walker._kernel(method, plan, ins.op_index)
            n = len(kernel.schema.arguments)
            outs = [i for a, i in zip(kernel.schema.arguments, ins.args[:n]) if a.is_out] or list(ins.args[n:])
            sink.append(Intermediate(len(sink), chain, pc, "kernel", kernel.name, to_arrays([frame.get(i) for i in outs])))
        else:
            delegate = plan.delegates[ins.delegate_index]
            runner = walker.delegate_runners[delegate.id]
            payload = bytes(walker.loaded.program.backend_delegate_data[delegate.processed.index].data)
            n_out = runner.num_outputs(payload)
            outs = list(ins.args[len(ins.args) - n_out:])
            for inner in getattr(runner, "last_inner", None) or []:
                sink.append(Intermediate(len(sink), chain, pc, "delegate-op", inner.op, list(inner.outputs),
                                         inner.index, inner.name, dict(inner.info)))
            if hasattr(runner, "last_inner"):
                runner.last_inner = []
            sink.append(Intermediate(len(sink), chain, pc, "delegate", f"delegate:{delegate.id}",
                                     to_arrays([frame.get(i) for i in outs])))

    return observe


def save(work_dir: Path, run_meta: dict[str, Any], intermediates: list[Intermediate], outputs: list[np.ndarray]) -> None:
    """Write intermediates.npz + intermediates.json (the worker's result)."""
    arrays: dict[str, np.ndarray] = {}
    recs = []
    for item in intermediates:
        keys = []
        for j, a in enumerate(item.outputs):
            key = f"i{item.index}_o{j}"
            arrays[key] = np.ascontiguousarray(a)
            keys.append(key)
        rec = {"index": item.index, "chain": item.chain, "instruction": item.instruction, "kind": item.kind,
               "op": item.op, "outputs": keys}
        if item.kind == "delegate-op" or item.delegate_op is not None:
            rec.update(delegate_op=item.delegate_op, name=item.name, info=item.info)
        recs.append(rec)
    out_keys = []
    for j, a in enumerate(outputs):
        arrays[f"out{j}"] = np.ascontiguousarray(a)
        out_keys.append(f"out{j}")
    np.savez(work_dir / "intermediates.npz", **arrays)
    (work_dir / "intermediates.json").write_text(json.dumps({**run_meta, "intermediates": recs, "outputs": out_keys}))
