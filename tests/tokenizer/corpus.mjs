// The tokenizer parity corpus: hand-written edge cases plus strings drawn by a seeded PRNG
// (mulberry32), so every run and every machine sees the same ~2,400 strings.

const HAND = [
  "", " ", "  ", "\t", "\n", "\r\n", "\n\n\n", " \n ", "\t\t  \n\t", "   leading", "trailing   ", "a  b   c    d",
  "Hello world", "Hello, world!", "hello\nworld", "Hello World HELLO world", "I'm here", "you're", "they've",
  "we'll", "he'd", "it's", "IT'S", "They'LL", "DON'T", "o'clock", "rock'n'roll", "'s 't 're", "''quoted''",
  "1", "12", "123", "1234", "12345678901234567890", "3.14159", "-42", "1,000,000", "0x1F600", "1e-9", "v2.0.1",
  "٣٤٥", "१२३", "１２３４", "²³", "½ ¾", "Ⅻ",
  "def f(x):\n    return x * 2\n", "int main() {\n\treturn 0;\n}\n", "for (int i = 0; i < n; ++i) { a[i] += b[i]; }",
  "const x = await fetch(`/api/${id}`);", "SELECT * FROM users WHERE id = 42;", "<div class=\"a\">x</div>",
  "#include <stdio.h>", "x->y && !z || w != 0", "// comment\n/* block */", "    indented\n        more\n",
  "if x == 1:\n\tpass\n", "{\"key\": [1, 2, {\"n\": null}]}", "a_b_c = snake_case + CamelCase", "path/to/file.txt",
  "https://example.com/a?b=c&d=e#f", "user@example.com", "$HOME/.bashrc", "C:\\Windows\\System32", "~~~***!!!???",
  "机器学习是人工智能的一个分支。", "日本語のテキストとカタカナ、ひらがな。", "한국어 텍스트입니다.", "中文，標點符號：「」『』",
  "Привет, мир! Как дела?", "Ελληνικά γράμματα", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "सत्यमेव जयते।",
  "สวัสดีครับ ยินดีต้อนรับ", "ລາວ", "ქართული", "Հայերեն", "தமிழ்", "తెలుగు", "ಕನ್ನಡ", "മലയാളം", "বাংলা", "ગુજરાતી",
  "ਪੰਜਾਬੀ", "සිංහල", "မြန်မာ", "ខ្មែរ", "አማርኛ", "Tiếng Việt có dấu", "Zażółć gęślą jaźń", "Ærøskøbing", "straße",
  "naïve café résumé", "e\u0301", "A\u030A", "\u1100\u1161\u11A8", "ﬁ ﬂ", "Å Å", "\u0041\u0308\u0301",
  "😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇺🇸🇯🇵", "1️⃣", "❤️", "👩‍💻 coding", "🤷‍♀️", "emoji😀in😀text", "😀😀😀😀😀",
  "\u200d", "a\u200db", "\ufeffBOM", "x\u0085y", "x\u00a0y", "x\u2028y", "x\u2029y", "\u3000全角空白", "x\u200by",
  "\u202e reversed", "\u200f\u200e", "tab\there", "\u000b\u000c", "\u0001\u0002\u001f", "nul\u0000byte", "\u007f",
  "<|im_start|>user\nhello<|im_end|>\n", "<|im_start|>assistant\n<think>\nok\n</think>\n\nhi<|im_end|>",
  "<|endoftext|>", "<|im_start|><|im_end|>", "<|im_start", "im_end|>", "< |im_start| >", "x<|im_end|>y",
  "<tool_call>\n{\"name\": \"f\"}\n</tool_call>", "<tool_response>ok</tool_response>", "<think></think>",
  "<｜begin▁of▁sentence｜>hi", "<｜User｜>question<｜Assistant｜>answer<｜end▁of▁sentence｜>",
  "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get", "<｜User", "｜>", "<｜▁pad▁｜>",
  "a".repeat(300), " ".repeat(100), "\n".repeat(50), "ab".repeat(200), "😀".repeat(40), "中".repeat(200),
  "word ".repeat(100), "1234567890".repeat(20), "\t \n".repeat(30), "!@#$%^&*()_+-=[]{}|;':\",./<>?`~",
  "The quick brown fox jumps over the lazy dog.", "Lorem ipsum dolor sit amet, consectetur adipiscing elit.",
];

function mulberry32(seed) {
  return function () {
    seed |= 0;
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// Code point ranges assigned long ago (Unicode <= 10), so every Unicode version in use agrees on
// their properties.
const RANGES = [
  [0x20, 0x7e, 30], [0xa0, 0xff, 4], [0x100, 0x17f, 3], [0x300, 0x36f, 2], [0x391, 0x3c9, 2], [0x410, 0x44f, 4],
  [0x5d0, 0x5ea, 2], [0x621, 0x64a, 3], [0x660, 0x669, 1], [0x905, 0x939, 3], [0x93e, 0x94d, 1], [0xe01, 0xe3a, 3],
  [0xe40, 0xe4e, 1], [0x1100, 0x1112, 1], [0x1161, 0x1175, 1], [0x3041, 0x3096, 3], [0x30a1, 0x30fa, 3],
  [0x4e00, 0x9fa5, 8], [0xac00, 0xd7a3, 3], [0xff01, 0xff5e, 2], [0x2000, 0x206f, 2], [0x2190, 0x21ff, 1],
  [0x2200, 0x22ff, 1], [0x1f300, 0x1f5ff, 3], [0x1f600, 0x1f64f, 3], [0x1f680, 0x1f6c5, 1], [0x1f910, 0x1f93e, 1],
  [0x20000, 0x2a6d6, 1], [0x1d400, 0x1d454, 1],
];
const WHITESPACE = [" ", " ", " ", "  ", "\n", "\t", "\r\n", "\n\n", "   ", "\u00a0", "\u3000", " \n"];
const WORDS = [
  "the", "tokenizer", "function", "return", "Hello", "WORLD", "isn't", "we've", "数据", "模型", "東京", "ことば",
  "Москва", "данные", "القاهرة", "नमस्ते", "ภาษา", "한국", "αβγ", "über", "ﬁnal", "e\u0301t\u0301e", "0.5", "42",
  "2026", "x86_64", "std::vector", "=>", "!==", "...", "---", "```", "<|im_end|>", "<think>", "<｜User｜>",
  "<｜end▁of▁sentence｜>", "👍", "👨‍👩‍👧", "🇫🇷", "✨", "(", ")", "[]", "{}", "\"", "'", "#", "@", "%", "$5.00",
];

function randomCodePoint(rand, total) {
  let r = rand() * total;
  for (const [lo, hi, w] of RANGES) {
    if (r < w) return String.fromCodePoint(lo + Math.floor(rand() * (hi - lo + 1)));
    r -= w;
  }
  return "x";
}

// `wide` extra strings of code points drawn from all of U+0000..U+2FFFF (surrogates excluded),
// for one-off checks beyond the test corpus: they include characters assigned after Unicode 14,
// where PCRE2's tables and node's differ (see docs/ARCHITECTURE.md).
export function makeCorpus(count = 2400, seed = 20260601, wide = 0) {
  const rand = mulberry32(seed);
  const total = RANGES.reduce((s, r) => s + r[2], 0);
  const out = [...HAND];
  while (out.length < count) {
    const kind = rand();
    const parts = [];
    const n = 1 + Math.floor(rand() * 24);
    for (let i = 0; i < n; ++i) {
      const k = rand();
      if (kind < 0.5 && k < 0.55) parts.push(WORDS[Math.floor(rand() * WORDS.length)]);
      else if (k < 0.75) {
        let w = "";
        const len = 1 + Math.floor(rand() * 8);
        for (let j = 0; j < len; ++j) w += randomCodePoint(rand, total);
        parts.push(w);
      } else parts.push(WHITESPACE[Math.floor(rand() * WHITESPACE.length)]);
      if (rand() < 0.4) parts.push(" ");
    }
    out.push(parts.join(""));
  }
  for (let i = 0; i < wide; ++i) {
    let w = "";
    const n = 1 + Math.floor(rand() * 20);
    for (let j = 0; j < n; ++j) {
      const cp = Math.floor(rand() * 0x30000);
      w += cp >= 0xd800 && cp <= 0xdfff ? "A" : String.fromCodePoint(cp);
      if (rand() < 0.3) w += " ";
    }
    out.push(w);
  }
  return out;
}
