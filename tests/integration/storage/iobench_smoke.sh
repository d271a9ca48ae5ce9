#!/usr/bin/env bash
# Usage: iobench_smoke.sh COLIBRI_CLI WORKDIR
# Every storage and cache plugin of the build is listed with its capabilities; iobench measures
# each usable storage plugin, reports no errors, removes its test file and rejects bad arguments.
set -euo pipefail
cli="$1"
work="$2"
rm -rf "$work"
mkdir -p "$work/disk"

fail() { echo "FAIL: $*" >&2; exit 1; }

"$cli" plugins list --json > "$work/plugins.json"
python3 - "$work/plugins.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
have = {(p["kind"], p["name"]): p for p in doc["plugins"]}
want = {("storage", "mmap"): "zero_copy", ("storage", "stripe"): "mirror_fallback",
        ("storage", "faulty"): "fault_injection", ("cache", "pinned"): "pins", ("cache", "frequency"): "decay"}
for key, cap in want.items():
    assert key in have, f"{key} missing from plugins list: {sorted(have)}"
    assert cap in have[key]["capabilities"], f"{key} lacks capability {cap}: {have[key]['capabilities']}"
    assert have[key]["score"] > 0, f"{key} scores 0: {have[key]['score_reason']}"
uring = have.get(("storage", "io_uring"))
if uring is not None:
    assert "registered_buffers" in uring["capabilities"]
    assert uring["score"] > 0 or uring["score_reason"], "io_uring scores 0 without a reason"
PY

"$cli" iobench "$work/disk" --size 8M --seconds 0.2 --depths 1,4 --block-sizes 1M,4K --json > "$work/iobench.json"
python3 - "$work/iobench.json" "$work/plugins.json" <<'PY'
import json, sys
res = json.load(open(sys.argv[1]))
plugins = json.load(open(sys.argv[2]))["plugins"]
usable = {p["name"] for p in plugins
          if p["kind"] == "storage" and p["score"] > 0 and "fault_injection" not in p["capabilities"]}
seen = {r["plugin"] for r in res["results"]}
assert seen == usable, f"measured {sorted(seen)}, usable {sorted(usable)}"
for r in res["results"]:
    assert "error" not in r, r
    assert r["reads"] > 0 and r["mb_per_s"] > 0 and r["iops"] > 0, r
    if r["test"] == "seq":
        assert r["reads"] * r["block"] == res["file_size"], f"sequential pass did not cover the file: {r}"
    elif not r["direct_io"]:
        # Without O_DIRECT a block read twice comes from the page cache: a random point reads each at most once.
        assert r["reads"] * r["block"] <= res["file_size"], f"a cached point re-read its file: {r}"
points = {(r["plugin"], r["test"], r["block"], r["depth"]) for r in res["results"]}
for p in usable:
    for block in (1 << 20, 4096):
        for depth in (1, 4):
            assert (p, "rand", block, depth) in points, (p, block, depth)
PY
[ -z "$(ls -A "$work/disk")" ] || fail "iobench left files behind: $(ls "$work/disk")"

# A point's clock starts once its buffers are set up and registered: a point shorter than that setup (as a loaded
# machine makes any point) still reads. Its deadline used to start before, and a point could end with no read.
"$cli" iobench "$work/disk" --size 8M --seconds 0.0001 --depths 1 --block-sizes 1M --json > "$work/short.json"
python3 - "$work/short.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    assert "error" not in r and r["reads"] > 0, r
PY

# Bad input: clear errors, non-zero exit, nothing written.
if "$cli" iobench "$work/nope" > "$work/err1.txt" 2>&1; then fail "a missing directory was accepted"; fi
grep -q "$work/nope" "$work/err1.txt" || fail "the error does not name the directory: $(cat "$work/err1.txt")"
if "$cli" iobench "$work/disk" --depths 4,0 > "$work/err2.txt" 2>&1; then fail "--depths 0 was accepted"; fi
grep -q "'0'" "$work/err2.txt" || fail "the error does not name the bad depth: $(cat "$work/err2.txt")"
if "$cli" iobench "$work/disk" --block-sizes 3000 > "$work/err3.txt" 2>&1; then fail "--block-sizes 3000 was accepted"; fi
grep -q "3000" "$work/err3.txt" || fail "the error does not name the bad block size: $(cat "$work/err3.txt")"
if "$cli" iobench "$work/disk" --plugins nosuch > "$work/err4.txt" 2>&1; then fail "an unknown plugin was accepted"; fi
grep -q "nosuch" "$work/err4.txt" || fail "the error does not name the plugin: $(cat "$work/err4.txt")"
# The profile's storage settings are its plugin's: measured with them, and a value the plugin refuses is refused
# once, before any file is written (2 from the command line, 1 from a profile file).
set +e
"$cli" iobench "$work/disk" --set storage.plugin=pread --set storage.chunk_kib=1 > "$work/err5.txt" 2>&1; rc=$?
[ $rc = 2 ] || fail "storage.chunk_kib=1 from --set: exit $rc, not 2: $(cat "$work/err5.txt")"
grep -q "storage.chunk_kib is 1" "$work/err5.txt" || fail "the error does not name chunk_kib: $(cat "$work/err5.txt")"
"$cli" iobench "$work/disk" --set storage.bogus=1 > "$work/err6.txt" 2>&1; rc=$?
[ $rc = 2 ] || fail "storage.bogus=1 from --set: exit $rc, not 2: $(cat "$work/err6.txt")"
grep -q "unknown key 'storage.bogus'" "$work/err6.txt" || fail "the error does not name the key: $(cat "$work/err6.txt")"
printf 'extends: cpu\nstorage:\n  plugin: pread\n  chunk_kib: 3\n' > "$work/chunk3.yaml"
"$cli" iobench "$work/disk" --profile "$work/chunk3.yaml" > "$work/err7.txt" 2>&1; rc=$?
[ $rc = 1 ] || fail "chunk_kib: 3 in a profile file: exit $rc, not 1: $(cat "$work/err7.txt")"
grep -q "chunk3.yaml:4" "$work/err7.txt" || fail "the error does not name the file's line: $(cat "$work/err7.txt")"
set -e
"$cli" iobench "$work/disk" --size 8M --seconds 0.05 --depths 1 --block-sizes 4K --plugins pread,mmap \
  --set storage.plugin=pread --set storage.chunk_kib=8 --json > "$work/settings.json"
python3 - "$work/settings.json" <<'PY'
import json, sys
res = json.load(open(sys.argv[1]))
assert res["profile_settings_plugin"] == "pread", res["profile_settings_plugin"]
assert all("error" not in r for r in res["results"]), res["results"]
PY
[ -z "$(ls -A "$work/disk")" ] || fail "a refused iobench left files behind"

# Ctrl-C (and SIGTERM) while it measures: the test file goes too.
for sig in INT TERM; do
  "$cli" iobench "$work/disk" --size 8M --seconds 30 --plugins pread > /dev/null 2>&1 &
  pid=$!
  for _ in $(seq 200); do [ -n "$(ls -A "$work/disk")" ] && break; sleep 0.1; done
  [ -n "$(ls -A "$work/disk")" ] || fail "no test file appeared"
  sleep 0.5  # into the measurement
  kill -s "$sig" "$pid"
  status=0
  wait "$pid" || status=$?
  [ "$status" -ne 0 ] || fail "SIG$sig: iobench exited 0"
  [ -z "$(ls -A "$work/disk")" ] || fail "SIG$sig left the test file behind: $(ls "$work/disk")"
done
echo "iobench and plugins list: ok"
