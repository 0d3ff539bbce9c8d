"""The emulated world's incumbent router over real loopback HTTP: what it answers when the
tap behind it cannot be reached, and that a stall of its own loop is not mistaken for that.

The stall is real (the loop thread blocked in `time.sleep`, as a host starved for seconds
blocks it) and so is the connect (httpx to a listening uvicorn); only the moment of the
stall is arranged, by wrapping the connect so it lands while the connect is in flight."""

from __future__ import annotations

import asyncio
import time

import httpcore
import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from shadow.world.emulator import QuietServer
from shadow.world.process import free_port
from shadow.world.router import Router

#: the router's connect timeout here, and a stall past it
CONNECT_TIMEOUT_S = 0.5
STALL_S = 1.5


async def _serve(app) -> tuple[QuietServer, asyncio.Task[None], str]:
    port = free_port()
    server = QuietServer(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    return server, task, f"http://127.0.0.1:{port}"


async def _engine(request: Request) -> JSONResponse:
    return JSONResponse({"worker": request.path_params["worker"], "ok": True})


async def _through_router(upstream: str | None) -> httpx.Response:
    """One completion through a router in front of `upstream` (a closed port if None)."""
    engine = Starlette(routes=[Route("/{worker}/v1/completions", _engine, methods=["POST"])])
    engine_server, engine_task, engine_url = await _serve(engine)
    client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S))
    router = Router(["0", "1"], upstream or engine_url, capacity=4, client=client)
    router_server, router_task, router_url = await _serve(router.app)
    try:
        async with httpx.AsyncClient(timeout=30) as caller:
            return await caller.post(f"{router_url}/v1/completions", json={"prompt": "hi"})
    finally:
        for server in (router_server, engine_server):
            server.should_exit = True
        await asyncio.gather(router_task, engine_task)


def test_a_stall_of_the_routers_loop_during_a_connect_is_not_a_502(monkeypatch):
    """httpx's connect timer fires after a stall though the kernel had connected; the
    router connects again instead of answering 502 and excluding the worker (the
    real-vLLM tests' `upstream 1: ` with an empty error)."""
    real_connect = httpcore.AnyIOBackend.connect_tcp
    stalls: list[float] = []

    async def connect_during_a_stall(self, *args, **kwargs):
        # the router's first connect only (not the caller's, which has no short timeout):
        # the loop blocks while it is in flight
        if kwargs.get("timeout") == CONNECT_TIMEOUT_S and not stalls:
            stalls.append(STALL_S)
            asyncio.get_running_loop().call_soon(time.sleep, STALL_S)
        return await real_connect(self, *args, **kwargs)

    monkeypatch.setattr(httpcore.AnyIOBackend, "connect_tcp", connect_during_a_stall)
    answer = asyncio.run(_through_router(None))
    assert stalls == [STALL_S], "the stall was not arranged"
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"worker": "0", "ok": True}


def test_an_unreachable_tap_is_a_502_that_names_the_error():
    closed = f"http://127.0.0.1:{free_port()}"
    answer = asyncio.run(_through_router(closed))
    assert answer.status_code == 502
    error = answer.json()["error"]
    assert error.startswith("upstream 0: ConnectError"), error


def test_without_the_second_connect_the_stall_is_a_502(monkeypatch):
    """The same stall with one attempt: the failure the second connect exists for (so
    the first test shows the fix, not a stall that never bit)."""
    monkeypatch.setattr("shadow.world.router.CONNECT_ATTEMPTS", 1)
    real_connect = httpcore.AnyIOBackend.connect_tcp

    async def connect_during_a_stall(self, *args, **kwargs):
        if kwargs.get("timeout") == CONNECT_TIMEOUT_S:
            asyncio.get_running_loop().call_soon(time.sleep, STALL_S)
        return await real_connect(self, *args, **kwargs)

    monkeypatch.setattr(httpcore.AnyIOBackend, "connect_tcp", connect_during_a_stall)
    answer = asyncio.run(_through_router(None))
    assert answer.status_code == 502
    assert answer.json()["error"] == "upstream 0: ConnectTimeout"
