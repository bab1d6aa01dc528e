"""Errors as HTTP answers: the OpenAI envelope ``{"error": {"message", "type", "param", "code"}}``.

The status, type and code come from the error class (`dynamo_nb.errors`), or, for an error a
worker's handler raised, from what travelled with it; a worker's 4xx keeps the worker's own
message, a 5xx says which worker failed.

Example:
    >>> from dynamo_nb.errors import ModelNotFoundError
    >>> status, body = http_error(ModelNotFoundError("model 'x' not found; served models: tiny", param="model"))
    >>> status, body["error"]["type"], body["error"]["code"]
    (404, 'not_found_error', 'model_not_found')
"""

from __future__ import annotations

from typing import Any

from ..errors import DynamoNBError, RemoteHandlerError

__all__ = ["error_body", "http_error"]

_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    500: "server_error",
    503: "service_unavailable_error",
}


def error_body(
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    error_type: str | None = None,
) -> dict[str, Any]:
    """The OpenAI error envelope for ``status`` (its type from the status unless given)."""
    return {
        "error": {
            "message": message,
            "type": error_type
            or _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error"),
            "param": param,
            "code": code if code is not None else status,
        }
    }


def http_error(exc: DynamoNBError) -> tuple[int, dict[str, Any]]:
    """The status and envelope that ``exc`` becomes at the frontend."""
    status = exc.http_status
    message = str(exc)
    if isinstance(exc, RemoteHandlerError):
        message = (
            exc.remote_message
            if status < 500
            else f"the worker failed: {exc.error_type}: {exc.remote_message}"
        )
    return status, error_body(status, message, exc.param, exc.code, exc.openai_type)
