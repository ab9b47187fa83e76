"""Run an aiohttp app on a free loopback port for the duration of a test."""

from __future__ import annotations

from aiohttp import web


class RunningServer:
    def __init__(self, app: web.Application) -> None:
        self.app = app
        self._runner = web.AppRunner(app, access_log=None)
        self.port = 0

    async def start(self) -> RunningServer:
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        for address in self._runner.addresses:
            self.port = int(address[1])
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        await self._runner.cleanup()
