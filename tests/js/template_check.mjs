// Live comparison (integration test): @huggingface/jinja vs `colibri-cli template` for every template and case.
//   node tests/js/template_check.mjs /path/to/colibri-cli      (exit 0 ok, 1 mismatch, 77 skip)
import { spawnSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { Template } from "@huggingface/jinja";
import { allTemplates, cases, renderCase } from "./template_reference.mjs";
import { scratchDir } from "./tokenizer_common.mjs";

const cli = process.argv[2];
const tmp = scratchDir("colibri-tplcheck-");
const templates = allTemplates();
if (templates.length === 0) process.exit(77);
let failures = 0;
let compared = 0;
for (const t of templates) {
  const config = join(tmp, `${t.name}.tokenizer_config.json`);
  writeFileSync(config, JSON.stringify({ chat_template: t.source, bos_token: t.bos, eos_token: t.eos }));
  const template = new Template(t.source);
  for (const c of cases()) {
    const ref = renderCase(template, t, c);
    const messages = join(tmp, `${t.name}.${c.name}.json`);
    writeFileSync(messages, JSON.stringify({ messages: c.messages, add_generation_prompt: c.add_generation_prompt ?? false,
      ...(c.tools ? { tools: c.tools } : {}), ...(c.extra ?? {}) }));
    const run = spawnSync(cli, ["template", "--tokenizer-config", config, "--messages", messages], { encoding: "utf8" });
    compared++;
    const ok = ref.error !== undefined ? run.status !== 0 : run.status === 0 && run.stdout === ref.output;
    if (!ok) {
      failures++;
      console.error(`MISMATCH ${t.name} / ${c.name}: reference ${JSON.stringify(ref).slice(0, 300)}`);
      console.error(`  colibri (rc=${run.status}): ${JSON.stringify(run.stdout).slice(0, 300)} ${run.stderr.slice(0, 200)}`);
    }
  }
}
console.log(`${compared - failures} passed, ${failures} failed`);
process.exit(failures === 0 ? 0 : 1);
