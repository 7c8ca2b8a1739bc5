"""The sync AMQP transport.  With ``_transport_base`` (events, handler
protocols, error translation), ``_transport_channel`` (one channel),
``_transport_frames`` (publish frames) and ``_transport_patch`` (pika's
internals), the only modules that import pika.

One ``PikaTransport`` per connection runs a pika ``SelectConnection`` on its
own I/O thread; pika is not thread-safe, so every call from another thread is
marshalled onto that thread (``post`` / blocking ``call`` and channel RPCs).
Callbacks to the layers above (``ChannelHandler``, ``TransportListener``) run
on the I/O thread and must not block.  pika exceptions are translated here,
most specific first, and never leak.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import ssl
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pika
import pika.exceptions

from ._exceptions import (
    ConnectionLostError,
    IllegalStateError,
    JMSException,
    ProtocolError,
)
from ._transport_base import (
    RPC_TIMEOUT,
    ChannelHandler,
    Delivery,
    TransportListener,
    connect_timed_out,
    connection_parameters,
    listen_blocked,
    lost_error,
    note_direct_rabbitmq,
    open_failed,
    translate_error,
)
from ._transport_channel import TransportChannel
from ._transport_frames import PublishEncoder
from ._transport_patch import coalesce_writes, marshaled_output

__all__ = [
    "ChannelHandler",
    "Delivery",
    "PikaTransport",
    "TransportChannel",
    "TransportListener",
    "translate_error",
]

R = TypeVar("R")


class PikaTransport:
    """One AMQP connection on its own I/O thread."""

    def __init__(
        self,
        url: str,
        listener: TransportListener,
        *,
        heartbeat: int = 30,
        connect_timeout: float = 10.0,
        name: str = "rabbitflow",
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._params = connection_parameters(
            url, heartbeat=heartbeat, connect_timeout=connect_timeout, name=name, tls=ssl_context
        )
        self._listener = listener
        self._connect_timeout = connect_timeout
        self._connection: Any = None
        self._thread: threading.Thread | None = None
        self._name = name
        self.encoder = PublishEncoder()
        self.closing = False
        self.lost = False
        self._opened = False
        self.writes_coalesced = False  # the pika patch is in place (see _transport_patch)

    def raw_output(self) -> tuple[Callable[[bytes], None], int] | None:
        """(write encoded frames, largest body frame payload) for the publish
        path, or None when pika's internals are not as expected."""
        return marshaled_output(self._connection)

    @property
    def alive(self) -> bool:
        """True while the connection is open and not closing."""
        return not (self.closing or self.lost) and self._connection is not None

    def on_io_thread(self) -> bool:
        """True when called from the I/O thread."""
        return threading.current_thread() is self._thread

    def connect(self) -> None:
        """Open the connection and start the I/O thread.

        Raises:
            BrokerError: authentication / access refused, bad URL.
            ConnectionLostError: the broker cannot be reached.
        """
        opened: concurrent.futures.Future[None] = concurrent.futures.Future()
        connection = pika.SelectConnection(
            self._params,
            on_open_callback=functools.partial(self._on_open, opened),
            on_open_error_callback=functools.partial(self._on_open_error, opened),
            on_close_callback=functools.partial(self._on_closed, opened),
        )
        listen_blocked(connection, self._listener)
        self._connection = connection
        self._thread = threading.Thread(target=self._run, name=f"{self._name}-io", daemon=True)
        self._thread.start()
        try:
            opened.result(timeout=self._connect_timeout + 5)
        except concurrent.futures.TimeoutError:
            self.lost = True
            self.post(self._connection.close)
            raise connect_timed_out(self._params) from None
        except JMSException:
            self.lost = True
            raise

    # pika's connection callbacks (I/O thread); ``opened`` is connect()'s.
    def _on_open(self, opened: concurrent.futures.Future[None], conn: Any) -> None:
        self.writes_coalesced = coalesce_writes(conn)
        self._opened = True
        params = self._params
        note_direct_rabbitmq(getattr(conn, "server_properties", None), params.host, params.port)
        opened.set_result(None)

    def _on_open_error(
        self, opened: concurrent.futures.Future[None], _conn: Any, error: BaseException | str
    ) -> None:
        if not opened.done():
            opened.set_exception(open_failed(error))
        self._connection.ioloop.stop()

    def _on_closed(
        self, opened: concurrent.futures.Future[None], _conn: Any, reason: BaseException
    ) -> None:
        if opened.done() and not self.closing and not self.lost:
            self.lost = True
            self._listener.on_lost(lost_error(reason))
        self._connection.ioloop.stop()

    def _run(self) -> None:
        try:
            self._connection.ioloop.start()
        except Exception as exc:  # a pika bug must not hang the application
            # Before the open completed, connect() reports the failure itself.
            if self._opened and not self.lost and not self.closing:
                self.lost = True
                self._listener.on_lost(ConnectionLostError(f"I/O loop failed: {exc!r}"))
        finally:
            # Releases the loop's wake-up socket pair.
            with contextlib.suppress(Exception):
                self._connection.ioloop.close()

    def post(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the I/O thread soon (at once when already on it)."""
        if self.on_io_thread():
            fn()
            return
        # Loop gone: the connection is lost and recovery will run.
        with contextlib.suppress(RuntimeError, AttributeError, OSError, pika.exceptions.AMQPError):
            self._connection.ioloop.add_callback_threadsafe(fn)

    def call_later(self, delay: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the I/O thread after ``delay`` seconds (from the I/O thread)."""
        self._connection.ioloop.call_later(delay, fn)

    def wait(
        self, future: concurrent.futures.Future[R], *, timeout: float | None = RPC_TIMEOUT
    ) -> R:
        """Wait for an RPC result from another thread (``timeout`` None: as
        long as the connection lives).

        Raises:
            IllegalStateError: called on the I/O thread (would deadlock).
            ConnectionLostError: the connection died while waiting.
            ProtocolError: no answer within ``timeout`` seconds.
            JMSException: the RPC failed (translated).
        """
        if self.on_io_thread():
            raise IllegalStateError("blocking call on the rabbitflow I/O thread")
        remaining = timeout
        while True:
            if self.lost and not future.done():
                raise ConnectionLostError("connection lost")
            try:
                return future.result(timeout=0.2)
            except concurrent.futures.TimeoutError:
                if remaining is not None:
                    remaining -= 0.2
                    if remaining <= 0:
                        raise ProtocolError(
                            f"the broker did not answer within {timeout:g} s"
                        ) from None

    def open_channel(self, handler: ChannelHandler) -> TransportChannel:
        """Open a channel whose events go to ``handler``.

        Raises:
            ConnectionLostError: the connection is gone.
            JMSException: the broker refused.
        """
        if not self.alive:
            raise ConnectionLostError("connection is not open")
        future: concurrent.futures.Future[TransportChannel] = concurrent.futures.Future()

        def run() -> None:
            try:
                self._connection.channel(
                    on_open_callback=lambda ch: future.set_result(
                        TransportChannel(self, ch, handler)
                    )
                )
            except Exception as exc:
                future.set_exception(translate_error(exc))

        self.post(run)
        return self.wait(future)

    def close(self) -> None:
        """Close the connection and stop the I/O thread (idempotent)."""
        if self.closing:
            return
        self.closing = True
        if not self.lost and self._connection is not None:

            def run() -> None:
                if self._connection.is_open:
                    self._connection.close()
                elif not self._connection.is_closed:
                    pass  # opening/closing already: on_closed stops the loop

            self.post(run)
        thread = self._thread
        if thread is not None and not self.on_io_thread():
            thread.join(timeout=10)
