#!/usr/bin/python3
"""colibri-cli ab: trace recording (run, bench), import, replay (text, JSON, per-layer, bad input) and the HTML report
rendered in headless Chromium. Usage: ab_test.py COLIBRI_CLI MAKE_TINY_MODEL WORKDIR"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

CLI = GEN = WORK = None


def cli(*args, check=True):
    p = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"{args} failed ({p.returncode}): {p.stderr}")
    return p


_model = None


def model():
    global _model
    if _model is None:
        ckpt, out = os.path.join(WORK, "ckpt"), os.path.join(WORK, "model")
        shutil.rmtree(WORK, ignore_errors=True)
        os.makedirs(WORK)
        subprocess.run(["/usr/bin/python3", GEN, "--arch", "mixtral", "--out", ckpt], check=True, capture_output=True)
        cli("convert", "--input", ckpt, "--output", out, "--quantize", "q8_0")
        _model = out
    return _model


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class Trace(unittest.TestCase):
    def test_run_and_bench_record_every_token_and_layer(self):
        m = model()
        with open(os.path.join(m, "manifest.json")) as f:
            manifest = json.load(f)
        hp = manifest["hparams"]
        layers = sum(1 for e in manifest["experts"] if e["expert"] == 0)
        t = os.path.join(WORK, "bench.jsonl")
        cli("bench", "-m", m, "--prompt-tokens", "12", "--gen-tokens", "5", "--record-trace", t)
        recs = read_jsonl(t)
        self.assertEqual(len(recs), (12 + 5) * layers)
        for r in recs:
            self.assertEqual(list(r)[:4], ["request", "position", "token", "layer"])
            self.assertEqual(len(r["experts"]), len(r["weights"]))
            self.assertTrue(all(0 <= e < hp.get("num_experts", 1 << 30) for e in r["experts"]))
        # Decode records come token by token, every layer in order.
        decode = recs[12 * layers:]
        self.assertEqual([r["position"] for r in decode], [12 + i // layers for i in range(5 * layers)])
        # Steps: the 12 prompt tokens ran as one forward pass, each decoded token as one more.
        self.assertEqual(len({r["step"] for r in recs[:12 * layers]}), 1)
        self.assertEqual([r["step"] for r in decode], sorted(r["step"] for r in decode))
        self.assertEqual(len({r["step"] for r in decode}), 5)
        t2 = os.path.join(WORK, "run.jsonl")
        p = cli("run", "-m", m, "--prompt", "hello there", "-n", "4", "--seed", "3", "--ignore-eos",
                "--record-trace", t2)
        recs = read_jsonl(t2)
        positions = sorted({r["position"] for r in recs})
        self.assertEqual(positions, list(range(len(positions))))
        self.assertEqual(len(recs), len(positions) * layers)
        self.assertIn("routing trace", p.stderr)
        # As the run ran: the prompt in one pass, then a pass per decoded token (a step per position).
        steps = {r["position"]: r["step"] for r in recs}
        self.assertEqual(len({r["step"] for r in recs}), 1 + 3)  # -n 4: the last token never runs
        self.assertEqual(len({steps[q] for q in positions[-3:]}), 3)

    def test_import_csv_and_json(self):
        csv = os.path.join(WORK, "t.csv")
        with open(csv, "w") as f:
            f.write("request,position,layer,expert,weight\n0,0,0,3,0.7\n0,0,0,1,0.3\n0,0,1,2,1\n0,1,0,3,1\n")
        out = os.path.join(WORK, "csv.jsonl")
        cli("ab", "import", csv, "--format", "csv", "-o", out)
        recs = read_jsonl(out)
        self.assertEqual([(r["position"], r["layer"], r["experts"]) for r in recs],
                         [(0, 0, [3, 1]), (0, 1, [2]), (1, 0, [3])])
        self.assertAlmostEqual(recs[0]["weights"][0], 0.7, places=5)
        with open(csv, "w") as f:
            f.write("step,position,layer,expert\n7,0,0,3\n7,0,0,1\n7,1,0,3\n8,2,0,2\n")
        cli("ab", "import", csv, "--format", "csv", "-o", out)
        self.assertEqual([(r["step"], r["position"], r["experts"]) for r in read_jsonl(out)],
                         [(7, 0, [3, 1]), (7, 1, [3]), (8, 2, [2])])
        js = os.path.join(WORK, "t.json")
        with open(js, "w") as f:
            json.dump([{"layer": 0, "experts": [1, 2]}, {"layer": 1, "experts": [0, 3]},
                       {"layer": 0, "experts": [2, 3]}], f)
        out = os.path.join(WORK, "json.jsonl")
        cli("ab", "import", js, "--format", "json", "-o", out)
        self.assertEqual([(r["position"], r["layer"]) for r in read_jsonl(out)], [(0, 0), (0, 1), (1, 0)])
        # Bad input: the file and line are named, nothing is written.
        with open(csv, "w") as f:
            f.write("layer,expert\n0,1\n0,x\n")
        bad_out = os.path.join(WORK, "bad_import.jsonl")
        p = cli("ab", "import", csv, "--format", "csv", "-o", bad_out, check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("t.csv:3", p.stderr)
        self.assertFalse(os.path.exists(bad_out))
        p = cli("ab", "import", csv, "--format", "xml", "-o", bad_out, check=False)
        self.assertIn("csv or json", p.stderr)
        self.assertEqual(p.returncode, 2)  # a refused option value
        # A weight that is no finite number would be written as null, which replay refuses: refused at import.
        for weight in ("nan", "inf", "-inf"):
            with open(csv, "w") as f:
                f.write(f"layer,expert,weight\n0,1,0.5\n0,2,{weight}\n")
            p = cli("ab", "import", csv, "--format", "csv", "-o", bad_out, check=False)
            self.assertIn(f"t.csv:3: column weight: '{weight}' is not a finite number", p.stderr)
            self.assertFalse(os.path.exists(bad_out))
        # Quoted cells, as spreadsheets write them, read as plain ones; a column named twice, or an empty file, is
        # named (the empty file by its name alone: it has no line).
        with open(csv, "w") as f:
            f.write('"layer", "expert" ,"weight"\n0,"3","0.5"\n')
        cli("ab", "import", csv, "--format", "csv", "-o", out)
        self.assertEqual([(r["layer"], r["experts"]) for r in read_jsonl(out)], [(0, [3])])
        for text, words in (("layer,expert,layer\n0,1,0\n", 't.csv:1: the column "layer" appears twice'),
                            ("", "t.csv: the CSV is empty: it needs a header line")):
            with open(csv, "w") as f:
                f.write(text)
            p = cli("ab", "import", csv, "--format", "csv", "-o", bad_out, check=False)
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn(words, p.stderr)
            self.assertFalse(os.path.exists(bad_out))
        # A token's experts are distinct: a repeated id (CSV rows or a JSON list) is named, not counted twice.
        with open(csv, "w") as f:
            f.write("position,layer,expert\n0,0,1\n0,0,2\n0,0,1\n")
        p = cli("ab", "import", csv, "--format", "csv", "-o", bad_out, check=False)
        self.assertIn("t.csv:4: expert 1 is listed twice for layer 0 of one token", p.stderr)
        self.assertFalse(os.path.exists(bad_out))
        with open(js, "w") as f:
            json.dump([{"layer": 0, "experts": [1, 2]}, {"layer": 1, "experts": [3, 3]}], f)
        p = cli("ab", "import", js, "--format", "json", "-o", bad_out, check=False)
        self.assertIn("record [1]", p.stderr)
        self.assertIn("lists expert 3 twice", p.stderr)


class Replay(unittest.TestCase):
    def trace(self):
        m = model()  # first: it starts WORK afresh
        t = os.path.join(WORK, "replay.jsonl")
        if not os.path.exists(t):
            cli("bench", "-m", m, "--prompt-tokens", "24", "--gen-tokens", "24", "--record-trace", t)
        return t

    def test_json_sizes_policies_and_bound(self):
        p = cli("ab", "replay", "--trace", self.trace(), "-m", model(), "--policy", "lru", "--policy", "frequency",
                "--policy", "pinned:0:1", "--cache-experts", "8,3,4", "--per-layer", "--json")
        j = json.loads(p.stdout)
        self.assertEqual([s["cache_experts"] for s in j["sizes"]], [3, 4, 8])
        for s in j["sizes"]:
            self.assertEqual([x["policy"] for x in s["policies"]], ["lru", "frequency", "pinned:0:1"])
            for x in s["policies"]:
                self.assertGreaterEqual(x["reads"], s["optimal"]["reads"])
                self.assertEqual(sum(l["hits"] for l in x["per_layer"]), x["hits"])
            self.assertGreater(s["optimal"]["bytes_read"], 0)
        # 8 experts hold the whole tiny model: resident, every access hits.
        self.assertEqual(j["sizes"][-1]["policies"][0]["hit_rate"], 1.0)

    def test_text_output_and_bad_input(self):
        p = cli("ab", "replay", "--trace", self.trace(), "--policy", "lru", "--cache-experts", "3", "--expert-bytes",
                "1048576")
        self.assertIn("optimal (Belady)", p.stdout)
        self.assertIn("replayed", p.stdout)
        # A policy given twice ties with itself under names of their own; each size ends with the fewest reads, and
        # a size past the experts the trace uses says that all fit.
        args = ["ab", "replay", "--trace", self.trace(), "-m", model(), "--policy", "lru", "--policy", "frequency",
                "--policy", "lru", "--cache-experts", "3,999"]
        j = json.loads(cli(*args, "--json").stdout)
        text = cli(*args).stdout
        rows = {l.split()[0] + (" " + l.split()[1] if l.split()[1].startswith("#") else ""): l
                for l in text.splitlines() if l.startswith("  lru") or l.startswith("  frequency")}
        self.assertIn("lru #1", rows)
        self.assertIn("lru #2", rows)
        self.assertEqual([x["policy"] for x in j["sizes"][0]["policies"]], ["lru #1", "frequency", "lru #2"])
        small = j["sizes"][0]
        fewest = min(x["reads"] for x in small["policies"])
        winners = " = ".join(x["policy"] for x in small["policies"] if x["reads"] == fewest)
        self.assertIn(f"fewest reads: {winners} with {fewest} (", text)
        self.assertIn(f"the optimum's {small['optimal']['reads']})", text)
        # With the model, the count is the model's experts; from the trace alone, those it uses (fewer here).
        of_model = re.search(r"cache 999 experts \(.*more than the (\d+) experts the model has: all fit\)", text)
        self.assertIsNotNone(of_model, text)
        alone = cli("ab", "replay", "--trace", self.trace(), "--policy", "lru", "--cache-experts", "999",
                    "--expert-bytes", "1M").stdout
        used = re.search(r"cache 999 experts \(.*more than the (\d+) experts the trace uses: all fit\)", alone)
        self.assertIsNotNone(used, alone)
        with open(self.trace()) as f:
            distinct = {(r["layer"], e) for r in map(json.loads, f) if "layer" in r for e in r["experts"]}
        self.assertEqual(int(used.group(1)), len(distinct))
        self.assertLessEqual(len(distinct), int(of_model.group(1)))
        # A size as every other size flag takes it; nonsense is named.
        suffixed = cli("ab", "replay", "--trace", self.trace(), "--policy", "lru", "--cache-experts", "3",
                       "--expert-bytes", "1M")
        untimed = lambda text: re.sub(r" in [0-9.]+ s$", "", text, flags=re.M)  # the replay's own time varies
        self.assertEqual(untimed(suffixed.stdout), untimed(p.stdout))
        bad = cli("ab", "replay", "--trace", self.trace(), "--policy", "lru", "--cache-experts", "3",
                  "--expert-bytes", "lots", check=False)
        self.assertEqual(bad.returncode, 2)  # a refused option value
        self.assertIn("--expert-bytes lots:", bad.stderr)
        p = cli("ab", "replay", "--trace", self.trace(), "--policy", "nosuch", "--cache-experts", "3", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("nosuch", p.stderr)
        bad = os.path.join(WORK, "bad.jsonl")
        with open(bad, "w") as f:
            f.write('{"layer": 0, "experts": [1]}\n{"layer": 0}\n')
        p = cli("ab", "replay", "--trace", bad, "--policy", "lru", "--cache-experts", "3", check=False)
        self.assertIn("bad.jsonl:2", p.stderr)
        self.assertIn("experts", p.stderr)
        # Two pinned experts in a cache of one leave no room.
        p = cli("ab", "replay", "--trace", self.trace(), "-m", model(), "--policy", "pinned:0:0,0:1",
                "--cache-experts", "1", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("the 1 pinned so far fill it; give a larger --cache-experts or pin fewer experts", p.stderr)
        # A trace that skips some of the model's sparse layers is another model's, whose ids happen to fit: warned.
        one_layer = os.path.join(WORK, "one-layer.jsonl")
        with open(self.trace()) as f, open(one_layer, "w") as out:
            out.writelines(l for l in f if json.loads(l)["layer"] == 0)
        p = cli("ab", "replay", "--trace", one_layer, "-m", model(), "--policy", "lru", "--cache-experts", "4")
        self.assertRegex(p.stderr, r"routes through 1 of the model's \d+ sparse layers; a trace of another model\?")
        p = cli("ab", "replay", "--trace", self.trace(), "-m", model(), "--policy", "lru", "--cache-experts", "4")
        self.assertNotIn("a trace of another model", p.stderr)
        # A prompts file that cannot be read says why, in the OS's words; a directory is no prompts file.
        missing = os.path.join(WORK, "no-prompts.txt")
        p = cli("ab", "live", "-m", model(), "--profile", "cpu", "--profile", "cpu", "--prompts", missing, check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn(f"cannot read --prompts {missing}: No such file or directory", p.stderr)
        p = cli("ab", "live", "-m", model(), "--profile", "cpu", "--profile", "cpu", "--prompts", WORK, check=False)
        self.assertIn(f"--prompts {WORK} is a directory", p.stderr)
        # The summary counts the layers the trace routes through, not the highest one + 1.
        second_layer = os.path.join(WORK, "second-layer.jsonl")
        with open(self.trace()) as f, open(second_layer, "w") as out:
            out.writelines(l for l in f if json.loads(l)["layer"] == 1)
        p = cli("ab", "replay", "--trace", second_layer, "--expert-bytes", "4K", "--policy", "lru",
                "--cache-experts", "4")
        self.assertRegex(p.stdout, r"expert accesses, 1 layers\n")
        # A pin the model does not have is not a size problem.
        p = cli("ab", "replay", "--trace", self.trace(), "-m", model(), "--policy", "pinned:9:9", "--cache-experts",
                "4", check=False)
        self.assertIn("names L9/E9, which this model does not have", p.stderr)
        self.assertNotIn("larger cache", p.stderr)
        self.assertEqual(p.returncode, 2, p.stderr)  # the --policy value's mistake
        # A pin list that is empty, ends in a comma or names one expert twice; an expert of no bytes; each once named.
        for args, words in ((["-m", model(), "--policy", "pinned:"], "write the experts to pin as pinned:LAYER:EXPERT"),
                            (["-m", model(), "--policy", "pinned:0:1,"], "write the experts to pin as pinned:"),
                            (["-m", model(), "--policy", "pinned:0:1,0:1"], "pins 0:1 twice; give it once"),
                            (["-m", model(), "--policy", "pinned:x"], "--policy pinned:x: cache.pinned_experts: 'x'"),
                            (["--policy", "lru", "--expert-bytes", "0"], "--expert-bytes 0: an expert has at least 1")):
            p = cli("ab", "replay", "--trace", self.trace(), *args, "--cache-experts", "4", check=False)
            self.assertEqual(p.returncode, 2, (args, p.stderr))
            self.assertIn(words, p.stderr, args)
            self.assertEqual(p.stderr.count("--policy pinned:x"), 1 if "pinned:x" in args else 0, p.stderr)
        # A bad policy option names the --policy argument it came from.
        p = cli("ab", "replay", "--trace", self.trace(), "-m", model(), "--policy", "lru:bogus=1", "--cache-experts",
                "4", check=False)
        self.assertIn("--policy lru:bogus=1: unknown key 'cache.bogus'", p.stderr)
        self.assertEqual(p.returncode, 2)  # the command line's value, refused by the plugin: a usage error
        p = cli("ab", "replay", "--trace", self.trace(), "-m", model(), "--policy", "frequency:half_life=abc",
                "--cache-experts", "4", check=False)
        self.assertIn("'abc' is not an integer", p.stderr)
        self.assertEqual(p.returncode, 2)
        p = cli("ab", "replay", "--trace", self.trace(), "-m", model(), "--policy", "lru", "--set", "cache.bogus=1",
                "--cache-experts", "4", check=False)
        self.assertIn("unknown key 'cache.bogus'", p.stderr)
        self.assertEqual(p.returncode, 2)
        # The report never replaces the profile it was given.
        prof = os.path.join(WORK, "report-is-profile.yaml")
        with open(prof, "w") as f:
            f.write("extends: cpu\n")
        p = cli("ab", "replay", "--trace", self.trace(), "-m", model(), "--policy", "lru", "--cache-experts", "4",
                "--profile", prof, "--report", prof, check=False)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn(f"--report {prof} is the profile file", p.stderr)
        with open(prof) as f:
            self.assertEqual(f.read(), "extends: cpu\n")
        # A policy that is not installed is not a usage error.
        p = cli("ab", "replay", "--trace", self.trace(), "-m", model(), "--policy", "nosuch", "--cache-experts", "4",
                check=False)
        self.assertIn("no cache plugin named 'nosuch'", p.stderr)
        self.assertEqual(p.returncode, 1)
        # A --policy that is not spelled as one is refused as any bad flag value is (2); one key twice is said so.
        for spec, words in ((":x", "names no policy"), ("lru:x", "write settings as NAME:key=value"),
                            ("frequency:half_life=8;half_life=9", "sets half_life twice; give it once")):
            p = cli("ab", "replay", "--trace", self.trace(), "-m", model(), "--policy", spec, "--cache-experts", "4",
                    check=False)
            self.assertEqual(p.returncode, 2, (spec, p.stderr))
            self.assertIn(words, p.stderr)
        p = cli("ab", "replay", "--trace", self.trace(), "-m", model(), "--expert-bytes", "4096", "--policy", "lru",
                "--cache-experts", "4", check=False)
        self.assertIn("give --model or --expert-bytes, not both", p.stderr)
        p = cli("ab", "replay", "--trace", self.trace(), "--policy", "lru", "--cache-experts", "99999999999999",
                check=False)
        self.assertIn("--cache-experts: 99999999999999 is more experts than a cache can hold", p.stderr)
        self.assertEqual(p.returncode, 2)  # a refused option value
        p = cli("ab", "replay", "--trace", self.trace(), "--policy", "lru", "--cache-experts", "8,0", check=False)
        self.assertIn("'0' is not a positive expert count", p.stderr)
        self.assertEqual(p.returncode, 2)

    def test_expert_bytes_are_counted_in_4k_units_as_the_files_are(self):
        # 5 experts of 5000 bytes fill 5 slots of 8 KiB: not the 40000 bytes of all 8, so the cache streams.
        odd = json.loads(cli("ab", "replay", "--trace", self.trace(), "--policy", "lru", "--cache-experts", "5",
                             "--expert-bytes", "5000", "--json").stdout)
        even = json.loads(cli("ab", "replay", "--trace", self.trace(), "--policy", "lru", "--cache-experts", "5",
                              "--expert-bytes", "8192", "--json").stdout)
        self.assertEqual(odd["sizes"][0]["policies"][0]["hits"], even["sizes"][0]["policies"][0]["hits"])
        self.assertGreaterEqual(odd["sizes"][0]["optimal"]["hits"], odd["sizes"][0]["policies"][0]["hits"])

    def test_outputs_never_replace_their_inputs(self):
        trace = os.path.join(WORK, "precious.jsonl")
        shutil.copy(self.trace(), trace)
        def text():
            with open(trace) as f:
                return f.read()
        before = text()
        p = cli("ab", "replay", "--trace", trace, "--policy", "lru", "--cache-experts", "3", "--report", trace,
                check=False)
        self.assertIn("is --trace", p.stderr)
        self.assertEqual(text(), before)
        p = cli("ab", "import", trace, "--format", "json", "-o", trace, check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertEqual(text(), before)
        p = cli("bench", "-m", model(), "--prompt-tokens", "2", "--gen-tokens", "1", "--record-trace",
                os.path.join(model(), "manifest.json"), check=False)
        self.assertIn("lies inside --model", p.stderr)
        p = cli("ab", "replay", "--trace", trace, "--policy", "lru", "--cache-experts", "3", "-m", model(),
                "--report", os.path.join(model(), "manifest.json"), check=False)
        self.assertIn("lies inside --model", p.stderr)
        self.assertEqual(cli("inspect", model()).returncode, 0)

    def test_replay_counts_what_the_run_counted(self):
        # A run without prefetch and its own trace replayed at the same cache size: the same hits and misses,
        # prefill (8-token passes, each expert read once per pass) and decode alike.
        m = model()
        with open(os.path.join(m, "manifest.json")) as f:
            experts = json.load(f)["experts"]
        slot = max((e["size"] + 4095) // 4096 * 4096 for e in experts)
        checked = 0
        for policy in ("lru", "frequency"):
            for slots in (1, 2, 3, 5):
                t = os.path.join(WORK, f"run-{policy}-{slots}.jsonl")
                p = cli("bench", "-m", m, "--prompt-tokens", "24", "--gen-tokens", "24", "--batch", "8",
                        "--prefetch-layers", "0", "--set", f"cache.policy={policy}", "--expert-cache-size",
                        str(slots * slot), "--json", "--record-trace", t)
                run = json.loads(p.stdout)
                recs = read_jsonl(t)
                self.assertEqual(len({r["step"] for r in recs}), 3 + 24)  # 3 prefill passes, one per decoded token
                p = cli("ab", "replay", "--trace", t, "-m", m, "--policy", policy, "--cache-experts", str(slots),
                        "--json")
                got = json.loads(p.stdout)["sizes"][0]["policies"][0]
                want = (run["expert_hits"], run["expert_misses"])
                self.assertEqual((got["hits"], got["misses"]), want, f"{policy} with {slots} slots")
                checked += run["expert_hits"] > 0 and run["expert_misses"] > 0
        self.assertGreater(checked, 0)  # some sizes both hit and miss

    def test_html_report_renders_in_chromium(self):
        report = os.path.join(WORK, "report.html")
        cli("ab", "replay", "--trace", self.trace(), "-m", model(), "--policy", "lru", "--policy", "frequency",
            "--cache-experts", "2,3,4,6", "--report", report)
        html = open(report).read()
        self.assertNotIn("http://www.w3.org/1999", html.replace("http://www.w3.org/2000/svg", ""))
        self.assertNotIn("<script", html)
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        if not chromium:
            self.skipTest("chromium is not installed (apt-get install chromium)")
        with tempfile.TemporaryDirectory() as profile:
            p = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                                "--no-first-run", "--disable-background-networking", "--disable-component-update",
                                "--disable-sync", f"--user-data-dir={profile}", "--dump-dom", "file://" + report],
                               capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        dom = p.stdout
        self.assertIn('id="hit-rate-plot"', dom)
        # One polyline per policy plus the optimum, each with a point per cache size.
        lines = [l for l in dom.split("<polyline")[1:]]
        self.assertEqual(len(lines), 3)
        for l in lines:
            points = l.split('points="')[1].split('"')[0].split()
            self.assertEqual(len(points), 4)
        self.assertIn('data-policy="optimal (Belady)"', dom)


class Live(unittest.TestCase):
    def test_paired_runs_verdict_and_report(self):
        m = model()
        profiles = []
        for name, policy in (("a", "lru"), ("b", "frequency")):
            path = os.path.join(WORK, name + ".yaml")
            with open(path, "w") as f:
                f.write(f"memory:\n  expert_cache: 1M\ncache:\n  policy: {policy}\n")
            profiles += ["--profile", path]
        report = os.path.join(WORK, "live.html")
        trace = Replay().trace()
        p = cli("ab", "live", "-m", m, *profiles, "--runs", "3", "-n", "4", "--json", "--report", report,
                "--trace", trace, "--cache-experts", "3,4")
        html = open(report).read()
        # The report holds both: the replay plot (each profile's policy and the optimum) and the live verdict.
        self.assertEqual(html.count("<polyline"), 3)
        self.assertIn("(frequency)", html)
        j = json.loads(p.stdout)
        # Two cache policies on one backend decode the same tokens: the comparison is of the cache alone.
        self.assertTrue(j["same_tokens"])
        self.assertNotIn("generated different tokens", p.stderr)
        self.assertEqual(len(j["a"]["decode_tps"]), 3)
        self.assertEqual(len(j["b"]["hit_rate"]), 3)
        self.assertTrue(j["verdict"]["within_noise"])  # 3 pairs can never reach p < 0.05
        self.assertIn("within noise", j["verdict"]["text"])
        self.assertIn(j["verdict"]["text"].split(" (")[0], html)
        # The replay is in the JSON and text too, the same numbers `ab replay` gives for the two policies.
        self.assertEqual([s["cache_experts"] for s in j["replay"]["sizes"]], [3, 4])
        alone = json.loads(cli("ab", "replay", "--trace", trace, "-m", m, "--policy", "lru", "--policy", "frequency",
                               "--cache-experts", "3,4", "--json").stdout)
        for live_size, alone_size in zip(j["replay"]["sizes"], alone["sizes"]):
            self.assertEqual([x["hits"] for x in live_size["policies"]], [x["hits"] for x in alone_size["policies"]])
            self.assertEqual(live_size["optimal"]["hits"], alone_size["optimal"]["hits"])
        text = cli("ab", "live", "-m", m, *profiles, "--runs", "1", "-n", "2", "--trace", trace, "--cache-experts",
                   "3").stdout
        self.assertIn("replay of trace " + trace, text)
        self.assertIn("cache 3 experts", text)
        self.assertIn("optimal (Belady)", text)
        # Runs alternate, the order turned every other pair: A B B A A B.
        order = [l.split()[2].rstrip(":") for l in p.stderr.splitlines() if l.startswith("run ")]
        a_name, b_name = profiles[1], profiles[3]
        self.assertEqual(order, [a_name, b_name, b_name, a_name, a_name, b_name])
        # The measures' numbers: the median paired difference and the sign test's counts.
        for key in ("hit_rate", "bytes_read"):
            diffs = sorted(b - a for a, b in zip(j["a"][key], j["b"][key]))
            self.assertAlmostEqual(j["measure_tests"][key]["median_diff"], diffs[1])
            self.assertEqual(j["measure_tests"][key]["b_higher"], sum(d > 0 for d in diffs))
            self.assertEqual(j["measure_tests"][key]["a_higher"], sum(d < 0 for d in diffs))
        p = cli("ab", "live", "-m", m, "--profile", profiles[1], check=False)
        self.assertIn("exactly two profiles", p.stderr)
        # A B whose plugin refuses its options is said before A runs at all.
        bad = os.path.join(WORK, "bad-b.yaml")
        with open(bad, "w") as f:
            f.write("storage:\n  plugin: pread\n  chunk_kib: 1\n")
        p = cli("ab", "live", "-m", m, "--profile", profiles[1], "--profile", bad, "--runs", "2", "-n", "4", check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn(f"--profile {bad}: ", p.stderr)
        self.assertIn("storage.chunk_kib is 1", p.stderr)
        self.assertNotIn("run 1", p.stderr)
        # The cache's own measures get lines of their own; a report that cannot be written fails before any run.
        p = cli("ab", "live", "-m", m, *profiles, "--runs", "2", "-n", "4")
        self.assertRegex(p.stdout, r"expert hit rate: (no clear difference|the same|[AB] is better)")
        self.assertRegex(p.stdout, r"bytes read per run: (no clear difference|the same|[AB] is better)")
        self.assertIn(j["measures"][0].split(":")[0], "expert hit rate")
        p = cli("ab", "live", "-m", m, *profiles, "--runs", "2", "-n", "4", "--report", "/nonexistent/x.html",
                check=False)
        self.assertIn("report: cannot write /nonexistent/x.html", p.stderr)
        self.assertNotIn("run 1", p.stderr)
        # A cold run counts the reads its engine made at load: a profile that holds every expert reads them all then
        # (what `bench` counts), and nothing after; warm runs leave the load out.
        resident = os.path.join(WORK, "resident.yaml")
        with open(resident, "w") as f:
            f.write("memory:\n  expert_cache: 1G\n")
        with open(os.path.join(m, "manifest.json")) as f:
            expert_bytes = sum(x["size"] for x in json.load(f)["files"] if x["path"].startswith("experts/"))
        for mode, want in (("--cold", expert_bytes), ("--warm", 0)):
            j = json.loads(cli("ab", "live", "-m", m, "--profile", resident, profiles[1], "--runs", "2", "-n", "2",
                               mode, "--json").stdout)
            self.assertEqual(j["a"]["bytes_read"], [want, want], mode)
            self.assertEqual(j["a"]["hit_rate"], [1, 1], mode)
        # A replay has no memory tiers: --cache-experts sizes its cache, and a tier flag is refused, not ignored.
        p = cli("ab", "replay", "--trace", trace, "-m", m, "--policy", "lru", "--cache-experts", "3",
                "--expert-cache-size", "1M", check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("--expert-cache-size", p.stderr)
        # So does a trace of another model (one that routes to an expert this model does not have).
        other = os.path.join(WORK, "other-model-trace.jsonl")
        with open(trace) as f, open(other, "w") as out:
            record = json.loads(f.readline())
            out.write(json.dumps(dict(record, experts=[999], weights=[1.0])) + "\n")
        p = cli("ab", "live", "-m", m, *profiles, "--runs", "2", "-n", "4", "--trace", other, "--cache-experts", "3",
                check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("/E999, which model", p.stderr)
        self.assertNotIn("run 1", p.stderr)


if __name__ == "__main__":
    CLI, GEN, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
    result = unittest.main(argv=[sys.argv[0]] + sys.argv[4:], verbosity=2, exit=False).result
    if not result.wasSuccessful():
        sys.exit(1)
    # Every test skipped for want of chromium: report a skip to ctest.
    sys.exit(77 if result.skipped and not shutil.which("chromium") else 0)
