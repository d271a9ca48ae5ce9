// Writes tests/data/tokenizer/corpus.jsonl: one JSON string per line, the hard inputs every tokenizer is checked on.
// Deterministic (no randomness), so regenerating gives the same file.
import { writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, "..", "data", "tokenizer", "corpus.jsonl");

const paragraph =
  "The quick brown fox jumps over the lazy dog. 我们今天去北京的故宫博物院参观了很多古代文物。 " +
  "東京は日本の首都です。 안녕하세요, 세계! مرحبا بالعالم! नमस्ते दुनिया। Ça coûte 12,50 € — naïve café. ";

const corpus = [
  "Hello world",
  "",
  " ",
  "  leading and trailing spaces   ",
  "Hello, World! How's it going? I'm fine; they've gone, we'll see, you'd know, IT'S DONE, I'D LIKE.",
  "我们今天去北京的故宫博物院参观了很多古代文物。人工智能正在改变世界。",
  "東京は日本の首都です。ひらがなとカタカナ、そして漢字を混ぜた文章をテストします。ｶﾀｶﾅ半角",
  "안녕하세요, 세계! 한국어 텍스트 토큰화 테스트입니다. 띄어쓰기 없이도잘되나요",
  "مرحبا بالعالم! هذه جملة عربية للاختبار، مع أرقام ١٢٣٤٥ وعلامات الترقيم؟",
  "नमस्ते दुनिया, यह हिंदी में एक परीक्षण वाक्य है। क्षत्रिय ज्ञान श्री",
  "👨‍👩‍👧‍👦 family, 👍🏽 thumbs, 🏳️‍🌈 flag, 🧑🏿‍💻 coder, 👩🏻‍❤️‍💋‍👨🏼 kiss, 🇫🇷🇯🇵 flags, ❤️‍🔥",
  "Cafe\u0301 vs Café, n\u0303 vs ñ, A\u030A vs Å, Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇ text, \u1100\u1161\u11A8 jamo, ﬁ ligature, ㎏ ①",
  "def f(x):\n\tif x:\n\t\treturn x  # comment\n\treturn None\n\nclass A:\n    def __init__(self):\n        self.v = [1, 2, 3]\n",
  "int main() {\n    for (int i = 0; i < 10; ++i) {\n\t\tprintf(\"%d\\n\", i);\n    }\n    return 0;\n}\n",
  "a" + " ".repeat(40) + "b" + "\t".repeat(12) + "c" + " \t ".repeat(8) + "d" + " ".repeat(7) + "\n" + " ".repeat(3),
  "1234567890123456789012345678901234567890 3.14159265358979 1,000,000.00 0x1F2E 2024-01-31 1e-10 ٣٤٥ ５６７",
  "line1\r\nline2\r\n\r\nline3\n\n\nline4\r\r\n \r\n\t\r\n",
  "<s> </s> <unk> <|im_start|> <|im_end|> <|endoftext|> <|begin_of_text|> <|eot_id|> [INST] [/INST] <｜begin▁of▁sentence｜>",
  "<s><s></s>x<|im_start|><|im_start|>user\n<|im_start <|im_start| |im_start|> < s> <s > <S> <<s>> [INST][/INST]x",
  "text<|endoftext|>more text<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><｜User｜>q<｜Assistant｜>",
  "Pneumonoultramicroscopicsilicovolcanoconiosis".repeat(60),
  "x".repeat(3000),
  "ab".repeat(1500) + " " + "9".repeat(700) + " " + "的".repeat(500),
  "https://example.com/path/to/page?q=hello+world&lang=en#section-2 mailto:someone@example.org !!! ??? ... --- ***",
  "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕗𝕒𝕟𝕔𝕪 𓀀𓀁 ꙮ 🜁 \u{10FFFD} rare: ȸ ʬ ᚠᛇᚻ ⅷ Ⅻ",
  "control: \u0000 \u0001 \u0008 \u001b[31mred\u001b[0m \u007f soft\u00adhyphen zero\u200bwidth \ufeffbom \ufffd",
  "nbsp:\u00a0| em:\u2003| ideographic:\u3000| narrow:\u202f| line sep:\u2028| para:\u2029| nel:\u0085|",
  "\n",
  "\n\n\n",
  " \n \n ",
  "\t",
  "Price: ¥1,234 / €56.78 / $9.99 / £0.5 — 50% off!! (limited) [x] {y} <z> @user #tag ~home ^up |pipe|",
  "{\"role\": \"user\", \"content\": \"Summarize: \\\"quoted\\\" text\", \"n\": [1, 2.5, null, true]}",
  "| col1 | col2 |\n|------|------|\n| a    | b    |\n\n- item 1\n- item 2\n  - nested **bold** _it_ `code`\n",
  "Mixed: English中文日本語한국어العربيةहिन्दीРусскийΕλληνικάעברית ไทย",
  "ALLCAPS WORDS AND CamelCaseIdentifiersLikeThisOne and snake_case_names_here and kebab-case-too",
  "   \t  mixed indentation\n\t    again\n",
  "'s 't 're 've 'm 'll 'd 'S 'T 'RE quote'd words don't won't",
  paragraph.repeat(12),
  ("Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et dolore " +
    "magna aliqua.\n").repeat(40),
  "Ελληνικά κείμενα και Русский текст с цифрами 2024 года, עברית עם ניקוד: שָׁלוֹם",
  "ไทยภาษาไม่มีช่องว่างระหว่างคำ ລາວ ខ្មែរ မြန်မာ",
  "\u00e9\u0065\u0301\u1e9b\u0323 \uac00\u1100\u1161 \u2126 \u212b \u00c5",
  "tabs\tin\tthe\tmiddle\t\tand  double  spaces  ",
  "end with space ",
  "🙂",
  "ｆｕｌｌｗｉｄｔｈ　ｔｅｘｔ　１２３",
];

writeFileSync(out, corpus.map((s) => JSON.stringify(s)).join("\n") + "\n");
console.log(`wrote ${corpus.length} strings to ${out}`);
