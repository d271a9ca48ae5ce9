#!/usr/bin/env python3
"""Aggregate decode tokens/s of colibri-server with 1, 4 and 8 concurrent streams (a benchmark, not a test).

  server_decode_bench.py COLIBRI_SERVER MODEL [--streams 1,4,8] [--tokens 128] [-- extra server flags]

Each round starts N streaming /v1/completions requests at once (different prompts, seeded sampling so EOS is rare)
and reports sum(completion tokens) / (last stream end - first generated token). Add e.g.
`-- --expert-cache-size 4M` to force expert streaming on a small model.
"""
import http.client
import json
import subprocess
import sys
import threading
import time


def main():
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    server, model = argv[0], argv[1]
    streams = [int(x) for x in (argv[argv.index("--streams") + 1] if "--streams" in argv else "1,4,8").split(",")]
    tokens = int(argv[argv.index("--tokens") + 1]) if "--tokens" in argv else 128
    max_batch = str(max(streams))
    proc = subprocess.Popen([server, "--model", model, "--port", "0", "--max-batch", max_batch, "--log-level", "warn"]
                            + extra, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    port = int(line.split("http://")[1].split()[0].rsplit(":", 1)[1])
    print(line.strip())
    name = json.loads(_get(port, "/v1/models"))["data"][0]["id"]

    def one(i, out):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        body = {"model": name, "prompt": f"Stream number {i} says", "max_tokens": tokens, "temperature": 1.0,
                "seed": i, "stream": True, "stream_options": {"include_usage": True}}
        conn.request("POST", "/v1/completions", body=json.dumps(body))
        r = conn.getresponse()
        first = None
        n = 0
        for raw in r:
            s = raw.decode().strip()
            if not s.startswith("data: {"):
                continue
            ev = json.loads(s[6:])
            if ev.get("choices") and ev["choices"][0].get("text") and first is None:
                first = time.perf_counter()
            if ev.get("usage"):
                n = ev["usage"]["completion_tokens"]
        out[i] = (first, time.perf_counter(), n)

    one(0, {})  # warm-up
    base = None
    for n_streams in streams:
        out = {}
        threads = [threading.Thread(target=one, args=(i, out)) for i in range(n_streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        start = min(v[0] for v in out.values() if v[0] is not None)
        end = max(v[1] for v in out.values())
        total = sum(v[2] for v in out.values())
        rate = total / (end - start)
        base = base or rate
        print(f"{n_streams} streams: {total} tokens in {end - start:.2f} s = {rate:.1f} tok/s aggregate "
              f"({rate / base:.2f}x the 1-stream rate)", flush=True)
    metrics = _get(port, "/metrics")
    for key in ("colibri_engine_steps_total", "colibri_engine_step_sequences_total", "colibri_expert_bytes_read_total",
                'colibri_expert_misses_total{tier="ram"}'):
        for m in metrics.splitlines():
            if m.startswith(key + " "):
                print(" ", m)
    proc.terminate()
    proc.wait(30)


def _get(port, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path)
    return conn.getresponse().read().decode()


if __name__ == "__main__":
    main()
