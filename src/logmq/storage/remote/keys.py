"""Which object keys a remote store accepts, checked the same way by every back end.

A key becomes a path below the directory store's root, so ``..``, an absolute key or an
empty part could escape it or alias another key; S3 would take them, but a key valid on
one back end and not on the other would make the two stores disagree, so both check.
"""

from __future__ import annotations

from logmq.storage.remote.store import RemoteStorageError

MAX_KEY_BYTES = 1024  # S3's limit on a key's UTF-8 length (prefix included)

# The directory store keeps its in-flight writes here; no key may land in it.
RESERVED_FIRST_PART = ".logmq-tmp"


def _bad(what: str, key: object, why: str) -> RemoteStorageError:
    return RemoteStorageError(f"invalid remote {what} {key!r}: {why}", retriable=False)


def _check_parts(what: str, key: str, parts: list[str]) -> None:
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise _bad(what, key, f"longer than {MAX_KEY_BYTES} bytes")
    if key.startswith("/"):
        raise _bad(what, key, "absolute (starts with '/')")
    if any(ord(c) < 0x20 or ord(c) == 0x7F or 0xD800 <= ord(c) <= 0xDFFF for c in key):
        raise _bad(what, key, "control or surrogate character")
    if "\\" in key:
        raise _bad(what, key, "backslash")
    for part in parts:
        if part in (".", ".."):
            raise _bad(what, key, f"'{part}' part")
    if parts and parts[0] == RESERVED_FIRST_PART:
        raise _bad(what, key, f"'{RESERVED_FIRST_PART}' is reserved")


def validate_key(key: object) -> str:
    """``key`` if it names one object: non-empty ``/``-separated parts, none ``.``/``..``."""
    if not isinstance(key, str) or not key:
        raise _bad("key", key, "empty or not a string")
    parts = key.split("/")
    _check_parts("key", key, parts)
    if "" in parts:
        raise _bad("key", key, "empty part ('//' or a trailing '/')")
    return key


def validate_prefix(prefix: object) -> str:
    """``prefix`` if it can start keys: empty, or a key whose last part may be partial/empty."""
    if not isinstance(prefix, str):
        raise _bad("prefix", prefix, "not a string")
    if not prefix:
        return prefix
    parts = prefix.split("/")
    # the last part only filters names (``seg.`` or ``..`` may start a real name)
    _check_parts("prefix", prefix, parts[:-1])
    if "" in parts[:-1]:
        raise _bad("prefix", prefix, "empty part ('//')")
    return prefix
