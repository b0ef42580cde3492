"""Allreduce bus bandwidth on CPU images, as nccl-tests defines it, plus raw TCP between the nodes.

Usage: python allreduce_bw.py BACKEND [--min-bytes N] [--max-bytes N] [--iters N] [--warmup N]
                              [--tcp-seconds S] [--tcp-streams K]
  BACKEND: torch (torch.distributed gloo; under torchrun, or mpirun with MASTER_ADDR/PORT set),
           hvd-torch, hvd-tf (Horovod's allreduce; under mpirun or horovodrun).

Rank 0 prints one line per message size (float32, sizes doubling from --min-bytes):
  allreduce_bw size=1048576 ranks=4 time_us=1234.5 algbw=0.850 busbw=1.275
algbw = size / time, busbw = algbw * 2(n-1)/n (GB/s, 1e9 bytes), as nccl-tests'
doc/PERFORMANCE.md defines them. Then raw TCP: each rank sends to the next one (a ring, as the
ring allreduce does) for --tcp-seconds over --tcp-streams connections, on the address of its
GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME NIC, and rank 0 prints one line per rank and the least:
  tcp_bw rank=0 src=node-1 dst=node-2 gbs=1.234
  tcp_bw_min gbs=1.100 streams=2 seconds=2
"""

from __future__ import annotations

import argparse
import fcntl
import os
import socket
import struct
import sys
import threading
import time

SIOCGIFADDR = 0x8915


def nic_address(ifname: str) -> str:
    """The IPv4 address of a NIC (the ioctl `ip addr` reads)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", ifname[:15].encode()))
    return socket.inet_ntoa(packed[20:24])


def my_address() -> str:
    name = os.environ.get("GLOO_SOCKET_IFNAME") or os.environ.get("NCCL_SOCKET_IFNAME") or ""
    name = name.split(",")[0].lstrip("=^")
    if name:
        try:
            return nic_address(name)
        except OSError:
            pass
    return socket.gethostbyname(socket.gethostname())


class Comm:
    """The few collectives this program needs, over one backend."""

    def __init__(self, backend: str):
        self.backend = backend
        if backend == "torch":
            import torch
            import torch.distributed as dist

            if "RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" in os.environ:
                os.environ["RANK"] = os.environ["OMPI_COMM_WORLD_RANK"]
                os.environ["WORLD_SIZE"] = os.environ["OMPI_COMM_WORLD_SIZE"]
            dist.init_process_group("gloo")
            self.torch, self.dist = torch, dist
            self.rank, self.size = dist.get_rank(), dist.get_world_size()
        elif backend == "hvd-torch":
            import torch
            import horovod.torch as hvd

            hvd.init()
            self.torch, self.hvd = torch, hvd
            self.rank, self.size = hvd.rank(), hvd.size()
        elif backend == "hvd-tf":
            import tensorflow as tf
            import horovod.tensorflow as hvd

            hvd.init()
            self.tf, self.hvd = tf, hvd
            self.rank, self.size = hvd.rank(), hvd.size()
        else:
            raise SystemExit(f"allreduce_bw.py: unknown backend {backend!r} (torch, hvd-torch, hvd-tf)")

    def buffer(self, count: int):
        if self.backend == "hvd-tf":
            return self.tf.ones([count], dtype=self.tf.float32)
        return self.torch.ones(count, dtype=self.torch.float32)

    def allreduce(self, buf, name: str) -> None:
        if self.backend == "torch":
            self.dist.all_reduce(buf)
        elif self.backend == "hvd-torch":
            self.hvd.allreduce_(buf, op=self.hvd.Sum, name=name)
        else:
            self.hvd.allreduce(buf, op=self.hvd.Sum, name=name).numpy()

    def gather(self, obj) -> list:
        if self.backend == "torch":
            out = [None] * self.size
            self.dist.all_gather_object(out, obj)
            return out
        return self.hvd.allgather_object(obj)

    def barrier(self) -> None:
        self.gather(0)

    def close(self) -> None:
        if self.backend == "torch":
            self.dist.destroy_process_group()  # joins gloo's threads while Python is alive
        else:
            self.hvd.shutdown()


def sweep(comm: Comm, sizes: list[int], iters: int, warmup: int) -> None:
    n = comm.size
    for size in sizes:
        buf = comm.buffer(size // 4)
        for i in range(warmup):
            comm.allreduce(buf, f"w{size}.{i}")
        comm.barrier()
        t0 = time.perf_counter()
        for i in range(iters):
            comm.allreduce(buf, f"b{size}.{i}")
        seconds = (time.perf_counter() - t0) / iters
        times = comm.gather(seconds)
        if comm.rank == 0:
            t = max(times)  # the collective ends when its slowest rank does
            algbw = size / t / 1e9
            busbw = algbw * 2 * (n - 1) / n
            print(f"allreduce_bw size={size} ranks={n} time_us={t * 1e6:.1f} algbw={algbw:.3f} "
                  f"busbw={busbw:.3f}", flush=True)
        del buf


def tcp_ring(comm: Comm, seconds: float, streams: int) -> None:
    """Each rank sends to the next for `seconds` over `streams` connections; rank 0 prints."""
    if comm.size < 2:
        return
    host = socket.gethostname()
    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind((my_address(), 0))
    lsock.listen(streams)
    peers = comm.gather((lsock.getsockname()[0], lsock.getsockname()[1], host))

    def drain() -> None:
        conns = [lsock.accept()[0] for _ in range(streams)]
        mem = bytearray(1 << 22)

        def one(c: socket.socket) -> None:
            while c.recv_into(mem):
                pass
            c.close()

        ts = [threading.Thread(target=one, args=(c,)) for c in conns]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    receiver = threading.Thread(target=drain)
    receiver.start()
    comm.barrier()
    addr, port, dst = peers[(comm.rank + 1) % comm.size]
    socks = [socket.create_connection((addr, port)) for _ in range(streams)]
    data = memoryview(bytearray(1 << 22))
    sent = [0] * streams
    t0 = time.perf_counter()
    end = t0 + seconds

    def pump(i: int) -> None:
        s = socks[i]
        while time.perf_counter() < end:
            s.sendall(data)
            sent[i] += len(data)
        s.shutdown(socket.SHUT_WR)

    ts = [threading.Thread(target=pump, args=(i,)) for i in range(streams)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    receiver.join()  # the peer has every byte: the elapsed time covers the delivery
    gbs = sum(sent) / (time.perf_counter() - t0) / 1e9
    for s in socks:
        s.close()
    lsock.close()
    results = comm.gather((comm.rank, host, dst, gbs))
    if comm.rank == 0:
        for rank, src, to, g in results:
            print(f"tcp_bw rank={rank} src={src} dst={to} gbs={g:.3f}", flush=True)
        print(f"tcp_bw_min gbs={min(r[3] for r in results):.3f} streams={streams} seconds={seconds:g}",
              flush=True)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("backend")
    ap.add_argument("--min-bytes", type=int, default=1 << 20)
    ap.add_argument("--max-bytes", type=int, default=1 << 30)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--tcp-seconds", type=float, default=2.0)
    ap.add_argument("--tcp-streams", type=int, default=1)
    a = ap.parse_args(argv)
    sizes, s = [], max(4, a.min_bytes - a.min_bytes % 4)
    while s <= a.max_bytes:
        sizes.append(s)
        s *= 2
    comm = Comm(a.backend)
    try:
        sweep(comm, sizes, a.iters, a.warmup)
        if a.tcp_seconds > 0:
            tcp_ring(comm, a.tcp_seconds, a.tcp_streams)
    finally:
        comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
