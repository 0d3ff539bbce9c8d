"""The incumbent router: an OpenAI-compatible proxy that picks the decode worker by JSQ
over a ready pool (`jsq-pool`: fewest requests in flight among workers with a free slot,
ties to the lowest index); `rr` selectable. The replay names it `jsq-pool`, not `jsq`
(which dispatches on arrival into worker queues), because it holds a pool.

As in BALANCEROUTE.md, a request whose prefill is done waits in the router's ready pool
(oldest first) until some worker has a free slot (`capacity` in flight); only then is it
dispatched. The router announces `ready` when a request enters the pool (the tap announces
the rest), and tells the tap what it believed when it chose (`x-router-view`), so the
audit can tell the router's view apart from the mirror's."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from shadow.connectors.sink import HttpEventSink
from shadow.events import FinishEvent, ReadyEvent
from shadow.world.event_wire import sink_fields
from shadow.world.tap import HOP_BY_HOP, prompt_hash_of, prompt_tokens_of, proxy_client

POLICIES = ("jsq-pool", "rr")
#: tries at connecting to the tap before a request is answered 502 (see `Router._send`)
CONNECT_ATTEMPTS = 2


class Router:
    def __init__(
        self,
        workers: list[str],
        upstream: str,
        *,
        capacity: int,
        policy: str = "jsq-pool",
        sink: HttpEventSink | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        """`workers` are worker ids; requests go to `{upstream}/{worker}/...` (the tap)."""
        self.capacity = capacity
        self.sink = sink
        self._pool: deque[asyncio.Future[str]] = deque()
        if policy not in POLICIES:
            raise ValueError(f"router policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        self.workers = list(workers)
        self.upstream = upstream.rstrip("/")
        self.policy = policy
        self.in_flight = dict.fromkeys(self.workers, 0)
        self.excluded: set[str] = set()
        self._cursor = 0
        self._client = client
        self.app = Starlette(
            routes=[
                Route("/v1/completions", self.generate, methods=["POST"]),
                Route("/v1/chat/completions", self.generate, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/health", self.health, methods=["GET"]),
            ],
            lifespan=self._lifespan,
        )

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self._client = self._client or proxy_client()
        try:
            yield
        finally:
            await self._client.aclose()

    def choose(self) -> str | None:
        """A worker with a free slot by the policy, or None when every one is full."""
        candidates = [
            w for w in self.workers if w not in self.excluded and self.in_flight[w] < self.capacity
        ]
        if not candidates:
            return None
        if self.policy == "rr":
            for step in range(len(self.workers)):
                worker = self.workers[(self._cursor + step) % len(self.workers)]
                if worker in candidates:
                    self._cursor = self.workers.index(worker) + 1
                    return worker
        return min(candidates, key=lambda w: (self.in_flight[w], self.workers.index(w)))

    def _take(self) -> str | None:
        worker = self.choose()
        if worker is not None:
            self.in_flight[worker] += 1
        return worker

    def _release(self, worker: str) -> None:
        """A slot freed: hand it to the oldest request waiting in the pool."""
        self.in_flight[worker] -= 1
        while self._pool:
            waiter = self._pool[0]
            if waiter.done():
                self._pool.popleft()
                continue
            chosen = self._take()
            if chosen is None:
                return
            self._pool.popleft()
            waiter.set_result(chosen)

    async def health(self, request: Request) -> Response:
        return JSONResponse({"ok": True, "policy": self.policy, "in_flight": self.in_flight})

    async def models(self, request: Request) -> Response:
        assert self._client is not None
        answer = await self._client.get(f"{self.upstream}/{self.workers[0]}/v1/models")
        return Response(answer.content, answer.status_code, {"content-type": "application/json"})

    async def generate(self, request: Request) -> Response:
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        request_id = headers.setdefault("x-request-id", f"rt-{uuid.uuid4().hex}")
        if self.sink is not None:
            try:
                parsed = json.loads(body) if body else {}
            except ValueError:
                parsed = {}
            ready = ReadyEvent(
                ts=time.time(),
                request_id=request_id,
                prompt_tokens=prompt_tokens_of(parsed),
                prompt_hash=prompt_hash_of(parsed),
            )
            self.sink.put(sink_fields(ready))
        view = {w: {"running": n} for w, n in self.in_flight.items()}
        worker = self._take() if not self._pool else None
        if worker is None:  # wait in the ready pool for a free slot
            waiter: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            self._pool.append(waiter)
            try:
                worker = await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._release(waiter.result())
                if self.sink is not None:
                    cancelled = FinishEvent(
                        ts=time.time(), request_id=request_id, output_tokens=0, reason="cancelled"
                    )
                    self.sink.put(sink_fields(cancelled))
                raise
            view = {w: {"running": n - (w == worker)} for w, n in self.in_flight.items()}
        headers["x-router-view"] = json.dumps(view, separators=(",", ":"))
        headers["x-router-policy"] = self.policy
        try:
            url = f"{self.upstream}/{worker}{request.url.path}"
            upstream = await self._send(url, headers, body)
        except httpx.HTTPError as error:
            self.excluded.add(worker)
            self._release(worker)
            reason = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
            return JSONResponse({"error": f"upstream {worker}: {reason}"}, status_code=502)
        if upstream.status_code == 502:
            self.excluded.add(worker)
        return _Relay(self, worker, upstream)

    async def _send(self, url: str, headers: dict[str, str], body: bytes) -> httpx.Response:
        """The request to the tap, sent again once if connecting to it timed out. httpx
        times a connect with a timer beside the socket: when this loop stalls past the
        timeout (a host starved for seconds) the timer can win though the kernel had long
        connected, and nothing was sent yet. Seen in the real-vLLM tests as a 502 with an
        empty error; a tap that is truly gone is refused at once, not timed out."""
        client = self._client
        assert client is not None
        for _ in range(CONNECT_ATTEMPTS - 1):
            with contextlib.suppress(httpx.ConnectTimeout):
                request = client.build_request("POST", url, headers=headers, content=body)
                return await client.send(request, stream=True)
        request = client.build_request("POST", url, headers=headers, content=body)
        return await client.send(request, stream=True)

    async def _pump(self, worker: str, upstream: httpx.Response, send: Send) -> None:
        try:
            async for chunk in upstream.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx.HTTPError:
            self.excluded.add(worker)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class _Relay(Response):
    """The upstream's answer passed through while a watcher waits for the client to
    leave: whichever ends first, the upstream request is closed right there (a client
    gone closes it, so the tap, and the engine, see it go) and the slot released. Not a
    `StreamingResponse` over a generator: there the close sits in the generator's
    `finally`, which runs only when the cancellation lands inside the generator or when
    it is finalized, so a client's leaving did not reliably reach the upstream."""

    def __init__(self, router: Router, worker: str, upstream: httpx.Response) -> None:
        self.router = router
        self.worker = worker
        self.upstream = upstream
        self.status_code = upstream.status_code
        self.background = None
        self.init_headers(
            {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})  # fmt: skip
            pump = asyncio.ensure_future(self.router._pump(self.worker, self.upstream, send))
            watch = asyncio.ensure_future(_wait_disconnect(receive))
            try:
                await asyncio.wait((pump, watch), return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (pump, watch):
                    task.cancel()
                await asyncio.gather(pump, watch, return_exceptions=True)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.upstream.aclose())
            self.router._release(self.worker)


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
