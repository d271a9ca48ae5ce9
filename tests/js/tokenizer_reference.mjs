// Generates the golden token ids of every tokenizer (shipped + variants) over tests/data/tokenizer/corpus.jsonl
// with the HuggingFace tokenizers library (native binding @anush008/tokenizers):
//   node tests/js/tokenizer_reference.mjs            -> writes tests/data/tokenizer/golden/<name>.jsonl
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { allTokenizerFiles, dataDir, readCorpus, referenceRecords } from "./tokenizer_common.mjs";

const corpus = readCorpus();
const goldenDir = join(dataDir, "golden");
mkdirSync(goldenDir, { recursive: true });
for (const { name, file } of allTokenizerFiles()) {
  const records = await referenceRecords(file, corpus);
  writeFileSync(join(goldenDir, `${name}.jsonl`), records.map((r) => JSON.stringify(r)).join("\n") + "\n");
  console.log(`${name}: ${records.length} records`);
}
