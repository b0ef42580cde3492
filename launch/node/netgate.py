"""The network gate's program, run in a job's container on every node at once (host network;
launch/jobs/netgate.py sends it: `docker exec CONTAINER python3 -c TEXT ARGS`). Standard
library only: every image has python3, not every image has iperf.

    --me ADDR --port P     listen on the job's NIC (ADDR: the address peers use)
    --serve K              receive K streams, one at a time (in the order they arrive)
    --to ADDR (repeated)   send one stream of --seconds to each, one after the other
    --timeout S            give up on a peer (connect, its go, its answer) after S seconds in all

A stream: the sender connects and says who it is (HEADER bytes), waits for the receiver's go
(a receiver serves one stream at a time, so no node's link carries two streams one way),
sends zeros for --seconds, half-closes; the receiver counts the bytes from its first read to
the end and answers `BYTES SECONDS`. Output, one JSON object a line: for each stream sent
`{"from", "to", "bytes", "seconds"}` as its receiver measured it (or `{"from", "to",
"error"}`), then `{"instance_type": ...}` (the DMI product name: the EC2 instance type on Nitro).
Exit 0 once every stream was tried; 3 when the port cannot be bound.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time

CHUNK = 256 * 1024
HEADER = 64  # bytes: "dtrain-netgate 1 ADDR", space-padded
GO = b"g"
DMI = "/sys/devices/virtual/dmi/id/product_name"


def recv_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        part = conn.recv(n - len(data))
        if not part:
            raise ConnectionError("closed early")
        data += part
    return data


def receive(conn: socket.socket) -> tuple[int, float]:
    """One stream after the go: (bytes after the first read, seconds from the first read to the end)."""
    first = conn.recv(CHUNK)
    if not first:
        return 0, 0.0
    t0 = time.monotonic()
    n = 0
    while True:
        part = conn.recv(CHUNK)
        if not part:
            return n, time.monotonic() - t0
        n += len(part)


def serve(listener: socket.socket, count: int, deadline: float) -> None:
    """Serve `count` streams one at a time; stop at the deadline."""
    for _ in range(count):
        left = deadline - time.monotonic()
        if left <= 0:
            return
        listener.settimeout(left)
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            try:
                conn.settimeout(max(deadline - time.monotonic(), 0.1))
                recv_exact(conn, HEADER)
                conn.sendall(GO)
                n, seconds = receive(conn)
                conn.sendall(f"{n} {seconds:.6f}\n".encode())
            except OSError:
                continue


def send(me: str, peer: str, port: int, seconds: float, deadline: float) -> dict:
    """One stream to peer: its receiver's count, or the error."""
    out = {"from": me, "to": peer}
    conn = None
    while conn is None:  # the peer's program may not listen yet
        try:
            conn = socket.create_connection((peer, port), timeout=max(min(deadline - time.monotonic(), 5), 0.1),
                                            source_address=(me, 0))
        except OSError as e:
            if time.monotonic() + 0.1 >= deadline:
                return {**out, "error": f"connect: {e.strerror or e}"}
            time.sleep(0.1)
    with conn:
        try:
            conn.settimeout(max(deadline - time.monotonic(), 0.1))
            conn.sendall(f"dtrain-netgate 1 {me}".encode().ljust(HEADER))
            if recv_exact(conn, 1) != GO:
                return {**out, "error": "no go from the receiver"}
            buf = bytes(CHUNK)
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                conn.sendall(buf)
            conn.shutdown(socket.SHUT_WR)
            answer = b""
            while not answer.endswith(b"\n"):
                part = conn.recv(64)
                if not part:
                    break
                answer += part
            n, took = answer.split()
            return {**out, "bytes": int(n), "seconds": float(took)}
        except (OSError, ValueError) as e:
            return {**out, "error": f"stream: {getattr(e, 'strerror', None) or e}"}


def instance_type() -> str:
    try:
        with open(DMI) as f:
            return f.read().strip()
    except OSError:
        return ""


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="netgate.py")
    ap.add_argument("--me", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--serve", type=int, default=0)
    ap.add_argument("--to", action="append", default=[])
    ap.add_argument("--timeout", type=float, default=30.0)
    a = ap.parse_args(argv)
    deadline = time.monotonic() + a.timeout
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((a.me, a.port))
        listener.listen(8)
    except OSError as e:
        print(json.dumps({"error": f"cannot listen on {a.me}:{a.port}: {e.strerror or e}"}), flush=True)
        return 3
    server = threading.Thread(target=serve, args=(listener, a.serve, deadline), daemon=True)
    server.start()
    for peer in a.to:
        print(json.dumps(send(a.me, peer, a.port, a.seconds, deadline)), flush=True)
    server.join(max(deadline - time.monotonic(), 0))
    listener.close()
    print(json.dumps({"instance_type": instance_type()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
