"""A headless Chromium driven over its DevTools protocol (websocket-client), for the page tests.

Chromium is the Debian package (`.ci/run` installs it when missing); no browser is downloaded.
"""
from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def browser_path() -> str | None:
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


class Chromium:
    """One headless browser with one page; `evaluate` runs JavaScript in it, `screenshot` returns PNG bytes."""

    def __init__(self, width: int = 1400, height: int = 1000, timeout: float = 60.0):
        import websocket  # websocket-client (the test extra)
        self.profile = tempfile.TemporaryDirectory(prefix="golinear-chromium-", ignore_cleanup_errors=True)  # its helpers may still write
        self.proc = subprocess.Popen(
            [browser_path(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--hide-scrollbars", f"--window-size={width},{height}", "--remote-debugging-port=0",
             f"--user-data-dir={self.profile.name}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file, deadline = Path(self.profile.name) / "DevToolsActivePort", time.monotonic() + timeout
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=timeout))
        url = next(p["webSocketDebuggerUrl"] for p in pages if p["type"] == "page")
        self.ws = websocket.create_connection(url, timeout=timeout, suppress_origin=True)
        self.ids = itertools.count(1)

    def send(self, method: str, **params) -> dict:
        msg_id = next(self.ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def open(self, path: Path) -> None:
        self.send("Page.enable")
        self.send("Page.navigate", url=Path(path).resolve().as_uri())
        for _ in range(600):
            if self.evaluate("document.readyState") == "complete":
                return
            time.sleep(0.1)
        raise RuntimeError(f"{path} did not finish loading")

    def evaluate(self, expression: str):
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self) -> bytes:
        return base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"])

    def close(self) -> None:
        if getattr(self, "ws", None):
            self.ws.close()
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.profile.cleanup()
