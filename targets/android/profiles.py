"""How each on-device runner is invoked and how its results are read back.

executor-runner: ExecuTorch's portable executor_runner built with BundleIO (its
flags, log and exit codes: targets/et_runner/executor_runner.py). It checks test case 0
only, so each case runs as its own one-case bundle and its tensors come back
from `--output_file PREFIX` (`PREFIX-<i>.bin`).

qnn-executor-runner: reads a plain .pte plus raw inputs listed in
input_list.txt (one line per inference) and writes
`output_<inference>_<output>.raw`; all cases run in one process.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from bundlerun.bundles.errors import TargetError
from bundlerun.targets.android.config import SOC_HTP_ARCH, AndroidTargetConfig

RUNNER_NAMES = {"executor-runner": "executor_runner", "qnn-executor-runner": "qnn_executor_runner"}
_OUTPUT_RAW = re.compile(r"^output_(\d+)_(\d+)\.raw$")


def qnn_runner_args(method_index: int, etdump: str | None) -> list[str]:
    args = ["--model_path", "model.pte", "--input_list_path", "input_list.txt", "--output_folder_path", "outputs"]
    if method_index:
        args += ["--method_index", str(method_index)]
    if etdump:
        args += ["--etdump_path", etdump]
    return args


def runner_command(run_dir: str, runner_name: str, args: list[str], env: dict[str, str]) -> str:
    """cd into the run folder and start the runner through a constant `sh -c` that
    records its pid (to kill a hung runner later) and execs the runner, so the exit
    status (139 for SIGSEGV) is the runner's own. Every path and argument is a
    separately quoted word; nothing user-supplied is spliced into nested quotes."""
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    parts = [f"cd {shlex.quote(run_dir)}"]
    if exports:
        parts.append(f"export {exports}")
    launcher = "sh -c " + shlex.quote('echo $$ > .runner.pid && exec "$0" "$@"')
    parts.append(f"{launcher} ./{shlex.quote(runner_name)} " + " ".join(shlex.quote(a) for a in args))
    return " && ".join(parts)


def sort_qnn_outputs(names: list[str]) -> dict[int, list[str]]:
    """output_<inference>_<output>.raw grouped by inference, sorted numerically (10 after 9)."""
    grouped: dict[int, list[tuple[int, str]]] = {}
    for name in names:
        m = _OUTPUT_RAW.match(name)
        if m:
            grouped.setdefault(int(m.group(1)), []).append((int(m.group(2)), name))
    return {k: [n for _, n in sorted(v)] for k, v in sorted(grouped.items())}


def qnn_libraries(cfg: AndroidTargetConfig, htp_arch: str) -> list[Path]:
    """The QNN HTP libraries for one Hexagon architecture: what ExecuTorch pushes beside
    qnn_executor_runner (backends/qualcomm/export_utils.py:313-326 at the pinned commit)."""
    if cfg.qnn_sdk_root is None:
        raise TargetError("qnn-executor-runner needs the QNN SDK: set QNN_SDK_ROOT or [targets.adb] qnn_sdk_root")
    root = Path(cfg.qnn_sdk_root)
    android = root / "lib" / "aarch64-android"
    libs = [
        android / "libQnnHtp.so",
        android / "libQnnSystem.so",
        android / f"libQnnHtpV{htp_arch}Stub.so",
        android / "libQnnHtpPrepare.so",
        root / "lib" / f"hexagon-v{htp_arch}" / "unsigned" / f"libQnnHtpV{htp_arch}Skel.so",
    ]
    if cfg.qnn_backend_lib is not None:
        libs.append(Path(cfg.qnn_backend_lib))
    missing = [str(p) for p in libs if not p.is_file()]
    if missing:
        raise TargetError(f"QNN libraries missing for HTP v{htp_arch}: {', '.join(missing)}")
    return libs


def resolve_htp_arch(cfg: AndroidTargetConfig, device_soc: str | None) -> str:
    if cfg.htp_arch:
        return str(cfg.htp_arch).lstrip("vV")
    soc = (cfg.soc_model or device_soc or "").strip().upper()
    if soc in SOC_HTP_ARCH:
        return SOC_HTP_ARCH[soc]
    raise TargetError(
        f"cannot tell the Hexagon HTP architecture of SoC {soc or '(unknown)'}; set [targets.adb] htp_arch "
        f"(known SoCs: {', '.join(sorted(SOC_HTP_ARCH))})")
