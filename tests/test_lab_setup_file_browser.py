"""``make course``'s start page opens the file browser at the repository root (issue 53: it
followed the start notebook into ``notebooks/``, one folder below ``exercises/``). The browser
side is tests/test_browser.py's ``make course`` case; here the server extension's redirect."""

from __future__ import annotations

import pytest
from tornado.httputil import HTTPHeaders, HTTPServerRequest, RequestStartLine

from llminfra.course.lab_setup import SERVER_CONFIG, BrowserAtRoot

START = "/lab/tree/notebooks/00_start_here.ipynb"


@pytest.fixture(autouse=True)
def start_page(monkeypatch):
    monkeypatch.setattr(BrowserAtRoot, "start_path", START)


def _answer(uri: str, status: int = 200, method: str = "GET"):
    request = HTTPServerRequest(start_line=RequestStartLine(method, uri, "HTTP/1.1"),
                                headers=HTTPHeaders({"Host": "127.0.0.1"}))
    t = BrowserAtRoot(request)
    headers = HTTPHeaders({"Content-Type": "text/html", "Content-Length": "4264"})
    status, headers, body = t.transform_first_chunk(status, headers, b"<html>lab</html>", True)
    return status, headers, body + t.transform_chunk(b"more", True)


def test_the_start_page_redirects_to_the_root_file_browser_keeping_its_token():
    status, headers, body = _answer(f"{START}?token=abc")
    assert (status, body, headers["Content-Length"]) == (302, b"", "0")
    assert headers["Location"] == f"{START}?token=abc&file-browser-path=/"
    assert _answer(START)[1]["Location"] == f"{START}?file-browser-path=/"


@pytest.mark.parametrize("uri, status, method", [
    (f"{START}?token=abc&file-browser-path=/", 200, "GET"),   # already placed: no loop
    ("/lab/tree/notebooks/01_training_vs_inference.ipynb", 200, "GET"),   # other pages unchanged
    (f"{START}?token=abc", 302, "GET"),                        # the login redirect passes
    (START, 200, "HEAD")])
def test_every_other_answer_passes_unchanged(uri, status, method):
    got_status, headers, body = _answer(uri, status, method)
    assert (got_status, body) == (status, b"<html>lab</html>more")
    assert "Location" not in headers


def test_the_server_configuration_enables_the_extension():
    assert SERVER_CONFIG["ServerApp"]["jpserver_extensions"] == {"llminfra.course.lab_setup": True}
