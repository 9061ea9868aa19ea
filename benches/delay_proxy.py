#!/usr/bin/env python3
"""A TCP proxy that holds every chunk it relays for DELAY_MS in each direction, for
benches/catchup.sh: a round trip through it takes 2 x DELAY_MS more. It stands in for
`tc netem delay` on kernels built without sch_netem (this project's VM): it adds the delay to
the application's round trips (a frame and its ack), which is what a stop-and-wait protocol
pays, though TCP's own acks between it and each side are not delayed.

    delay_proxy.py DELAY_MS LISTEN_HOST:PORT TARGET_HOST:PORT

Standard library only; one connection or many; order kept per direction; stops on SIGTERM.
"""

import asyncio
import socket
import sys


async def relay(reader, writer, delay):
    """Copies reader to writer, each chunk DELAY seconds after it was read."""
    loop = asyncio.get_running_loop()
    queue = asyncio.Queue()

    async def write():
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                writer.close()
                return
            writer.write(data)
            await writer.drain()

    task = asyncio.create_task(write())
    try:
        while True:
            data = await reader.read(1 << 20)
            queue.put_nowait((loop.time() + delay, data))
            if not data:
                break
    except ConnectionError:
        queue.put_nowait((loop.time(), b""))
    try:
        await task
    except ConnectionError:
        pass


def nodelay(writer):
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def main():
    delay = float(sys.argv[1]) / 1000
    listen_host, listen_port = sys.argv[2].rsplit(":", 1)
    target_host, target_port = sys.argv[3].rsplit(":", 1)

    async def serve(client_reader, client_writer):
        server_reader, server_writer = await asyncio.open_connection(target_host, int(target_port))
        nodelay(client_writer)
        nodelay(server_writer)
        await asyncio.gather(
            relay(client_reader, server_writer, delay),
            relay(server_reader, client_writer, delay),
        )

    server = await asyncio.start_server(serve, listen_host, int(listen_port))
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
