#!/usr/bin/env bash
# Installs the SDK component into a scratch prefix, builds examples/custom_cache_policy against it
# with find_package(ColibriSDK), runs the cache conformance suite on it, and checks colibri-cli
# finds it, validates its options and uses it when a profile names it.
set -euo pipefail
build=$1 cli=$2 example=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" --component sdk >/dev/null
test -f "$work/prefix/lib/cmake/ColibriSDK/ColibriSDKConfig.cmake"
test -f "$work/prefix/include/colibri/sdk/sdk.hpp"
test -f "$work/prefix/lib/pkgconfig/colibri-sdk.pc"
# pkg-config points into the prefix the SDK was installed to, not the configured one.
if command -v pkg-config >/dev/null; then
  cflags=$(PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig" pkg-config --cflags colibri-sdk)
  inc=$(echo "$cflags" | tr ' ' '\n' | sed -n 's/^-I//p')
  test -f "$inc/colibri/sdk/sdk.hpp" || { echo "pkg-config --cflags points elsewhere: $cflags"; exit 1; }
  # A plugin built with pkg-config alone, as the .pc file's comment says, exports only the entry symbol and loads.
  pc() { PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig" pkg-config "$@" colibri-sdk; }
  mkdir -p "$work/pc"
  # shellcheck disable=SC2046  # the flags are words
  g++ $(pc --cflags) $(pc --variable=plugin_cflags) -c "$example/fifo_policy.cpp" -o "$work/pc/fifo.o"
  # shellcheck disable=SC2046
  g++ "$work/pc/fifo.o" $(pc --variable=plugin_ldflags) $(pc --libs) -o "$work/pc/libcolibri-cache-fifo.so"
  exported=$(nm -D --defined-only "$work/pc/libcolibri-cache-fifo.so" | awk '{print $3}' | grep -v '^_' || true)
  [ "$exported" = "colibri_plugin_entry" ] || { echo "pkg-config plugin exports: $exported"; exit 1; }
  out=$(COLIBRI_PLUGIN_PATH="$work/pc" "$cli" plugins list)
  echo "$out" | grep -q "cache    fifo .*$work/pc/libcolibri-cache-fifo.so" ||
    { echo "the pkg-config plugin is not listed:"; echo "$out"; exit 1; }
  # An unresolved symbol fails the link, as under colibri_add_plugin, not the user's first load of the plugin
  # (not in a sanitizer build, whose .pc leaves --no-undefined out as colibri_add_plugin does there).
  if ! grep -Eq '^COLIBRI_(SANITIZE|TSAN|FUZZ):BOOL=ON' "$build/CMakeCache.txt"; then
  printf 'extern "C" void colibri_missing_function();\nextern "C" void colibri_plugin_entry() { colibri_missing_function(); }\n' \
    > "$work/pc/undefined.cpp"
  g++ $(pc --cflags) $(pc --variable=plugin_cflags) -c "$work/pc/undefined.cpp" -o "$work/pc/undefined.o"
  # shellcheck disable=SC2046
  if g++ "$work/pc/undefined.o" $(pc --variable=plugin_ldflags) $(pc --libs) -o "$work/pc/libundefined.so" 2>/dev/null; then
    echo "a plugin with an undefined symbol linked with plugin_ldflags"; exit 1
  fi
  fi
fi

cmake -S "$example" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_CXX_FLAGS="-Wall -Wextra -Werror" >/dev/null
cmake --build "$work/build" >/dev/null
test -f "$work/build/libcolibri-cache-fifo.so"
ctest --test-dir "$work/build" --output-on-failure | tail -3

# Only the entry symbol is exported.
exported=$(nm -D --defined-only "$work/build/libcolibri-cache-fifo.so" | awk '{print $3}' | grep -v '^_' || true)
[ "$exported" = "colibri_plugin_entry" ] || { echo "unexpected exports: $exported"; exit 1; }

out=$(COLIBRI_PLUGIN_PATH="$work/build" "$cli" plugins list)
echo "$out" | grep -q "cache    fifo          0.1.0    10" || { echo "fifo not listed:"; echo "$out"; exit 1; }

cat > "$work/fifo.yaml" <<'YAML'
cache:
  policy: fifo
  log_evictions: true
YAML
out=$(COLIBRI_PLUGIN_PATH="$work/build" "$cli" profile show --profile "$work/fifo.yaml")
echo "$out" | grep -q "cache.log_evictions = true" || { echo "option not shown:"; echo "$out"; exit 1; }

printf 'cache:\n  policy: fifo\n  log_evictons: true\n' > "$work/typo.yaml"
if out=$(COLIBRI_PLUGIN_PATH="$work/build" "$cli" profile show --profile "$work/typo.yaml" 2>&1); then
  echo "misspelt fifo option accepted"; exit 1
fi
echo "$out" | grep -q "typo.yaml:3:3: unknown key 'cache.log_evictons'; did you mean 'cache.log_evictions'?" \
  || { echo "bad error: $out"; exit 1; }
# plugins.paths in a profile: relative to that file, and a missing directory is named.
mkdir -p "$work/profiles"
printf 'plugins:\n  paths: [../build, ../nowhere]\ncache:\n  policy: fifo\n' > "$work/profiles/rel.yaml"
out=$(cd / && "$cli" profile show --profile "$work/profiles/rel.yaml" 2>&1) || { echo "relative plugins.paths: $out"; exit 1; }
echo "$out" | grep -q "cache.policy = fifo" || { echo "fifo not found through a relative path: $out"; exit 1; }
# (`..` is left for the OS to resolve, as through a profile directory that is a symlink.)
echo "$out" | grep -q "plugin directory $work/profiles/../nowhere (from profile plugins.paths) does not exist" \
  || { echo "missing directory not named: $out"; exit 1; }
echo "third-party plugin: all checks passed"
