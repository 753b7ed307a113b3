"""How fast does the daemon serve `/v1/chat/completions`? The sim backend unpaced.

Starts `topasd start --speed max --port 0` (a fresh decision log in a temp
folder), then `--concurrency` clients send chat completions back to back for
`--requests` requests (after `--warmup` more): plain OpenAI bodies spread over
`--agents` system prompts (so agents and prefixes vary), `--max-tokens`
output tokens each. Reports the sustained rate (completed requests per wall
second), wall latency p50/p99 per request, and how the daemon's wall time
divides: in the scheduler (policy decisions), in the engine (the rest of the
engine loop: the simulator, event recording), and outside both (HTTP, JSON,
the asyncio server, thread hand-offs; the share of the measured window during
which the engine loop was not running).

    python bench/api_load.py [--requests 3000] [--concurrency 64] [--policy topas] [--json]

With `--readers N`, N clients read the `/v1/events` stream throughout, and
one more, in a process of its own, polls `GET /health` back to back while
the calls run: the report
adds its latency (p50, p99, max), how many events the readers received, and
every failed call (a non-200 answer or a broken connection). The issue-28
run: `--readers 100 --concurrency 1000 --requests 1000 --warmup 0`.

The client is a minimal keep-alive HTTP/1.1 client (one connection per
concurrent client) on the same machine (2 cores here): it takes CPU from the
daemon, and its own overhead is part of what the latency shows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _daemon import start_daemon as _start_daemon  # bench/_daemon.py
from _results import at_least, update_section  # bench/_results.py


def start_daemon(workdir: Path, policy: str, profile: str) -> tuple[subprocess.Popen, str]:
    return _start_daemon(workdir, "--speed", "max", "--policy", policy, "--profile", profile)


def body(i: int, agents: int, max_tokens: int) -> dict[str, Any]:
    return {
        "model": "topasd-sim", "max_tokens": max_tokens,
        "messages": [
            {"role": "system", "content": f"You are agent {i % agents}. " * 60},
            {"role": "user", "content": f"Request {i}: summarise the plan in a few lines."},
        ],
    }


class Conn:
    """A minimal HTTP/1.1 keep-alive client (one connection). httpx's async pool
    costs more CPU per request than the server does, and on 2 cores the client
    would be what this measures."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @staticmethod
    async def open(host: str, port: int) -> Conn:
        return Conn(*await asyncio.open_connection(host, port))

    async def request(self, method: str, path: str, payload: Any = None) -> tuple[int, Any]:
        body = b"" if payload is None else json.dumps(payload).encode()
        head = (f"{method} {path} HTTP/1.1\r\nHost: topasd\r\nContent-Type: application/json"
                f"\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        self.writer.write(head + body)
        await self.writer.drain()
        raw = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = next(int(v) for k, _, v in (ln.partition(":") for ln in lines[1:])
                      if k.lower() == "content-length")
        data = await self.reader.readexactly(length)
        return status, json.loads(data)

    def close(self) -> None:
        self.writer.close()


async def read_events(host: str, port: int, counts: list[int]) -> None:
    """One `/v1/events` reader: reads (and counts the events of) the stream
    until it ends or the task is cancelled."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"GET /v1/events HTTP/1.1\r\nHost: topasd\r\n\r\n")
    await writer.drain()
    try:
        await reader.readuntil(b"\r\n\r\n")
        while chunk := await reader.read(1 << 16):
            counts.append(chunk.count(b"\nevent: "))
    finally:
        writer.close()


def probe_health(host: str, port: int, stop: Any, out: Any) -> None:
    """`GET /health` back to back until `stop` is set; sends each answer's wall
    latency to `out`. It runs in a process of its own, so that what it
    measures is the daemon, not this client's event loop busy with a thousand
    calls and a hundred streams."""
    import http.client

    conn = http.client.HTTPConnection(host, port, timeout=120)
    lat: list[float] = []
    while not stop.is_set():
        t = time.perf_counter()
        conn.request("GET", "/health")
        reply = conn.getresponse()
        reply.read()
        assert reply.status == 200, reply.status
        lat.append(time.perf_counter() - t)
    conn.close()
    out.send(lat)


async def load(url: str, n: int, warmup: int, concurrency: int, agents: int,
               max_tokens: int, readers: int = 0) -> dict[str, Any]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    latencies: list[float] = []
    engine_lat: list[float] = []
    errors = 0
    counter = iter(range(n + warmup))
    marks: dict[str, Any] = {}
    events: list[int] = []
    streams = [asyncio.create_task(read_events(host, int(port), events)) for _ in range(readers)]
    conns = [await Conn.open(host, int(port)) for _ in range(concurrency)]
    stop, (got, out) = multiprocessing.Event(), multiprocessing.Pipe(duplex=False)
    probe = multiprocessing.Process(target=probe_health, args=(host, int(port), stop, out),
                                    daemon=True) if readers else None
    if probe is not None:
        probe.start()

    if warmup == 0:  # the window opens before the first call
        marks["state0"] = (await conns[0].request("GET", "/v1/state?limit=1"))[1]
        marks["t0"] = time.perf_counter()

    async def worker(conn: Conn) -> None:
        nonlocal errors
        for i in counter:
            if i == warmup and warmup:
                marks["state0"] = (await conn.request("GET", "/v1/state?limit=1"))[1]
                marks["t0"] = time.perf_counter()
            t = time.perf_counter()
            try:
                status, reply = await conn.request("POST", "/v1/chat/completions",
                                                   body(i, agents, max_tokens))
            except (OSError, asyncio.IncompleteReadError, ValueError):
                status, reply = 0, None  # a broken connection is a failed call
            if i >= warmup:
                if status == 200:
                    latencies.append(time.perf_counter() - t)
                    engine_lat.append(reply["topasd"]["latency_s"])
                else:
                    errors += 1
            if status == 0:
                return

    await asyncio.gather(*(worker(c) for c in conns))
    wall = time.perf_counter() - marks["t0"]
    stop.set()
    health: list[float] = await asyncio.to_thread(got.recv) if probe is not None else []
    state1 = (await conns[0].request("GET", "/v1/state?limit=1"))[1]
    for c in conns:
        c.close()
    for task in streams:
        task.cancel()
    await asyncio.gather(*streams, return_exceptions=True)
    return summary(marks["state0"], state1, wall, latencies, engine_lat, errors) | (
        {"readers": readers, "events_read": sum(events), "health_probes": len(health),
         "health_p50_ms": float(np.percentile(health, 50)) * 1e3,
         "health_p99_ms": float(np.percentile(health, 99)) * 1e3,
         "health_max_ms": max(health) * 1e3} if readers else {})


def summary(s0: dict[str, Any], s1: dict[str, Any], wall: float, latencies: list[float],
            engine_lat: list[float], errors: int) -> dict[str, Any]:
    """The measures of one load window, between the daemon's states `s0` and `s1`."""
    pump = s1["loop"]["pump_wall_s"] - s0["loop"]["pump_wall_s"]
    decide = s1["loop"]["decide_wall_s"] - s0["loop"]["decide_wall_s"]
    lat = np.array(latencies) * 1e3
    return {
        "requests": len(latencies), "errors": errors, "wall_s": wall,
        "rate_req_s": len(latencies) / wall,
        "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
        "mean_ms": float(lat.mean()),
        "engine_p50_s": float(np.percentile(engine_lat, 50)),
        "engine_p99_s": float(np.percentile(engine_lat, 99)),
        "decisions": s1["counts"]["decisions"] - s0["counts"]["decisions"],
        "scheduler_share": decide / wall, "engine_share": (pump - decide) / wall,
        "outside_share": max(0.0, 1.0 - pump / wall),
        "engine_time_s": s1["t"] - s0["t"],
    }


def report(args: argparse.Namespace, res: dict[str, Any]) -> str:
    """The results table of one run."""
    return "\n".join([
        f"/v1/chat/completions on the sim (unpaced), policy {args.policy}, "
        f"{args.concurrency} clients, {args.agents} agents, max_tokens {args.max_tokens}:",
        "",
        "| measure | value |",
        "|---|---|",
        f"| sustained rate | {res['rate_req_s']:.1f} req/s ({res['requests']} requests, "
        f"{res['errors']} errors, {res['wall_s']:.1f} s) |",
        f"| latency (wall) | p50 {res['p50_ms']:.1f} ms, p99 {res['p99_ms']:.1f} ms |",
        f"| latency (engine time) | p50 {res['engine_p50_s']:.1f} s, "
        f"p99 {res['engine_p99_s']:.1f} s |",
        f"| daemon wall time | scheduler {res['scheduler_share']:.1%}, engine "
        f"{res['engine_share']:.1%}, outside both {res['outside_share']:.1%} |",
        f"| decisions | {res['decisions']} ({res['engine_time_s']:.0f} s of engine time) |",
        *([f"| /v1/events readers | {args.readers}, {res['events_read']:,} events read |",
           f"| /health while loaded | p50 {res['health_p50_ms']:.1f} ms, p99 "
           f"{res['health_p99_ms']:.1f} ms, max {res['health_max_ms']:.1f} ms "
           f"({res['health_probes']} probes) |"] if args.readers else []),
        "",
        f"Load average {os.getloadavg()[0]:.2f} on {res['cpus']} CPUs while measuring.",
    ])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=at_least(1), default=3000)
    ap.add_argument("--warmup", type=at_least(0), default=200)
    ap.add_argument("--concurrency", type=at_least(1), default=64)
    ap.add_argument("--agents", type=at_least(1), default=4, help="distinct system prompts")
    ap.add_argument("--max-tokens", type=at_least(1), default=64)
    ap.add_argument("--policy", default="topas")
    ap.add_argument("--profile", default="qwen2.5-32b-a100")
    ap.add_argument("--readers", type=at_least(0), default=0,
                    help="/v1/events readers throughout, and a /health probe")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", action="store_true", help="record in docs/RESULTS.md")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_daemon(Path(tmp), args.policy, args.profile)
        try:
            res = asyncio.run(load(url, args.requests, args.warmup, args.concurrency,
                                   args.agents, args.max_tokens, args.readers))
        finally:
            proc.terminate()
            proc.wait(60)
    res.update({"policy": args.policy, "profile": args.profile,
                "concurrency": args.concurrency, "max_tokens": args.max_tokens,
                "agents": args.agents, "python": platform.python_version(),
                "cpus": os.cpu_count()})
    if args.json:
        print(json.dumps(res, indent=2))
        return
    text = report(args, res)
    print(text)
    if args.write:
        import sys


        command = "python " + " ".join(["bench/api_load.py", *sys.argv[1:]])
        name, title = f"api_load-{args.policy}", f"Daemon API load ({args.policy})"
        if args.readers:
            name += f"-readers{args.readers}"
            title += f" with {args.readers} event-stream readers"
        update_section(name, f"## {title}\n\nCommand: `{command}`\n\n{text}")


if __name__ == "__main__":
    main()
