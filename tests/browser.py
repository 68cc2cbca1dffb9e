"""Load a page in real headless Chromium and inspect it over the DevTools protocol.

A minimal RFC 6455 websocket client on the standard library (no extra
dependency) speaks CDP to the page: it collects console errors, uncaught
exceptions and log errors, reports every <img>'s decode state, and takes a
full-page screenshot. The browser runs in its own process group and is always
reaped.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
]


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None


class WebSocket:
    def __init__(self, url: str, timeout: float = 30.0) -> None:
        m = re.match(r"ws://([^/:]+):(\d+)(/.*)", url)
        if not m:
            raise ValueError(url)
        host, port, path = m.group(1), int(m.group(2)), m.group(3)
        self.sock = socket.create_connection((host, port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("websocket handshake closed")
            head += chunk
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError(f"websocket handshake refused: {head[:200]!r}")
        self.buf = head.split(b"\r\n\r\n", 1)[1]

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("websocket closed")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def send(self, text: str) -> None:
        payload = text.encode()
        header = bytearray([0x81])
        n = len(payload)
        if n < 126:
            header.append(0x80 | n)
        elif n < 1 << 16:
            header += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(bytes(header) + mask + masked)

    def recv(self) -> str:
        message = b""
        while True:
            b0, b1 = self._read(2)
            opcode, n = b0 & 0x0F, b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            mask = self._read(4) if b1 & 0x80 else None
            data = self._read(n)
            if mask:
                data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
            if opcode == 8:
                raise ConnectionError("websocket closed by peer")
            if opcode == 9:  # ping -> pong
                self.sock.sendall(bytes([0x8A, 0x80]) + os.urandom(4))
                continue
            message += data
            if b0 & 0x80:
                return message.decode()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


@dataclass
class PageCheck:
    console_errors: list[str] = field(default_factory=list)
    images: list[dict[str, Any]] = field(default_factory=list)
    title: str = ""
    screenshot: Path | None = None
    evaluated: Any = None  # what `evaluate` returned (JSON), read from the page the browser built
    viewport: Path | None = None  # a screenshot of the first screen only (what a reader sees on opening)


def check_page(url: str, screenshot: Path, timeout: float = 60.0, width: int = 1280, height: int = 900,
               evaluate: str | None = None, viewport: Path | None = None) -> PageCheck:
    """Open `url`, wait for load, collect errors and image states, screenshot the full page (and
    the first screen into `viewport`); `evaluate`, a JavaScript expression whose value is
    JSON-serialisable, is run once images have decoded and its value kept in `evaluated`."""
    exe = chromium_path()
    if exe is None:
        raise FileNotFoundError("chromium not installed")
    profile = tempfile.mkdtemp(prefix="bundlerun-chromium-")
    proc = subprocess.Popen(
        [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
         f"--window-size={width},{height}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )
    ws = None
    try:
        deadline = time.monotonic() + timeout
        stderr_lines: list[str] = []
        found = threading.Event()

        def drain() -> None:  # keep reading so chromium never blocks on a full pipe
            for raw in iter(proc.stderr.readline, b""):
                stderr_lines.append(raw.decode(errors="replace"))
                if "DevTools listening on" in stderr_lines[-1]:
                    found.set()

        threading.Thread(target=drain, daemon=True).start()
        if not found.wait(timeout):
            raise RuntimeError("chromium did not start: " + "".join(stderr_lines)[-2000:])
        port = int(re.search(r"DevTools listening on ws://[^:]+:(\d+)/", "".join(stderr_lines)).group(1))
        pages = []
        while not pages:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as resp:
                pages = [t for t in json.load(resp) if t.get("type") == "page"]
            if not pages:
                time.sleep(0.1)
        ws = WebSocket(pages[0]["webSocketDebuggerUrl"], timeout=timeout)
        result = PageCheck()
        next_id = [0]
        events: list[dict[str, Any]] = []

        def call(method: str, **params: Any) -> dict[str, Any]:
            next_id[0] += 1
            ws.send(json.dumps({"id": next_id[0], "method": method, "params": params}))
            while True:
                msg = json.loads(ws.recv())
                if msg.get("id") == next_id[0]:
                    if "error" in msg:
                        raise RuntimeError(f"{method}: {msg['error']}")
                    return msg.get("result", {})
                events.append(msg)

        for domain in ("Runtime", "Log", "Page"):
            call(f"{domain}.enable")
        call("Page.navigate", url=url)
        while not any(e.get("method") == "Page.loadEventFired" for e in events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"page {url} did not load in {timeout} s")
            events.append(json.loads(ws.recv()))
        # Images are decoded asynchronously; wait until each has finished (or failed).
        js = ("Promise.all([...document.images].map(i => i.decode().then(() => 1, () => 0)))"
              ".then(() => JSON.stringify([...document.images].map(i => ({alt: i.alt, complete: i.complete, "
              "naturalWidth: i.naturalWidth, naturalHeight: i.naturalHeight}))))")
        value = call("Runtime.evaluate", expression=js, awaitPromise=True, returnByValue=True)["result"]["value"]
        result.images = json.loads(value)
        result.title = call("Runtime.evaluate", expression="document.title", returnByValue=True)["result"]["value"]
        if evaluate is not None:
            got = call("Runtime.evaluate", expression=f"JSON.stringify({evaluate})", returnByValue=True)
            if "exceptionDetails" in got:
                raise RuntimeError(f"evaluate failed: {json.dumps(got['exceptionDetails'])[:500]}")
            result.evaluated = json.loads(got["result"]["value"])
        if viewport is not None:
            shot = call("Page.captureScreenshot", format="png")
            viewport.write_bytes(base64.b64decode(shot["data"]))
            result.viewport = viewport
        metrics = call("Page.getLayoutMetrics")
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        shot = call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                    clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1})
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        result.screenshot = screenshot
        for e in events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                result.console_errors.append(json.dumps(params.get("args"))[:500])
            elif method == "Runtime.exceptionThrown":
                result.console_errors.append(json.dumps(params.get("exceptionDetails"))[:500])
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                result.console_errors.append(params["entry"].get("text", "")[:500])
        return result
    finally:
        if ws is not None:
            ws.close()
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
        shutil.rmtree(profile, ignore_errors=True)
