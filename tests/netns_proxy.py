"""A slow or busy link for tests/netns.py's networks: a TCP proxy that holds every chunk it
forwards, either way, for a delay with jitter. This kernel has no netem qdisc, so a slow link
between a host and a service is this proxy, run on the service's host on a port of its own.

    python tests/netns_proxy.py LISTEN_HOST LISTEN_PORT TARGET_HOST TARGET_PORT DELAY_S JITTER_S
        [THROTTLE]

THROTTLE (a fraction, default 0) makes it an S3 endpoint that sheds load as S3 does: that
share of new connections gets its first request answered with 503 SlowDown, and is closed.
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


SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


async def _shed(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
    """Answer the connection's first request 503 SlowDown as soon as its head is read (as
    S3 may, before a body: a client that sent `Expect: 100-continue` sends none), and close
    the connection."""
    try:
        await client_r.readuntil(b"\r\n\r\n")
        client_w.write(
            b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
            + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(SLOW_DOWN)
            + SLOW_DOWN
        )
        await client_w.drain()
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        pass
    finally:
        client_w.close()


async def serve(
    listen: tuple[str, int],
    target: tuple[str, int],
    delay: float,
    jitter: float,
    throttle: float = 0.0,
) -> None:
    shed = [0, 0]  # connections shed, connections in all

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        shed[1] += 1
        if random.random() < throttle:
            shed[0] += 1
            print(f"shed {shed[0]} of {shed[1]}", flush=True)
            await _shed(client_r, client_w)
            return
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
    throttle = float(sys.argv[7]) if len(sys.argv) > 7 else 0.0
    asyncio.run(
        serve((host, int(port)), (to_host, int(to_port)), float(delay), float(jitter), throttle)
    )
