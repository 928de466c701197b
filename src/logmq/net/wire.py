"""What a front door's codec must do, so one server shell serves every protocol. Sans-IO.

The server (server.py) and the connection state machine (connection.py) split frames
(every protocol here prefixes a frame with its u32 size), queue requests, run handlers
and write replies, with sendfile for file regions. What differs between the native
protocol and Kafka's is only how a frame becomes a ``Request`` and how a ``Reply``
becomes a response head: a ``WireCodec``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from logmq.net import codec as native

if TYPE_CHECKING:
    from logmq.net.codec import Request
    from logmq.net.connection import ProtocolError
    from logmq.net.reply import Reply


class WireCodec(Protocol):
    def decode_request(self, frame: memoryview) -> Request:
        """One request frame (without its size prefix); InvalidFrameError if malformed."""
        ...

    def peek_correlation_id(self, frame: memoryview) -> int | None:
        """The correlation id of a frame that would not decode, if it can be read."""
        ...

    def encode_head(self, request: Request, reply: Reply, tail_len: int) -> bytes:
        """Size prefix, response header and body; ``tail_len`` tail bytes follow."""
        ...

    def encode_error(self, error: ProtocolError) -> bytes | None:
        """The answer to a request that could not be decoded; None: nothing can be said."""
        ...


class NativeWire:
    """logmq's own protocol (docs/protocol.md): msgpack bodies and raw tails."""

    def decode_request(self, frame: memoryview) -> Request:
        return native.decode_request(frame)

    def peek_correlation_id(self, frame: memoryview) -> int | None:
        return native.peek_correlation_id(frame)

    def encode_head(self, request: Request, reply: Reply, tail_len: int) -> bytes:
        return native.encode_response_head(request.correlation_id, reply.body, tail_len)

    def encode_error(self, error: ProtocolError) -> bytes | None:
        body = {"error": int(error.code), "message": error.message}
        return native.encode_response_head(error.correlation_id, body)
