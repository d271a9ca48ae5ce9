// Live comparison (integration test): HF tokenizers vs colibri-cli on the corpus plus seeded random strings, for
// every shipped tokenizer and variant. Exit 0 = identical, 1 = mismatch, 77 = nothing to compare (skip).
//   node tests/js/tokenizer_check.mjs /path/to/colibri-cli
import { execFileSync } from "node:child_process";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { allTokenizerFiles, loadHF, readCorpus, rng, scratchDir } from "./tokenizer_common.mjs";

const cli = process.argv[2];
if (!cli) {
  console.error("usage: tokenizer_check.mjs COLIBRI_CLI");
  process.exit(2);
}

const pieces = [
  "a", "The", " the", "ing", "Hello", "WORLD", "x", "'s", "'LL", " ", "  ", "\t", "\n", "\r\n", "\n\n", "0", "42",
  "12345", "3.14", ",", ".", "!", "?", "...", "--", "(", ")", "{", "}", "<", ">", "/", "\\", "\"", "'", "#", "@",
  "中", "文字", "日本語", "ひらがな", "한국어", "العربية", "हिन्दी", "Ελληνικά", "Русский", "é", "e\u0301", "\u0301",
  "ñ", "👍", "🏽", "\u200d", "👨‍👩‍👧", "🏳️‍🌈", "𓀀", "\u00a0", "\u3000", "\ufeff", "\u0000", "<s>", "</s>", "<unk>",
  "<|im_start|>", "<|endoftext|>", "<|eot_id|>", "[INST]", "<｜User｜>", "<s", "|>", "<|", "▁", "Ġ", "<0x0A>",
  "colibri", " xyzzy", "<tool>", "</tool>", "Hello", "[MASK]", "<extra>", "１２３", "ﬁ", "İ", "ß", "ǅ",
];
const random = rng(Number(process.env.COLIBRI_FUZZ_SEED ?? 20240531));
const fuzz = [];
for (let i = 0; i < Number(process.env.COLIBRI_FUZZ_COUNT ?? 150); i++) {
  const n = 1 + Math.floor(random() * 40);
  let s = "";
  for (let k = 0; k < n; k++) s += pieces[Math.floor(random() * pieces.length)];
  fuzz.push(s);
}
const texts = [...readCorpus(), ...fuzz];

const tmp = scratchDir("colibri-tokcheck-");
const input = join(tmp, "input.jsonl");
writeFileSync(input, texts.map((t) => JSON.stringify(t)).join("\n") + "\n");

const { Tokenizer } = loadHF();
const files = allTokenizerFiles();
if (files.length === 0) {
  console.error("SKIP: no tokenizer files found (set COLIBRI_TOKENIZERS_DIR or run npm ci in tests/js)");
  process.exit(77);
}
// transformers' LlamaTokenizerFast (and CodeLlama's) rebuilds the post-processor from tokenizer_config.json's
// add_bos_token (default true) / add_eos_token (default false), whatever tokenizer.json says (DeepSeek-V3 ships a
// plain ByteLevel one). colibri follows transformers; this gives the ids transformers would.
function transformersAffixes(file, tok) {
  const cfgPath = join(dirname(file), "tokenizer_config.json");
  if (!existsSync(cfgPath)) return null;
  const cfg = JSON.parse(readFileSync(cfgPath, "utf8"));
  if (!["LlamaTokenizerFast", "LlamaTokenizer", "CodeLlamaTokenizerFast", "CodeLlamaTokenizer"].includes(cfg.tokenizer_class)) {
    return null;
  }
  const id = (t) => (t == null ? undefined : tok.tokenToId(typeof t === "string" ? t : t.content));
  const addBos = typeof cfg.add_bos_token === "boolean" ? cfg.add_bos_token : true;
  const addEos = typeof cfg.add_eos_token === "boolean" ? cfg.add_eos_token : false;
  const bos = id(cfg.bos_token), eos = id(cfg.eos_token);
  if ((addBos && bos == null) || (addEos && eos == null)) return null;
  return { before: addBos ? [bos] : [], after: addEos ? [eos] : [] };
}

let failures = 0;
let compared = 0;
for (const { name, file } of files) {
  const tok = Tokenizer.fromFile(file);
  const affixes = transformersAffixes(file, tok);
  for (const addSpecial of [false, true]) {
    const args = ["tokenize", "--tokenizer", file, "--jsonl", input, ...(addSpecial ? ["--add-special"] : [])];
    const out = execFileSync(cli, args, { maxBuffer: 1 << 28 }).toString("utf8").trimEnd().split("\n");
    if (out.length !== texts.length) {
      console.error(`${name}: colibri-cli printed ${out.length} lines for ${texts.length} inputs`);
      failures++;
      continue;
    }
    for (let i = 0; i < texts.length; i++) {
      let ref = Array.from((await tok.encode(texts[i], null, { addSpecialTokens: addSpecial && !affixes })).getIds());
      if (addSpecial && affixes) ref = [...affixes.before, ...ref, ...affixes.after];
      const got = JSON.parse(out[i]).ids;
      compared++;
      if (JSON.stringify(ref) !== JSON.stringify(got)) {
        failures++;
        if (failures <= 10) {
          console.error(`MISMATCH ${name} add_special=${addSpecial} input ${JSON.stringify(texts[i]).slice(0, 120)}`);
          console.error(`  hf:      ${JSON.stringify(ref).slice(0, 300)}`);
          console.error(`  colibri: ${JSON.stringify(got).slice(0, 300)}`);
        }
      }
    }
  }
  // Decoding: the reference ids back to text.
  const idsFile = join(tmp, `${name}.ids.jsonl`);
  const refIds = [];
  for (const t of texts) refIds.push(Array.from((await tok.encode(t, null, { addSpecialTokens: true })).getIds()));
  writeFileSync(idsFile, refIds.map((ids) => JSON.stringify(ids)).join("\n") + "\n");
  for (const skip of [false, true]) {
    const args = ["tokenize", "--tokenizer", file, "--jsonl", idsFile, "--decode", ...(skip ? ["--skip-special"] : [])];
    const out = execFileSync(cli, args, { maxBuffer: 1 << 28 }).toString("utf8").trimEnd().split("\n");
    for (let i = 0; i < refIds.length; i++) {
      const ref = await tok.decode(refIds[i], skip);
      const got = JSON.parse(out[i]).text;
      compared++;
      if (ref !== got) {
        failures++;
        if (failures <= 10) console.error(`DECODE MISMATCH ${name} skip=${skip}: ${JSON.stringify(ref).slice(0, 100)} vs ${JSON.stringify(got).slice(0, 100)}`);
      }
    }
  }
  console.log(`${name}: checked`);
}
console.log(`${compared - failures} passed, ${failures} failed`);
process.exit(failures === 0 ? 0 : 1);
