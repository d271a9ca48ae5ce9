#!/usr/bin/env python3
"""Time to first token of a conversation's second turn, cold against warm (a benchmark, not a test).

  prompt_cache_bench.py COLIBRI_SERVER MODEL [--words 220] [--reps 3] [--ctx 2048]

Each round starts a fresh server and sends turn 2 (turn 1 plus a few words) cold, where no prefix is cached; then
turn 1, then turn 2 again, which now finds turn 1's KV cache and runs only the new tokens. Cold and warm are
measured on the same server a few seconds apart, and the ratio is printed per round.
"""
import argparse
import http.client
import json
import os
import re
import signal
import subprocess
import time


def start(server, model, ctx):
    p = subprocess.Popen([server, "--model", model, "--port", "0", "--ctx", str(ctx), "--log-level", "warn"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in p.stdout:
        m = re.search(r"listening on http://[^:]+:(\d+) ", line)
        if m:
            return p, int(m.group(1))
    raise SystemExit("the server did not start")


def first_token(port, model, prompt):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = json.dumps({"model": os.path.basename(model.rstrip("/")), "prompt": prompt, "max_tokens": 1,
                       "temperature": 0})
    t = time.time()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = json.loads(c.getresponse().read())
    seconds = time.time() - t
    if "usage" not in r:
        raise SystemExit(f"request failed: {r}")
    return seconds, r["usage"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("server")
    ap.add_argument("model")
    ap.add_argument("--words", type=int, default=220)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=2048)
    a = ap.parse_args()
    words = ("the colibri hovers over red flowers and drinks nectar while the sun rises over the hills " * 100).split()
    turn1 = " ".join(words[:a.words])
    turn2 = turn1 + " then it flies away"
    for rep in range(a.reps):
        p, port = start(a.server, a.model, a.ctx)
        try:
            cold, u_cold = first_token(port, a.model, turn2)
            first_token(port, a.model, turn1)
            warm, u_warm = first_token(port, a.model, turn2)
        finally:
            p.send_signal(signal.SIGTERM)
            p.wait()
        print(f"round {rep + 1}: {u_cold['prompt_tokens']} prompt tokens; cold {cold:.3f} s "
              f"({u_cold['prompt_tokens_details']['cached_tokens']} cached), warm {warm:.3f} s "
              f"({u_warm['prompt_tokens_details']['cached_tokens']} cached): {cold / warm:.1f}x", flush=True)


if __name__ == "__main__":
    main()
