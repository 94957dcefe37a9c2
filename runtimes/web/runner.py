"""Run a .tflite model in headless Chromium with LiteRT.js (`@litertjs/core`).

A local HTTP server on 127.0.0.1 serves this folder (page, script, node_modules), the
model and a job (inputs, accelerator, run counts); Chromium opens the page, which runs
the job and POSTs the outputs and timings back. Nothing leaves the machine.

    from runtimes.web import run_in_browser
    result = run_in_browser(open("model.tflite", "rb").read(), [x])
    result.outputs, result.times_ms

Needs `npm ci` in runtimes/web (installs the pinned @litertjs/core) and a Chromium
(Debian: `apt-get install chromium`); `web_unavailable()` says what is missing.
"""

from __future__ import annotations

import base64
import json
import mimetypes
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

WEB_DIR = os.path.dirname(os.path.abspath(__file__))
CORE_DIR = os.path.join(WEB_DIR, "node_modules", "@litertjs", "core")
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Headless flags that work as root on a machine without network or GPU.
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-dev-shm-usage",
)
WEB_DTYPES = {np.dtype(np.float32): "float32", np.dtype(np.int32): "int32", np.dtype(np.uint8): "uint8"}


class WebRunError(RuntimeError):
    """The browser could not load or run the model; the message holds the page's error."""


@dataclass
class WebResult:
    outputs: list[np.ndarray]
    init_ms: float  # fetch and compile the model (the first model also pays loading LiteRT.js wasm)
    first_ms: float  # the first run
    times_ms: list[float] = field(default_factory=list)  # the timed runs after warm-up
    user_agent: str = ""
    error: str | None = None  # what LiteRT.js said when this model failed (outputs empty)


def find_browser() -> str | None:
    env = os.environ.get("LITERT_TORCH_CHROMIUM")
    if env:
        return env if os.path.isfile(env) else None
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def web_unavailable() -> str | None:
    """Why the web runner cannot run here (None when it can)."""
    if not os.path.isfile(os.path.join(CORE_DIR, "dist", "index.js")):
        return f"@litertjs/core is not installed: run `npm ci` in {WEB_DIR} (tools/setup.sh --web does it)"
    if find_browser() is None:
        return "no Chromium found: install it (Debian: apt-get install chromium) or set LITERT_TORCH_CHROMIUM"
    return None


def _encode(array: np.ndarray) -> dict:
    array = np.ascontiguousarray(array)
    if array.dtype not in WEB_DTYPES:
        raise TypeError(
            f"LiteRT.js takes float32, int32 or uint8 inputs, got {array.dtype.name}; "
            "convert with target='web' to cast int64 inputs to int32"
        )
    return {
        "data": base64.b64encode(array.astype(array.dtype.newbyteorder("<")).tobytes()).decode(),
        "shape": list(array.shape),
        "dtype": WEB_DTYPES[array.dtype],
    }


def _decode(item: dict) -> np.ndarray:
    raw = base64.b64decode(item["data"])
    return np.frombuffer(raw, dtype=np.dtype(item["dtype"]).newbyteorder("<")).reshape(item["shape"]).copy()


def _handler(files: dict[str, bytes], done: threading.Event, box: dict):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def _send(self, status: int, body: bytes, content_type: str):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            # Cross-origin isolation: lets LiteRT.js use SharedArrayBuffer (threads).
            self.send_header("Cross-Origin-Opener-Policy", "same-origin")
            self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):  # noqa: N802 (http.server naming)
            path = self.path.split("?")[0]
            if path == "/":
                path = "/index.html"
            if path in files:
                return self._send(
                    200, files[path], "application/octet-stream" if path.endswith(".tflite") else "application/json"
                )
            local = os.path.realpath(os.path.join(WEB_DIR, path.lstrip("/")))
            if not local.startswith(WEB_DIR + os.sep) or not os.path.isfile(local):
                return self._send(404, b"not found", "text/plain")
            kind = (
                "application/wasm"
                if local.endswith(".wasm")
                else ("text/javascript" if local.endswith(".js") else mimetypes.guess_type(local)[0] or "text/plain")
            )
            with open(local, "rb") as f:
                self._send(200, f.read(), kind)

        def do_POST(self):  # noqa: N802
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            box["result"] = json.loads(body)
            self._send(200, b"{}", "application/json")
            done.set()

    return Handler


def run_in_browser(
    model_content: bytes, inputs, *, accelerator: str = "wasm", warmup: int = 1, runs: int = 3, timeout: float = 120.0
) -> WebResult:
    """Run `model_content` (its first signature) on `inputs` (numpy arrays, in order) in
    headless Chromium with LiteRT.js; returns outputs (numpy, in order) and timings."""
    [result] = run_many_in_browser(
        [(model_content, inputs)], accelerator=accelerator, warmup=warmup, runs=runs, timeout=timeout
    )
    if result.error:
        raise WebRunError(f"LiteRT.js failed: {result.error}")
    return result


def run_many_in_browser(
    tasks, *, accelerator: str = "wasm", warmup: int = 1, runs: int = 3, timeout: float = 120.0
) -> list[WebResult]:
    """Run several (model_content, inputs) pairs in one browser session (one start-up).
    A model LiteRT.js cannot load or run gets a result with `.error` set; the others run."""
    why = web_unavailable()
    if why:
        raise WebRunError(why)
    if accelerator not in ("wasm", "webgpu"):
        raise ValueError(f"accelerator must be 'wasm' or 'webgpu', got {accelerator!r}")
    files, jobs = {}, []
    for i, (content, inputs) in enumerate(tasks):
        files[f"/model{i}.tflite"] = bytes(content)
        jobs.append({"model": f"/model{i}.tflite", "inputs": [_encode(np.asarray(x)) for x in inputs]})
    job = {"accelerator": accelerator, "warmup": int(warmup), "runs": int(runs), "tasks": jobs}
    files["/job.json"] = json.dumps(job).encode()
    result = _run_page(files, accelerator, timeout)
    if "error" in result:
        raise WebRunError(f"LiteRT.js failed: {result['error']}")
    agent = result.get("user_agent", "")
    return [
        WebResult([], 0.0, 0.0, [], agent, r["error"])
        if "error" in r
        else WebResult(
            [_decode(o) for o in r["outputs"]],
            float(r["init_ms"]) + (result["load_ms"] if not i else 0.0),
            float(r["first_ms"]),
            [float(t) for t in r["times_ms"]],
            agent,
        )
        for i, r in enumerate(result["results"])
    ]


def _run_page(files: dict[str, bytes], accelerator: str, timeout: float) -> dict:
    """Serve `files` and this folder on 127.0.0.1, open the page in headless Chromium and
    return what the page POSTs back."""
    done, box = threading.Event(), {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(files, done, box))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    profile = tempfile.mkdtemp(prefix="litert_web_")
    flags = list(CHROMIUM_FLAGS)
    if accelerator == "webgpu":  # WebGPU needs the GPU process (software rendering here)
        flags = [f for f in flags if f != "--disable-gpu"] + ["--enable-unsafe-webgpu"]
    cmd = [
        find_browser(),
        *flags,
        f"--user-data-dir={profile}",
        f"http://127.0.0.1:{server.server_address[1]}/index.html",
    ]
    browser = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if not done.wait(timeout):
            raise WebRunError(
                f"no result from the browser within {timeout:.0f} s "
                f"(chromium exit code {browser.poll()}; command: {' '.join(cmd)})"
            )
    finally:
        browser.terminate()
        try:
            browser.wait(10)
        except subprocess.TimeoutExpired:
            browser.kill()
            browser.wait()
        server.shutdown()
        server.server_close()
        shutil.rmtree(profile, ignore_errors=True)
    return box["result"]
