"""The errors the OpenAI server answers with: one exception, :class:`APIError`, and the
handlers that turn FastAPI's own failures (a body that does not validate, an unknown route, a
body over the limits of :mod:`llminfra.serving.http_limits`) into OpenAI's error body.

Every refusal names the field at fault (``param``) and quotes at most 200 characters of the
bad value (:func:`~llminfra.engine.sampling_params.clip_repr`). Taught in chapter 05.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from llminfra.engine.sampling_params import clip, clip_repr
from llminfra.serving import openai_protocol as api

#: the status of a request whose client left before the answer (nginx's "client closed request")
CLIENT_CLOSED_REQUEST = 499


class APIError(Exception):
    """A request the server refuses: HTTP ``status`` and OpenAI's error fields."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.code, self.type_ = status, param, code, type_

    def response(self) -> JSONResponse:
        return JSONResponse(api.error_body(str(self), self.type_, self.param, self.code),
                            status_code=self.status)


def validation_error(exc: RequestValidationError) -> APIError:
    """The 400 for a body FastAPI's validation refused: its first error, the field as
    ``param``, the bad value clipped."""
    err = exc.errors()[0] if exc.errors() else {}
    loc = [str(x) for x in err.get("loc", ()) if x != "body"]
    if err.get("type") == "json_invalid":
        return APIError(400, f"the body is not valid JSON: {err.get('msg', '')}")
    param = loc[0] if loc else None
    where = ".".join(loc) or "body"
    if err.get("type") == "extra_forbidden":
        return APIError(400, f"{where}: this server does not support the field {where!r} "
                             f"(it refuses what it would otherwise ignore)", param=param)
    return APIError(400, f"{where}: {err.get('msg', 'invalid value')} "
                         f"(got {clip_repr(err.get('input'))})", param=param)


async def _api_error(request, exc: APIError):
    return exc.response()


async def _invalid(request, exc: RequestValidationError):
    return validation_error(exc).response()


async def _http(request, exc: StarletteHTTPException):
    if exc.status_code in (408, 413):            # the body limits: said as they are
        code = "request_too_large" if exc.status_code == 413 else "request_timeout"
        response = APIError(exc.status_code, exc.detail, code=code).response()
        response.headers.update(exc.headers or {})   # ``Connection: close`` if it must
        return response
    code = "not_found" if exc.status_code == 404 else None
    return APIError(exc.status_code, f"{request.method} {clip(request.url.path)}: "
                                     f"{exc.detail}", code=code).response()


def add_error_handlers(app: FastAPI) -> None:
    """Answer every refusal of ``app`` with OpenAI's error body: an :class:`APIError` as it
    is, a validation failure as a 400 naming the field, any other HTTP error with its status
    (408 / 413 from the body limits keep theirs, with a ``code``)."""
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StarletteHTTPException, _http)
