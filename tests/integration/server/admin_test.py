#!/usr/bin/python3
"""colibri-server cache admin, routing traces and context limits end to end (ctest label integration):

  admin_test.py COLIBRI_CLI COLIBRI_SERVER FIXTURE_GENERATOR WORK_DIR [-k PATTERN]

* POST /admin/cache/clear and /admin/cache/warm: what they drop and load, stats before and after, greedy text
  unchanged by either, bad bodies (400 naming the field), auth.
* colibri-cli cache stats|clear|warm --server URL: answers, connection refused, 401 without --api-key, bad URL.
* colibri-server --record-trace: one request id per request, the same routing as `colibri-cli run --record-trace`,
  whole lines after SIGTERM mid-stream, and `colibri-cli ab replay` reads it.
* prompt + max_tokens beyond the context: 400 context_length_exceeded naming both numbers.
Uses the Server helper of server_test.py (same directory).
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest

import server_test as st

SLOT = 3 * 256 * 512 * 4  # one expert of the tiny f32 Mixtral (hidden 256, intermediate 512), a multiple of 4 KiB


def cli(*args, check=True, timeout=120, env=None):
    p = subprocess.run([st.CLI] + list(args), capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, **(env or {})))
    if check and p.returncode != 0:
        raise AssertionError(f"colibri-cli {' '.join(args)} failed ({p.returncode}): {p.stderr}")
    return p


def greedy(s, prompt="The colibri", n=24):
    status, body = s.json("POST", "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": n,
                                                      "temperature": 0})
    assert status == 200, body
    return body["choices"][0]["text"]


def free_port():
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return sk.getsockname()[1]


class CacheAdmin(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # Room for 4 of the 8 experts (streaming), one of them pinned.
        cls.s = st.Server("--expert-cache-size", str(4 * SLOT), "--set", "cache.policy=pinned", "--set",
                          "cache.pinned_experts=[0:1]")
        cls.url = f"http://127.0.0.1:{cls.s.port}"

    @classmethod
    def tearDownClass(cls):
        assert cls.s.stop() == 0

    def stats(self):
        status, body = self.s.json("GET", "/admin/cache/stats")
        self.assertEqual(status, 200, body)
        return body

    def post(self, path, body=None):
        return self.s.json("POST", path, body)

    def test_clear_and_warm(self):
        text = greedy(self.s)
        before = self.stats()
        self.assertEqual(before["budget_bytes"], 4 * SLOT)
        self.assertGreaterEqual(before["resident_experts"], 2)

        status, r = self.post("/admin/cache/clear")
        self.assertEqual(status, 200, r)
        self.assertEqual(r["object"], "cache.clear")
        self.assertEqual(r["kept_pinned"], 1)
        self.assertEqual(r["kept_in_use"], 0)
        self.assertEqual(r["dropped_experts"], before["resident_experts"] - 1)
        self.assertEqual(r["dropped_bytes"], r["dropped_experts"] * SLOT)
        self.assertEqual((r["resident_experts"], r["resident_bytes"]), (1, SLOT))
        after = self.stats()
        self.assertEqual((after["resident_experts"], after["resident_bytes"]), (1, SLOT))
        self.assertEqual(after["evictions"], before["evictions"])

        # Same greedy text from a cold cache; the misses show the reloads.
        self.assertEqual(greedy(self.s), text)
        self.assertGreater(self.stats()["misses"], after["misses"])

        self.post("/admin/cache/clear")
        bytes0 = self.stats()["bytes_read"]
        status, r = self.post("/admin/cache/warm", {"experts": ["0:0", "1:2", "0:1"]})
        self.assertEqual(status, 200, r)
        self.assertEqual((r["object"], r["source"]), ("cache.warm", "experts"))
        self.assertEqual((r["requested"], r["loaded"], r["already_resident"], r["no_room"]), (3, 2, 1, 0))
        self.assertEqual(r["bytes_read"], 2 * SLOT)
        self.assertEqual(r["resident_experts"], 3)
        st_ = self.stats()
        self.assertEqual(st_["resident_experts"], 3)
        self.assertEqual(st_["bytes_read"], bytes0 + 2 * SLOT)

        # The usage this server has seen: most used first, until the cache is full.
        status, r = self.post("/admin/cache/warm")
        self.assertEqual(status, 200, r)
        self.assertEqual(r["source"], "usage_history")
        self.assertEqual(r["loaded"] + r["already_resident"] + r["no_room"], r["requested"])
        self.assertEqual(r["resident_experts"], 4)
        self.assertLessEqual(r["resident_bytes"], r["budget_bytes"])
        status, r = self.post("/admin/cache/warm", {"top": 2})
        self.assertEqual((status, r["requested"]), (200, 2))
        self.assertEqual(greedy(self.s), text)

    def test_clear_and_warm_during_a_stream_do_not_change_it(self):
        req = {"model": "tiny", "prompt": "A long story", "max_tokens": 300, "temperature": 0}
        alone = self.s.json("POST", "/v1/completions", req)[1]["choices"][0]["text"]
        got = {}
        t = threading.Thread(target=lambda: got.update(r=self.s.stream("/v1/completions", req)))
        t.start()
        answers = []
        while t.is_alive() and len(answers) < 40:
            answers.append(self.post("/admin/cache/clear")[0])
            answers.append(self.post("/admin/cache/warm", {"experts": ["1:0", "1:3"]})[0])
        t.join(60)
        print(f"  {len(answers)} admin requests during the stream", flush=True)
        self.assertEqual(set(answers), {200})
        status, events, done = got["r"]
        self.assertTrue(status == 200 and done)
        self.assertEqual(st.stream_text(events, "text"), alone)

    def test_bad_admin_requests(self):
        cases = [
            ("/admin/cache/warm", {"experts": ["9:9"]}, "experts[0]", "invalid_value"),
            ("/admin/cache/warm", {"experts": ["0:1", "zero:one"]}, "experts[1]", "invalid_value"),
            ("/admin/cache/warm", {"top": -1}, "top", "invalid_value"),
            ("/admin/cache/warm", {"tpo": 3}, "tpo", "unknown_parameter"),
            ("/admin/cache/clear", {"everything": True}, "everything", "unknown_parameter"),
        ]
        for path, body, param, code in cases:
            status, got = self.post(path, body)
            st.assert_error(self, status, got, 400, code, param)
        status, raw, _ = self.s.request("POST", "/admin/cache/warm", "{nope")
        st.assert_error(self, status, json.loads(raw), 400)
        status, got = self.s.json("GET", "/admin/cache/clear")
        st.assert_error(self, status, got, 405)
        self.assertEqual(self.s.json("GET", "/health")[0], 200)

    def test_cli_server(self):
        p = cli("cache", "stats", "--server", self.url)
        self.assertIn("resident_experts", p.stdout)
        self.assertIn("budget_bytes", p.stdout)
        # Sizes readable, with the exact count beside them: bytes_read too, not only the *_bytes keys.
        read = [line for line in p.stdout.splitlines() if line.startswith("bytes_read ")]
        self.assertEqual(len(read), 1, p.stdout)
        self.assertRegex(read[0], r"bytes_read +([0-9.]+[KMGT]? \([0-9]+ bytes\)|[0-9]+)$")
        if int(json.loads(cli("cache", "stats", "--server", self.url, "--json").stdout)["bytes_read"]) >= 1024:
            self.assertIn(" bytes)", read[0])
        p = cli("cache", "clear", "--server", self.url, "--json")
        self.assertEqual(json.loads(p.stdout)["object"], "cache.clear")
        p = cli("cache", "warm", "--server", self.url, "--experts", "0:0,1:1", "--json")
        r = json.loads(p.stdout)
        self.assertEqual((r["requested"], r["loaded"]), (2, 2))
        greedy(self.s, n=4)
        r = json.loads(cli("cache", "warm", "--server", self.url, "--top", "3", "--json").stdout)
        self.assertEqual(r["requested"], 3)
        # More than fit (room for 4, one pinned): a note says how many did not; the text names sizes readably.
        p = cli("cache", "warm", "--server", self.url, "--experts", "0:0,0:2,0:3,1:0,1:1,1:2,1:3")
        self.assertRegex(p.stderr, r"note: [1-9]\d* of the 7 experts asked for did not fit")
        self.assertRegex(p.stdout, r"budget_bytes\s+\S+ \(\d+ bytes\)")
        p = cli("cache", "stats", "--server", self.url)
        self.assertRegex(p.stdout, r"hit_rate\s+(n/a|\d+\.\d%)\n")
        self.assertRegex(p.stdout, r"stall_seconds\s+\d+\.\d{3} s\n")
        p = cli("cache", "warm", "--server", self.url, "--experts", "7:7", check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("experts[0]", p.stderr)
        self.assertIn("400", p.stderr)

    def test_context_limits(self):
        status, got = self.s.json("POST", "/v1/completions", {"model": "tiny", "prompt": [5] * 500,
                                                              "max_tokens": 20})
        st.assert_error(self, status, got, 400, "context_length_exceeded", "prompt")
        for number in ("512", "520", "500", "20"):
            self.assertIn(number, got["error"]["message"])
        status, got = self.s.json("POST", "/v1/chat/completions", {
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 600})
        st.assert_error(self, status, got, 400, "context_length_exceeded", "messages")
        self.assertIn("600 in the completion", got["error"]["message"])
        # max_tokens left out: up to what the context has left.
        status, body = self.s.json("POST", "/v1/completions", {"model": "tiny", "prompt": [5] * 500,
                                                               "temperature": 0})
        self.assertEqual(status, 200, body)
        u = body["usage"]
        self.assertLessEqual(u["total_tokens"], 512)
        if body["choices"][0]["finish_reason"] == "length":
            self.assertEqual(u["total_tokens"], 512)


class ModelReplaced(unittest.TestCase):
    def test_a_model_replaced_under_a_streaming_server_is_named(self):
        # convert --force into the directory a server streams from: the next expert read fails its checksum or finds
        # another file, and the error says the model was replaced (restart), not that it is damaged (re-convert).
        model = os.path.join(st.WORK, "replaced")
        other = os.path.join(st.WORK, "ckpt-other")
        subprocess.run(["rm", "-rf", model], check=True)
        cli("convert", "--input", os.path.join(st.WORK, "ckpt"), "--output", model, "--quantize", "f32", "--quiet")
        if not os.path.exists(os.path.join(other, "config.json")):
            subprocess.run([sys.executable, st.GEN, "--arch", "mixtral", "--out", other, "--dtype", "f32", "--seed", "99"],
                           check=True, capture_output=True)
        s = st.Server("--model", model, "--expert-cache-size", str(2 * SLOT), "--prefetch-layers", "0")
        try:
            status, _ = s.json("POST", "/v1/completions", {"model": "replaced", "prompt": "hi", "max_tokens": 2})
            self.assertEqual(status, 200)
            cli("convert", "--input", other, "--output", model, "--quantize", "f32", "--force", "--quiet")
            status, got = s.json("POST", "/v1/completions", {"model": "replaced", "prompt": "a b c d e f g",
                                                              "max_tokens": 8, "temperature": 0})
            self.assertEqual(status, 500, got)
            message = got["error"]["message"]
            # The cause first: the read's own advice (inspect --verify) would have the user hunt for damage.
            self.assertTrue(message.startswith("The model failed to run: this model was replaced on disk after it "
                                               "was loaded"), message)
            self.assertNotIn(model, message)  # the client is not told where the server keeps its models
        finally:
            s.stop()


class ClientErrors(unittest.TestCase):
    def test_api_key_refused_connection_and_bad_url(self):
        s = st.Server("--api-key", "sekrit")
        try:
            url = f"http://127.0.0.1:{s.port}"
            p = cli("cache", "stats", "--server", url, check=False)
            self.assertEqual(p.returncode, 1)
            self.assertIn("--api-key", p.stderr)
            p = cli("cache", "clear", "--server", url, "--api-key", "wrong", check=False)
            self.assertEqual(p.returncode, 1)
            self.assertIn("rejected", p.stderr)
            status, got = s.json("POST", "/admin/cache/clear")
            st.assert_error(self, status, got, 401)
            # The command line wins over COLIBRI_API_KEY; the variable serves where the flag is not given.
            p = cli("cache", "stats", "--server", url, "--api-key", "sekrit", env={"COLIBRI_API_KEY": "wrong"})
            p = cli("cache", "stats", "--server", url, env={"COLIBRI_API_KEY": "sekrit"})
            # No request yet, so no lookup: no hit rate to claim
            self.assertRegex(p.stdout, r"(?m)^hit_rate +n/a$")
            self.assertIn('"hit_rate": null', cli("cache", "stats", "--server", url, "--json",
                                                   env={"COLIBRI_API_KEY": "sekrit"}).stdout)
            p = cli("cache", "stats", "--server", url, check=False, env={"COLIBRI_API_KEY": "wrong"})
            self.assertIn("rejected the API key in COLIBRI_API_KEY", p.stderr)
            p = cli("cache", "clear", "--server", url, "--api-key", "sekrit")
            self.assertIn("dropped_experts", p.stdout)
            # One "key  value" line per field, however long the key (vram_dropped_experts is the longest).
            for line in p.stdout.splitlines():
                key, value = line.split(None, 1)
                self.assertRegex(line, r"^\S+  +\S")
                # A count, or a size readable and exact: "12M (12582912 bytes)".
                self.assertRegex(value.strip(), r"^(-?[\d.]+|\S+ \(\d+ bytes\))$", line)
            self.assertIn("vram_dropped_experts", p.stdout)
        finally:
            self.assertEqual(s.stop(), 0)
        dead = f"http://127.0.0.1:{free_port()}"
        p = cli("cache", "stats", "--server", dead, check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn(dead, p.stderr)
        self.assertIn("colibri-server", p.stderr)
        # A URL that is no URL is refused by the parser, as any other refused option value: exit 2.
        for bad in ("htp://127.0.0.1:1", "http://127.0.0.1:99999", "https://127.0.0.1:1", "http://[::1"):
            p = cli("cache", "stats", "--server", bad, check=False)
            self.assertEqual(p.returncode, 2, bad)
            self.assertIn(f"--server: bad server URL '{bad}'", p.stderr)
        # A name that resolves to nothing: said so, and how the address is written.
        p = cli("cache", "stats", "--server", "no-such-host.invalid", check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("cannot resolve the host 'no-such-host.invalid'", p.stderr)
        self.assertIn("http://127.0.0.1:8080", p.stderr)
        # Nothing to warm from yet: a fresh server with an empty usage history.
        history = os.path.join(st.WORK, "no-history.json")
        if os.path.exists(history):
            os.remove(history)
        s = st.Server("--usage-history", history)
        try:
            status, got = s.json("POST", "/admin/cache/warm", {"top": 3})
            st.assert_error(self, status, got, 400, "no_usage_history", "top")
            self.assertIn(history, got["error"]["message"])
        finally:
            self.assertEqual(s.stop(), 0)
        p = cli("cache", "stats", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--server", p.stderr)


def read_jsonl(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data.endswith(b"\n"), "the trace ends in the middle of a line"
    return [json.loads(line) for line in data.decode().splitlines()]


class RecordTrace(unittest.TestCase):
    def test_trace_matches_run_and_replays(self):
        path = os.path.join(st.WORK, "server-trace.jsonl")
        s = st.Server("--record-trace", path, "--drain-timeout", "0.5")
        prompt, n = "hello there", 6
        try:
            status, body = s.json("POST", "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": n,
                                                              "temperature": 0})
            self.assertEqual(status, 200, body)
            generated = body["usage"]["completion_tokens"]
            # Two at once (batched together), then a stream cut short by SIGTERM.
            threads = [threading.Thread(target=greedy, args=(s, p, 8)) for p in st.PROMPTS[:2]]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            got = {}

            def long_stream():
                got["r"] = s.stream("/v1/completions", {"model": "tiny", "prompt": "Go on", "max_tokens": 400,
                                                        "temperature": 1.0, "seed": 1})
            t = threading.Thread(target=long_stream)
            t.start()
            time.sleep(0.5)
        finally:
            rc = s.stop(signal.SIGTERM)
        t.join(30)
        self.assertEqual(rc, 0)
        recs = read_jsonl(path)
        self.assertEqual(sorted({r["request"] for r in recs}), [0, 1, 2, 3])
        layers = 2
        first = [r for r in recs if r["request"] == 0]
        # The first request ran alone: every position of the prompt and of all but the last sampled token,
        # in every sparse layer; the same routing, tokens and weights as `colibri-cli run --record-trace`.
        self.assertEqual(len(first), (len(first) // layers) * layers)
        run_trace = os.path.join(st.WORK, "run-trace.jsonl")
        cli("run", "--model", st.MODEL, "--prompt", prompt, "-n", str(n), "--temperature", "0", "--record-trace",
            run_trace)
        by_key = {(r["position"], r["layer"]): r for r in read_jsonl(run_trace)}
        prompt_tokens = len({r["position"] for r in first}) - (generated - 1)
        self.assertGreater(prompt_tokens, 0)
        for r in first:
            ref = by_key[(r["position"], r["layer"])]
            self.assertEqual((r["token"], r["experts"], r["weights"]), (ref["token"], ref["experts"], ref["weights"]),
                             r)
        self.assertEqual(sorted({r["position"] for r in first}), list(range(prompt_tokens + generated - 1)))
        for req in (1, 2):
            # Contiguous; the start is past 0 when the request found a prefix in the prompt cache (not run, so not
            # in the trace): the two prompts share their first words, and one may arrive after the other finished.
            positions = sorted({r["position"] for r in recs if r["request"] == req})
            self.assertEqual(positions, list(range(positions[0], positions[0] + len(positions))))
        p = cli("ab", "replay", "--trace", path, "--model", st.MODEL, "--policy", "lru", "--cache-experts", "2,4",
                "--json")
        j = json.loads(p.stdout)
        self.assertEqual([x["cache_experts"] for x in j["sizes"]], [2, 4])
        self.assertGreater(j["sizes"][0]["policies"][0]["hits"] + j["sizes"][0]["policies"][0]["misses"], 0)

    def test_batched_trace_replays_to_the_server_counts(self):
        # Requests decoding together share forward passes: the trace's steps group them, and `ab replay` of it counts
        # the hits and misses the server counted (no prefetch, a cache of 3 of the 8 experts, 4-token prefill passes).
        path = os.path.join(st.WORK, "server-batched-trace.jsonl")
        s = st.Server("--record-trace", path, "--prefetch-layers", "0", "--expert-cache-size", str(3 * SLOT),
                      "--set", "cache.policy=lru", "--batch", "4")
        try:
            threads = [threading.Thread(target=greedy, args=(s, p, 10)) for p in st.PROMPTS[:3]]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            served = (s.metric('colibri_expert_hits_total{tier="ram"}'),
                      s.metric('colibri_expert_misses_total{tier="ram"}'))
        finally:
            self.assertEqual(s.stop(signal.SIGTERM), 0)
        recs = read_jsonl(path)
        self.assertEqual(sorted({r["request"] for r in recs}), [0, 1, 2])
        self.assertGreater(len({r["step"] for r in recs}), 3)
        requests_of_step = {}
        for r in recs:
            requests_of_step.setdefault(r["step"], set()).add(r["request"])
        self.assertTrue(any(len(v) > 1 for v in requests_of_step.values()), "no two requests ever ran together")
        p = cli("ab", "replay", "--trace", path, "--model", st.MODEL, "--policy", "lru", "--cache-experts", "3",
                "--json")
        got = json.loads(p.stdout)["sizes"][0]["policies"][0]
        self.assertEqual((got["hits"], got["misses"]), served)
        self.assertGreater(served[1], 0)

    def test_unwritable_trace_is_named(self):
        bad = os.path.join(st.WORK, "no-such-dir", "t.jsonl")
        p = subprocess.run([st.SERVER, "--model", st.MODEL, "--port", "0", "--record-trace", bad],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 1)
        self.assertIn(bad, p.stderr)

    def test_a_trace_cut_short_by_the_disk_fails_the_exit_status(self):
        # /dev/full refuses every write as a full disk would: the server serves on, logs the error, and its exit
        # status says the trace it was asked for is incomplete.
        s = st.Server("--record-trace", "/dev/full")
        status, _ = s.json("POST", "/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 2})
        self.assertEqual(status, 200)
        self.assertEqual(s.stop(), 1)
        with open(s.log.name) as log:
            self.assertIn("the routing trace /dev/full stopped at a write error", log.read())

    def test_negative_ctx_is_refused(self):
        p = subprocess.run([st.SERVER, "--model", st.MODEL, "--port", "0", "--ctx", "-1"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2)  # a refused option value, as every other
        self.assertIn("--ctx: -1 is negative; give a context length in tokens, or 0 for the default", p.stderr)
        for args, words in ((["--batch", "0"], "--batch: 0 is below 1"),
                            (["--max-batch", "0"], "--max-batch: 0 is below 1"),
                            (["--io-threads", "65"], "--io-threads: 65 is above 64"),
                            (["--max-header-size", "100"], "--max-header-size: 100 is below 1024"),
                            (["--write-timeout", "-1"], "--write-timeout: -1 is out of range; give 0 to 86400"),
                            (["--request-timeout", "1e400"], "--request-timeout: 1e400 is out of range"),
                            (["--max-header-size", "0x10"], "--max-header-size: 0x10 is below 1024"),
                            (["--max-body-size", "4Q"], "--max-body-size: 4Q is not a size"),
                            (["--set", "cache"], "--set: cache: write --set KEY=VALUE")):
            p = subprocess.run([st.SERVER, "--model", st.MODEL, "--port", "0", *args],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 2, args)
            self.assertIn(words, p.stderr, args)


def main():
    args = sys.argv[1:]
    st.CLI, st.SERVER, st.GEN, st.WORK = args[:4]
    os.makedirs(st.WORK, exist_ok=True)
    st.make_model()
    unittest.main(argv=[sys.argv[0], "-v"] + args[4:])


if __name__ == "__main__":
    main()
