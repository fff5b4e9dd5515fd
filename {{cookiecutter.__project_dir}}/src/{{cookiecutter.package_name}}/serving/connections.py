"""What one client's connections may hold on the server: headers in time, and a few connections at once.

uvicorn bounds a request's size but neither the time its headers take nor how many connections one
client keeps open. A client that opens a thousand connections and sends one header line on each every
ten seconds holds a thousand file descriptors for as long as it likes: the server's ``ulimit -n`` is
spent, and ``/health`` and every good client are refused for the whole attack (the "Slowloris"
attack). :func:`bounded_connections` returns uvicorn's own HTTP protocol (``httptools``, which
LitServe installs with ``uvicorn[standard]``) with two bounds, for ``LitServer.run(http=...)``, which
hands it to ``uvicorn.Config(http=...)``:

- **Headers in time.** Each request's headers must be complete ``header_timeout`` seconds after its
  connection opens (or, on a kept-alive connection, after the request's first byte): later, the
  client gets 408 and the connection is closed. A deadline, not an idle timer: a header line every
  second does not extend it. The body has its own deadline (``serving.api.JSONBodyMiddleware``).
- **Connections per client.** A client address (the peer's IP) holds at most
  ``max_client_connections`` connections at once in each HTTP process; one more is answered 503 at
  once and closed, so its descriptor is back before it can pile up. Behind a reverse proxy every
  request comes from the proxy's address: raise the bound there, or set 0 for none (the proxy then
  owns the bound).
"""

import asyncio
import collections
import logging
import math

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

logger = logging.getLogger("uvicorn.error")


def bounded_connections(header_timeout: float = 10.0, max_client_connections: int = 64) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with a deadline on each request's headers and a bound on each
    client's connections (the module's docstring says why).

    Args:
        header_timeout: seconds a request's headers may take to arrive (later: 408, connection closed).
        max_client_connections: connections one client IP may hold at once in each HTTP process
            (more: 503, connection closed); 0 for no bound.

    Raises:
        ValueError: ``header_timeout`` is not positive, or ``max_client_connections`` is negative.
    """
    if not header_timeout > 0:
        raise ValueError(f"header_timeout must be a positive number of seconds, got {header_timeout:g}")
    if max_client_connections < 0:
        raise ValueError(f"max_client_connections must be 0 (no bound) or more, got {max_client_connections}")
    # Each call its own counts: one server's clients are not another's (and tests start several).
    warned: dict[str, float] = {}
    state = {"held": collections.Counter(), "warned": warned}
    limits = {"header_timeout": header_timeout, "max_client_connections": max_client_connections}
    return type("BoundedHttpToolsProtocol", (BoundedHttpToolsProtocol,), {**limits, **state})


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, bounded as :func:`bounded_connections` says (build it there)."""

    header_timeout: float
    max_client_connections: int
    held: collections.Counter  # open connections by client address, in this process
    warned: dict[str, float]  # when each address was last said to be over the bound (event-loop time)

    late_headers: asyncio.TimerHandle | None = None
    counted: str | None = None  # the address this connection is counted under

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        address = self.client[0] if self.client else None
        if address is not None and self.max_client_connections:
            self.counted = address
            self.held[address] += 1
            limit = self.max_client_connections
            if self.held[address] > limit:
                if self.loop.time() - self.warned.get(address, -math.inf) > 60:  # a line a minute, not one a connection
                    self.warned[address] = self.loop.time()
                    logger.warning("%s holds %d connections (--max_client_connections): refusing more", address, limit)
                self.refuse(503, f"this client holds {limit} connections, the server's --max_client_connections")
                return
        self.expect_headers()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.expect_headers()  # a kept-alive connection's next request: its own deadline

    def on_headers_complete(self) -> None:
        self.headers_arrived()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self.headers_arrived()
        if self.counted is not None:
            self.held[self.counted] -= 1
            if not self.held[self.counted]:
                del self.held[self.counted]
            self.counted = None
        super().connection_lost(exc)

    def expect_headers(self) -> None:
        if self.late_headers is None and not self.transport.is_closing():
            self.late_headers = self.loop.call_later(self.header_timeout, self.headers_late)

    def headers_arrived(self) -> None:
        if self.late_headers is not None:
            self.late_headers.cancel()
            self.late_headers = None

    def headers_late(self) -> None:
        self.late_headers = None
        if self.cycle is not None and not self.cycle.response_complete:  # a pipelined request waits its turn:
            self.expect_headers()  # a 408 now would cut the answer being written (its time is --timeout's)
            return
        late = f"the request headers did not arrive within {self.header_timeout:g} s (the server's --header_timeout)"
        self.refuse(408, late)

    def refuse(self, status: int, reason: str) -> None:
        """Answer ``status`` with ``reason`` as plain text and close the connection."""
        phrase = {408: "Request Timeout", 503: "Service Unavailable"}[status]
        body = reason.encode()
        head = f"HTTP/1.1 {status} {phrase}\r\ncontent-type: text/plain; charset=utf-8\r\n"
        head += f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        self.transport.write(head.encode() + body)
        self.transport.close()
