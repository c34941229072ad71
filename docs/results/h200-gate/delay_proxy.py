"""A reverse proxy that holds every completion request for a fixed time before passing it on: a known,
real slowdown of the server behind it, to measure what the baseline gate detects.

    python delay_proxy.py LISTEN_PORT UPSTREAM_URL DELAY_MS

Only POSTs to ``.../completions`` are delayed; ``/health``, ``/metrics``, ``/tokenize`` and
``/reset_prefix_cache`` pass straight through, so the plugin measures the server as usual. Responses stream
through chunk by chunk, so TTFT grows by the delay and nothing else.
"""

from __future__ import annotations

import asyncio
import sys

import aiohttp
from aiohttp import web

# Headers that belong to one hop: the proxy's own connection decides them.
HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade"}


def app(upstream: str, delay_s: float) -> web.Application:
    async def start(application: web.Application) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        connector = aiohttp.TCPConnector(limit=0)
        application["client"] = aiohttp.ClientSession(timeout=timeout, connector=connector, auto_decompress=False)

    async def stop(application: web.Application) -> None:
        await application["client"].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        if request.method == "POST" and request.path.endswith("/completions"):
            await asyncio.sleep(delay_s)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        body = await request.read()
        client: aiohttp.ClientSession = request.app["client"]
        async with client.request(request.method, upstream + request.path_qs, headers=headers, data=body) as up:
            response = web.StreamResponse(
                status=up.status, headers={k: v for k, v in up.headers.items() if k.lower() not in HOP}
            )
            await response.prepare(request)
            async for chunk in up.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    application = web.Application(client_max_size=1 << 30)
    application.on_startup.append(start)
    application.on_cleanup.append(stop)
    application.router.add_route("*", "/{tail:.*}", forward)
    return application


if __name__ == "__main__":
    port, upstream, delay_ms = int(sys.argv[1]), sys.argv[2].rstrip("/"), float(sys.argv[3])
    web.run_app(app(upstream, delay_ms / 1000.0), host="127.0.0.1", port=port, print=None)
