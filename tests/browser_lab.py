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
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]
START_TIMEOUT_S = 90
#: The test's JupyterLab does not autosave: every save is the test's own (the toolbar's button,
#: :func:`save_notebook`). Autosaving every 5 s during a chapter's run re-serialized the whole
#: notebook, plots and all, a dozen times: chapter 05 ran in 60 s instead of 31 s on 2 cores, and
#: an autosave racing another save made JupyterLab ask "File Changed"
AUTOSAVE = False
#: how long :func:`save_notebook` waits for its save to land before clicking save again
SAVE_NUDGE_S = 3
#: not copied into the served repository
COPY_IGNORE = shutil.ignore_patterns(".git", ".venv", ".venv-*", ".llama.cpp", "__pycache__",
                                     ".pytest_cache", ".hypothesis", ".jupyter-test", "docs",
                                     "*.egg-info",
                                     "bench-results", ".whl", ".gl", ".ipynb_checkpoints")
ERROR_MARK = re.compile(r"Traceback \(most recent call last\)|^\w*(Error|Exception)\b", re.M)


class WidgetDidNotChange(AssertionError):
    """The widget's output did not show the expected text after its control moved."""


class CellError(AssertionError):
    """A cell showed an error, or run-all stopped early, never started or never ended."""


def course_lab_args() -> list[str]:
    """The arguments ``make course`` gives ``jupyter lab`` (the Makefile's COURSE_LAB_ARGS)."""
    m = re.search(r"^COURSE_LAB_ARGS\s*:?=\s*(.*)$", (ROOT / "Makefile").read_text(), re.M)
    if not m:
        raise AssertionError("Makefile defines no COURSE_LAB_ARGS")
    return shlex.split(m.group(1))


def copy_repository(dest: Path) -> Path:
    """A copy of the repository's working tree (no .git, no .venv, no caches) at ``dest``, its
    course notebooks trusted as ``make course`` trusts them."""
    from llminfra.course.lab_setup import course_notebooks, trust_notebooks
    shutil.copytree(ROOT, dest, ignore=COPY_IGNORE)
    trust_notebooks(course_notebooks(dest))
    return dest


def _write_settings(settings: Path) -> None:
    """The course's shipped settings (``llminfra.course.lab_setup.OVERRIDES``, what ``make
    course`` installs), and the test's own: no autosave, every cell drawn (not only those
    scrolled into view)."""
    from llminfra.course.lab_setup import OVERRIDES
    plugins = {**OVERRIDES,
               "@jupyterlab/docmanager-extension:plugin": {"autosave": AUTOSAVE},
               "@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"}}
    for plugin, value in plugins.items():
        package, name = plugin.split(":")
        path = settings / package / f"{name}.jupyterlab-settings"
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

    def kernel_ready(self, path: str) -> bool:
        """Whether the server holds a session for notebook ``path`` whose kernel is idle and has a
        browser connected (its websocket open: the page's session then holds the kernel)."""
        api = f"{self.base}/api/sessions?token={self.token}"
        with urllib.request.urlopen(api, timeout=10) as r:
            sessions = json.loads(r.read())
        return any(s["path"] == path and s["kernel"].get("connections", 0) > 0
                   and s["kernel"].get("execution_state") == "idle" for s in sessions)

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


def wait_for_kernel(page, lab: Lab, path: str, timeout_ms: int) -> None:
    """Wait until notebook ``path``, opened in ``page``, has its kernel connected and idle;
    click through a "Select Kernel" dialog if one shows.

    The toolbar's execution indicator alone does not tell: JupyterLab 4 draws it with
    ``data-status='idle'`` (its initial state) as soon as the notebook is drawn, before the
    notebook has a session. "Run All" clicked in that window runs nothing: each cell is skipped
    without a message (prompts stay ``[ ]``), or a "Select Kernel" dialog waits for a click, and
    run-all never ends (issue 24: seconds between the drawn notebook and its session on a loaded
    2-core CPU). So the server is asked too (:meth:`Lab.kernel_ready`).
    """
    with explained(page, f"{path}: waiting for its kernel"):
        page.locator(f"{PANEL} .jp-Notebook").first.wait_for(state="visible", timeout=timeout_ms)
        dialog = page.locator(".jp-Dialog .jp-mod-accept")
        deadline = time.monotonic() + timeout_ms / 1000
        while not lab.kernel_ready(path):
            if dialog.count():
                dialog.first.click()
            if time.monotonic() > deadline:
                raise AssertionError(f"no idle kernel connected to {path} within "
                                     f"{timeout_ms / 1000:.0f} s")
            time.sleep(0.25)
        if dialog.count():
            dialog.first.click()
        page.locator(f"{PANEL} .jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(
            timeout=timeout_ms)


def _menu(page, menu: str, item: str) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(rf"^{menu}$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(rf"^{re.escape(item)}$")).click()


#: JavaScript: each code cell's input prompt (``[ ]``, ``[*]``, ``[3]``). A cell whose source is
#: collapsed (the Colab cell: ``source_hidden``) shows a placeholder without a count instead:
#: it reads ``[ran]`` once it has an output (outputs are cleared before the run), else ``[ ]``.
_PROMPTS = """(panelSelector) => {
  const panel = document.querySelector(panelSelector);
  return panel ? [...panel.querySelectorAll('.jp-CodeCell')].map(c => {
      if (c.querySelector('.jp-InputPlaceholder'))
        return c.querySelector('.jp-OutputArea-child') ? '[ran]' : '[ ]';
      const p = c.querySelector('.jp-InputPrompt');
      return p ? p.textContent.trim() : '';  // innerText is '' off screen
  }) : [];
}"""
#: JavaScript: run-all has ended. Either the last code cell shows its execution count, or
#: run-all stopped at an error (an error output; a warning on stderr is not one); and no cell is
#: running or queued. Only meaningful once the run has started on cleared cells.
_RUN_FINISHED = """(panelSelector) => {
  const panel = document.querySelector(panelSelector);
  if (!panel) return false;
  const prompts = (PROMPTS)(panelSelector);
  if (prompts.length === 0 || prompts.some(p => p.includes('*'))) return false;
  if (/\\[\\d+\\]/.test(prompts[prompts.length - 1])) return true;
  const error = /ERROR_MARK/m;
  return [...panel.querySelectorAll(
      ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")]
      .some(e => error.test(e.textContent));
}""".replace("ERROR_MARK", ERROR_MARK.pattern).replace("(PROMPTS)", f"({_PROMPTS})")
#: how long the kernel may take to start the first cell after "Run All" (it is idle by then)
RUN_START_TIMEOUT_MS = 60_000


def run_all_cells(page, timeout_ms: int) -> None:
    """Clear the stored outputs, run all cells from the Run menu and wait until run-all ends; raise
    :class:`CellError` if any cell shows an error, a code cell did not run, or the run did not
    start (within :data:`RUN_START_TIMEOUT_MS`) or end (within ``timeout_ms``).

    Three waits, so that neither a stale prompt nor a run that never began passes for a finished
    run: every prompt cleared (``[ ]``), then some cell running or run (``[*]`` or ``[n]``), then
    :data:`_RUN_FINISHED`. Each failure says what the page showed (:func:`describe_page`).
    """
    with explained(page, "run all", CellError):
        _menu(page, "Edit", "Clear Outputs of All Cells")
        _wait(page, f"""(s) => ({_PROMPTS})(s).every(p => !/[\\d*]/.test(p))""", 30_000,
              "Clear Outputs of All Cells left execution counts")
        _menu(page, "Run", "Run All Cells")
        _wait(page, f"""(s) => ({_PROMPTS})(s).some(p => /[\\d*]/.test(p))""", RUN_START_TIMEOUT_MS,
              "Run All started no cell")
        _wait(page, _RUN_FINISHED, timeout_ms, "run-all did not end")
        stderr = page.locator(f"{PANEL} .jp-OutputArea-output"
                              "[data-mime-type='application/vnd.jupyter.stderr']")
        errors = [t for t in stderr.all_text_contents() if ERROR_MARK.search(t)]
        prompts = page.evaluate(_PROMPTS, PANEL)
        not_run = [i for i, p in enumerate(prompts) if not re.search(r"\[(\d+|ran)\]", p)]
        if errors or not_run:
            raise CellError(f"{len(errors)} cell(s) show an error, code cells {not_run} did not "
                            f"run; first error:\n{errors[0][-2000:] if errors else '(none)'}")


def _wait(page, predicate: str, timeout_ms: int, what: str) -> None:
    """``page.wait_for_function(predicate)`` on the notebook panel; on timeout a
    :class:`CellError` saying ``what`` and how long was waited."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    try:
        page.wait_for_function(predicate, arg=PANEL, timeout=timeout_ms, polling=250)
    except PlaywrightTimeout:
        raise CellError(f"{what} within {timeout_ms / 1000:.0f} s") from None


_PAGE_STATE = """(panelSelector) => {
  const text = (e, n) => e ? e.textContent.replace(/\\s+/g, ' ').trim().slice(-n) : '';
  const state = {dialogs: [...document.querySelectorAll('.jp-Dialog')].map(d => text(d, 300)),
                 kernel: [...document.querySelectorAll('#jp-main-statusbar .jp-StatusBar-Item')]
                     .map(e => text(e, 80)).filter(t => t.includes('|')).join('; ')};
  const panel = document.querySelector(panelSelector);
  if (!panel) return state;
  const indicator = panel.querySelector('.jp-Notebook-ExecutionIndicator');
  state.indicator = indicator ? indicator.getAttribute('data-status') : null;
  const cells = [...panel.querySelectorAll('.jp-CodeCell')];
  const prompt = c => text(c.querySelector('.jp-InputPrompt'), 20);
  state.prompts = cells.map(prompt);
  const cell = i => i < 0 ? null : {index: i, prompt: prompt(cells[i]),
      source: text(cells[i].querySelector('.cm-line'), 100),
      output: text(cells[i].querySelector('.jp-Cell-outputArea'), 300)};
  const running = state.prompts.findIndex(p => p.includes('*'));
  const numbered = state.prompts.map((p, i) => /\\[\\d+\\]/.test(p) ? i : -1).filter(i => i >= 0);
  state.running = cell(running);
  state.lastRun = cell(numbered.length ? numbered[numbered.length - 1] : -1);
  state.last = cell(cells.length - 1);
  return state;
}"""


def describe_page(page) -> str:
    """What the page shows, for a failure message: a screenshot (saved to a temporary file, its
    path given), open dialogs, the kernel status, how many code cells ran, and the running, the
    last run and the last code cell, each with its prompt (``[*]``, ``[n]``, ``[ ]``), first
    line and output text."""
    lines = []
    try:
        shot = Path(tempfile.mkdtemp(prefix="llminfra-browser-")) / "page.png"
        page.screenshot(path=str(shot))
        lines.append(f"screenshot of the page: {shot}")
    except Exception as e:  # the page may be gone: say so, and go on with what can be read
        lines.append(f"no screenshot: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    try:
        s = page.evaluate(_PAGE_STATE, PANEL)
    except Exception as e:
        return "\n".join(lines + [f"page state unreadable: {type(e).__name__}: {e}"])
    lines += [f"dialog: {d!r}" for d in s["dialogs"]]
    lines.append(f"kernel in the status bar: {s['kernel']!r}; "
                 f"execution indicator: {s.get('indicator')}")
    prompts = s.get("prompts") or []
    ran = sum(bool(re.search(r"\[\d+\]", p)) for p in prompts)
    lines.append(f"code cells: {len(prompts)}, {ran} run, "
                 f"{sum('*' in p for p in prompts)} running or queued [*], "
                 f"{len(prompts) - ran - sum('*' in p for p in prompts)} not run [ ]")
    for key, label in (("running", "running cell"), ("lastRun", "last cell run"),
                       ("last", "last cell")):
        c = s.get(key)
        if c:
            lines.append(f"{label}: code cell {c['index']} {c['prompt']} {c['source']!r} "
                         f"-> output {c['output']!r}")
    return "\n".join(lines)


_PAGE_MARK = "\n--- the page ---\n"


@contextmanager
def explained(page, what: str, error: type[AssertionError] = AssertionError):
    """Add :func:`describe_page` to a failure inside the block (once, if blocks nest): an
    assertion keeps its class, a Playwright error (a timeout) becomes ``error``; both say
    ``what`` was being done."""
    from playwright.sync_api import Error as PlaywrightError
    try:
        yield
    except AssertionError as e:
        if _PAGE_MARK in str(e):
            raise
        raise type(e)(f"{what}: {e}{_PAGE_MARK}{describe_page(page)}") from None
    except PlaywrightError as e:
        raise error(f"{what}: {e.message.splitlines()[0]}{_PAGE_MARK}{describe_page(page)}") from e


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


def _press_slider(page, row: WidgetRow, control, attempts: int = 3) -> None:
    """Focus the slider's handle and press ``row.move``; until its readout changes, focus and
    press again (on a loaded machine a key press sent while JupyterLab is still moving focus
    after "Run All" can land elsewhere). A readout that never changes fails here, by name."""
    start = _value(row, control)
    for _ in range(attempts):
        control.locator(".noUi-handle").focus()
        page.keyboard.press(row.move)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if _value(row, control) != start:
                return
            time.sleep(0.2)
    raise WidgetDidNotChange(f"{row.chapter}: the slider's readout stayed at {start} after "
                             f"{attempts} presses of {row.move} on its focused handle")


def _normal(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def move_and_check(page, row: WidgetRow, screenshot: Path | None, timeout_ms: int = 60_000) -> str:
    """Move ``row``'s control once; wait until the widget shows ``row.expected(new value)``.

    Raises :class:`WidgetDidNotChange` naming the missing text if it does not within
    ``timeout_ms``, with what the page showed (:func:`describe_page`). Saves a screenshot of the
    widget to ``screenshot``. Returns the widget's text.
    """
    with explained(page, f"moving the {row.chapter} widget ({row.move})"):
        return _move_and_check(page, row, screenshot, timeout_ms)


def _move_and_check(page, row: WidgetRow, screenshot: Path | None, timeout_ms: int) -> str:
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
        _press_slider(page, row, control)
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


# ------------------------------------------------------------------ stored outputs, as nbval checks
#: what nbval leaves out of its comparison (nbval.plugin.IPyNbFile.skip_compare, images included)
NBVAL_SKIP = ("metadata", "traceback", "prompt_number", "output_type", "name", "execution_count",
              "application/vnd.jupyter.widget-view+json", "image/png", "image/jpeg")
NBVAL_SANITIZE = ROOT / "tests" / "nbval_sanitize.cfg"


def _save_from_toolbar(page) -> None:
    """Click the notebook toolbar's save button (``docmanager:save``): a key press would go to
    the widget control last moved, and ipywidgets keep key presses from JupyterLab."""
    button = page.locator(f"{PANEL} .jp-Toolbar [data-command='docmanager:save']").first
    if button.count():
        button.click()
    else:                                   # a JupyterLab without the button: the menu
        _menu(page, "File", "Save Notebook")


def unsaved_widgets(nb) -> list[str]:
    """Model ids that an output of ``nb`` shows but its saved widget state lacks: opened again,
    such an output says "Error displaying widget: model not found". Seen in CI when the save ran
    while a moved widget's new child models were still being created."""
    state = nb.metadata.get("widgets", {}).get(
        "application/vnd.jupyter.widget-state+json", {}).get("state", {})
    return sorted({out["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]
                   for c in nb.cells if c.cell_type == "code" for out in c.get("outputs", [])
                   if "application/vnd.jupyter.widget-view+json" in out.get("data", {})}
                  - set(state))


def save_notebook(page, lab: Lab, path: str, timeout_ms: int = 120_000):
    """Save the notebook on show (the toolbar's button: a key press would go to the widget
    control last moved) and return the file as saved (an ``nbformat`` node), once the save has
    landed with every code cell run, every widget shown in the saved widget state
    (:func:`unsaved_widgets`) and the tab clean. A "File Changed" dialog is answered with
    Overwrite (what the page shows is the run being checked); a save that has not landed so
    after :data:`SAVE_NUDGE_S` is clicked again."""
    import nbformat
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    file = lab.served / path
    with explained(page, f"saving {path}"):
        deadline = time.monotonic() + timeout_ms / 1000
        before = file.stat().st_mtime_ns
        nudge_at = 0.0
        unrun: list = ["(not read yet)"]
        while True:
            if time.monotonic() > nudge_at:
                _save_from_toolbar(page)
                overwrite = page.locator(".jp-Dialog .jp-mod-accept")
                try:
                    overwrite.first.wait_for(timeout=1_000)
                    overwrite.first.click()
                except PlaywrightTimeout:  # no dialog: the save went through
                    pass
                nudge_at = time.monotonic() + SAVE_NUDGE_S
            landed = file.stat().st_mtime_ns > before
            if landed:
                try:
                    nb = nbformat.reads(file.read_text(), as_version=4)
                    # a collapsed cell (the Colab cell) is judged by its outputs, which the
                    # caller compares with the stored ones
                    unrun = [f"code cell {i}: {c.source.strip().splitlines()[0][:60]!r}"
                             for i, c in enumerate(x for x in nb.cells if x.cell_type == "code")
                             if c.source.strip() and c.execution_count is None
                             and not c.metadata.get("jupyter", {}).get("source_hidden")]
                    unrun += [f"widget {m} (shown, not in the saved widget state)"
                              for m in unsaved_widgets(nb)]
                except (ValueError, OSError):  # caught mid-write: read again
                    unrun = ["(caught mid-write)"]
            if landed and not unrun and page.locator(".lm-TabBar-tab.jp-mod-dirty").count() == 0:
                return nb
            if time.monotonic() > deadline:
                raise AssertionError(f"{path} was not saved with every cell run within "
                                     f"{timeout_ms / 1000:.0f} s (saved: {landed}); not run in "
                                     f"the saved file: {unrun}")
            time.sleep(0.25)


def _compared(outputs: list, patterns: list[tuple[str, str]]) -> dict:
    """nbval's view of a cell's outputs: streams merged, each remaining key (MIME types flattened
    out of ``data``) -> its sanitized values, without the keys nbval skips."""
    from nbval.plugin import coalesce_streams, transform_streams_for_comparison

    def clean(value):
        if isinstance(value, str):
            for regex, replace in patterns:
                value = re.sub(regex, replace, value)
        return value

    import copy
    flat: dict[str, list] = {}
    for out in transform_streams_for_comparison(coalesce_streams(copy.deepcopy(outputs))):
        for key, value in out.items():
            if key in NBVAL_SKIP:
                continue
            items = value.items() if key == "data" else [(key, value)]
            for k, v in items:
                if k not in NBVAL_SKIP:
                    flat.setdefault(k, []).append(clean(v))
    return flat


def _nbval_ignores(cell) -> bool:
    tags = set(cell.get("metadata", {}).get("tags", []))
    first = cell.source.lstrip().splitlines()[0] if cell.source.strip() else ""
    return bool(tags & {"nbval-ignore-output", "nbval-skip"}) or \
        first.strip() in ("# NBVAL_IGNORE_OUTPUT", "# NBVAL_SKIP")


def output_mismatches(ran, stored) -> list[str]:
    """Where the notebook ``ran`` (as saved after a run) shows other outputs than the ``stored``
    one, compared as ``pytest --nbval --nbval-sanitize-with tests/nbval_sanitize.cfg`` compares
    them (cells tagged ``nbval-ignore-output`` left out). Empty when they agree."""
    from nbval.plugin import get_sanitize_patterns

    patterns = get_sanitize_patterns(NBVAL_SANITIZE.read_text())
    ran_cells = [c for c in ran.cells if c.cell_type == "code"]
    stored_cells = [c for c in stored.cells if c.cell_type == "code"]
    if [c.source for c in ran_cells] != [c.source for c in stored_cells]:
        return ["the code cells differ from the stored notebook's"]
    problems = []
    for i, (a, b) in enumerate(zip(ran_cells, stored_cells)):
        if _nbval_ignores(b):
            continue
        got, want = _compared(a.outputs, patterns), _compared(b.outputs, patterns)
        if got != want:
            key = next(k for k in sorted(set(got) | set(want)) if got.get(k) != want.get(k))
            problems.append(f"code cell {i} ({b.source.splitlines()[0][:60]!r}), {key}:\n"
                            f"  stored: {str(want.get(key))[:600]}\n"
                            f"  ran:    {str(got.get(key))[:600]}")
    return problems


def widget_drawn(page, row: WidgetRow, when: str, timeout_ms: int = 30_000) -> None:
    """``row``'s control is drawn on the notebook on show (a widget view, not its text
    stand-in and not "Error displaying widget"); ``when`` says at which point, in a failure."""
    with explained(page, f"the {row.chapter} widget, {when}"):
        try:
            page.locator(f"{PANEL} {row.control}").first.wait_for(state="visible",
                                                                  timeout=timeout_ms)
        except Exception as err:
            shown = page.locator(f"{PANEL} .jp-OutputArea-output").all_inner_texts()
            broken = [t for t in shown if "Error displaying widget" in t
                      or "[interactive widget]" in t]
            raise AssertionError(f"not drawn within {timeout_ms / 1000:.0f} s; the outputs "
                                 f"show: {broken[:3] or '(no widget stand-in)'}") from err


def run_all_read_outputs(page, timeout_ms: int) -> list[str]:
    """Run all cells of a notebook whose failing cells are tagged ``raises-exception`` (JupyterLab
    runs on past them) and return each code cell's output text as the page shows it, once every
    code cell shows an execution count. Raises :class:`CellError` (with what the page showed)
    when the run does not start or end."""
    with explained(page, "run all, reading the outputs", CellError):
        _menu(page, "Run", "Run All Cells")
        _wait(page, f"""(s) => ({_PROMPTS})(s).some(p => /[\\d*]/.test(p))""", RUN_START_TIMEOUT_MS,
              "Run All started no cell")
        _wait(page, f"""(s) => {{ const p = ({_PROMPTS})(s);
                  return p.length > 0 && p.every(x => /\\[(\\d+|ran)\\]/.test(x)); }}""",
              timeout_ms, "not every code cell ran")
        return page.evaluate(f"""(s) => [...document.querySelector(s).querySelectorAll(
            '.jp-CodeCell')].map(c => {{ const o = c.querySelector('.jp-Cell-outputArea');
                                         return o ? o.innerText : ''; }})""", PANEL)


def put_setting(lab: Lab, plugin: str, value: dict) -> None:
    """Replace the user settings of JupyterLab ``plugin`` (``"@jupyterlab/notebook-extension:
    tracker"``) with ``value`` through the server's settings API; ``{}``: its defaults."""
    req = urllib.request.Request(f"{lab.base}/lab/api/settings/{plugin}?token={lab.token}",
                                 data=json.dumps({"raw": json.dumps(value)}).encode(),
                                 method="PUT", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status in (200, 204), f"settings of {plugin} not written: HTTP {r.status}"
