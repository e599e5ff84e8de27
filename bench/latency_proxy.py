"""A loopback TCP proxy adding a fixed delay to every byte sent towards the server (so one
round trip through it costs ``delay_ms`` more), run in a child process so that it never
shares an event loop or the GIL with what is measured.

Run: python bench/latency_proxy.py LISTEN_PORT TARGET_PORT DELAY_MS
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                delay_s: float) -> None:
    """Copy reader to writer, each chunk written ``delay_s`` after it arrived (in order)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def send() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        writer.close()

    sender = asyncio.create_task(send())
    try:
        while True:
            data = await reader.read(65536)
            queue.put_nowait((loop.time() + delay_s, data))
            if not data:
                break
    except ConnectionError:
        queue.put_nowait((0.0, b""))
    await sender


async def serve(listen_port: int, target_port: int, delay_ms: float) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(_pipe(reader, up_writer, delay_ms / 1000),
                             _pipe(up_reader, writer, 0.0), return_exceptions=True)

    server = await asyncio.start_server(handle, "127.0.0.1", listen_port)
    async with server:
        await server.serve_forever()


class LatencyProxy:
    """The proxy in a child process: ``with LatencyProxy(listen, target, 1.0): ...``."""

    def __init__(self, listen_port: int, target_port: int, delay_ms: float) -> None:
        self.args = [str(listen_port), str(target_port), str(delay_ms)]
        self.port = listen_port
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LatencyProxy:
        import socket

        self.proc = subprocess.Popen([sys.executable, str(Path(__file__)), *self.args])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("latency proxy did not start")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(5)


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])))
