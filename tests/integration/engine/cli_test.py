#!/usr/bin/python3
"""colibri-cli run / chat / perplexity / bench on a tiny random Mixtral (ctest label integration):

  cli_test.py COLIBRI_CLI FIXTURE_GENERATOR WORK_DIR
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

CLI, GEN, WORK = None, None, None


def cli(*args, stdin=None, check=True):
    p = subprocess.run([CLI] + list(args), capture_output=True, text=True, input=stdin, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"colibri-cli {' '.join(args)} failed ({p.returncode}):\n{p.stderr}")
    return p


def manifest_opens(test, *args):
    """colibri-cli ARGS under strace (the test skips where there is none, or it cannot trace): the finished process
    and its opens of a manifest.json."""
    if shutil.which("strace") is None:
        test.skipTest("strace is not installed")
    trace = os.path.join(WORK, "manifest-opens.strace")
    p = subprocess.run(["strace", "-f", "-e", "trace=openat", "-o", trace, CLI] + list(args), capture_output=True,
                       text=True, timeout=300)
    if p.returncode != 0 and "strace:" in p.stderr:
        test.skipTest("strace cannot trace here: " + p.stderr.strip())
    with open(trace) as f:
        return p, [line for line in f if "manifest.json" in line]


def model():
    ckpt, out = os.path.join(WORK, "ckpt"), os.path.join(WORK, "tiny-mixtral")
    if not os.path.exists(os.path.join(out, "manifest.json")):
        subprocess.run([sys.executable, GEN, "--arch", "mixtral", "--out", ckpt], check=True, capture_output=True)
        cli("convert", "--input", ckpt, "--output", out, "--quantize", "q8_0")
    return out


def hparams_copy(name, **hparams):
    """A copy of the tiny model (WORK/name) whose manifest says these hyper-parameters."""
    out = os.path.join(WORK, name)
    if not os.path.exists(os.path.join(out, "manifest.json")):
        shutil.copytree(model(), out, dirs_exist_ok=True)
        with open(os.path.join(out, "manifest.json")) as f:
            man = json.load(f)
        man["hparams"].update(hparams)
        with open(os.path.join(out, "manifest.json"), "w") as f:
            json.dump(man, f)
    return out


def chat_model(name, template, special_tokens=()):
    """A copy of the tiny model with this chat template, and these special tokens added to its tokenizer (at the
    ids after its vocabulary, which its embedding already has)."""
    out = os.path.join(WORK, name)
    if os.path.exists(os.path.join(out, "manifest.json")):
        return out
    shutil.copytree(model(), out, dirs_exist_ok=True)

    def edit(file, change):
        with open(os.path.join(out, file)) as f:
            doc = json.load(f)
        change(doc)
        with open(os.path.join(out, file), "w") as f:
            json.dump(doc, f)

    def add_tokens(tok):
        first = 1 + max(a["id"] for a in tok["added_tokens"] + [{"id": i} for i in tok["model"]["vocab"].values()])
        for i, token in enumerate(special_tokens):
            tok["added_tokens"].append({"id": first + i, "content": token, "single_word": False, "lstrip": False,
                                        "rstrip": False, "normalized": False, "special": True})

    def drop_hashes(man):  # deliberate edits
        for file in ("tokenizer.json", "tokenizer_config.json"):
            man["tokenizer"].get("xxh64", {}).pop(file, None)

    edit("tokenizer.json", add_tokens)
    edit("tokenizer_config.json", lambda config: config.update(chat_template=template))
    edit("manifest.json", drop_hashes)
    return out


class Run(unittest.TestCase):
    def test_same_seed_same_text_and_stats_line(self):
        a = cli("run", "-m", model(), "-p", "Hello world", "-n", "12", "--seed", "5", "--ignore-eos")
        b = cli("run", "-m", model(), "-p", "Hello world", "-n", "12", "--seed", "5", "--ignore-eos")
        c = cli("run", "-m", model(), "-p", "Hello world", "-n", "12", "--seed", "6", "--ignore-eos")
        self.assertEqual(a.stdout, b.stdout)
        self.assertNotEqual(a.stdout, c.stdout)
        self.assertTrue(a.stdout.startswith("Hello world"))
        # --seed -1 is a random seed (llama.cpp's spelling), named in the stats line so that it can be repeated.
        seeds = set()
        for _ in range(2):
            r = cli("run", "-m", model(), "-p", "Hello world", "-n", "12", "--seed", "-1", "--ignore-eos")
            seed = int(re.search(r", seed (\d+)\)", r.stderr).group(1))
            self.assertLess(seed, 2 ** 32)
            again = cli("run", "-m", model(), "-p", "Hello world", "-n", "12", "--seed", str(seed), "--ignore-eos")
            self.assertEqual(again.stdout, r.stdout)
            seeds.add(seed)
        self.assertEqual(len(seeds), 2)
        stats = a.stderr.strip().splitlines()[-1]
        for word in ("resident", "backend cpu", "storage pread", "cache frequency", "prefill", "decode",
                     "expert hit rate", "read", "I/O stall", "12 generated"):
            self.assertIn(word, stats)
        self.assertRegex(stats, r"\| decode [0-9.]+ tok/s \|")
        # One token comes out of the prefill: no decode step ran, so no rate (it read 0.0 tok/s).
        one = cli("run", "-m", model(), "-p", "Hello world", "-n", "1", "--ignore-eos").stderr.strip().splitlines()[-1]
        self.assertIn("| decode n/a |", one)
        self.assertRegex(one, r"\| prefill [0-9.]+ tok/s \|")

    def test_prompt_from_a_file_or_standard_input(self):
        a = cli("run", "-m", model(), "-p", "Hello world", "-n", "6", "--seed", "5", "--ignore-eos")
        path = os.path.join(WORK, "prompt.txt")
        with open(path, "w") as f:
            f.write("Hello world")
        b = cli("run", "-m", model(), "--file", path, "-n", "6", "--seed", "5", "--ignore-eos")
        c = cli("run", "-m", model(), "-f", "-", "-n", "6", "--seed", "5", "--ignore-eos", stdin="Hello world")
        self.assertEqual(a.stdout, b.stdout)
        self.assertEqual(a.stdout, c.stdout)
        p = cli("run", "-m", model(), "-n", "2", check=False)
        self.assertIn("give the prompt: --prompt TEXT, or --file FILE", p.stderr)
        # A prompt past --ctx is told to raise it; one past the model's own context only to shrink.
        with open(os.path.join(model(), "manifest.json")) as f:
            max_ctx = json.load(f)["hparams"]["max_position_embeddings"]
        p = cli("run", "-m", model(), "-p", "word " * 40, "-n", "2", "--ctx", "16", check=False)
        self.assertIn(f"shorten the prompt or raise --ctx (the model allows {max_ctx})", p.stderr)
        p = cli("run", "-m", model(), "-f", "-", "-n", "2", stdin="word " * (max_ctx + 10), check=False)
        self.assertIn(f"shorten the prompt (the model's own context is {max_ctx} positions)", p.stderr)
        # A closed standard input is said to be closed, not taken for an empty prompt.
        p = subprocess.run(["bash", "-c", 'exec 0<&-; exec "$0" run -m "$1" -f - -n 2', CLI, model()],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 1)
        self.assertIn("--file -: standard input is closed", p.stderr)
        p = cli("run", "-m", model(), "-p", "hi", "--stop", "", check=False)
        self.assertEqual(p.returncode, 2)  # a refused option value, as an empty value of any other option
        self.assertIn("an empty text stops nothing", p.stderr)

    def test_a_kv_cache_past_the_ram_is_warned_about(self):
        # Host KV pages are paid for as the context fills: a --ctx whose cache outgrows the RAM would fail mid-answer.
        long_model = hparams_copy("tiny-long", max_position_embeddings=1 << 30)
        p = cli("run", "-m", long_model, "-p", "hi", "-n", "1", "--ctx", str(1 << 30))
        self.assertRegex(p.stderr, r"the KV cache of 1073741824 positions grows to \S+, more than the \S+ of RAM")
        p = cli("run", "-m", long_model, "-p", "hi", "-n", "1", "--ctx", "64")
        self.assertNotIn("more than the", p.stderr)

    def test_packed_experts_answer_as_split_ones(self):
        # --no-split-experts packs a layer's experts into one file; the model answers with the same bits.
        packed = os.path.join(WORK, "tiny-packed")
        shutil.rmtree(packed, ignore_errors=True)
        cli("convert", "--input", os.path.join(WORK, "ckpt"), "--output", packed, "--quantize", "q8_0",
            "--no-split-experts", "--quiet")
        split_files = sum(len(f) for _, _, f in os.walk(os.path.join(model(), "experts")))
        packed_files = sum(len(f) for _, _, f in os.walk(os.path.join(packed, "experts")))
        self.assertLess(packed_files, split_files)
        args = ["-p", "The fox", "-n", "8", "--temp", "0", "--ignore-eos"]
        self.assertEqual(cli("run", "-m", packed, *args).stdout, cli("run", "-m", model(), *args).stdout)

    def test_json_mode_and_no_echo_print_the_answer_alone(self):
        plain = cli("run", "-m", model(), "-p", "Answer:", "-n", "8", "--temp", "0", "--ignore-eos").stdout
        alone = cli("run", "-m", model(), "-p", "Answer:", "-n", "8", "--temp", "0", "--ignore-eos", "--no-echo").stdout
        self.assertEqual("Answer:" + alone, plain)
        p = cli("run", "-m", model(), "-p", "Answer:", "-n", "60", "--json", "--seed", "3")
        if "eos" in p.stderr.strip().splitlines()[-1]:  # the object closed within 60 tokens: stdout parses as it is
            self.assertIsInstance(json.loads(p.stdout), dict)
        self.assertTrue(p.stdout.lstrip().startswith("{"), p.stdout)
        # An object the token limit cuts short does not parse: said, and the exit status is 1.
        p = cli("run", "-m", model(), "-p", "Answer:", "-n", "2", "--json", "--seed", "3", check=False)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("error: the JSON object is incomplete (it does not parse): the token limit (-n 2) came first",
                      p.stderr)
        with self.assertRaises(ValueError):
            json.loads(p.stdout)

    def test_a_failed_write_to_standard_output_is_an_error(self):
        for args in (("run", "-m", model(), "-p", "hi", "-n", "4"), ("tokenize", "-m", model(), "--text", "hi"),
                     ("run", "-m", model(), "-p", "hi", "-n", "4", "--json")):
            with open("/dev/full", "w") as full:
                p = subprocess.run([CLI, *args], stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
            self.assertEqual(p.returncode, 1, args)
            self.assertIn("error: writing standard output failed", p.stderr)
            self.assertNotIn("JSON object is incomplete", p.stderr)  # one error, the true one

    def test_greedy_is_deterministic_and_stop_string_cuts(self):
        a = cli("run", "-m", model(), "-p", "The fox", "-n", "16", "--temp", "0", "--ignore-eos", "--seed", "1")
        b = cli("run", "-m", model(), "-p", "The fox", "-n", "16", "--temp", "0", "--ignore-eos", "--seed", "2")
        self.assertEqual(a.stdout, b.stdout)
        generated = a.stdout[len("The fox"):].rstrip("\n")
        if len(generated) >= 4:
            stop = generated[2:4]
            c = cli("run", "-m", model(), "-p", "The fox", "-n", "16", "--temp", "0", "--ignore-eos", "--stop", stop)
            self.assertEqual(c.stdout.rstrip("\n"), "The fox" + generated[:generated.index(stop)])
            self.assertIn("stop", c.stderr.strip().splitlines()[-1])

    def test_context_and_bad_flags(self):
        p = cli("run", "-m", model(), "-p", "a b c d e f g h i j k l", "--ctx", "4", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("context", p.stderr)
        self.assertEqual(p.stdout, "")  # refused before the prompt is echoed
        p = cli("run", "-m", model(), "-p", "hi", "-n", "50", "--ctx", "8", "--ignore-eos", "--temp", "0")
        self.assertIn("context of 8 positions is full", p.stderr)
        counts = re.search(r"\((\d+) prompt \+ (\d+) generated tokens, context", p.stderr)
        self.assertIsNotNone(counts, p.stderr)
        self.assertEqual(int(counts[1]) + int(counts[2]), 8)  # prompt and answer share the context, as the server's
        # --ctx 0 is the default (the model's context here); a negative one is refused, by profile show too.
        p = cli("run", "-m", model(), "-p", "hi", "-n", "2", "--ctx", "0", "--ignore-eos", "--temp", "0")
        self.assertEqual(p.stdout, cli("run", "-m", model(), "-p", "hi", "-n", "2", "--ignore-eos", "--temp", "0").stdout)
        for args in (("run", "-p", "hi"), ("profile", "show")):
            p = cli(*args, "-m" if args[0] == "run" else "--model", model(), "--ctx", "-3", check=False)
            self.assertEqual(p.returncode, 2, args)
            self.assertIn("--ctx: -3 is negative; give a context length in tokens, or 0 for the default", p.stderr)
        # So is every other option value out of its range, by the parser or, where the model decides, before the
        # weights load: one exit status for every refused flag.
        text = os.path.join(WORK, "refused-flags.txt")
        with open(text, "w") as f:
            f.write("some text to score\n")
        m = model()
        for args, words in (
                (["run", "-m", m, "-p", "hi", "--batch", "0"], "--batch: 0 is below 1"),
                # Read as CLI11 converts them (hex, a sign): no spelling slips past the check.
                (["run", "-m", m, "-p", "hi", "--batch", "0x0"], "--batch: 0x0 is below 1"),
                (["run", "-m", m, "-p", "hi", "--ctx", "-0x3"], "--ctx: -0x3 is negative"),
                (["bench", "-m", m, "--prompt-tokens", "+0"], "--prompt-tokens: +0 is below 1"),
                (["run", "-m", m, "-p", "hi", "--kv-type", "q4"], "--kv-type: q4 not in {f16,q8_0,f32}"),
                (["run", "-m", m, "-p", "hi", "--set", "memory"], "--set: memory: write --set KEY=VALUE"),
                (["chat", "-m", m, "--ctx", "-1"], "--ctx: -1 is negative"),
                (["bench", "-m", m, "--prompt-tokens", "0"], "--prompt-tokens: 0 is below 1"),
                (["bench", "-m", m, "--gen-tokens", "-1"], "--gen-tokens: -1 is negative"),
                (["perplexity", "-m", m, "-f", text, "--ctx", "1"], "--ctx 1: a chunk needs 2 tokens to score one"),
                (["perplexity", "-m", m, "-f", text, "--ctx", "-4"], "--ctx -4: a chunk needs 2 tokens to score one"),
                (["cache", "stats", "-m", m, "--top", "0"], "--top: 0 is below 1"),
                (["ab", "live", "-m", m, "--profile", "cpu", "--profile", "cpu", "--runs", "0"], "--runs: 0 is below 1"),
                (["ab", "live", "-m", m, "--profile", "cpu", "--profile", "cpu", "-n", "1"], "--tokens: 1 is below 2"),
                (["run", "-m", m, "-p", "hi", "--ctx", "100000000"], "--ctx 100000000 exceeds the model's context"),
                (["logits", "-m", m, "--tokens", "1,x", "-o", os.path.join(WORK, "x.npy")], "'x' is not a token id"),
                (["logits", "-m", m, "--tokens", "-1", "-o", os.path.join(WORK, "x.npy")], "'-1' is not a token id"),
                (["logits", "-m", m, "--tokens", "1,2,", "-o", os.path.join(WORK, "x.npy")], "ends with a comma"),
                (["logits", "-m", m, "--tokens", "1,100000", "-o", os.path.join(WORK, "x.npy")],
                 "--tokens: 100000 is past the model's vocabulary (ids 0.."),
                (["tokenize", "-m", m, "--text", "hi", "--skip-special"], "--skip-special applies to --decode only"),
                (["iobench", WORK, "--depths", "0"], "--depths entry '0' must be 1..1024"),
                (["convert", "-i", os.path.join(WORK, "ckpt"), "-o", os.path.join(WORK, "q9"), "-q", "q9"],
                 "unknown preset 'q9'; choose one of"),
                (["convert", "-i", os.path.join(WORK, "ckpt"), "-o", os.path.join(WORK, "both"), "--split-experts",
                  "--no-split-experts"], "--split-experts excludes --no-split-experts"),
                (["cache", "stats", "--server", "ftp://127.0.0.1:1"], "--server: bad server URL")):
            p = cli(*args, check=False)
            self.assertEqual(p.returncode, 2, (args, p.stderr))
            self.assertIn(words, p.stderr, args)
            self.assertNotIn("compute cpu", p.stderr, args)  # before any backend starts
        # A --set value its plugin has no key for, of the wrong type, or refused when the plugin is created, is the
        # command line's mistake too (2); the same value from a profile file is not (1).
        for kv, words in (("memory.vram_admission=sometimes", "'sometimes' is not one of frequency, always"),
                          ("storage.bogus=1", "--set storage.bogus=1: unknown key 'storage.bogus'"),
                          ("cache.half_life=abc", "'abc' is not an integer"),
                          ("storage.chunk_kib=1", "storage.chunk_kib = 1 is from command line --set storage.chunk_kib=1")):
            p = cli("run", "-m", model(), "-p", "hi", "-n", "1", "--set", kv, check=False)
            self.assertEqual(p.returncode, 2, (kv, p.stderr))
            self.assertIn(words, p.stderr, kv)
        refused = os.path.join(WORK, "chunk-1.yaml")
        with open(refused, "w") as f:
            f.write("storage:\n  chunk_kib: 1\n")
        p = cli("run", "-m", model(), "-p", "hi", "-n", "1", "--profile", refused, check=False)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("storage.chunk_kib is 1", p.stderr)
        # Sampling values out of range exit 2, as the values the option parser refuses (--top-k abc) do.
        p = cli("run", "-m", model(), "-p", "hi", "--top-p", "2", check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--top-p must be in (0, 1], got 2", p.stderr)
        p = cli("run", "-m", model(), "-p", "hi", "--top-k", "-5", check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--top-k must be positive, or 0 or -1 (off), got -5", p.stderr)
        self.assertEqual(cli("run", "-m", model(), "-p", "hi", "--top-k", "abc", check=False).returncode, 2)
        p = cli("chat", "-m", model(), "--temperature", "-1", stdin="Hello\n", check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        # Values CLI11 would clamp, wrap or read as unset are refused, on every command's options: two seeds gave one
        # answer, and an empty --expert-cache-size ran with the automatic cache.
        for extra, words in ((["--seed", "99999999999999999999"], "--seed: 99999999999999999999 is out of range"),
                             (["-n", "99999999999999999999"], "is out of range"),
                             (["--expert-cache-size", ""], "--expert-cache-size: an empty value"),
                             (["--profile", ""], "--profile: an empty value")):
            p = cli("run", "-m", model(), "-p", "hi", *extra, check=False)
            self.assertEqual(p.returncode, 2, extra)
            self.assertIn(words, p.stderr, extra)
        p = cli("bench", "-m", model(), "--seed", "-3", check=False)  # an unsigned option: not wrapped
        self.assertIn("--seed: -3 is negative", p.stderr)
        self.assertEqual(cli("tokenize", "-m", model(), "--text", "").stdout.strip(), '{"ids":[]}')  # "" is a text
        p = cli("run", "-m", model(), "-p", "hi", "--seed", "-2", check=False)  # not wrapped to 2^64 - 2
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--seed: -2 is negative; give 0 or more, or -1 for a random seed", p.stderr)
        # A plugin's own range check names the value; where it was set comes with it.
        p = cli("run", "-m", model(), "-p", "hi", "--set", "storage.chunk_kib=-1", check=False)
        self.assertIn("storage.chunk_kib is -1", p.stderr)
        self.assertIn("(storage.chunk_kib = -1 is from command line --set storage.chunk_kib=-1)", p.stderr)
        p = cli("run", "-m", os.path.join(WORK, "no-such-model"), "-p", "hi", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("no-such-model", p.stderr)
        for flag, words in (("--prompt", "not empty: there must be a token to run"),
                            ("--tokens", "--tokens: an empty value")):
            p = cli("logits", "-m", model(), flag, "", "-o", os.path.join(WORK, "empty.npy"), check=False)
            self.assertEqual(p.returncode, 2)
            self.assertIn(words, p.stderr)
        # More tokens than the context: raising --ctx is the fix only below the model's own context.
        with open(os.path.join(model(), "manifest.json")) as f:
            n_ctx = json.load(f)["hparams"]["max_position_embeddings"]
        too_many = ",".join(["5"] * (n_ctx + 1))
        p = cli("logits", "-m", model(), "--tokens", too_many, "-o", os.path.join(WORK, "long.npy"), check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn(f"exceed the context of {n_ctx} positions (the model's own context; give fewer tokens)", p.stderr)
        p = cli("logits", "-m", model(), "--tokens", "5,5,5,5", "--ctx", "3", "-o", os.path.join(WORK, "long.npy"),
                check=False)
        self.assertIn(f"exceed the context of 3 positions (raise --ctx or memory.kv_cache, up to the model's {n_ctx})",
                      p.stderr)
        # --profile wins over COLIBRI_PROFILE, which serves where the flag is not given.
        env = dict(os.environ, COLIBRI_PROFILE="no-such-profile")
        for args in (("profile", "show"), ("run", "-m", model(), "-p", "hi", "-n", "1")):
            p = subprocess.run([CLI, *args, "--profile", "cpu"], capture_output=True, text=True, env=env)
            self.assertEqual(p.returncode, 0, p.stderr)
            p = subprocess.run([CLI, *args], capture_output=True, text=True, env=env)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("no-such-profile", p.stderr)


def history_env(name):
    env = dict(os.environ, XDG_CACHE_HOME=os.path.join(WORK, name))
    subprocess.run(["rm", "-rf", env["XDG_CACHE_HOME"]], check=True)
    return env


def history_uses(env):
    p = subprocess.run([CLI, "cache", "stats", "--model", model()], capture_output=True, text=True, env=env, check=True)
    return int(p.stdout.split("distinct, ")[1].split(" uses")[0])


class InvalidUtf8Files(unittest.TestCase):
    def test_a_file_that_is_not_utf8_is_warned_about_with_the_byte(self):
        bad = os.path.join(WORK, "latin1.txt")
        with open(bad, "wb") as f:
            f.write("Caf\u00e9 au lait. ".encode("latin-1") * 200)  # 0xE9 alone: Latin-1, not UTF-8
        good = os.path.join(WORK, "utf8.txt")
        with open(good, "wb") as f:
            f.write("Caf\u00e9 au lait. ".encode() * 200)
        for args in (["run", "-m", model(), "-n", "1", "--file"], ["perplexity", "-m", model(), "--ctx", "64", "-f"]):
            p = subprocess.run([CLI] + args + [bad], capture_output=True, text=True, errors="replace")  # echoed
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("latin1.txt is not UTF-8 text (byte 3 is not valid UTF-8)", p.stderr)
            p = subprocess.run([CLI] + args + [good], capture_output=True, text=True)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertNotIn("not UTF-8", p.stderr)


class UnknownHistoryKeys(unittest.TestCase):
    def test_counts_of_experts_the_model_lacks_are_left_out_and_dropped_at_the_next_save(self):
        env = history_env("unknown-keys")
        subprocess.run([CLI, "run", "-m", model(), "-p", "Hi", "-n", "2"], capture_output=True, env=env, check=True)
        p = subprocess.run([CLI, "cache", "stats", "--model", model(), "--json"], capture_output=True, text=True,
                           env=env, check=True)
        path = json.loads(p.stdout)["usage_history"]
        with open(path) as f:
            history = json.load(f)
        history["counts"]["99:99"] = 10 ** 9  # would be the most used
        with open(path, "w") as f:
            json.dump(history, f)
        p = subprocess.run([CLI, "cache", "stats", "--model", model(), "--json"], capture_output=True, text=True,
                           env=env, check=True)
        stats = json.loads(p.stdout)
        self.assertNotIn({"layer": 99, "expert": 99}, [{k: e[k] for k in ("layer", "expert")} for e in stats["most_used"]])
        self.assertIn("this model does not have (e.g. 99:99)", stats["note"])
        # warm reads the experts the model has, as stats lists them (it stopped at 99:99).
        p = subprocess.run([CLI, "cache", "warm", "--model", model()], capture_output=True, text=True, env=env)
        self.assertEqual(p.returncode, 0, p.stderr)
        p = subprocess.run([CLI, "run", "-m", model(), "-p", "Hi", "-n", "2"], capture_output=True, text=True,
                           env=env, check=True)
        self.assertIn("does not have (e.g. 99:99); dropped them", p.stderr)
        with open(path) as f:
            self.assertNotIn("99:99", json.load(f)["counts"])
        p = subprocess.run([CLI, "cache", "stats", "--model", model(), "--json"], capture_output=True, text=True,
                           env=env, check=True)
        self.assertIsNone(json.loads(p.stdout)["note"])


class Interrupt(unittest.TestCase):
    def test_ctrl_c_ends_a_run_with_its_statistics_and_usage_history(self):
        env = history_env("interrupt-run")
        trace = os.path.join(WORK, "interrupted-trace.jsonl")
        if os.path.exists(trace):
            os.remove(trace)
        p = subprocess.Popen([CLI, "run", "-m", model(), "-p", "Hi", "-n", "100000", "--ignore-eos", "--ctx", "32000",
                              "--record-trace", trace], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        p.stdout.read(64)  # generating
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 130, err)
        self.assertIn(b"interrupted", err)
        stats = re.search(r"expert hit rate .*\((\d+) prompt \+ (\d+) generated tokens, cancelled", err.decode())
        self.assertIsNotNone(stats, err)
        self.assertGreater(history_uses(env), 0)
        # The trace of the tokens done is kept (it was dropped): one step per prompt pass and per decoded token.
        with open(trace) as f:
            steps = {json.loads(line)["step"] for line in f if line.strip()}
        self.assertGreater(len(steps), 1)
        self.assertLessEqual(len(steps), 1 + int(stats[2]))
        self.assertEqual(min(steps), 0)  # a trace's own steps, not the engine's count run on from the generation

    def test_ctrl_c_leaves_no_partial_output_and_the_old_file_as_it_was(self):
        text = os.path.join(WORK, "long.txt")
        with open(text, "w") as f:
            f.write("The quick brown fox jumps over the lazy dog. " * 3000)
        out = os.path.join(WORK, "interrupted.logits")
        with open(out, "w") as f:
            f.write("old")
        for signals in (1, 2):  # once: stops after the chunk and reports; twice: ends at once
            # Chunks of 2048 take long enough that the second Ctrl-C comes while one runs (512 no longer did).
            p = subprocess.Popen([CLI, "perplexity", "-m", model(), "-f", text, "--ctx", "2048", "--save-logits", out],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            deadline = time.time() + 60
            # The signals must come while a chunk is being scored: past the header (the chunks' token ids, at most
            # 540 KB for 135 000 characters; a Ctrl-C while it is written comes before the scoring loop listens) and
            # its first rows of logits, and while the file stands still (a forward pass, not the last rows of a
            # chunk, after which a first Ctrl-C ends the run before the second comes).
            last, still_since = -1, time.time()
            while time.time() < deadline:
                size = os.path.getsize(out + ".partial") if os.path.exists(out + ".partial") else -1
                if size != last:
                    last, still_since = size, time.time()
                elif size > 1000000 and time.time() - still_since > 0.02:
                    break
                time.sleep(0.005)
            for _ in range(signals):
                p.send_signal(signal.SIGINT)
                time.sleep(0.05)
            stdout, stderr = p.communicate(timeout=120)
            if signals == 1:
                self.assertEqual(p.returncode, 130, stderr)
                self.assertRegex(stdout, r"interrupted after \d+ of \d+ chunks: perplexity [0-9.]+ over \d+ tokens "
                                         r"\(--save-logits not written\)")
            else:
                self.assertEqual(p.returncode, -signal.SIGINT, stderr)
            self.assertFalse(os.path.exists(out + ".partial"), signals)
            with open(out) as f:
                self.assertEqual(f.read(), "old")


class Chat(unittest.TestCase):
    def test_two_turns(self):
        env = history_env("chat")
        p = subprocess.run([CLI, "chat", "-m", model(), "-n", "6", "--seed", "3"], input="Hello\nHow are you?\n",
                           capture_output=True, text=True, env=env, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stderr.count("expert hit rate"), 2, p.stderr)
        self.assertEqual(p.stderr.count(", seed 3)"), 2, p.stderr)
        # Without --seed, a random one, named in the stats line so that the chat can be replayed.
        p = subprocess.run([CLI, "chat", "-m", model(), "-n", "6"], input="Hello\n", capture_output=True, text=True,
                           env=env, timeout=300, check=True)
        seed = re.search(r", seed (\d+)\)", p.stderr).group(1)
        again = subprocess.run([CLI, "chat", "-m", model(), "-n", "6", "--seed", seed], input="Hello\n",
                               capture_output=True, text=True, env=env, timeout=300, check=True)
        self.assertEqual(again.stdout, p.stdout)
        first = history_uses(env)
        self.assertGreater(first, 0, "a chat counts into the usage history")
        subprocess.run([CLI, "chat", "-m", model(), "-n", "6", "--seed", "3"], input="Hello\n", capture_output=True,
                       text=True, env=env, timeout=300, check=True)
        self.assertGreater(history_uses(env), first)

    def test_next_turn_returns_to_the_window_saved_at_the_prompts_end(self):
        # Window 4 and --batch 1: each layer keeps 192 rows. The second turn shares the first's prompt but not its
        # reply (re-encoded differently), and the reply moved the rows past the prompt's end: the window saved there
        # is put back, so the prompt is reused as with a cache that keeps every position, and the transcript is the
        # same. With no saved window (memory.kv_sliding_window's rows alone) the turn would run from position 0.
        out = hparams_copy("tiny-window", sliding_window=4)
        self.assertRegex(cli("inspect", "-m", out).stdout, r"attention: +context \d+, sliding window 4 on (\d+) of \1 ")
        self.assertNotIn("sliding", cli("inspect", "-m", model()).stdout)
        # The file count is the manifest and the files it checksums, as many as --verify hashes.
        shown = cli("inspect", "-m", model(), "--verify").stdout
        listed = re.search(r"files: +(\d+) \(manifest.json and the (\d+) files it holds checksums of\)", shown)
        self.assertIsNotNone(listed, shown)
        self.assertEqual(int(listed.group(1)), int(listed.group(2)) + 1)
        self.assertIn(f"verify:        ok ({listed.group(2)} files, ", shown)
        turns = " ".join(["the quiet river runs"] * 30) + "\nand then what\n"
        args = ["chat", "-m", out, "-n", "150", "--temp", "0", "--batch", "1", "--template", "chatml"]
        window = cli(*args, stdin=turns)
        full = cli(*args, "--set", "memory.kv_sliding_window=false", stdin=turns)
        self.assertIn("sliding-window layers keep 192 of", window.stderr)
        self.assertEqual(window.stdout, full.stdout)
        reused = lambda p: [int(x.split(" reused")[0].rsplit(", ", 1)[1]) for x in p.stderr.splitlines()
                            if " reused from the cache" in x]
        self.assertEqual(reused(window), reused(full))
        self.assertGreater(reused(full)[1], 500)

    def test_drafts_keep_the_transcript(self):
        # --draft's rejected drafts are dropped from the KV cache (a sliding window's rows included), so the next turn
        # reuses the same prefix and the chat is the one without drafts, greedy or sampled.
        out = hparams_copy("tiny-window", sliding_window=4)
        turns = " ".join(["the quiet river runs"] * 20) + "\nand then the quiet river runs\n"
        for sampling in (["--temp", "0"], ["--temp", "0.8", "--seed", "4"]):
            args = ["chat", "-m", out, "-n", "80", "--template", "chatml", *sampling]
            plain = cli(*args, stdin=turns)
            spec = cli(*args, "--draft", "6", stdin=turns)
            self.assertEqual(spec.stdout, plain.stdout, sampling)
            reused = lambda p: [x.split(" reused")[0].rsplit(", ", 1)[1] for x in p.stderr.splitlines()
                                if " reused from the cache" in x]
            self.assertEqual(reused(spec), reused(plain), sampling)
            if sampling[1] == "0":
                self.assertRegex(spec.stderr, r", [1-9]\d* of \d+ drafted tokens kept")
            # The model as its own draft model: its KV cache follows the whole conversation (the earlier turns
            # included), so every greedy draft is right.
            self_drafted = cli(*args, "--draft-model", out, "--draft-p-min", "0", stdin=turns)
            self.assertEqual(self_drafted.stdout, plain.stdout, sampling)
            counts = re.findall(r", (\d+) of (\d+) drafted tokens kept", self_drafted.stderr)
            self.assertEqual(len(counts), 2, self_drafted.stderr)
            if sampling[1] == "0":
                self.assertTrue(all(kept == ran for kept, ran in counts), counts)
        bad = cli("chat", "-m", out, "--draft", "65", stdin="", check=False)
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("--draft", bad.stderr)

    def test_next_turn_of_a_recurrent_model_returns_to_a_checkpoint(self):
        # Qwen3-Next's recurrent states sum up every position, so a turn can return only where a state was kept. This
        # template opens "<think>" in the prompt and drops it from the history: the next turn shares the prompt up to
        # the generation prompt, where a checkpoint was kept (memory.kv_checkpoints), and the transcript is a cold
        # run's. Without checkpoints the turn runs from position 0.
        ckpt, out = os.path.join(WORK, "ckpt-qwen3_next"), os.path.join(WORK, "tiny-qwen3_next")
        if not os.path.exists(os.path.join(out, "manifest.json")):
            subprocess.run([sys.executable, GEN, "--arch", "qwen3_next", "--out", ckpt], check=True,
                           capture_output=True)
            cli("convert", "--input", ckpt, "--output", out)
        template = os.path.join(WORK, "think_dropped.jinja")
        with open(template, "w") as f:
            f.write("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")
        turns = "what does the river say\nand then what\n"
        # Sampled with a fixed seed: a tiny model's greedy tokens hardly depend on the states, its probabilities do.
        args = ["chat", "-m", out, "-n", "40", "--temp", "1", "--top-k", "0", "--top-p", "1", "--min-p", "0", "--seed",
                "5", "--template", template, "--system", "Be brief."]
        kept = cli(*args, stdin=turns)
        none = cli(*args, "--set", "memory.kv_checkpoints=0", stdin=turns)
        self.assertEqual(kept.stdout, none.stdout)
        reused = lambda p: [int(x.split(" reused")[0].rsplit(", ", 1)[1]) for x in p.stderr.splitlines()
                            if " reused from the cache" in x]
        prompt = lambda p: [int(x.split(" prompt tokens")[0].rsplit("(", 1)[1]) for x in p.stderr.splitlines()
                            if " reused from the cache" in x]
        self.assertEqual(reused(none), [0, 0])
        # The first turn's prompt less its generation prompt: the tokens it shares with the whole prompt.
        bare = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nwhat does the river say<|im_end|>\n"
        ids = lambda text: json.loads(cli("tokenize", "-m", out, "--text", text).stdout)["ids"]
        whole = ids(bare + "<|im_start|>assistant\n<think>\n")
        bare = next(i for i, (a, b) in enumerate(zip(ids(bare) + [None], whole)) if a != b)
        self.assertEqual(prompt(kept)[0], len(whole))
        self.assertEqual(reused(kept)[0], 0)
        self.assertGreater(prompt(kept)[0], bare)
        self.assertEqual(reused(kept)[1], bare)
        # The plan counts the checkpoints' copies of the states: 4 by default, each every linear layer's.
        with open(os.path.join(out, "manifest.json")) as f:
            hp = json.load(f)["hparams"]
        conv = 2 * hp["linear_k_heads"] * hp["linear_k_dim"] + hp["linear_v_heads"] * hp["linear_v_dim"]
        state = conv * (hp["linear_conv_kernel"] - 1) + hp["linear_v_heads"] * hp["linear_k_dim"] * hp["linear_v_dim"]
        plan = lambda *flags: json.loads(cli("profile", "show", "--model", out, "--ctx", "64", "--json",
                                             *flags).stdout)["memory_plan"]
        self.assertEqual(plan()["kv_checkpoint_bytes"], 4 * len(hp["linear_layers"]) * state * 4)
        self.assertEqual(plan()["kv_bytes"] - plan("--set", "memory.kv_checkpoints=0")["kv_bytes"],
                         plan()["kv_checkpoint_bytes"])
        self.assertIn("for up to 4 checkpoints (memory.kv_checkpoints)",
                      cli("profile", "show", "--model", out, "--ctx", "64").stdout)

    def test_commands_typos_and_failed_turns(self):
        p = cli("chat", "-m", model(), "-n", "2", stdin="/help\n/bogus\n/quit\nnever sent\n")
        self.assertIn("commands: /reset forgets the conversation", p.stderr)
        self.assertIn("unknown command /bogus;", p.stderr)
        self.assertNotIn("prompt tokens", p.stderr)  # no turn ran: neither the typo nor the line after /quit
        p = cli("chat", "-m", model(), "-n", "2", stdin="/usr/bin is a directory\n")
        self.assertIn("prompt tokens", p.stderr)  # a turn, not a command
        # A turn that cannot run (the conversation outgrew the context) makes the exit status 1 at the end.
        p = cli("chat", "-m", model(), "-n", "8", "--ctx", "32", "--temp", "0",
                stdin="Hello there\nmore words here\nand again more\nfinal\n", check=False)
        self.assertIn("no longer fits the context", p.stderr)
        self.assertEqual(p.returncode, 1)

    def test_an_unknown_template_is_refused(self):
        p = cli("chat", "-m", model(), "--template", "LLAMA2", stdin="Hello\n", check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("--chat-template LLAMA2 is neither a built-in (llama2, mistral, gpt-oss, chatml) nor a readable "
                      "file", p.stderr)
        p = cli("chat", "-m", model(), "--template", "mistrall", stdin="Hello\n", check=False)
        self.assertIn("(did you mean mistral?)", p.stderr)
        # A file that is not a chat template (it never reads messages) would drop the conversation: refused.
        plain = os.path.join(WORK, "not-a-template.txt")
        with open(plain, "w") as f:
            f.write("You are a helpful assistant.\n")
        p = cli("chat", "-m", model(), "--template", plain, stdin="Hello\n", check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("never reads `messages`, so the conversation would be left out of the prompt", p.stderr)
        p = cli("chat", "-m", model(), "-n", "2", "--template", "llama2", stdin="Hello\n")
        self.assertIn("template: built-in llama2", p.stderr)
        # --chat-template (as the server's) takes a file too, and wins over the model's own template.
        own = chat_model("tiny-own-template", "{% for m in messages %}[OWN]{{ m.content }}{% endfor %}", [])
        path = os.path.join(WORK, "mine.jinja")
        with open(path, "w") as f:
            f.write("{% for m in messages %}[MINE]{{ m.content }}{% endfor %}")
        self.assertIn("(template: tokenizer_config.json)", cli("chat", "-m", own, "-n", "1", stdin="Hi\n").stderr)
        p = cli("chat", "-m", own, "-n", "1", "--chat-template", path, stdin="Hi\n")
        self.assertIn(f"(template: {path})", p.stderr)
        n_mine = len(json.loads(cli("tokenize", "-m", own, "--text", "[MINE]Hi").stdout)["ids"])
        n_own = len(json.loads(cli("tokenize", "-m", own, "--text", "[OWN]Hi").stdout)["ids"])
        self.assertNotEqual(n_mine, n_own)
        self.assertIn(f"({n_mine} prompt tokens,", p.stderr)

    def test_a_template_that_does_not_parse_is_said_before_the_weights_load(self):
        # The load (minutes on a real model) never starts: its backend is not even created.
        broken = chat_model("tiny-broken-template", "{% for m in messages %}{{ m.content }}", [])
        p = cli("chat", "-m", broken, "-n", "1", stdin="Hi\n", check=False)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("the model's chat template does not parse", p.stderr)
        self.assertIn("give one with --chat-template", p.stderr)
        self.assertNotIn("compute cpu", p.stderr)
        # Named instead, a template lets the same model chat.
        p = cli("chat", "-m", broken, "-n", "1", "--chat-template", "chatml", stdin="Hi\n")
        self.assertIn("compute cpu", p.stderr)
        self.assertIn("(template: built-in chatml)", p.stderr)

    def test_harmony_thinking_goes_to_stderr_and_only_the_answer_to_the_history(self):
        # gpt-oss's harmony markers added to a copy of the tiny model's tokenizer (ids its embedding already has), and a
        # template whose generation prompt opens the analysis channel for a message "think", the final one otherwise.
        # A random model writes no harmony itself: every special token is banned, and each reply is checked against
        # `run` on the prompt the template renders for the history the chat should have kept.
        names = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>"]
        out = chat_model("tiny-harmony", (
            "{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endfor %}"
            "{% if add_generation_prompt %}<|start|>assistant<|channel|>"
            "{% if messages[-1].content == 'think' %}analysis{% else %}final{% endif %}<|message|>{% endif %}"), names)
        with open(os.path.join(out, "tokenizer.json")) as f:
            specials = [a["id"] for a in json.load(f)["added_tokens"]]
        bans = [f"--logit-bias={i}=-100" for i in specials]
        greedy = ["-n", "6", "--temp", "0"] + bans

        def render(*turns):
            path = os.path.join(WORK, "harmony_messages.json")
            with open(path, "w") as f:
                json.dump([{"role": r, "content": c} for r, c in turns], f)
            return cli("template", "--tokenizer-config", os.path.join(out, "tokenizer_config.json"), "--messages", path,
                       "--add-generation-prompt").stdout.rstrip("\n")

        def run(prompt):  # the continuation and the prompt's token count
            p = cli("run", "-m", out, "-p", prompt, "--no-special", "--ignore-eos", *greedy)
            count = int(re.search(r"\((\d+) prompt \+", p.stderr).group(1))
            return p.stdout[len(prompt):].rstrip("\n"), count

        p = cli("chat", "-m", out, *greedy, stdin="think\nanswer\n")
        thinking, _ = run(render(("user", "think")))
        self.assertGreater(len(thinking), 0)
        answer, count = run(render(("user", "think"), ("assistant", ""), ("user", "answer")))
        self.assertGreater(len(answer), 0)
        self.assertEqual(p.stdout, "\n" + answer + "\n")
        self.assertIn(thinking + "\n", p.stderr)
        stats = [line for line in p.stderr.splitlines() if "expert hit rate" in line]
        self.assertIn(f"({count} prompt tokens, ", stats[1])
        hidden = cli("chat", "-m", out, "--hide-reasoning", *greedy, stdin="think\n")
        self.assertNotIn(thinking, hidden.stderr)
        self.assertEqual(hidden.stdout, "\n")
        # Without the ban the splitter sees what the model writes; a marker never reaches the terminal.
        free = cli("chat", "-m", out, "-n", "24", "--temp", "0", stdin="think\nanswer\n")
        for name in names:
            self.assertNotIn(name, free.stdout + free.stderr)

    def test_a_turn_may_span_lines(self):
        # A line ending in a backslash goes on; a """ block holds pasted lines; each is one turn, whose text holds the
        # newlines (the same reply as the turn written with them through the template).
        greedy = ["-n", "4", "--temp", "0", "--template", "chatml"]
        p = cli("chat", "-m", model(), *greedy, stdin='first \\\nsecond\n"""\nthird\n\nfourth\n"""\n')
        stats = [l for l in p.stderr.splitlines() if "expert hit rate" in l]
        self.assertEqual(len(stats), 2, p.stderr)
        one = cli("chat", "-m", model(), *greedy, stdin='"""\nfirst \nsecond\n"""\n')
        self.assertEqual(p.stdout.splitlines()[0], one.stdout.splitlines()[0])
        self.assertRegex(stats[0], r"\((\d+) prompt tokens")
        self.assertEqual(re.search(r"\((\d+) prompt tokens", stats[0]).group(1),
                         re.search(r"\((\d+) prompt tokens",
                                   [l for l in one.stderr.splitlines() if "expert hit rate" in l][0]).group(1))

    def test_template_without_a_template_names_its_flag(self):
        cfg = os.path.join(WORK, "no-template", "tokenizer_config.json")
        os.makedirs(os.path.dirname(cfg), exist_ok=True)
        with open(cfg, "w") as f:
            json.dump({"bos_token": "<bos>", "eos_token": "<eos>"}, f)
        msgs = os.path.join(WORK, "no-template", "messages.json")
        with open(msgs, "w") as f:
            json.dump([{"role": "user", "content": "hi"}], f)
        p = cli("template", "--tokenizer-config", cfg, "--messages", msgs, check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("name one of llama2, mistral, gpt-oss, chatml with --family", p.stderr)
        p = cli("template", "--tokenizer-config", cfg, "--messages", msgs, "--family", "chatml")
        self.assertIn("<|im_start|>user\nhi<|im_end|>", p.stdout)

    def test_template_renders_a_conversation_with_tools_with_the_tool_use_template(self):
        # A named list (Hermes 2 Pro, Command R+): "tool_use" when the conversation has tools, as transformers does.
        cfg = os.path.join(WORK, "named-templates", "tokenizer_config.json")
        os.makedirs(os.path.dirname(cfg), exist_ok=True)
        with open(cfg, "w") as f:
            json.dump({"chat_template": [{"name": "default", "template": "D:{{ messages[0].content }}"},
                                         {"name": "tool_use", "template": "T:{{ tools[0].function.name }}"}]}, f)
        msgs = os.path.join(WORK, "named-templates", "messages.json")
        for body, want in (([{"role": "user", "content": "hi"}], "D:hi"),
                           ({"messages": [{"role": "user", "content": "hi"}],
                             "tools": [{"type": "function", "function": {"name": "f"}}]}, "T:f"),
                           ({"messages": [{"role": "user", "content": "hi"}], "tools": []}, "D:hi")):
            with open(msgs, "w") as f:
                json.dump(body, f)
            self.assertEqual(cli("template", "--tokenizer-config", cfg, "--messages", msgs).stdout, want)

    def test_a_think_block_goes_to_stderr(self):
        # Qwen3's way: the generation prompt opens <think> for a message "think" and closes an empty block otherwise.
        out = chat_model("tiny-think", (
            "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% if messages[-1].content == 'think' %}<think>\n"
            "{% else %}<think>\n\n</think>\n\n{% endif %}{% endif %}"))
        greedy = ["-n", "6", "--temp", "0"]
        p = cli("chat", "-m", out, *greedy, stdin="think\n")
        prompt = "<user>think</user><assistant><think>\n"
        q = cli("run", "-m", out, "-p", prompt, "--no-special", "--ignore-eos", *greedy)
        thinking = q.stdout[len(prompt):].strip()
        self.assertGreater(len(thinking), 0)
        self.assertEqual(p.stdout, "\n")
        self.assertIn(thinking, p.stderr)

    def test_logit_bias_is_checked(self):
        p = cli("chat", "-m", model(), "--logit-bias", "5:-100", stdin="Hello\n", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("'5:-100' is not TOKEN_ID=BIAS", p.stderr)
        p = cli("run", "-m", model(), "-p", "hi", "--logit-bias", "999999=1", check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--logit-bias: token id 999999 is outside the model's vocabulary of", p.stderr)
        p = cli("run", "-m", model(), "-p", "hi", "--logit-bias", "5=300", check=False)
        self.assertIn("must be in [-100, 100]", p.stderr)
        # A banned token never comes; the same bias twice is the same run.
        a = cli("run", "-m", model(), "-p", "The fox", "-n", "8", "--temp", "0", "--ignore-eos")
        b = cli("run", "-m", model(), "-p", "The fox", "-n", "8", "--temp", "0", "--ignore-eos", "--logit-bias",
                "0=100")
        self.assertNotEqual(a.stdout, b.stdout)


class Outputs(unittest.TestCase):
    def test_an_output_never_replaces_an_input(self):
        # Outputs are written whole at the end, over what was there: naming an input (or a file of the model) as
        # an output is refused before the work, and every input stays as it was.
        m = os.path.join(WORK, "outputs-model")
        if not os.path.exists(os.path.join(m, "manifest.json")):
            shutil.copytree(model(), m)
        text, schema = os.path.join(WORK, "outputs-text.txt"), os.path.join(WORK, "outputs-schema.json")
        with open(text, "w") as f:
            f.write("the quick brown fox jumps over the lazy dog " * 4)
        with open(schema, "w") as f:
            f.write('{"type": "object"}')
        # A profile file, and one it extends: outputs never replace them either.
        parent_prof, prof = os.path.join(WORK, "outputs-parent.yaml"), os.path.join(WORK, "outputs-profile.yaml")
        with open(parent_prof, "w") as f:
            f.write("extends: cpu\n")
        with open(prof, "w") as f:
            f.write("extends: outputs-parent.yaml\ndescription: the user's own\n")
        base = os.path.join(WORK, "outputs-base.logits")
        cli("perplexity", "-m", m, "--file", text, "--ctx", "8", "--save-logits", base)
        def contents():
            out = {}
            for path in [text, schema, base, prof, parent_prof] + [os.path.join(m, f) for f in sorted(os.listdir(m))]:
                if os.path.isfile(path):
                    with open(path, "rb") as f:
                        out[path] = f.read()
            return out
        before = contents()
        manifest = os.path.join(m, "manifest.json")
        npy = os.path.join(WORK, "outputs.npy")
        for args, want in [
                (["logits", "-m", m, "--tokens", "1,2", "--out", manifest], "--out " + manifest + " lies inside --model"),
                (["logits", "-m", m, "--tokens", "1,2", "--out", npy, "--trace", manifest], "--trace " + manifest),
                (["logits", "-m", m, "--tokens", "1,2", "--out", npy, "--trace", npy], "both name"),
                (["perplexity", "-m", m, "--file", text, "--ctx", "8", "--save-logits", text], "is --file"),
                (["perplexity", "-m", m, "--file", text, "--ctx", "8", "--save-logits", base, "--kl-base", base],
                 "is --kl-base"),
                (["perplexity", "-m", m, "--file", text, "--ctx", "8", "--save-logits", manifest], "lies inside --model"),
                (["run", "-m", m, "--prompt", "hi", "-n", "1", "--json-schema", schema, "--record-trace", schema],
                 "is --json-schema"),
                (["run", "-m", m, "--file", text, "-n", "1", "--record-trace", text], "is --file"),
                (["logits", "-m", m, "--profile", prof, "--tokens", "1,2", "--out", prof], "is the profile file"),
                (["perplexity", "-m", m, "--profile", prof, "--file", text, "--ctx", "8", "--save-logits", parent_prof],
                 "is the profile file " + parent_prof),
                (["run", "-m", m, "--profile", prof, "--prompt", "hi", "-n", "1", "--record-trace", prof],
                 "is the profile file")]:
            p = cli(*args, check=False)
            self.assertEqual(p.returncode, 1, args)
            self.assertIn(want, p.stderr, args)
            self.assertIn("name another file" if "both" not in want else "a file of its own", p.stderr)
            self.assertNotIn("compute", p.stderr, args)  # refused before the model loads (minutes on a real one)
        self.assertEqual(contents(), before)
        self.assertFalse(os.path.exists(npy))
        # A directory given for a text file is named as such.
        for args in (["run", "-m", m, "--file", WORK, "-n", "1"], ["perplexity", "-m", m, "--file", WORK]):
            p = cli(*args, check=False)
            self.assertIn(f"--file {WORK} is a directory", p.stderr)

    def test_an_output_that_cannot_be_written_is_said_before_the_load(self):
        missing = os.path.join(WORK, "no-such-dir", "x.npy")
        p = cli("logits", "-m", model(), "--tokens", "1,2", "--out", missing, check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn(f"--out {missing}: the directory {os.path.dirname(missing)} does not exist", p.stderr)
        self.assertNotIn("compute", p.stderr)
        # A read-only directory: a read-only mount where this runs as root (which file modes do not stop), else modes.
        ro = os.path.join(WORK, "read-only")
        os.makedirs(ro, exist_ok=True)
        mounted = False
        if os.geteuid() == 0:
            mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", ro],
                                     capture_output=True).returncode == 0
            if not mounted:
                self.skipTest("root without a read-only mount to test with")
        else:
            os.chmod(ro, 0o555)
        try:
            out = os.path.join(ro, "x.npy")
            for args in (["logits", "-m", model(), "--tokens", "1,2", "--out", out],
                         ["run", "-m", model(), "--prompt", "hi", "-n", "1", "--record-trace", out]):
                p = cli(*args, check=False)
                self.assertEqual(p.returncode, 1, args)
                self.assertIn(f"{out}: cannot write in {ro} (", p.stderr)
                self.assertNotIn("a leftover", p.stderr)
                self.assertNotIn("compute", p.stderr, args)  # before the model loads
        finally:
            if mounted:
                subprocess.run(["umount", ro])
            else:
                os.chmod(ro, 0o755)


class Perplexity(unittest.TestCase):
    def test_perplexity_and_kl_base(self):
        text = os.path.join(WORK, "text.txt")
        with open(text, "w") as f:
            f.write("The quick brown fox jumps over the lazy dog. " * 40)
        base = os.path.join(WORK, "base.logits")
        a = cli("perplexity", "-m", model(), "-f", text, "--ctx", "32", "--max-chunks", "2", "--save-logits", base)
        self.assertRegex(a.stdout, r"perplexity [0-9.]+ over 62 tokens")
        b = cli("perplexity", "-m", model(), "-f", text, "--ctx", "32", "--max-chunks", "2", "--kl-base", base)
        self.assertIn("KL(base || this) mean 0.000000 max 0.000000, top-1 agreement 100.00%", b.stdout)
        c = cli("perplexity", "-m", model(), "-f", text, "--ctx", "16", "--max-chunks", "2", "--kl-base", base,
                check=False)
        self.assertIn("was saved with --ctx 32, this run's is 16; give --ctx 32", c.stderr)
        # A base saved over more chunks serves a run of fewer (its first ones); one of fewer says how many it has.
        one = cli("perplexity", "-m", model(), "-f", text, "--ctx", "32", "--max-chunks", "1", "--kl-base", base)
        self.assertRegex(one.stdout, r"over 31 tokens")
        self.assertIn("KL(base || this) mean 0.000000 max 0.000000, top-1 agreement 100.00%", one.stdout)
        short_base = os.path.join(WORK, "base-1chunk.logits")
        cli("perplexity", "-m", model(), "-f", text, "--ctx", "32", "--max-chunks", "1", "--save-logits", short_base)
        more = cli("perplexity", "-m", model(), "-f", text, "--ctx", "32", "--max-chunks", "2", "--kl-base",
                   short_base, check=False)
        self.assertEqual(more.returncode, 1, more.stderr)
        self.assertIn("covers 1 chunk, this run scores 2; give --max-chunks 1", more.stderr)
        other = os.path.join(WORK, "other.txt")
        with open(other, "w") as f:
            f.write("Sphinx of black quartz, judge my vow. " * 40)
        o = cli("perplexity", "-m", model(), "-f", other, "--ctx", "32", "--max-chunks", "2", "--kl-base", base,
                check=False)
        self.assertEqual(o.returncode, 1, o.stderr)
        self.assertRegex(o.stderr, r"was saved from other text \(its token [0-9]+ differs\)")
        d = cli("perplexity", "-m", model(), "-f", text, "--max-chunks", "-1", check=False)  # was read as "all"
        self.assertEqual(d.returncode, 2)
        self.assertIn("--max-chunks: -1 is negative; give 0 (all) or more", d.stderr)
        # A model with a context shorter than the default chunk of 512: the chunk is its context, unless --ctx asks
        # for more, which is refused naming the flag the user gave.
        short = hparams_copy("tiny-short", max_position_embeddings=48)
        e = cli("perplexity", "-m", short, "-f", text, "--max-chunks", "1")
        self.assertRegex(e.stdout, r"perplexity [0-9.]+ over 47 tokens")
        f = cli("perplexity", "-m", short, "-f", text, "--ctx", "64", check=False)
        self.assertEqual(f.returncode, 2)
        self.assertIn("--ctx 64 exceeds the model's context (48 positions)", f.stderr)

    def test_the_manifest_is_read_once(self):
        # The default chunk (the model's context where that is shorter), the --ctx check and the load share one read
        # of manifest.json, which also checks every model file and hashes the tokenizer's.
        text = os.path.join(WORK, "text-once.txt")
        with open(text, "w") as f:
            f.write("The quick brown fox jumps over the lazy dog. " * 40)
        short = hparams_copy("tiny-short", max_position_embeddings=48)
        for ctx, tokens in (([], 47), (["--ctx", "32"], 31)):
            p, opens = manifest_opens(self, "perplexity", "-m", short, "-f", text, "--max-chunks", "1", *ctx)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertRegex(p.stdout, rf"perplexity [0-9.]+ over {tokens} tokens")
            self.assertEqual(len(opens), 1, f"{ctx}: " + "".join(opens))

    def test_bad_kl_base_leaves_no_partial_logits(self):
        text = os.path.join(WORK, "text2.txt")
        with open(text, "w") as f:
            f.write("Pack my box with five dozen liquor jugs. " * 40)
        base = os.path.join(WORK, "base2.logits")
        args = ["perplexity", "-m", model(), "-f", text, "--ctx", "32", "--max-chunks", "2"]
        cli(*args, "--save-logits", base)
        with open(base, "rb") as f:
            blob = f.read()
        out = os.path.join(WORK, "new2.logits")
        with open(out, "wb") as f:
            f.write(b"what the user had")
        for name, data, message in (("short", blob[:-4], "is truncated"), ("long", blob + b"\0" * 8, "more logits")):
            bad = os.path.join(WORK, f"{name}.logits")
            with open(bad, "wb") as f:
                f.write(data)
            p = cli(*args, "--kl-base", bad, "--save-logits", out, check=False)
            self.assertNotEqual(p.returncode, 0, name)
            self.assertIn(message, p.stderr)
            self.assertFalse(os.path.exists(out + ".partial"), f"{name}: a half-written .partial was left behind")
            with open(out, "rb") as f:
                self.assertEqual(f.read(), b"what the user had", f"{name}: the existing --save-logits file changed")


class Bench(unittest.TestCase):
    def test_json(self):
        p = cli("bench", "-m", model(), "--prompt-tokens", "16", "--gen-tokens", "4", "--json")
        j = json.loads(p.stdout)
        self.assertEqual(j["mode"], "resident")
        self.assertGreater(j["decode_tokens_per_second"], 0)
        self.assertGreater(j["active_weight_bytes_per_token"], 0)

    def test_ops_counts_and_times_every_backend_call(self):
        args = ["bench", "-m", model(), "--prompt-tokens", "8", "--json", "--no-warmup"]
        plain = json.loads(cli(*args, "--gen-tokens", "4").stdout)
        self.assertNotIn("op_times", plain)
        runs = {}
        for gen in (4, 8):
            j = json.loads(cli(*args, "--gen-tokens", str(gen), "--ops").stdout)
            self.assertGreater(j["expert_hits"] + j["expert_misses"], 0)
            decode = {op["name"]: op for op in j["op_times"]["decode"]}
            # Every decode step runs the same program: each call's count is a whole number per token.
            for name, op in decode.items():
                self.assertEqual(op["calls"] % gen, 0, (name, op))
            runs[gen] = {name: op["calls"] // gen for name, op in decode.items()}
            self.assertGreater(runs[gen]["matmul"], 0)
            self.assertEqual(runs[gen]["embedding"], 1)
            # The calls happen within the decode loop: their time is part of it.
            self.assertLessEqual(sum(op["seconds"] for op in decode.values()),
                                 gen / j["decode_tokens_per_second"] * 1.0001)
            prefill = {op["name"]: op["calls"] for op in j["op_times"]["prefill"]}
            self.assertEqual(prefill["embedding"], 1)  # the prompt in one chunk
        self.assertEqual(runs[4], runs[8])
        text = cli(*args[:-2], "--gen-tokens", "4", "--ops").stdout
        self.assertIn("ops        decode, per token", text)
        self.assertRegex(text, r"\n\s+matmul\s+\d+\.\d+\s+\d")
        self.assertIn("(outside the backend)", text)

    def test_bandwidth_bound_is_read_with_the_compute_threads(self):
        # The bound's bandwidth comes from as many threads as decode runs (one thread reads about half as fast).
        for threads in ("1", "2"):
            j = json.loads(cli("bench", "-m", model(), "--prompt-tokens", "4", "--gen-tokens", "2", "--json",
                               "--set", f"compute.threads={threads}").stdout)
            self.assertEqual(j["memory_read_bandwidth_threads"], int(threads))
            self.assertGreater(j["memory_read_bandwidth_bytes_per_second"], 0)
            self.assertAlmostEqual(j["decode_bandwidth_bound_tokens_per_second"],
                                   j["memory_read_bandwidth_bytes_per_second"] / j["active_weight_bytes_per_token"])
            # The probe's 256 MiB buffer comes after the run and is not part of the run's peak RSS (a tiny model).
            self.assertGreater(j["peak_rss_bytes"], 0)
            self.assertLess(j["peak_rss_bytes"], 200 << 20)

    def test_warms_up_where_the_expert_tiers_stay_as_they_are(self):
        m = model()
        # Resident: an unmeasured run first, its positions forgotten (the measured prompt and decode fill --ctx).
        args = ["bench", "-m", m, "--ctx", "32", "--prompt-tokens", "28", "--gen-tokens", "4", "--json"]
        warm = json.loads(cli(*args).stdout)
        cold = json.loads(cli(*args, "--no-warmup").stdout)
        self.assertEqual((warm["mode"], warm["warmup"], cold["warmup"]), ("resident", True, False))
        # The counters are the measured run's alone: the same lookups as without the warm-up.
        self.assertEqual(warm["expert_hits"] + warm["expert_misses"], cold["expert_hits"] + cold["expert_misses"])
        self.assertIn("warm-up run", cli(*args[:-1]).stdout)
        # Streaming: a warm-up would fill the cache the run measures, so only when asked for.
        with open(os.path.join(m, "manifest.json")) as f:
            slot = max((e["size"] + 4095) // 4096 * 4096 for e in json.load(f)["experts"])
        small = args + ["--expert-cache-size", str(2 * slot)]
        streamed, asked = json.loads(cli(*small).stdout), json.loads(cli(*small, "--warmup").stdout)
        self.assertEqual((streamed["mode"], streamed["warmup"], asked["warmup"]), ("streaming", False, True))
        self.assertEqual(asked["expert_misses"] + asked["expert_hits"], streamed["expert_misses"] + streamed["expert_hits"])
        self.assertLessEqual(asked["bytes_read"], streamed["bytes_read"])  # the warm-up's reads are not the run's
        p = cli(*args, "--warmup", "--no-warmup", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--no-warmup", p.stderr)


class BenchOutput(unittest.TestCase):
    def test_a_resident_run_reports_no_disk_rate(self):
        # Every expert of a resident model is read at load, before the clock starts: those reads over the run's
        # time made a 9 GB/s "disk" on this machine's 1 GB/s one.
        args = ["bench", "-m", model(), "--prompt-tokens", "8", "--gen-tokens", "2"]
        j = json.loads(cli(*args, "--json").stdout)
        self.assertEqual(j["mode"], "resident")
        self.assertGreater(j["bytes_read"], 0)  # the load's reads, still counted as read
        self.assertEqual((j["disk_bytes_per_second"], j["decode_disk_bytes_per_second"]), (0.0, 0.0))
        text = cli(*args).stdout
        self.assertIn("streaming  none: every expert resident (read at load)", text)
        self.assertIn("decode     2 tokens:", text)


class ConvertSummary(unittest.TestCase):
    def test_tensors_kept_in_another_type_are_listed_as_kept(self):
        # A q8_0 GGUF converted with q4_k_m keeps its q8_0 tensors (re-quantizing would only lose more). The summary
        # read "q4_k -> q8_0", as if they had been converted into q8_0.
        ckpt, gguf = os.path.join(WORK, "ckpt-gguf"), os.path.join(WORK, "tiny-q8.gguf")
        out = os.path.join(WORK, "from-gguf")
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run([sys.executable, GEN, "--arch", "mixtral", "--out", ckpt, "--gguf", gguf, "--gguf-dtype",
                        "q8_0"], check=True, capture_output=True)
        p = cli("convert", "--input", gguf, "--output", out, "--quantize", "q4_k_m")
        kept = [line for line in p.stdout.splitlines() if "already quantized in the input" in line]
        self.assertTrue(kept, p.stdout)
        for line in kept:
            self.assertRegex(line, r"^\s+\d+ x q8_0 instead of q\d_k \(already quantized in the input")


    def test_a_model_named_with_250_bytes_converts_runs_and_keeps_its_history(self):
        # The names colibri derives from it (the hidden sibling convert writes into, the usage history file and its
        # lock) would pass the 255 bytes a name may have: they are shortened with a hash.
        model()  # the checkpoint
        parent = os.path.join(WORK, "long-names")
        shutil.rmtree(parent, ignore_errors=True)
        os.makedirs(parent)
        out = os.path.join(parent, "m" * 250)
        cli("convert", "--input", os.path.join(WORK, "ckpt"), "--output", out, "--quantize", "q8_0")
        cli("convert", "--input", os.path.join(WORK, "ckpt"), "--output", out, "--quantize", "q8_0", "--force")
        self.assertEqual(os.listdir(parent), ["m" * 250])  # no hidden sibling left
        env = history_env("long-names-history")
        p = subprocess.run([CLI, "run", "-m", out, "-p", "hi", "-n", "2"], capture_output=True, text=True, env=env)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("not saved", p.stderr)
        p = subprocess.run([CLI, "cache", "stats", "--model", out], capture_output=True, text=True, env=env)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("uses", p.stdout)


class UnreadableFiles(unittest.TestCase):
    def test_an_expert_file_the_user_cannot_read_is_refused_at_load_and_not_blamed_on_convert(self):
        # A run printed part of its answer, then stopped at the expert it could not open; inspect --verify told the
        # user to re-run convert. Permissions are checked at load now, and named as the fix. Root reads anything:
        # then the commands run as nobody (setpriv), where the build tree lets them.
        as_user = []
        if os.geteuid() == 0:
            if shutil.which("setpriv") is None:
                self.skipTest("root, and no setpriv to run as another user")
            as_user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        tmp = tempfile.mkdtemp(prefix="colibri-perm-")
        try:
            copy = os.path.join(tmp, "m")
            shutil.copytree(model(), copy)
            for root, dirs, files in os.walk(tmp):
                os.chmod(root, 0o755)
                for f in files:
                    os.chmod(os.path.join(root, f), 0o644)
            locked = os.path.join(copy, "experts", "L001", "E002.bin")
            os.chmod(locked, 0)
            env = dict(os.environ, HOME=tmp, XDG_CACHE_HOME=tmp, XDG_DATA_HOME=tmp, XDG_CONFIG_HOME=tmp)
            probe = subprocess.run(as_user + [CLI, "--version"], capture_output=True, text=True, env=env)
            if probe.returncode != 0:
                self.skipTest(f"colibri-cli cannot run as another user here: {probe.stderr.strip()}")
            p = subprocess.run(as_user + [CLI, "run", "-m", copy, "-p", "hi", "-n", "3", "--expert-cache-size", "1"],
                               capture_output=True, text=True, env=env, timeout=120)
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertEqual(p.stdout, "")  # refused before any answer
            self.assertIn("experts/L001/E002.bin cannot be read: Permission denied", p.stderr)
            self.assertNotIn("re-run convert", p.stderr)
            p = subprocess.run(as_user + [CLI, "inspect", copy, "--verify"], capture_output=True, text=True, env=env,
                               timeout=120)
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn("verify:        1 problem(s)", p.stdout)
            problems = [line for line in p.stdout.splitlines() if "E002.bin" in line]
            self.assertEqual(len(problems), 1, p.stdout + p.stderr)
            self.assertIn("E002.bin cannot be read: Permission denied", problems[0])
            self.assertNotIn("re-run convert", problems[0])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class MemoryPlan(unittest.TestCase):
    """profile show --model: what the model takes where, before loading, as the engine then sizes it."""

    def test_the_plan_reads_the_manifest_once(self):
        # The plan and the --ctx check share one read of manifest.json (which checks every model file).
        p, opens = manifest_opens(self, "profile", "show", "--model", model(), "--ctx", "64")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(len(opens), 1, "".join(opens))

    def test_plan_matches_the_manifest_and_the_engine(self):
        m = model()
        with open(os.path.join(m, "manifest.json")) as f:
            man = json.load(f)
        hp = man["hparams"]
        slot = max((e["size"] + 4095) // 4096 * 4096 for e in man["experts"])
        flags = ["--expert-cache-size", str(2 * slot), "--vram-budget", str(3 * slot)]
        gpu = ["--set", "compute.backend=vulkan"]  # planned as a device with memory of its own; nothing loads it
        plan = json.loads(cli("profile", "show", "--model", m, "--ctx", "64", "--json", *flags, *gpu).stdout)[
            "memory_plan"]
        self.assertEqual(plan["shared_bytes"], sum(t["size"] for t in man["tensors"]))
        self.assertEqual(plan["expert_bytes"], sum(e["size"] for e in man["experts"]))
        self.assertEqual((plan["mode"], plan["slot_bytes"], plan["ram_slots"], plan["ram_expert_bytes"]),
                         ("streaming", slot, 2, 2 * slot))
        self.assertEqual((plan["vram_slots"], plan["vram_expert_bytes"]), (3, 3 * slot))
        kv = 64 * 2 * hp["num_layers"] * hp["num_kv_heads"] * hp["head_dim"] * 2  # K and V, f16
        self.assertEqual((plan["context"], plan["kv_bytes"]), (64, kv))
        self.assertEqual(plan["kv_checkpoint_bytes"], 0, "full attention alone needs no checkpoint")
        self.assertEqual(plan["host_bytes_at_most"], plan["shared_bytes"] + 2 * slot + kv)
        # The server's --max-batch sequences each hold such a cache.
        batch = json.loads(cli("profile", "show", "--model", m, "--ctx", "64", "--max-batch", "4", "--json",
                               *flags).stdout)["memory_plan"]
        self.assertEqual((batch["kv_bytes"], batch["kv_sequences"], batch["kv_bytes_all"]), (kv, 4, 4 * kv))
        self.assertEqual(batch["host_bytes_at_most"], plan["shared_bytes"] + 2 * slot + 4 * kv)
        self.assertIn("the server's 4 sequences (--max-batch) hold up to",
                      cli("profile", "show", "--model", m, "--ctx", "64", "--max-batch", "4").stdout)
        self.assertEqual(cli("profile", "show", "--model", m, "--max-batch", "0", check=False).returncode, 2)
        # A draft model (the model itself here) takes half the expert cache at most, RAM for its weights, and a KV
        # cache beside each sequence's, as the server and run count them.
        drafted = json.loads(cli("profile", "show", "--model", m, "--ctx", "64", "--max-batch", "4", "--json",
                                 "--expert-cache-size", str(4 * slot), "--draft-model", m).stdout)["memory_plan"]
        d = drafted["draft_model"]
        self.assertEqual((d["model"], d["expert_cache_bytes"], drafted["expert_cache_bytes"]), (m, 2 * slot, 2 * slot))
        self.assertEqual(d["ram_bytes"], plan["shared_bytes"] + 2 * slot)
        self.assertEqual((d["kv_bytes"], drafted["kv_bytes_all"]), (kv, 4 * 2 * kv))
        self.assertEqual(drafted["host_bytes_at_most"], plan["shared_bytes"] + 2 * slot + d["ram_bytes"] + 8 * kv)
        self.assertIsNone(batch["draft_model"])
        text = cli("profile", "show", "--model", m, "--ctx", "64", "--draft-model", m).stdout
        self.assertIn(f"draft model     {m}: ", text)
        self.assertIn("(shared + RAM tier + draft model + KV caches)", text)
        missing = cli("profile", "show", "--model", m, "--draft-model", m + "-nowhere", check=False)
        self.assertEqual(missing.returncode, 1, missing.stderr)
        self.assertIn("--draft-model", missing.stderr)
        # The cpu backend has no device memory: a run ignores the VRAM budget (warned), and the plan says so.
        on_cpu = json.loads(cli("profile", "show", "--model", m, "--ctx", "64", "--json", *flags).stdout)[
            "memory_plan"]
        self.assertEqual((on_cpu["vram_slots"], on_cpu["vram_budget_ignored_bytes"]), (0, 3 * slot))
        self.assertIn("ignored: compute backend cpu has no device memory",
                      cli("profile", "show", "--model", m, "--vram-budget", "1K").stdout)
        run = cli("run", "-m", m, "-p", "hi", "-n", "1", "--vram-budget", "1K")
        self.assertIn("memory.vram_budget (1K) ignored: compute backend cpu has no device memory", run.stderr)
        bench = json.loads(cli("bench", "-m", m, "--ctx", "64", "--prompt-tokens", "4", "--gen-tokens", "2", "--json",
                               *flags).stdout)
        self.assertEqual((bench["mode"], bench["context"], bench["buffers_mapped"]),
                         (plan["mode"], plan["context"], plan["ram_slots"]))
        text = cli("profile", "show", "--model", m, "--ctx", "64", *flags).stdout
        self.assertIn("streaming, 2 slots of", text)
        self.assertIn("64 positions", text)
        q8 = json.loads(cli("profile", "show", "--model", m, "--ctx", "64", "--kv-type", "q8_0", "--json").stdout)
        self.assertLess(q8["memory_plan"]["kv_bytes"], kv)
        self.assertEqual(q8["memory_plan"]["mode"], "resident")  # the automatic RAM tier holds this tiny model

    def test_bad_plans_are_the_engines_errors(self):
        m = model()
        p = cli("profile", "show", "--model", m, "--vram-budget", "1K", "--set", "compute.backend=vulkan", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("memory.vram_budget", p.stderr)
        p = cli("profile", "show", "--model", m, "--ctx", "100000000", check=False)
        self.assertEqual(p.returncode, 2)  # a refused option value, as run refuses it
        self.assertIn("exceeds the model's context", p.stderr)
        p = cli("profile", "show", "--model", os.path.join(WORK, "no-such-model"), check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("no-such-model", p.stderr)
        # A run names where the refused memory value was set; the command line's is a usage error.
        p = cli("run", "-m", m, "-p", "hi", "-n", "1", "--set", "memory.kv_cache=100", check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("memory.kv_cache (100 bytes) holds no position", p.stderr)
        self.assertIn("memory.kv_cache = 100 is from command line --set memory.kv_cache=100", p.stderr)
        # A context past the model's is refused before the weights load (no backend started).
        p = cli("run", "-m", m, "-p", "hi", "-n", "1", "--ctx", "100000000", check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--ctx 100000000 exceeds the model's context", p.stderr)
        self.assertNotIn("compute cpu", p.stderr)


if __name__ == "__main__":
    CLI, GEN, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(WORK, exist_ok=True)
    unittest.main(argv=[sys.argv[0]] + sys.argv[4:], verbosity=2)
