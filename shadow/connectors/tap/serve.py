"""Running a tap: its event sink, its proxy and its listeners (`listener.listen`), in the
current event loop, until stopped."""

from __future__ import annotations

import asyncio
import logging

from shadow.connectors.sink import POST_TIMEOUT_S, HttpEventSink, Poster, SinkPostError
from shadow.connectors.tap.config import EngineConfig, TapConfig, read_token
from shadow.connectors.tap.listener import Listener, listen
from shadow.connectors.tap.proxy import TapProxy
from shadow.connectors.tap.upstream import UpstreamClient, UpstreamError

log = logging.getLogger(__name__)


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
        self._listeners: list[Listener] = []
        self._stopped = asyncio.Event()

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
            try:
                listener = await listen(self.proxy.handler(engine), host, port)
            except OSError as error:
                await self.stop()
                raise OSError(f"tap listener {name}: cannot listen on {host}:{port}: "
                              f"{error.strerror or error}") from None  # fmt: skip
            self._listeners.append(listener)
            self.addresses[name] = f"http://{host}:{listener.port}"
        return self

    async def serve_forever(self) -> None:
        await self._stopped.wait()

    async def stop(self) -> None:
        await asyncio.gather(*(listener.close() for listener in self._listeners))
        self._listeners.clear()
        await self.proxy.stop()
        await self.sink.aclose()
        await self._sink_client.aclose()
        self._stopped.set()
