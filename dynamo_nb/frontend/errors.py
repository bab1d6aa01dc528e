"""HTTP errors in the OpenAI envelope: ``{"error": {"message", "type", "param", "code"}}``.

Example:
    >>> err = HTTPError(404, "model 'x' not found", code="model_not_found")
    >>> err.body()["error"]["type"]
    'not_found_error'
"""

from __future__ import annotations

from typing import Any

from ..errors import DynamoNBError

__all__ = ["HTTPError", "error_body"]

_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    500: "server_error",
    503: "service_unavailable_error",
}


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The OpenAI error envelope for ``status``."""
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error"),
            "param": param,
            "code": code if code is not None else status,
        }
    }


class HTTPError(DynamoNBError):
    """An HTTP error the frontend answers with (status + OpenAI envelope)."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code)
