"""Running a tap: its event sink, its proxy and one uvicorn server per listener, in the
current event loop, until stopped."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

import uvicorn

from shadow.connectors.sink import POST_TIMEOUT_S, HttpEventSink, Poster, SinkPostError
from shadow.connectors.tap.config import EngineConfig, TapConfig, read_token
from shadow.connectors.tap.proxy import TapProxy
from shadow.connectors.tap.upstream import UpstreamClient, UpstreamError

log = logging.getLogger(__name__)


#: how often a listener's server looks at its exit flag when not told: uvicorn's own loop
#: wakes every 0.1 s, a cost per second per listener whatever the traffic (the tap is
#: held to a share of a core per chunk, and a quiet tap's wake-ups are all overhead)
TICK_S = 1.0


class _Server(uvicorn.Server):
    """Leaves signal handlers to the owner (several servers share one process), and
    wakes once a second instead of ten times; `request_exit` stops it at once."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def main_loop(self) -> None:
        self._exit_requested = asyncio.Event()
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 10) % 864000  # on_tick's own count of 0.1 s ticks
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exit_requested.wait(), TICK_S)

    def request_exit(self) -> None:
        self.should_exit = True
        requested = getattr(self, "_exit_requested", None)
        if requested is not None:
            requested.set()


def make_sink(config: TapConfig) -> tuple[HttpEventSink, UpstreamClient]:
    """The sink to the service and its client, which carries the bearer token (the caller
    closes it after the sink). The posts go through the tap's own HTTP client, not httpx:
    measured here, a post of 50 events cost 1.6-1.9 ms of CPU through httpx and 0.09 ms
    through it, and the tap is held to a share of a core."""
    assert config.service is not None
    token = read_token(config.token_file)
    client = UpstreamClient()
    sink = HttpEventSink(config.service, source=config.source, fleet=config.fleet,
                         flush_interval_s=config.flush_interval_s,
                         max_buffer=config.max_buffer,
                         poster=own_poster(client, token))  # fmt: skip
    return sink, client


def own_poster(client: UpstreamClient, token: str | None) -> Poster:
    """Posts a batch through `client` (bearer `token`), the answer read whole; a post that
    cannot connect, breaks off or takes over `POST_TIMEOUT_S` is a `SinkPostError`."""
    headers = [(b"content-type", b"application/x-ndjson")]
    if token:
        headers.append((b"authorization", b"Bearer " + token.encode("latin-1")))

    async def post(url: str, body: bytes) -> int:
        try:
            async with asyncio.timeout(POST_TIMEOUT_S):
                response = await client.send("POST", url, headers, body)
                try:
                    await response.aread()
                finally:  # a whole answer gives the connection back; a cut one closes it
                    await response.aclose()
        except TimeoutError:
            raise SinkPostError(f"no answer within {POST_TIMEOUT_S:g} s") from None
        except UpstreamError as error:
            raise SinkPostError(str(error)) from None
        return response.status_code

    return post


class RunningTap:
    """A started tap: `addresses` maps each listener (an engine's worker, or "shared",
    or "metrics") to its URL."""

    def __init__(self, config: TapConfig) -> None:
        self.config = config
        self.sink, self._sink_client = make_sink(config)
        self.proxy = TapProxy(config, self.sink)
        self.addresses: dict[str, str] = {}
        self._servers: list[_Server] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> RunningTap:
        await self.sink.start()
        await self.proxy.start()
        listeners: list[tuple[str, tuple[str, int], EngineConfig | None]] = []
        if self.config.listen is not None:
            listeners.append(("shared", self.config.listen, None))
        if self.config.metrics_listen is not None:
            listeners.append(("metrics", self.config.metrics_listen, None))
        for engine in self.config.engines:
            if engine.listen is not None:
                listeners.append((engine.worker, engine.listen, engine))
        for name, (host, port), engine in listeners:
            # no `server` or `date` header of its own: the engine's pass through alone
            server = _Server(uvicorn.Config(
                self.proxy.app(engine), host=host, port=port, log_level="warning",
                lifespan="off", timeout_keep_alive=120, server_header=False, date_header=False,
            ))  # fmt: skip
            self._servers.append(server)
            self._tasks.append(asyncio.create_task(server.serve()))
            while not server.started:
                if self._tasks[-1].done():
                    await self.stop()
                    raise OSError(f"tap listener {name}: cannot listen on {host}:{port}")
                await asyncio.sleep(0.01)
            bound = server.servers[0].sockets[0].getsockname()[1] if port == 0 else port
            self.addresses[name] = f"http://{host}:{bound}"
        return self

    async def serve_forever(self) -> None:
        await asyncio.gather(*self._tasks)

    async def stop(self) -> None:
        for server in self._servers:
            server.request_exit()
        for task in self._tasks:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(task, 10)
        await self.proxy.stop()
        await self.sink.aclose()
        await self._sink_client.aclose()
