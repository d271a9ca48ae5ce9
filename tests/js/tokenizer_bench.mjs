// HuggingFace tokenizers encode throughput on the same text as colibri_bench_tokenizer (corpus x 48, ~1 MB) and
// the same 100 KB word, one encode call at a time:  node tests/js/tokenizer_bench.mjs [name...]
import { join } from "node:path";
import { readCorpus, loadHF, TOKENIZERS, tokenizerDir } from "./tokenizer_common.mjs";

const once = readCorpus().map((s) => s + "\n").join("");
const text = once.repeat(48);
let word = "";
while (Buffer.byteLength(word) < 100000) word += "antidisestablishmentarianism";
const { Tokenizer } = loadHF();
const names = process.argv.length > 2 ? process.argv.slice(2) : TOKENIZERS;

async function measure(tok, input) {
  const bytes = Buffer.byteLength(input, "utf8");
  await tok.encode(input, null, { addSpecialTokens: false }); // warm-up (fills the BPE cache, as the C++ bench does)
  let iterations = 0;
  let tokens = 0;
  const start = process.hrtime.bigint();
  let elapsed = 0;
  while (elapsed < 2.0 || iterations < 3) {
    const enc = await tok.encode(input, null, { addSpecialTokens: false });
    tokens = enc.getLength();
    iterations++;
    elapsed = Number(process.hrtime.bigint() - start) / 1e9;
  }
  return { mbps: (bytes * iterations) / elapsed / 1e6, ms: (elapsed / iterations) * 1e3, tokens };
}

for (const name of names) {
  const dir = tokenizerDir(name);
  if (!dir) {
    console.error(`skip ${name}: not found`);
    continue;
  }
  const tok = Tokenizer.fromFile(join(dir, "tokenizer.json"));
  const a = await measure(tok, text);
  const b = await measure(tok, word);
  console.log(
    `${name.padEnd(13)} corpus_1MB: ${a.mbps.toFixed(2).padStart(7)} MB/s (${a.ms.toFixed(1)} ms, ${a.tokens} tokens)` +
      `   100KB_word: ${b.mbps.toFixed(2).padStart(7)} MB/s (${b.ms.toFixed(1)} ms, ${b.tokens} tokens)`
  );
}
