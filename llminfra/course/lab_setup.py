"""What ``make course`` does to JupyterLab so that a chapter opens as it was stored.

* **Trust the course's notebooks** (``notebooks/``, ``exercises/``, ``solutions/``): JupyterLab
  renders a notebook's saved widgets (its stored widget state) only when the notebook is
  trusted; untrusted, each widget shows its one-line ``text/plain`` stand-in until its cell runs.
  Trust is a signature of the file's content in the user's Jupyter data folder
  (``nbformat.sign``, what ``jupyter trust`` writes): a changed file is untrusted again until
  the learner runs it, as for any notebook.
* **Ship the course's JupyterLab settings** (:data:`OVERRIDES`, ``overrides.json`` in the
  environment's ``share/jupyter/lab/settings``, which JupyterLab reads as its defaults): widget
  state saved with the notebook (without it a saved chapter keeps the stored state of an earlier
  run and shows "model not found" for the widgets of the new one), and no news pop-up.

* **Open the course's chapters read-only** (:mod:`llminfra.course.lab_contents`): reading a
  chapter never rewrites it (restoring its saved widgets marks it changed, and autosave wrote it
  back with an empty widget state). ``make course`` names the contents manager on JupyterLab's
  command line; :func:`install_server_config` names it in the environment's Jupyter server
  configuration too (``etc/jupyter/jupyter_server_config.d/llminfra-course.json``), for a
  JupyterLab started otherwise (Binder).

* **Open the file browser at the repository root** (:func:`_load_jupyter_server_extension`, a
  Jupyter server extension ``make course`` and the server configuration enable): JupyterLab's
  file browser follows the notebook a URL opens, so the start page
  (``/lab/tree/notebooks/00_start_here.ipynb``) left it in ``notebooks/``, one folder below
  ``exercises/`` and ``solutions/``. Loading the start page adds ``file-browser-path=/`` to its
  URL (the query JupyterLab 4 reads to place the file browser), so the root's folders show.

``python -m llminfra.course.lab_setup [ROOT]`` does all four (``make course``, Binder's
``postBuild``); ``tests/test_browser.py`` starts its JupyterLab with the same settings and trust.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from tornado.web import OutputTransform

#: JupyterLab plugin id -> settings, as the course ships them
OVERRIDES = {
    "@jupyter-widgets/jupyterlab-manager:plugin": {"saveState": True},
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false",
                                                    "checkForUpdates": False},
}
#: the course's notebook folders, relative to the repository root
FOLDERS = ("notebooks", "exercises", "solutions")
ROOT = Path(__file__).resolve().parents[2]


def course_notebooks(root: Path = ROOT) -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (root / folder).glob("*.ipynb"))


def trust_notebooks(paths, notary=None) -> int:
    """Sign each notebook as trusted (``jupyter trust``) with ``notary`` (default: the user's
    ``nbformat.sign.NotebookNotary``); return how many."""
    import nbformat
    from nbformat.sign import NotebookNotary

    notary = NotebookNotary() if notary is None else notary
    n = 0
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        notary.sign(nb)
        n += 1
    return n


def install_overrides(prefix: str | Path = sys.prefix) -> Path:
    """Merge :data:`OVERRIDES` into ``PREFIX/share/jupyter/lab/settings/overrides.json``."""
    path = Path(prefix) / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    current = json.loads(path.read_text()) if path.is_file() else {}
    for plugin, settings in OVERRIDES.items():
        current[plugin] = {**current.get(plugin, {}), **settings}
    path.write_text(json.dumps(current, indent=2) + "\n")
    return path


#: the Jupyter server configuration the course ships (chapters read-only)
SERVER_CONFIG = {"ServerApp": {
    "contents_manager_class": "llminfra.course.lab_contents.CourseContentsManager",
    "jpserver_extensions": {"llminfra.course.lab_setup": True}}}
#: the URL query JupyterLab 4 reads to place its file browser when a page opens
FILE_BROWSER_PATH = "file-browser-path"


class BrowserAtRoot(OutputTransform):
    """Answer a page load of :attr:`start_path` (the server's ``default_url``, the start
    notebook) that names no :data:`FILE_BROWSER_PATH` with a redirect to the same URL plus
    ``file-browser-path=/`` (its token kept); every other response passes unchanged."""

    #: the start page's path, set when the extension loads
    start_path = ""

    def __init__(self, request) -> None:
        self.location = None
        if (request.method == "GET" and self.start_path and request.path == self.start_path
                and FILE_BROWSER_PATH not in parse_qs(request.query)):
            query = f"{request.query}&" if request.query else ""
            self.location = f"{request.path}?{query}{FILE_BROWSER_PATH}=/"

    def transform_first_chunk(self, status_code, headers, chunk, finishing):
        if self.location is None or status_code != 200:
            self.location = None
            return status_code, headers, chunk
        for name in ("Content-Type", "Content-Encoding", "Etag"):
            headers.pop(name, None)
        headers["Location"] = self.location
        headers["Content-Length"] = "0"
        return 302, headers, b""

    def transform_chunk(self, chunk, finishing):
        return chunk if self.location is None else b""


def _jupyter_server_extension_points() -> list[dict]:
    return [{"module": "llminfra.course.lab_setup"}]


def _load_jupyter_server_extension(serverapp) -> None:
    """The Jupyter server extension: :class:`BrowserAtRoot` on the server's start page."""
    BrowserAtRoot.start_path = urlparse(serverapp.default_url).path
    serverapp.web_app.add_transform(BrowserAtRoot)


def install_server_config(prefix: str | Path = sys.prefix) -> Path:
    """Write :data:`SERVER_CONFIG` to
    ``PREFIX/etc/jupyter/jupyter_server_config.d/llminfra-course.json`` (read by every Jupyter
    server of that environment, as extensions' own configurations are)."""
    path = Path(prefix) / "etc" / "jupyter" / "jupyter_server_config.d" / "llminfra-course.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(SERVER_CONFIG, indent=2) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    root = Path(argv[0]) if argv else ROOT
    n = trust_notebooks(course_notebooks(root))
    path = install_overrides()
    server = install_server_config()
    print(f"trusted {n} course notebooks; JupyterLab settings in {path}; chapters open "
          f"read-only ({server})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
