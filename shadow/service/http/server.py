"""uvicorn's server as `shadow serve` runs it: a stop may cut the wait for open requests,
never the lifespan's shutdown (stop the workers, flush, close the database)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from types import FrameType

import uvicorn

GRACE_S = 10.0  # how long a stop waits for requests in flight before it drops them


class ServiceServer(uvicorn.Server):
    """uvicorn's `Server`, stopping differently in three ways. A second Ctrl-C (or `timeout
    -s INT`, which signals the process and then its group) set uvicorn's `force_exit`,
    which skipped the lifespan's shutdown too: asyncio then cancelled the lifespan mid-wait
    and printed its traceback. Here it skips only the wait for open requests, as
    `GRACE_S` does, and those requests are ended by closing their connections (the
    handlers see a disconnect) rather than cancelled (a traceback each). And each signal is
    raised again once after the stop (as `Server.run` does), not once per press.
    `announce` tells the person at the terminal what a stop is waiting for."""

    def __init__(self, app: object, announce: Callable[[str], None]) -> None:
        super().__init__(uvicorn.Config(app, log_level="warning"))
        self.announce = announce

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        first = not self.should_exit
        super().handle_exit(sig, frame)
        self._captured_signals = list(dict.fromkeys(self._captured_signals))
        if first:
            self.announce(
                f"stopping: open requests get up to {GRACE_S:g} s, then the workers stop and "
                "the database is flushed; Ctrl-C again skips the wait"
            )
        elif self.force_exit:
            self.announce("stopping without waiting for open requests")

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        deadline = asyncio.get_running_loop().call_later(GRACE_S, self._stop_waiting)
        try:
            await super().shutdown(sockets)
        finally:
            deadline.cancel()
        if self.force_exit and not self._lifespan_stopped():  # uvicorn skips it then
            await self._end_open_requests()
            await self.lifespan.shutdown()

    def _lifespan_stopped(self) -> bool:
        """Whether the lifespan's shutdown ran (the grace period can run out during it, which
        sets `force_exit` after uvicorn has looked at it)."""
        stopped = getattr(self.lifespan, "shutdown_event", None)
        return stopped is None or stopped.is_set()

    def _stop_waiting(self) -> None:
        if self.server_state.connections:
            self.announce(f"stopping: {len(self.server_state.connections)} open requests "
                          f"after {GRACE_S:g} s; ending them")  # fmt: skip
        self.force_exit = True

    async def _end_open_requests(self, within_s: float = 2.0) -> None:
        for connection in list(self.server_state.connections):
            connection.transport.close()  # type: ignore[attr-defined]
        deadline = time.monotonic() + within_s
        while self.server_state.tasks and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
