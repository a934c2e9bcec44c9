"""Driver for scripts/bench-fetch: serves the payload with sendfile on
loopback, runs curl and the installer alternately, reports medians."""

import http.server
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

binary, work, sha, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
payload = os.path.join(work, "payload.run")
size = os.path.getsize(payload)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(size))
        self.end_headers()
        with open(payload, "rb") as f:
            self.connection.sendfile(f)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
url = f"http://127.0.0.1:{server.server_port}/payload.run"


def measure(argv):
    # GNU time reports the command's own peak RSS: Linux carries ru_maxrss
    # across exec, so measuring a child forked from this (large) Python
    # process would report Python's size instead.
    rss_file = os.path.join(work, "rss")
    start = time.monotonic()
    proc = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss_file] + argv,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"failed: {argv}")
    with open(rss_file) as f:
        kib = int(f.read().strip().splitlines()[-1])
    return wall, kib / 1024


def curl():
    out = os.path.join(work, "curl.out")
    r = measure(["curl", "-sS", "-o", out, url])
    os.remove(out)
    return r


def fetch():
    cache = os.path.join(work, "cache")
    r = measure([binary, "--termination-log", "/nonexistent", "--log-level", "warn",
                 "fetch", "--url", url, "--sha256", sha, "--allow-http",
                 "--cache-dir", cache])
    shutil.rmtree(cache)
    return r


results = {"curl": [], "fetch": []}
curl()  # warm the page cache and the server
for _ in range(runs):
    results["curl"].append(curl())
    results["fetch"].append(fetch())

wall = {k: statistics.median(w for w, _ in v) for k, v in results.items()}
rss = {k: max(m for _, m in v) for k, v in results.items()}
mib = size / (1024 * 1024)
print(f"payload: {mib:.0f} MiB, {runs} runs each, median wall time, max peak RSS")
print(f"{'':8}{'wall s':>10}{'MiB/s':>10}{'peak RSS MiB':>15}")
for k in ("curl", "fetch"):
    print(f"{k:8}{wall[k]:10.2f}{mib / wall[k]:10.0f}{rss[k]:15.1f}")
ratio = wall["fetch"] / wall["curl"]
print(f"ratio fetch/curl wall time: {ratio:.2f} (target <= 1.20: {'met' if ratio <= 1.2 else 'NOT met'})")
print(f"fetch peak RSS: {rss['fetch']:.1f} MiB (target <= 64: {'met' if rss['fetch'] <= 64 else 'NOT met'})")
