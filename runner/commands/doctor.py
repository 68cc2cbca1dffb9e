"""`bundlerun doctor`: what this machine can run, and what is missing.

Checks the tools behind each target family without importing torch: the
Corstone FVPs (`<FVP> --version`), arm-none-eabi-gcc, the configured
arm_executor_runner ELFs, tosa-tools, Vela, the executorch/torch distributions
and adb. Every probe is bounded by a timeout and never raises.
"""

from __future__ import annotations


from pathlib import Path

import click

FVP_NAMES = ("FVP_Corstone_SSE-300_Ethos-U55", "FVP_Corstone_SSE-300_Ethos-U65", "FVP_Corstone_SSE-320")
PROBE_TIMEOUT_S = 30.0


def _probe(cmd: list[str]) -> tuple[bool, str]:
    """Run a version command; (ok, first non-empty output line or the failure)."""
    import subprocess

    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, errors="replace", timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL
        )
    except FileNotFoundError:
        return False, "not found"
    except subprocess.TimeoutExpired:
        return False, f"no answer within {PROBE_TIMEOUT_S:.0f}s"
    except OSError as exc:
        return False, exc.strerror or str(exc)
    text = (proc.stdout or "") + (proc.stderr or "")
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if proc.returncode != 0:
        return False, f"exit {proc.returncode}: {first}"[:160]
    return True, first[:160]


def _dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _fvp_section(project: dict) -> dict:
    targets = project.get("targets", {}) if isinstance(project, dict) else {}
    section = targets.get("fvp", {}) if isinstance(targets, dict) else {}
    return section if isinstance(section, dict) else {}


def collect(project: dict) -> list[dict]:
    """Rows of {component, ok, detail, where}; `ok` None means not applicable."""
    import shutil

    rows: list[dict] = []
    fvp_cfg = _fvp_section(project)
    fvp_dir = fvp_cfg.get("fvp_path")
    for name in FVP_NAMES:
        path = None
        if fvp_dir:
            p = Path(str(fvp_dir)).expanduser()
            cand = p / name if p.is_dir() else p
            if cand.is_file() and (cand.name == name or not p.is_dir()):
                path = str(cand)
        path = path or shutil.which(name)
        if path is None:
            rows.append({"component": name, "ok": False, "detail": "not on PATH" + (f" nor in {fvp_dir}" if fvp_dir else ""), "where": ""})
            continue
        ok, detail = _probe([path, "--version"])
        rows.append({"component": name, "ok": ok, "detail": detail, "where": path})

    gcc = shutil.which("arm-none-eabi-gcc")
    if gcc:
        ok, detail = _probe([gcc, "--version"])
        rows.append({"component": "arm-none-eabi-gcc", "ok": ok, "detail": detail, "where": gcc})
    else:
        rows.append({"component": "arm-none-eabi-gcc", "ok": False, "detail": "not on PATH (needed only to build runners)", "where": ""})

    elfs = _configured_elfs(fvp_cfg)
    if not elfs:
        rows.append({"component": "runner ELF", "ok": None, "detail": "none configured ([targets.fvp] runner_elf)", "where": ""})
    for label, value in elfs:
        p = Path(str(value)).expanduser()
        exists = p.is_file()
        detail = _elf_kind(p) if exists else "missing"
        rows.append({"component": f"runner ELF {label}", "ok": exists, "detail": detail, "where": str(p)})

    for label, dist, module in (
        ("tosa-tools", "tosa-tools", "tosa_reference_model"),
        ("Vela", "ethos-u-vela", "ethosu.vela"),
        ("executorch", "executorch", None),
        ("torch", "torch", None),
        ("pyserial", "pyserial", None),
        ("adb-shell", "adb-shell", None),
    ):
        version = _dist_version(dist)
        importable = True
        if version and module:
            import importlib.util

            try:
                importable = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):
                importable = False
        rows.append(
            {
                "component": label,
                "ok": bool(version) and importable,
                "detail": (version or "not installed") + ("" if importable else f" (module {module} missing)"),
                "where": dist,
            }
        )

    adb = shutil.which("adb")
    if adb:
        ok, detail = _probe([adb, "version"])
        rows.append({"component": "adb", "ok": ok, "detail": detail, "where": adb})
    else:
        rows.append({"component": "adb", "ok": False, "detail": "not on PATH (adb:// targets; adb+tcp:// works without it)", "where": ""})
    return rows


def _configured_elfs(fvp_cfg: dict) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for key in ("runner_elf", "uart_runner_elf"):
        value = fvp_cfg.get(key)
        if isinstance(value, str) and value:
            out.append((key, value))
        elif isinstance(value, dict):
            out.extend((f"{key}[{k}]", v) for k, v in value.items() if isinstance(v, str))
    for key in ("runner_elfs", "uart_runner_elfs"):
        table = fvp_cfg.get(key)
        if isinstance(table, dict):
            out.extend((f"{key}[{k}]", v) for k, v in table.items() if isinstance(v, str))
    for key, sub in fvp_cfg.items():
        if isinstance(sub, dict) and key not in ("runner_elf", "uart_runner_elf", "runner_elfs", "uart_runner_elfs"):
            for name in ("runner_elf", "uart_runner_elf"):
                if isinstance(sub.get(name), str):
                    out.append((f"{key} {name}", sub[name]))
    return out


def _elf_kind(path: Path) -> str:
    try:
        with open(path, "rb") as fh:
            head = fh.read(20)
    except OSError as exc:
        return f"unreadable: {exc.strerror}"
    if head[:4] != b"\x7fELF":
        return "not an ELF file"
    machine = int.from_bytes(head[18:20], "little")
    return "ELF, Arm" if machine == 40 else f"ELF, machine {machine} (not Arm)"


@click.command(name="doctor")
@click.option("--config", "config_path", type=click.Path(path_type=Path), default=None,
              help="bundlerun.toml to read [targets.fvp] from (default: found upward from cwd).")
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
def command(config_path: Path | None, as_json: bool) -> None:
    """Report which targets this machine can drive (FVPs, toolchain, runners, TOSA, Vela, adb)."""
    project: dict = {}
    try:
        from bundles.project_config import load_project_config

        project = load_project_config(config_path, validate_tolerances=False) or {}
    except ImportError:
        pass
    rows = collect(project)
    if as_json:
        import json

        click.echo(json.dumps(rows, indent=2))
        return
    from runner.report import wide_console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="bundlerun doctor", show_lines=False)
    table.add_column("component", no_wrap=True)
    table.add_column("status")
    table.add_column("version / detail")
    table.add_column("location", overflow="fold")
    marks = {True: "[green]ok[/green]", False: "[red]missing[/red]", None: "[yellow]-[/yellow]"}
    for row in rows:
        table.add_row(escape(row["component"]), marks[row["ok"]], escape(row["detail"]), escape(row["where"]))
    wide_console().print(table)
