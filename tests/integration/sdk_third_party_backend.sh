#!/usr/bin/env bash
# Installs the SDK component into a scratch prefix, builds examples/third_party_backend against it
# with find_package(ColibriSDK), runs the compute conformance suite on it, and checks colibri-cli
# lists it and selects it when a profile names it.
set -euo pipefail
build=$1 cli=$2 example=$3 work=$4
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
echo "third-party backend: all checks passed"
