"""`bundlerun devices`: the Android devices an adb server sees, with their state.

A farm operator's first question before a run: which serials are `device`
(ready), `offline` or `unauthorized` (accept the prompt). Uses the real adb CLI,
optionally against a remote server (-H/-P, like adb itself).
"""

from __future__ import annotations

import json

import click
from bundlerun.bundles.errors import BundlerunError


@click.command(name="devices")
@click.option("--adb-host", "-H", "host", default=None, help="adb server host (adb -H).")
@click.option("--adb-port", "-P", "port", type=int, default=None, help="adb server port (adb -P).")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def command(host, port, as_json):
    """List Android devices attached to the adb server and their state.

    Exit code: 0 when at least one device is ready, 1 when none is, 2 when adb
    itself cannot be used.
    """
    from bundlerun.targets.android.adb_cli import AdbCliTransport  # start-up: not loaded by `bundlerun --help`

    transport = AdbCliTransport(None, server_host=host, server_port=port)
    try:
        entries = transport.devices()
    except BundlerunError as exc:
        raise click.ClickException(str(exc)) from None
    hints = {"unauthorized": "accept the 'Allow USB debugging' prompt on the device",
             "offline": "replug it, or `adb reconnect`"}
    if as_json:
        click.echo(json.dumps([{"serial": e.serial, "state": e.state, **e.info} for e in entries], indent=2))
    elif not entries:
        click.echo("no devices attached")
    else:
        for e in entries:
            model = e.info.get("model", "")
            hint = hints.get(e.state, "")
            from bundlerun.runner.report.safe_text import visible  # serials and models come from the adb server

            click.echo(visible(f"{e.serial:24} {e.state:13} {model:20} {hint}".rstrip()))
    raise SystemExit(0 if any(e.state == "device" for e in entries) else 1)
