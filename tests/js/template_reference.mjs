// Renders every chat template (the shipped tokenizer_config.json ones and colibri's built-ins) over
// tests/data/chat/conversations.json with @huggingface/jinja, writing tests/data/chat/golden/<template>.jsonl:
// one line per case, {"case": name, "output": text} or {"case": name, "error": message}.
//   node tests/js/template_reference.mjs
import { existsSync, mkdirSync, readFileSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Template } from "@huggingface/jinja";
import { repoRoot, tokenizerDir } from "./tokenizer_common.mjs";

const chatDir = join(repoRoot, "tests", "data", "chat");

function tokenContent(v) {
  if (typeof v === "string") return v;
  if (v && typeof v === "object" && typeof v.content === "string") return v.content;
  return "";
}

// {name, source, bos, eos} for every template to check.
export function allTemplates() {
  const out = [];
  for (const name of ["mistral_nemo", "qwen3", "llama3", "deepseek_v3"]) {
    const dir = tokenizerDir(name);
    if (!dir || !existsSync(join(dir, "tokenizer_config.json"))) {
      console.error(`skip ${name}: tokenizer_config.json not found`);
      continue;
    }
    const config = JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8"));
    out.push({ name, source: config.chat_template, bos: tokenContent(config.bos_token), eos: tokenContent(config.eos_token) });
  }
  const specials = {
    "llama2": ["<s>", "</s>"],
    "mistral": ["<s>", "</s>"],
    "gpt-oss": ["<|startoftext|>", "<|return|>"],
    "chatml": ["", "<|im_end|>"],
  };
  for (const file of readdirSync(join(chatDir, "builtin")).sort()) {
    const name = file.replace(/\.jinja$/, "");
    const [bos, eos] = specials[name] ?? ["", ""];
    out.push({ name: `builtin_${name}`, source: readFileSync(join(chatDir, "builtin", file), "utf8"), bos, eos });
  }
  return out;
}

export function renderCase(template, t, c) {
  const context = {
    messages: c.messages,
    add_generation_prompt: c.add_generation_prompt ?? false,
    bos_token: t.bos,
    eos_token: t.eos,
    ...(c.tools ? { tools: c.tools } : {}),
    ...(c.extra ?? {}),
  };
  try {
    return { case: c.name, output: template.render(context) };
  } catch (e) {
    return { case: c.name, error: String(e?.message ?? e) };
  }
}

export function cases() {
  return JSON.parse(readFileSync(join(chatDir, "conversations.json"), "utf8")).cases;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const goldenDir = join(chatDir, "golden");
  mkdirSync(goldenDir, { recursive: true });
  for (const t of allTemplates()) {
    const template = new Template(t.source);
    const lines = cases().map((c) => JSON.stringify(renderCase(template, t, c)));
    writeFileSync(join(goldenDir, `${t.name}.jsonl`), lines.join("\n") + "\n");
    // The template itself travels with the golden file so the C++ test does not need ../shared.
    writeFileSync(join(goldenDir, `${t.name}.json`), JSON.stringify({ source: t.source, bos: t.bos, eos: t.eos }) + "\n");
    console.log(`${t.name}: ${lines.length} cases`);
  }
}
