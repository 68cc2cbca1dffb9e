"""`bundlerun doctor`: which targets are ready here, and what is missing for the others.

Each registered target module declares its own probe (`TargetSpec.doctor`);
this command only runs them and prints the rows. No torch import; every probe
is bounded by a timeout and never raises.
"""

from __future__ import annotations


from pathlib import Path

import click
from bundlerun.bundles.errors import BundlerunError
from bundlerun.targets import Check, families

def collect(project: dict) -> list[dict]:
    """Rows of {target, component, ok, detail, where} from every registered target's own probe;
    `ok` None means not applicable. Plus the runners in the build cache."""
    from dataclasses import asdict

    targets_cfg = project.get("targets", {}) if isinstance(project, dict) else {}
    rows: list[dict] = []
    for spec in families():
        section = targets_cfg.get(spec.name, {}) if isinstance(targets_cfg, dict) else {}
        if spec.doctor is None:
            continue
        try:
            checks = spec.doctor(section if isinstance(section, dict) else {})
        except Exception as exc:  # noqa: BLE001 - a probe must never take doctor down
            # a BundlerunError (a damaged runner entry) is its own one line
            said = str(exc) if isinstance(exc, BundlerunError) else f"{type(exc).__name__}: {exc}"
            checks = [Check(spec.name, False, f"probe failed: {said}")]
        rows.extend({"target": spec.name, **asdict(c)} for c in checks)
    return rows


def readiness(rows: list[dict]) -> dict[str, tuple[bool, list[str]]]:
    """target -> (ready, what is missing): ready when none of its components is missing."""
    out: dict[str, tuple[bool, list[str]]] = {}
    for row in rows:
        ready, missing = out.get(row["target"], (True, []))
        if row["ok"] is False:
            ready, missing = False, [*missing, row["component"]]
        out[row["target"]] = (ready, missing)
    return out


@click.command(name="doctor")
@click.option("--config", "config_path", type=click.Path(path_type=Path), default=None,
              help="bundlerun.toml to read [targets.fvp] from (default: found upward from cwd).")
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
def command(config_path: Path | None, as_json: bool) -> None:
    """Report which targets this machine can drive (FVPs, toolchain, runners, TOSA, Vela, adb)."""
    project: dict = {}
    try:
        from bundlerun.bundles.project_config import load_project_config  # optional: its failure to load is handled here

        project = load_project_config(config_path, validate_tolerances=False) or {}
    except ImportError:
        pass
    rows = collect(project)
    if as_json:
        import json

        click.echo(json.dumps({"checks": rows, "targets": {k: {"ready": r, "missing": m}
                                                          for k, (r, m) in readiness(rows).items()}}, indent=2))
        return
    from bundlerun.runner.report.console import wide_console  # start-up: not loaded by `bundlerun --help`
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="bundlerun doctor", show_lines=False)
    table.add_column("target", no_wrap=True)
    table.add_column("component", no_wrap=True)
    table.add_column("status")
    table.add_column("version / detail")
    table.add_column("location", overflow="fold")
    marks = {True: "[green]ok[/green]", False: "[red]missing[/red]", None: "[yellow]-[/yellow]"}
    for row in rows:
        table.add_row(escape(row["target"]), escape(row["component"]), marks[row["ok"]], escape(row["detail"]),
                      escape(row["where"]))
    console = wide_console()
    console.print(table)
    for name, (ready, missing) in readiness(rows).items():
        console.print(f"{escape(name)}: " + ("[green]ready[/green]" if ready else f"[red]not ready[/red] (missing {escape(', '.join(missing))})"))
