"""The chapter 08 roofline widget in real JupyterLab, driven by headless Chromium.

Opens a copy of ``notebooks/08_gpu_hardware_and_roofline.ipynb`` in a private JupyterLab server
(the helpers of ``tests/test_browser.py``: random token, free port on 127.0.0.1, its own
settings / runtime / workspace folders), runs all cells from the Run menu, presses ArrowRight on
the widget's concurrency slider and checks that the summary the kernel sends back changes to one
more sequence. Skipped, saying what is missing, without Debian's ``chromium`` or ``playwright``.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_browser import (CHROMIUM, CHROMIUM_ARGS, RUN_TIMEOUT_MS, _accept_kernel_dialog,
                          _free_port, _require_browser, _run_all_cells, _wait_for_server)

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = "08_gpu_hardware_and_roofline.ipynb"


@pytest.fixture(scope="module")
def lab08(tmp_path_factory):
    """A private JupyterLab serving a copy of chapter 08; yields (base_url, token)."""
    _require_browser()
    home = tmp_path_factory.mktemp("lab08")
    served = home / "notebooks"
    served.mkdir()
    shutil.copy(ROOT / "notebooks" / NOTEBOOK, served / NOTEBOOK)  # JupyterLab autosaves
    settings = home / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    notebook_settings = home / "settings" / "@jupyterlab" / "notebook-extension"
    notebook_settings.mkdir(parents=True)   # draw every cell, not only those scrolled into view
    (notebook_settings / "tracker.jupyterlab-settings").write_text(
        json.dumps({"windowingMode": "none"}))
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(home / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"),
               JUPYTER_RUNTIME_DIR=str(home / "runtime"), JUPYTER_CONFIG_DIR=str(home / "config"),
               JUPYTER_DATA_DIR=str(home / "data"),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    port, token = _free_port(), secrets.token_hex(16)
    log = home / "lab.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip", "127.0.0.1",
             "--port", str(port), f"--IdentityProvider.token={token}", "--allow-root",
             f"--ServerApp.root_dir={home}"],
            cwd=home, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_for_server(f"{base}/api/status?token={token}", proc, log)
        yield base, token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def page08(lab08):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser.new_page(viewport={"width": 1400, "height": 1000})
        finally:
            browser.close()


def test_concurrency_slider_changes_the_summary(lab08, page08):
    base, token = lab08
    page = page08
    page.goto(f"{base}/lab/tree/notebooks/{NOTEBOOK}?token={token}")
    page.locator(".jp-Notebook").first.wait_for(state="visible", timeout=RUN_TIMEOUT_MS)
    _accept_kernel_dialog(page)
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle'], "
                 ".jp-Toolbar-kernelStatus").first.wait_for(timeout=RUN_TIMEOUT_MS)
    _run_all_cells(page)

    # the cell after the widget switches to Llama-2-70B on 4 GPUs and 16 sequences: wait until
    # the live kernel has run it (stored outputs are on the page from the start)
    sel = ".llminfra-roofline-calculator .llminfra-roofline-summary"
    has_text = ("([sel, text]) => Array.from(document.querySelectorAll(sel))"
                ".some(e => e.innerText.includes(text))")
    page.wait_for_function(has_text, arg=[sel, "16 sequences at once"], timeout=RUN_TIMEOUT_MS)
    summary = page.locator(sel).last
    before = summary.inner_text()
    tokens_before = re.search(r"([\d.]+) tokens/s in all", before).group(1)

    calc = page.locator(".llminfra-roofline-calculator").last
    handles = calc.locator(".widget-slider .noUi-handle")
    assert handles.count() == 2  # context, concurrency
    handles.nth(1).focus()
    page.keyboard.press("ArrowRight")

    page.wait_for_function(has_text, arg=[sel, "17 sequences at once"], timeout=60_000)
    after = summary.inner_text()
    assert re.search(r"([\d.]+) tokens/s in all", after).group(1) != tokens_before
