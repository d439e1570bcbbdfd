"""A slow link for tests/netns.py's networks: a TCP proxy that holds every chunk it forwards,
either way, for a delay with jitter. This kernel has no netem qdisc, so a slow link between
a host and a service is this proxy, run on the service's host on a port of its own.

    python tests/netns_proxy.py LISTEN_HOST LISTEN_PORT TARGET_HOST TARGET_PORT DELAY_S JITTER_S
"""

from __future__ import annotations

import asyncio
import random
import sys


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float, jitter: float
) -> None:
    try:
        while chunk := await reader.read(65536):
            await asyncio.sleep(max(0.0, delay + random.uniform(-jitter, jitter)))
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def serve(
    listen: tuple[str, int], target: tuple[str, int], delay: float, jitter: float
) -> None:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*target)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(
            _pipe(client_r, server_w, delay, jitter), _pipe(server_r, client_w, delay, jitter)
        )

    server = await asyncio.start_server(handle, *listen)
    print("listening", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    host, port, to_host, to_port, delay, jitter = sys.argv[1:7]
    asyncio.run(serve((host, int(port)), (to_host, int(to_port)), float(delay), float(jitter)))
