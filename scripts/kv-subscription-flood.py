#!/usr/bin/env python3
"""Issue 43, finding 2: one TCP peer of a KV-event PUB socket floods it with subscriptions.

Starts MOCKSERVE (default target/debug/mockserve) with a KV-event endpoint on 127.0.0.1, keeps
one live subscriber of everything, times 400 completions (8 clients, best of 3), then has one
peer send N subscriptions of 64 KiB (default 40,000: 2.6 GB on the wire) and another 1,000,000
short ones, waits for the server to apply them (a PING answered), and times the completions
again. Prints the server's resident memory at each step.

    cargo build -p mock_server && python3 scripts/kv-subscription-flood.py [N]

Needs only python3; listens on 127.0.0.1:18431 (HTTP) and :18557 (KV events).
"""
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.environ.get("MOCKSERVE", os.path.join(HERE, "..", "target", "debug", "mockserve"))
HTTP, KV = 18431, 18557
BIG = int(sys.argv[1]) if len(sys.argv) > 1 else 40_000


def rss_mb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
    return -1


def frame(body, flags=0):
    if len(body) < 256:
        return bytes([flags, len(body)]) + body
    return bytes([flags | 2]) + struct.pack(">Q", len(body)) + body


def subscriber():
    sock = socket.create_connection(("127.0.0.1", KV))
    greeting = bytearray(64)
    greeting[0], greeting[9], greeting[10] = 0xFF, 0x7F, 3
    greeting[12:16] = b"NULL"
    sock.sendall(bytes(greeting))
    ready = b"\x05READY\x0bSocket-Type" + struct.pack(">I", 3) + b"SUB"
    sock.sendall(frame(ready, 4))
    return sock


def applied(sock):
    """Sends a PING and reads until the PONG: everything sent before it is applied."""
    sock.sendall(frame(b"\x04PING\x00\x0a", 4))
    seen = b""
    while b"PONG" not in seen:
        seen = seen[-8:] + sock.recv(1 << 16)


def completions(n=400, clients=8):
    def one(i):
        body = json.dumps({"model": "mock-model", "prompt": f"hello {i} " * 20, "max_tokens": 32})
        request = urllib.request.Request(
            f"http://127.0.0.1:{HTTP}/v1/completions", body.encode(),
            {"Content-Type": "application/json"})
        urllib.request.urlopen(request).read()

    start = time.time()
    threads = [threading.Thread(target=lambda k=k: [one(k * n + j) for j in range(n // clients)])
               for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.time() - start


server = subprocess.Popen(
    [BIN, "--port", str(HTTP), "--kv-events-endpoint", f"tcp://*:{KV}", "--speedup-ratio", "inf"],
    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
try:
    server.stdout.readline()
    live = subscriber()
    live.sendall(frame(b"\x01"))
    threading.Thread(target=lambda: [live.recv(1 << 16) for _ in iter(int, 1)], daemon=True).start()
    print(f"resident at start: {rss_mb(server.pid)} MB")
    before = min(completions() for _ in range(3))
    print(f"400 completions: {before:.2f} s")
    flood = subscriber()
    for _ in range(BIG):
        flood.sendall(frame(b"\x01" + b"x" * (64 * 1024 - 2)))
    applied(flood)
    print(f"after {BIG:,} subscriptions of 64 KiB: {rss_mb(server.pid)} MB")
    short = subscriber()
    short.sendall(b"".join(frame(b"\x01" + b"%07d" % i) for i in range(1_000_000)))
    applied(short)
    print(f"after 1,000,000 short subscriptions: {rss_mb(server.pid)} MB")
    after = min(completions() for _ in range(3))
    print(f"400 completions under the flood: {after:.2f} s ({after / before:.2f} x)")
finally:
    server.terminate()
    server.wait()
