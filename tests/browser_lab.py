"""Drive a real JupyterLab from headless Chromium: the server, the page, run-all, a widget's move.

Used by ``tests/test_browser.py``. One private JupyterLab per test session serves a *copy* of the
repository (JupyterLab autosaves into what it serves), started with the Makefile's
``COURSE_LAB_ARGS`` (what ``make course`` runs) plus a random token, a free port on 127.0.0.1
and its own settings / runtime / workspace folders. Chromium is Debian's (``/usr/bin/chromium``),
driven by pip's ``playwright`` without ``playwright install``. Facts this relies on (flags,
selectors, the news pop-up, run-all from the menu) are in NOTEBOOK_TESTING.md.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]
START_TIMEOUT_S = 90
#: autosave interval of the test's JupyterLab (default 120 s): a rewrite on open shows quickly
AUTOSAVE_S = 1
#: not copied into the served repository
COPY_IGNORE = shutil.ignore_patterns(".git", ".venv", "__pycache__", ".pytest_cache",
                                     ".hypothesis", ".jupyter-test", "docs", "*.egg-info",
                                     "bench-results", ".whl", ".gl", ".ipynb_checkpoints")
ERROR_MARK = re.compile(r"Traceback \(most recent call last\)|^\w*(Error|Exception)\b", re.M)


class WidgetDidNotChange(AssertionError):
    """The widget's output did not show the expected text after its control moved."""


class CellError(AssertionError):
    """A cell showed an error (or run-all stopped before the last cell)."""


def course_lab_args() -> list[str]:
    """The arguments ``make course`` gives ``jupyter lab`` (the Makefile's COURSE_LAB_ARGS)."""
    m = re.search(r"^COURSE_LAB_ARGS\s*:?=\s*(.*)$", (ROOT / "Makefile").read_text(), re.M)
    if not m:
        raise AssertionError("Makefile defines no COURSE_LAB_ARGS")
    return shlex.split(m.group(1))


def copy_repository(dest: Path) -> Path:
    """A copy of the repository's working tree (no .git, no .venv, no caches) at ``dest``."""
    shutil.copytree(ROOT, dest, ignore=COPY_IGNORE)
    return dest


def _write_settings(settings: Path) -> None:
    files = {"apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
             "docmanager-extension/plugin": {"autosaveInterval": AUTOSAVE_S},
             # draw every cell, not only those scrolled into view
             "notebook-extension/tracker": {"windowingMode": "none"}}
    for name, value in files.items():
        path = settings / "@jupyterlab" / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Lab:
    """A running JupyterLab: ``base`` URL, ``token``, the ``served`` copy, ``runtime`` folder."""
    proc: subprocess.Popen
    base: str
    token: str
    served: Path
    runtime: Path
    log: Path

    def url(self, path: str) -> str:
        """``path`` opened in a fresh workspace (nothing restored from earlier tests)."""
        return f"{self.base}/lab/workspaces/w{secrets.token_hex(4)}/tree/{path}?token={self.token}"

    def shut_down_kernels(self) -> None:
        """Delete every session (and its kernel), so kernels of closed tabs free their memory."""
        api = f"{self.base}/api/sessions"
        with urllib.request.urlopen(f"{api}?token={self.token}", timeout=10) as r:
            sessions = json.loads(r.read())
        for s in sessions:
            req = urllib.request.Request(f"{api}/{s['id']}?token={self.token}", method="DELETE")
            urllib.request.urlopen(req, timeout=30).close()

    def start_page_file(self) -> Path:
        """The file ``make course`` hands the learner's browser (redirects to the start notebook)."""
        return self.runtime / f"jpserver-file-to-run-{self.proc.pid}-open.html"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def start_lab(home: Path, served: Path) -> Lab:
    """Start JupyterLab on ``served`` (cwd) as ``make course`` does, privately; wait until it answers."""
    _write_settings(home / "settings")
    runtime = home / "runtime"
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(home / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"),
               JUPYTER_RUNTIME_DIR=str(runtime), JUPYTER_CONFIG_DIR=str(home / "config"),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    port, token = _free_port(), secrets.token_hex(16)
    log = home / "lab.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip", "127.0.0.1",
             "--port", str(port), f"--IdentityProvider.token={token}", "--allow-root",
             *course_lab_args()],
            cwd=served, env=env, stdout=out, stderr=subprocess.STDOUT)
    lab = Lab(proc, f"http://127.0.0.1:{port}", token, served, runtime, log)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{lab.base}/api/status?token={token}", timeout=2) as r:
                if r.status == 200:
                    return lab
        except OSError:
            time.sleep(0.5)
    lab.stop()
    raise RuntimeError(f"jupyter lab did not answer within {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


#: the notebook panel on show (others may sit in hidden tabs)
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"


def wait_for_kernel(page, timeout_ms: int) -> None:
    """Wait for the notebook, click through a "Select Kernel" dialog if one shows, wait for idle."""
    page.locator(f"{PANEL} .jp-Notebook").first.wait_for(state="visible", timeout=timeout_ms)
    dialog = page.locator(".jp-Dialog .jp-mod-accept")
    idle = page.locator(f"{PANEL} .jp-Notebook-ExecutionIndicator[data-status='idle']")
    dialog.or_(idle).first.wait_for(state="visible", timeout=timeout_ms)   # whichever comes first
    if dialog.count():
        dialog.first.click()
    idle.first.wait_for(timeout=timeout_ms)


def _menu(page, menu: str, item: str) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(rf"^{menu}$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(rf"^{re.escape(item)}$")).click()


_RUN_FINISHED = """(panelSelector) => {
  const panel = document.querySelector(panelSelector);
  if (!panel) return false;
  const prompts = [...panel.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]
      .map(p => p.textContent.trim());  // innerText is '' off screen
  if (prompts.length === 0 || prompts.some(p => p.includes('*'))) return false;
  const errors = [...panel.querySelectorAll(
      ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")];
  return /\\[\\d+\\]/.test(prompts[prompts.length - 1]) || errors.length > 0;
}"""


def run_all_cells(page, timeout_ms: int) -> None:
    """Clear the stored outputs, run all cells from the Run menu, wait until the last code cell
    has run (or run-all stopped), and raise :class:`CellError` if any cell shows an error."""
    _menu(page, "Edit", "Clear Outputs of All Cells")
    _menu(page, "Run", "Run All Cells")
    page.wait_for_function(_RUN_FINISHED, arg=PANEL, timeout=timeout_ms, polling=250)
    stderr = page.locator(f"{PANEL} .jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    errors = [t for t in stderr.all_text_contents() if ERROR_MARK.search(t)]
    prompts = page.locator(f"{PANEL} .jp-CodeCell .jp-InputPrompt").all_text_contents()
    not_run = [i for i, p in enumerate(prompts) if not re.search(r"\[\d+\]", p)]
    if errors or not_run:
        raise CellError(f"{len(errors)} cell(s) show an error, code cells {not_run} did not run; "
                        f"first error:\n{errors[0][-2000:] if errors else '(none)'}")


@dataclass(frozen=True)
class WidgetRow:
    """One widget of one chapter, and how the browser test moves it.

    ``control``: Playwright selector of the main control's container (``.widget-slider``,
    ``.widget-text`` or ``.widget-dropdown``); ``move``: ``"ArrowRight"`` / ``"ArrowLeft"`` (a
    slider's handle gets the key), ``"type:<text>"`` (typed into the text box, then Enter) or
    ``"select:<option>"`` (chosen in the drop-down); ``expected(value)``: the strings the widget
    must show once the control holds ``value`` (read back from the slider's readout, the text
    box or the drop-down: a number, or the option's text), computed from the package;
    ``sabotage``: code that, appended to a copy of the notebook, disconnects the control's
    callback (used to show the test can fail). Rows of one notebook run in their order.
    """
    chapter: str
    notebook: str
    control: str
    move: str
    expected: Callable[[float | int | str], list[str]]
    sabotage: str = ""


def _box(control):
    """The widget's outer box: the outermost ``.widget-vbox`` holding the control."""
    return control.locator("xpath=ancestor::div[contains(@class,'widget-vbox')][last()]")


def _value(row: WidgetRow, control) -> float | int | str:
    if row.move.startswith("select:"):
        return control.locator("select").evaluate("s => s.options[s.selectedIndex].text")
    if row.move.startswith("type:"):
        return float(control.locator("input").input_value())
    value = float(control.locator(".widget-readout").inner_text())
    return int(value) if value == int(value) else value


def _normal(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def move_and_check(page, row: WidgetRow, screenshot: Path | None, timeout_ms: int = 60_000) -> str:
    """Move ``row``'s control once; wait until the widget shows ``row.expected(new value)``.

    Raises :class:`WidgetDidNotChange` naming the missing text if it does not within
    ``timeout_ms``. Saves a screenshot of the widget to ``screenshot``. Returns the widget's text.
    """
    control = page.locator(f"{PANEL} {row.control}").first
    control.wait_for(state="visible", timeout=timeout_ms)
    box = _box(control)
    control.scroll_into_view_if_needed()
    before = _normal(box.inner_text())
    if row.move.startswith("type:"):
        field = control.locator("input")
        field.fill(row.move[len("type:"):])
        field.press("Enter")
    elif row.move.startswith("select:"):
        control.locator("select").select_option(label=row.move[len("select:"):])
    else:
        control.locator(".noUi-handle").focus()
        page.keyboard.press(row.move)
    value = _value(row, control)
    want = [_normal(s) for s in row.expected(value)]
    deadline = time.monotonic() + timeout_ms / 1000
    text = ""
    while time.monotonic() < deadline:
        text = _normal(box.inner_text())
        if all(w in text for w in want):
            break
        time.sleep(0.25)
    if screenshot is not None:  # the text comes first, an image may follow: let the kernel settle
        idle = page.locator(f"{PANEL} .jp-Notebook-ExecutionIndicator[data-status='idle']").first
        for _ in range(2):
            idle.wait_for(timeout=timeout_ms)
            time.sleep(1.0)
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        box.screenshot(path=str(screenshot))
    missing = [w for w in want if w not in text]
    if not missing and all(w in before for w in want):
        raise AssertionError(f"{row.chapter}: the widget showed {want} before the move too; "
                             "choose a move that changes what it shows")
    if missing:
        raise WidgetDidNotChange(f"{row.chapter}: after {row.move} the control reads {value}, but "
                                 f"the widget does not show {missing[0]!r}; it shows {text[:400]!r}")
    return text
