"""The course's chapters open read-only in JupyterLab: reading one never rewrites it.

A chapter (``notebooks/NN_*.ipynb``, ``solutions/NN_*.ipynb``) carries its widgets' saved state,
so JupyterLab draws them before anything runs. Restoring that state marks the notebook changed
(ipywidgets' manager does, with ``saveState`` on), and JupyterLab's autosave then wrote the
chapter back within two minutes of opening it, with the widget state of a kernel that had run
nothing: empty. Opened again, every widget said "Error displaying widget: model not found".

:class:`CourseContentsManager` is JupyterLab's usual file manager, except that it reports the
course's own chapter files as not writable (``"writable": false`` in the contents API, as for a
file without write permission). JupyterLab 4 then

* never autosaves them (its save handler skips a document it cannot save),
* disables *File → Save* for them ("Document is read-only … use Save as… instead"; Ctrl+S
  says so in a notification), and on closing a changed one offers *Save as*;

and the server refuses a write to them (HTTP 403, naming *Save As*), whoever asks. A copy saved
with *File → Save Notebook As…* (``notebooks/my_02.ipynb``), the learners' ``exercises/`` and
every other file stay writable. ``git restore``, ``git pull`` and the maintainers' ``make
notebooks`` write the files directly, not through JupyterLab, and are not affected.

``make course`` starts JupyterLab with it (the Makefile's ``COURSE_LAB_ARGS``), and
:mod:`llminfra.course.lab_setup` names it in the environment's Jupyter server configuration
(Binder). ``tests/test_browser.py`` opens chapters with autosave on and checks that the files
stay byte-identical.
"""

from __future__ import annotations

import re

from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
from tornado.web import HTTPError

__all__ = ["CourseContentsManager", "is_read_only", "READ_ONLY"]

#: the course's chapter files, relative to the served root (the repository): a chapter
#: (``00``–``99``) or appendix (``A1``) in ``notebooks/``, or a solution in ``solutions/``
READ_ONLY = re.compile(r"^(notebooks/(\d\d|A\d)|solutions/\d\d)_[A-Za-z0-9_]+\.ipynb$")


def is_read_only(path: str) -> bool:
    """Is ``path`` (as the contents API names it, relative to the served root) a course
    chapter that JupyterLab must not write?"""
    return READ_ONLY.match(path.strip("/")) is not None


class CourseContentsManager(AsyncLargeFileManager):
    """JupyterLab's default contents manager, with the course's chapters read-only (module
    docstring)."""

    async def get(self, path, content=True, type=None, format=None, **kwargs):
        model = await super().get(path, content=content, type=type, format=format, **kwargs)
        if model.get("type") == "directory" and isinstance(model.get("content"), list):
            for child in model["content"]:
                if is_read_only(child["path"]):
                    child["writable"] = False
        elif is_read_only(model["path"]):
            model["writable"] = False
        return model

    async def save(self, model, path=""):
        if is_read_only(path) and await self.file_exists(path):
            path = path.strip("/")
            raise HTTPError(403, f"{path} is a course chapter, opened read-only so that reading "
                                 "it never rewrites it: use File → Save Notebook As… to keep a "
                                 "copy of your run (for example notebooks/my_"
                                 f"{path.rsplit('/', 1)[-1]})")
        return await super().save(model, path)
