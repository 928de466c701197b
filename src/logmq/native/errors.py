"""How the native door names its APIs and answers a request it refuses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from logmq.errors import ErrorCode
from logmq.net.codec import ApiKey, Request
from logmq.net.reply import Reply


def native_api_name(api_key: int) -> str:
    try:
        return ApiKey(api_key).name.lower()
    except ValueError:
        return str(api_key)


def native_error_reply(api_list: Callable[[], Any]) -> Callable[[Request, ErrorCode, str], Reply]:
    """The native door's error answer; an unserved ApiVersions also lists what is served."""

    def reply(request: Request, code: ErrorCode, message: str) -> Reply:
        body: dict[str, Any] = {"error": int(code), "message": message}
        if request.api_key == ApiKey.API_VERSIONS and code == ErrorCode.UNSUPPORTED_VERSION:
            body["apis"] = api_list()
        return Reply(body)

    return reply
