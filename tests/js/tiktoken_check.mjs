// Live comparison (integration test): tiktoken (the npm package: OpenAI's Rust tiktoken compiled to WebAssembly, the
// engine Kimi K2's, Moonlight's and Hunyuan-A13B's tokenizer code runs) vs colibri-cli on a tiktoken tokenizer without
// a tokenizer.json, laid out as Kimi K2 ships one (tiktoken.model, tokenizer_config.json whose auto_map names
// tokenization_kimi, 256 special tokens after the ranks) and as Hunyuan-A13B does (hy.tiktoken, tokenization_hy). The vocabulary is o200k_base (200k ranks, many Han tokens),
// which the package carries; Kimi's own is not on npm. Exit 0 = identical, 1 = mismatch, 77 = skip.
//   node tests/js/tiktoken_check.mjs /path/to/colibri-cli
import { execFileSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { readCorpus, rng, scratchDir } from "./tokenizer_common.mjs";

const cli = process.argv[2];
if (!cli) {
  console.error("usage: tiktoken_check.mjs COLIBRI_CLI");
  process.exit(2);
}
const require = createRequire(import.meta.url);
let Tiktoken, encoderPath;
try {
  ({ Tiktoken } = require("tiktoken/lite"));
  encoderPath = require.resolve("tiktoken/encoders/o200k_base.json");
} catch (e) {
  console.error(`SKIP: the tiktoken npm package is not installed (npm ci in tests/js): ${e.message}`);
  process.exit(77);
}

// tokenization_kimi.py's pat_str, as that file writes it.
const patterns = [
  String.raw`[\p{Han}]+`,
  String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String.raw`\p{N}{1,3}`,
  String.raw` ?[^\s\p{L}\p{N}]+[\r\n]*`,
  String.raw`\s*[\r\n]+`,
  String.raw`\s+(?!\S)`,
  String.raw`\s+`,
];
const patStr = patterns.join("|");

// o200k_base's ranks ("! offset tok tok ..." lines) as tiktoken.model lines.
const encoder = JSON.parse(readFileSync(encoderPath, "utf8"));
const lines = [];
for (const line of encoder.bpe_ranks.split("\n").filter(Boolean)) {
  const [, offset, ...tokens] = line.split(" ");
  tokens.forEach((t, i) => lines.push(`${t} ${Number(offset) + i}`));
}
const base = lines.length;

// Kimi's layout of special tokens: ids base..base+255, some named in added_tokens_decoder, the rest reserved.
const named = ["[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|start_header_id|>",
  "<|end_header_id|>", "[EOT]", "<|im_system|>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
  "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<|im_middle|>"];
const specials = {};
const decoder = {};
for (let i = 0; i < 256; i++) {
  const id = base + i;
  const content = i < named.length ? named[i] : `<|reserved_token_${id}|>`;
  specials[content] = id;
  if (i < named.length) {
    decoder[String(id)] = { content, lstrip: false, normalized: false, rstrip: false, single_word: false, special: true };
  }
}

const dir = scratchDir("colibri-tiktoken-");
writeFileSync(join(dir, "tiktoken.model"), lines.join("\n") + "\n");
writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify({
  added_tokens_decoder: decoder,
  auto_map: { AutoTokenizer: ["tokenization_kimi.TikTokenTokenizer", null] },
  bos_token: "[BOS]",
  eos_token: "[EOS]",
  tokenizer_class: "TikTokenTokenizer",
}, null, 2));
writeFileSync(join(dir, "tokenization_kimi.py"),
  "class TikTokenTokenizer:\n    num_reserved_special_tokens = 256\n    pat_str = \"|\".join(\n        [\n" +
  patterns.map((p) => `            r"""${p}""",\n`).join("") + "        ]\n    )\n");

// Pieces where Kimi's split differs from GPT-4o's (Han next to letters, digits, marks and other scripts), specials.
const pieces = [
  "中", "文字", "日本語", "漢字かな", "ひらがな", "カタカナ", "한국어", "中a", "a中", "A中B", "Ab中", "中'S", "中's",
  "DON'T", "don't", "x'LL", "中1", "1中", "中 文", "中\n", "\n中", "é中", "e\u0301中", "中\u0301", "\u0301", "𠀀", "𪜀",
  "〇", "々", "㐀", "Hello", " world", "WORLD", "ǅx", "İ", "ß", "ﬁ", "１２３", "12345", "3.14", " ", "  ", "\t", "\n",
  "\r\n", "\n\n", ",", "...", "!?", "(", ")", "/", "\\", "\"", "'", "#", "👍", "👨‍👩‍👧", "\u00a0", "\u3000", "\ufeff",
  "[BOS]", "<|im_end|>", "<|im_user|>", `<|reserved_token_${base + 200}|>`, "<|im_end", "[EOS", "<|", "|>",
  "العربية", "हिन्दी", "Ελληνικά", "Русский", "ไทย", "\u0000",
];
const random = rng(Number(process.env.COLIBRI_FUZZ_SEED ?? 20261206));
const texts = [...readCorpus()];
const input = join(dir, "input.jsonl");
// `count` more texts of 1 to 30 random pieces, then every text into the input file.
function addRandomTexts(count) {
  for (let i = 0; i < count; i++) {
    const n = 1 + Math.floor(random() * 30);
    let s = "";
    for (let k = 0; k < n; k++) s += pieces[Math.floor(random() * pieces.length)];
    texts.push(s);
  }
  writeFileSync(input, texts.map((t) => JSON.stringify(t)).join("\n") + "\n");
}
addRandomTexts(Number(process.env.COLIBRI_FUZZ_COUNT ?? 400));

// One family's comparison: tokenize and decode every text with colibri-cli on `dir` and with tiktoken (`prepare`:
// what the family's code does to the text before tiktoken, Hunyuan's NFC).
let failures = 0;
let compared = 0;
const run = (args) => execFileSync(cli, args, { maxBuffer: 1 << 28 }).toString("utf8").trimEnd().split("\n");
function compare(label, dir, specialIds, pattern, prepare) {
  const enc = new Tiktoken(lines.join("\n"), specialIds, pattern);
  const out = run(["tokenize", "--tokenizer", dir, "--jsonl", input]);
  if (out.length !== texts.length) {
    console.error(`${label}: colibri-cli printed ${out.length} lines for ${texts.length} inputs`);
    process.exit(1);
  }
  const refIds = [];
  for (let i = 0; i < texts.length; i++) {
    // The codes' encode: allowed_special="all" (special tokens anywhere in the text are those tokens).
    const ref = Array.from(enc.encode(prepare(texts[i]), "all"));
    refIds.push(ref);
    const got = JSON.parse(out[i]).ids;
    compared++;
    if (JSON.stringify(ref) !== JSON.stringify(got)) {
      failures++;
      if (failures <= 10) {
        console.error(`${label} MISMATCH input ${JSON.stringify(texts[i]).slice(0, 120)}`);
        console.error(`  tiktoken: ${JSON.stringify(ref).slice(0, 300)}`);
        console.error(`  colibri:  ${JSON.stringify(got).slice(0, 300)}`);
      }
    }
  }
  // Decoding: tiktoken's bytes read as UTF-8 with replacement characters, as the codes' decode does.
  const idsFile = join(dir, "ids.jsonl");
  writeFileSync(idsFile, refIds.map((ids) => JSON.stringify(ids)).join("\n") + "\n");
  const decoded = run(["tokenize", "--tokenizer", dir, "--jsonl", idsFile, "--decode"]);
  const utf8 = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });  // Python keeps a leading BOM
  for (let i = 0; i < refIds.length; i++) {
    const ref = utf8.decode(enc.decode(Uint32Array.from(refIds[i])));
    const got = JSON.parse(decoded[i]).text;
    compared++;
    if (ref !== got) {
      failures++;
      if (failures <= 10) console.error(`${label} DECODE MISMATCH ${JSON.stringify(ref).slice(0, 100)} vs ${JSON.stringify(got).slice(0, 100)}`);
    }
  }
  enc.free();
}
compare("kimi", dir, specials, patStr, (t) => t);

// Hunyuan-A13B's layout: hy.tiktoken (its loader numbers the lines; o200k's are in rank order), tokenization_hy.py's
// PAT_STR, its 210 special tokens after the ranks, and NFC before tiktoken (its tokenize()).
const hyPattern = String.raw`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`;
const hyDir = scratchDir("colibri-hy-tiktoken-");
writeFileSync(join(hyDir, "hy.tiktoken"), lines.join("\n") + "\n");
writeFileSync(join(hyDir, "tokenizer_config.json"), JSON.stringify({
  auto_map: { AutoTokenizer: ["tokenization_hy.HYTokenizer", null] },
  eos_token: "<|eos|>",
  pad_token: "<|pad|>",
  tokenizer_class: "HYTokenizer",
}, null, 2));
writeFileSync(join(hyDir, "tokenization_hy.py"),
  `VOCAB_FILES_NAMES = {"vocab_file": "hy.tiktoken"}\n\nPAT_STR = r"""${hyPattern}"""\n`);
const hySpecials = {};
["<|endoftext|>", "<|startoftext|>", "<|bos|>", "<|eos|>", "<|pad|>",
  ...Array.from({ length: 205 }, (_, i) => `<|extra_${i}|>`)].forEach((c, i) => { hySpecials[c] = base + i; });
pieces.push("<|startoftext|>", "<|extra_0|>", "<|extra_4|>", "<|eos|>", "<|extra_204|>");
addRandomTexts(100);  // texts with Hunyuan's specials too
compare("hunyuan", hyDir, hySpecials, hyPattern, (t) => t.normalize("NFC"));

console.log(`tiktoken (${base} ranks; Kimi's split and specials, Hunyuan's split, specials and NFC): ` +
  `${compared - failures} passed, ${failures} failed`);
process.exit(failures === 0 ? 0 : 1);
