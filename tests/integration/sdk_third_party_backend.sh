#!/usr/bin/env bash
# Installs the SDK component into a scratch prefix, builds examples/third_party_backend against it
# with find_package(ColibriSDK), runs the compute conformance suite on it, checks colibri-cli
# lists it, and that a profile naming it runs a tiny f32 model to the same greedy text as the CPU
# backend.
set -euo pipefail
build=$1 cli=$2 example=$3 work=$4
src=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" --component sdk >/dev/null

cmake -S "$example" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_CXX_FLAGS="-Wall -Wextra -Werror" >/dev/null
cmake --build "$work/build" >/dev/null
so="$work/build/libcolibri-compute-scalar.so"
test -f "$so"
ctest --test-dir "$work/build" --output-on-failure | tail -3

exported=$(nm -D --defined-only "$so" | awk '{print $3}' | grep -v '^_' || true)
[ "$exported" = "colibri_plugin_entry" ] || { echo "unexpected exports: $exported"; exit 1; }

out=$(COLIBRI_PLUGIN_PATH="$work/build" "$cli" plugins list)
echo "$out" | grep -Eq "compute +scalar +0\.1\.0 +1 " || { echo "scalar not listed:"; echo "$out"; exit 1; }

printf 'compute:\n  backend: scalar\n  threads: 1\n' > "$work/scalar.yaml"
out=$(COLIBRI_PLUGIN_PATH="$work/build" "$cli" profile show --profile "$work/scalar.yaml")
echo "$out" | grep -q "compute.backend = scalar" || { echo "backend not shown:"; echo "$out"; exit 1; }

# The scalar backend claims f32 only: an f32 model with an f32 KV cache runs on it.
/usr/bin/python3 "$src/tests/fixtures/make_tiny_model.py" --arch mixtral --out "$work/hf" >/dev/null
"$cli" convert --input "$work/hf" --output "$work/model" --quantize f32 >/dev/null 2>&1
gen() { COLIBRI_PLUGIN_PATH="$work/build" "$cli" run -m "$work/model" -p "Hello world" -n 8 --temp 0 --ignore-eos \
          --kv-type f32 "$@" 2>"$work/run.err"; }
scalar=$(gen --profile "$work/scalar.yaml") || { cat "$work/run.err"; exit 1; }
grep -q "backend scalar" "$work/run.err" || { echo "run did not use the scalar backend:"; cat "$work/run.err"; exit 1; }
cpu=$(gen --set compute.backend=cpu) || { cat "$work/run.err"; exit 1; }
[ "$scalar" = "$cpu" ] || { printf 'scalar: %q\ncpu:    %q\n' "$scalar" "$cpu"; exit 1; }
# Its f16 KV cache (the default) is refused at load, naming the KV type, before any text is written.
if COLIBRI_PLUGIN_PATH="$work/build" "$cli" run -m "$work/model" -p "Hello world" -n 8 --profile "$work/scalar.yaml" \
    >"$work/f16.out" 2>"$work/f16.err"; then
  echo "an f16 KV cache ran on a backend that claims f32 only"; exit 1
fi
grep -q "cannot run attention on a f16 KV cache" "$work/f16.err" || { cat "$work/f16.err"; exit 1; }
[ ! -s "$work/f16.out" ] || { echo "text written before the refusal:"; cat "$work/f16.out"; exit 1; }
# Qwen3-Next's gated-delta-rule layers need three optional ops the scalar backend does not offer: refused at load by
# name, with the backends that run them.
/usr/bin/python3 "$src/tests/fixtures/make_tiny_model.py" --arch qwen3_next --out "$work/hf-next" >/dev/null
"$cli" convert --input "$work/hf-next" --output "$work/next" --quantize f32 >/dev/null 2>&1
if COLIBRI_PLUGIN_PATH="$work/build" "$cli" run -m "$work/next" -p "Hello world" -n 4 --kv-type f32 \
    --profile "$work/scalar.yaml" >"$work/next.out" 2>"$work/next.err"; then
  echo "qwen3_next ran on a backend without its linear-attention ops"; exit 1
fi
grep -q "compute backend scalar cannot run qwen3_next's gated-delta-rule layers (the mul, causal_conv and gated_delta_rule ops); use compute.backend: cpu, cuda or vulkan" "$work/next.err" ||
  { cat "$work/next.err"; exit 1; }
[ ! -s "$work/next.out" ] || { echo "text written before the refusal:"; cat "$work/next.out"; exit 1; }
echo "third-party backend: all checks passed"
