#!/usr/bin/env python3
"""An HTTP proxy in front of an S3 server that adds latency and injects faults, for the
object-storage tests (tests/objects.rs) and benchmarks (scripts/bench/bench_objects.py).

    scripts/dev/s3_fault_proxy.py --listen 9100 --upstream 127.0.0.1:9000 \\
        [--delay-ms 20] [--fail-every N] [--reset-every N] [--slow-every N] \\
        [--strip-if-match] [--strip-etag] [--huge-length-for SUBSTRING] [--deny-writes] \\
        [--no-conditional-puts] [--lose-first-answer-for SUBSTRING] [--stall-after-bytes N]

Every request waits --delay-ms before it is forwarded (a round trip to a remote region). Counting
requests from 1: every --fail-every-th is answered `503 SlowDown` without reaching the server;
every --reset-every-th GET with a body has its response cut off in the middle and the connection
closed (a reset); every --slow-every-th response trickles its body, a quarter of every 64 KiB
at a time with a pause of 1/64 s. Three faults of a broken server: --strip-if-match drops the
`If-Match` header from every request (the server then answers whatever version it holds);
--strip-etag drops the `ETag` header from every GET's response;
--huge-length-for answers every GET whose path contains SUBSTRING with `Content-Length:
100000000000000` over its real body, sent in two pieces before the connection closes. And
read-only credentials: --deny-writes answers every PUT, POST and DELETE `403 AccessDenied`; a server
without conditional writes: --no-conditional-puts answers every PUT with `If-None-Match`
`501 NotImplemented`. A lost answer: --lose-first-answer-for SUBSTRING forwards the first PUT whose
path contains SUBSTRING to the server and answers `500 InternalError` instead of its answer.
And a stalled server: after `GET /__proxy_stall`, or once --stall-after-bytes bytes of response
bodies were sent in all, every request is read and never answered, and every response being sent
stops where it is, its connection held open (a server that accepts TCP and goes silent).
`GET /__proxy_stats` answers the counts as JSON (requests, failed, reset, slowed, stripped,
etag_stripped, lied, denied, unconditional, lost, stalled). Responses are sent with `Connection: close`. Standard library only.
"""

import argparse
import asyncio
import json

STATS = {"requests": 0, "failed": 0, "reset": 0, "slowed": 0, "stripped": 0, "etag_stripped": 0, "lied": 0, "denied": 0,
         "unconditional": 0, "lost": 0, "stalled": 0}
# Set by `GET /__proxy_stall` (or --stall-after-bytes): from then on nothing is answered.
STALLING = False
# Bytes of response bodies sent, in all.
SENT = 0


async def stall(*writers):
    """Never answers: holds the connections open (until the client gives up) without a byte."""
    STATS["stalled"] += 1
    try:
        await asyncio.Event().wait()
    finally:
        for w in writers:
            w.close()


async def read_request(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = 0
    for line in lines[1:]:
        if line.lower().startswith("content-length:"):
            length = int(line.split(":", 1)[1].strip())
    body = await reader.readexactly(length) if length else b""
    return head, lines[0], body


def with_connection_close(head: bytes) -> bytes:
    lines = [l for l in head.decode("latin-1").split("\r\n") if l and not l.lower().startswith("connection:")]
    return ("\r\n".join(lines) + "\r\nConnection: close\r\n\r\n").encode("latin-1")


async def answer_error(client_w, status: bytes, code: bytes, message: bytes):
    """Answers with an S3 error document and closes the connection."""
    payload = b"<Error><Code>%s</Code><Message>%s</Message></Error>" % (code, message)
    client_w.write(b"HTTP/1.1 %s\r\nContent-Type: application/xml\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                   % (status, len(payload)) + payload)
    await client_w.drain()
    client_w.close()


# The connections' tasks: asyncio holds tasks weakly, and a stalled one waits on nothing else.
TASKS = set()


async def handle(client_r, client_w, args):
    task = asyncio.current_task()
    TASKS.add(task)
    try:
        await serve(client_r, client_w, args)
    finally:
        TASKS.discard(task)


async def serve(client_r, client_w, args):
    try:
        head, request_line, body = await read_request(client_r)
    except (asyncio.IncompleteReadError, ConnectionError):
        client_w.close()
        return
    global STALLING, SENT
    method, path = request_line.split(" ")[:2]
    if path == "/__proxy_stall":
        STALLING = True
        client_w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await client_w.drain()
        client_w.close()
        return
    if path == "/__proxy_stats":
        payload = json.dumps(STATS).encode()
        client_w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(payload) + payload)
        await client_w.drain()
        client_w.close()
        return
    if STALLING:
        await stall(client_w)
        return
    STATS["requests"] += 1
    n = STATS["requests"]
    if args.delay_ms:
        await asyncio.sleep(args.delay_ms / 1000)
    if args.fail_every and n % args.fail_every == 0:
        STATS["failed"] += 1
        await answer_error(client_w, b"503 Slow Down", b"SlowDown", b"Please reduce your request rate.")
        return
    if args.strip_if_match and b"\r\nif-match:" in head.lower():
        STATS["stripped"] += 1
        head = b"\r\n".join(l for l in head.split(b"\r\n") if not l.lower().startswith(b"if-match:"))
    if args.deny_writes and method in ("PUT", "POST", "DELETE"):
        STATS["denied"] += 1
        await answer_error(client_w, b"403 Forbidden", b"AccessDenied", b"Access Denied")
        return
    if args.no_conditional_puts and method == "PUT" and b"\r\nif-none-match:" in head.lower():
        STATS["unconditional"] += 1
        await answer_error(client_w, b"501 Not Implemented", b"NotImplemented",
                           b"A header you provided implies functionality that is not implemented")
        return
    host, port = args.upstream.rsplit(":", 1)
    up_r, up_w = await asyncio.open_connection(host, int(port))
    up_w.write(with_connection_close(head) + body)
    await up_w.drain()
    resp_head = await up_r.readuntil(b"\r\n\r\n")
    if method == "PUT" and args.lose_first_answer_for and args.lose_first_answer_for in path and not STATS["lost"]:
        STATS["lost"] += 1
        up_w.close()
        await answer_error(client_w, b"500 Internal Server Error", b"InternalError", b"The answer was lost.")
        return
    length = None
    for line in resp_head.decode("latin-1").split("\r\n")[1:]:
        if line.lower().startswith("content-length:"):
            length = int(line.split(":", 1)[1].strip())
    if method == "GET" and args.huge_length_for and args.huge_length_for in path and length:
        STATS["lied"] += 1
        lines = [l for l in resp_head.split(b"\r\n") if not l.lower().startswith(b"content-length:")]
        client_w.write(with_connection_close(b"\r\n".join(lines).rstrip(b"\r\n") + b"\r\nContent-Length: 100000000000000\r\n\r\n"))
        data = await up_r.read()
        for piece in (data[: len(data) // 2], data[len(data) // 2 :]):
            client_w.write(piece)
            await client_w.drain()
            await asyncio.sleep(0.05)
        client_w.transport.abort()
        up_w.close()
        return
    if method == "GET" and args.strip_etag and b"\r\netag:" in resp_head.lower():
        STATS["etag_stripped"] += 1
        resp_head = b"\r\n".join(l for l in resp_head.split(b"\r\n") if not l.lower().startswith(b"etag:"))
    reset = method == "GET" and args.reset_every and n % args.reset_every == 0 and (length or 0) > 1
    slow = not reset and args.slow_every and n % args.slow_every == 0
    client_w.write(with_connection_close(resp_head))
    # The body is streamed as it comes (a reset stops at half of it; a slow one trickles).
    left = length // 2 if reset else None
    sent = 0
    if reset:
        STATS["reset"] += 1
    if slow:
        STATS["slowed"] += 1
    try:
        while True:
            piece = await up_r.read(1 << 16)
            if not piece:
                break
            if args.stall_after_bytes and SENT + len(piece) >= args.stall_after_bytes:
                piece = piece[: max(0, args.stall_after_bytes - SENT)]
                client_w.write(piece)
                SENT += len(piece)
                STALLING = True
            if STALLING:
                await stall(client_w, up_w)
                return
            SENT += len(piece)
            if left is not None:
                piece = piece[: max(0, left - sent)]
            if slow:
                step = max(1, len(piece) // 4)
                for i in range(0, len(piece), step):
                    client_w.write(piece[i : i + step])
                    await client_w.drain()
                    await asyncio.sleep(1 / 64)
            else:
                client_w.write(piece)
                await client_w.drain()
            sent += len(piece)
            if left is not None and sent >= left:
                client_w.transport.abort()
                up_w.close()
                return
    except ConnectionError:
        pass
    up_w.close()
    client_w.close()


async def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listen", type=int, required=True)
    p.add_argument("--upstream", required=True)
    p.add_argument("--delay-ms", type=float, default=0)
    p.add_argument("--fail-every", type=int, default=0)
    p.add_argument("--reset-every", type=int, default=0)
    p.add_argument("--slow-every", type=int, default=0)
    p.add_argument("--strip-if-match", action="store_true")
    p.add_argument("--strip-etag", action="store_true", help="drop the ETag header of GET responses")
    p.add_argument("--huge-length-for", default="")
    p.add_argument("--deny-writes", action="store_true")
    p.add_argument("--no-conditional-puts", action="store_true")
    p.add_argument("--lose-first-answer-for", default="")
    p.add_argument("--stall-after-bytes", type=int, default=0)
    args = p.parse_args()
    server = await asyncio.start_server(lambda r, w: handle(r, w, args), "127.0.0.1", args.listen, limit=1 << 20)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
