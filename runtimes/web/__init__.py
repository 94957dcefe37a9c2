"""The browser runtime: LiteRT.js in headless Chromium (see runner.py; page and script here)."""

from runtimes.web.runner import (
    WebResult,
    WebRunError,
    find_browser,
    run_in_browser,
    run_many_in_browser,
    web_unavailable,
)

__all__ = ["WebResult", "WebRunError", "find_browser", "run_in_browser", "run_many_in_browser", "web_unavailable"]
