"""A real headless Chromium, driven over the DevTools protocol on a pipe
(--remote-debugging-pipe: JSON messages ended by a NUL, written to the
browser's fd 3 and read from its fd 4), so the tests open memtrace's flame
graphs as a user's browser does: its script runs, real mouse events hit
real frames, and a screenshot shows what a user would see. No network:
the page is a local file, and the browser opens no port.

Debian's chromium-headless-shell (scripts/setup.sh --dev installs it)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

CANDIDATES = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")


def find() -> str | None:
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def _onto_3_and_4(r: int, w: int) -> None:
    """In the child: the command pipe's end as fd 3, the answer pipe's as fd 4
    (by way of high numbers: either may be 3 or 4 already)."""
    os.dup2(r, 100)
    os.dup2(w, 101)
    os.dup2(100, 3)
    os.dup2(101, 4)


class Browser:
    """One browser with one page (a flattened session on its target)."""

    def __init__(self, width: int = 1280, height: int = 800) -> None:
        exe = find()
        if exe is None:
            raise RuntimeError("no Chromium here: scripts/setup.sh --dev installs chromium-headless-shell")
        to_browser_r, self._w = os.pipe()
        self._r, from_browser_w = os.pipe()
        # The browser reads commands on its fd 3 and writes answers on its fd 4.
        self.proc = subprocess.Popen(
            [
                exe,
                "--headless",
                "--remote-debugging-pipe",
                "--no-sandbox",  # the tests run as root
                "--disable-gpu",
                "--no-first-run",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(3, 4),
            preexec_fn=lambda: _onto_3_and_4(to_browser_r, from_browser_w),
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buf = b""
        self._id = 0
        self.session: str | None = None
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.exceptions: list[str] = []

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command (on the page's session once there is one) and wait for its answer."""
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if self.session is not None and not method.startswith("Target."):
            msg["sessionId"] = self.session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._next(30.0)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if reply.get("method") == "Runtime.exceptionThrown":
                d = reply["params"]["exceptionDetails"]
                self.exceptions.append(d.get("exception", {}).get("description") or d.get("text", ""))

    def _next(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buf:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("the browser did not answer")
            chunk = os.read(self._r, 1 << 16)
            if not chunk:
                raise RuntimeError("the browser closed its pipe")
            self._buf += chunk
        msg, _, self._buf = self._buf.partition(b"\0")
        return dict(json.loads(msg))

    def open(self, path: Path) -> None:
        """Load a local file and wait until it (and its scripts) have loaded."""
        self.call("Page.navigate", url=path.resolve().as_uri())
        deadline = time.monotonic() + 30
        while self.eval("document.readyState") != "complete":
            if time.monotonic() > deadline:
                raise RuntimeError(f"{path} did not finish loading")
            time.sleep(0.05)

    def eval(self, expression: str) -> Any:
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def click(self, x: float, y: float) -> None:
        """A real left click at page coordinates: the browser hit-tests it."""
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except RuntimeError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._w)
        os.close(self._r)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
