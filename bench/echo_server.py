"""The latency floor: a bare aiohttp server answering ``POST /hook`` with ``{}``. Prints its port."""

from __future__ import annotations

import asyncio
import sys

from aiohttp import web


async def hook(request: web.Request) -> web.Response:
    await request.read()
    return web.json_response({})


async def main() -> None:
    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(f"echo listening on 127.0.0.1:{site._server.sockets[0].getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
