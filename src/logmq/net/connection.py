"""Server side of one client connection as a sans-IO state machine.

Bytes go in (``get_buffer``/``buffer_updated`` for readinto-style receiving, or
``receive_data``), protocol events come out; the asyncio shell in
``net/server.py`` owns the socket and carries them out. The machine decides what a
broken peer gets (an error answer and, when the byte stream can no longer be trusted, a
close) and when to stop reading (too many requests queued: backpressure), so those rules
are testable without a socket.
"""

from __future__ import annotations

from dataclasses import dataclass

from logmq.errors import ErrorCode, FrameTooLargeError, InvalidFrameError
from logmq.net.codec import DEFAULT_MAX_FRAME_SIZE, Request
from logmq.net.frame_reader import FrameReader
from logmq.net.wire import NativeWire, WireCodec

# Correlation id used to answer a frame whose header could not be read at all.
UNKNOWN_CORRELATION_ID = 0xFFFFFFFF


@dataclass(slots=True)
class RequestReceived:
    request: Request
    size: int  # frame bytes, for metrics


@dataclass(slots=True)
class ProtocolError:
    """Answer the error (the wire codec says how); close afterwards when ``fatal``.

    ``api_key`` and ``api_version`` are the request's when its header could be read
    (-1 otherwise): a Kafka answer is encoded in the version that was asked.
    """

    correlation_id: int
    code: ErrorCode
    message: str
    fatal: bool
    api_key: int = -1
    api_version: int = -1
    client_id: str = ""  # when the header could be read that far (logs)


Event = RequestReceived | ProtocolError


class ServerConnection:
    """Frames, parses and counts the requests of one connection.

    ``in_flight`` counts requests handed out and not yet answered (``request_done``); the
    shell stops reading while ``wants_read`` is False.
    """

    __slots__ = ("_reader", "_wire", "closing", "in_flight", "max_in_flight")

    def __init__(
        self,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_in_flight: int = 64,
        wire: WireCodec | None = None,
    ) -> None:
        self._reader = FrameReader(max_frame_size)
        self._wire = wire if wire is not None else NativeWire()
        self.max_in_flight = max_in_flight
        self.in_flight = 0
        self.closing = False  # after a fatal error: read nothing more

    def switch_wire(self, wire: WireCodec) -> None:
        """Read the frames from now on with ``wire`` (Reply.wire)."""
        self._wire = wire

    @property
    def wants_read(self) -> bool:
        return not self.closing and self.in_flight < self.max_in_flight

    @property
    def buffered(self) -> int:
        return self._reader.buffered

    def get_buffer(self) -> memoryview:
        """Memory for the next socket read (asyncio.BufferedProtocol.get_buffer)."""
        return self._reader.get_buffer()

    def buffer_updated(self, nbytes: int) -> list[Event]:
        """``nbytes`` were read into the last ``get_buffer()``."""
        if self.closing:
            return []  # lingering after a fatal error: input is discarded
        try:
            frames = self._reader.buffer_updated(nbytes)
        except FrameTooLargeError as e:
            return self._too_large(e)
        return self._events(frames)

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Event]:
        """Copying variant for callers that get ``bytes`` (data_received, tests)."""
        if self.closing:
            return []
        try:
            frames = self._reader.feed(data)
        except FrameTooLargeError as e:
            return self._too_large(e)
        return self._events(frames)

    def _too_large(self, e: FrameTooLargeError) -> list[Event]:
        # Refused before allocating; the stream cannot be re-synchronised now.
        self.closing = True
        self.in_flight += 1
        return [ProtocolError(UNKNOWN_CORRELATION_ID, ErrorCode.REQUEST_TOO_LARGE, str(e), True)]

    def _events(self, frames: list[memoryview]) -> list[Event]:
        events: list[Event] = []
        wire = self._wire
        for frame in frames:
            self.in_flight += 1
            try:
                events.append(RequestReceived(wire.decode_request(frame), len(frame) + 4))
            except InvalidFrameError as e:
                # Framing is intact (we know where the next frame starts), so only this
                # request fails; without a readable correlation id nobody can match the
                # answer, so the connection is closed after it.
                corr = wire.peek_correlation_id(frame)
                fatal = corr is None
                events.append(
                    ProtocolError(
                        UNKNOWN_CORRELATION_ID if corr is None else corr,
                        e.code,
                        str(e),
                        fatal,
                        getattr(e, "api_key", -1),
                        getattr(e, "api_version", -1),
                        getattr(e, "client_id", ""),
                    )
                )
                if fatal:
                    self.closing = True
                    break
        return events

    def request_done(self) -> None:
        """One request was answered (or needed no answer)."""
        if self.in_flight <= 0:
            raise RuntimeError("request_done() without a request in flight")
        self.in_flight -= 1
