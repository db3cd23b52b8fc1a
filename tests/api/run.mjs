// API tests for `flashserve serve` with the real OpenAI and Anthropic npm clients.
//
//   node run.mjs --binary build/src/flashserve [--model DIR] [--random-weights]
//
// --random-weights: the model's weights are random (models/deepseek-v4-tiny, models/glm5-tiny);
// the checks of what a trained model writes are skipped, saying so (family.mjs).
//
// Starts the server on a free loopback port (--port 0; the bound port is read from its log),
// waits for /health, runs every test in order, and stops the server. A global timer kills the
// server and fails the run if anything hangs. Prints one line per test and a JSON summary with
// the measured figures (load test requests/s, TTFT).
import { mkdtempSync, openSync, readdirSync, readFileSync, rmSync, statSync, writeSync, closeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { spawnServer } from './server.mjs';
import { figures, results, skip, summary, test } from './harness.mjs';
import { modelProfile } from './family.mjs';

const args = process.argv.slice(2);
const argOf = (name, dflt) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : dflt;
};
const binary = argOf('--binary');
const model = argOf('--model');
if (!binary) {
  console.error('usage: node run.mjs --binary PATH [--model DIR]');
  process.exit(2);
}

const profile = modelProfile(model, args);
console.log(`model ${model ?? '(embedded)'}: family ${profile.family}, ${profile.trained ? 'trained' : 'random'} weights`);

const servers = [];
const globalTimer = setTimeout(() => {
  console.error('api tests: global timeout; killing the servers');
  for (const s of servers) s.proc.kill('SIGKILL');
  process.exit(1);
}, Number(argOf('--timeout-s', '150')) * 1000);

async function startServer(extra) {
  const { proc, port, base, log } = await spawnServer(binary, [...(model ? ['--model', model] : []), ...extra]);
  for (let i = 0; i < 100; ++i) {
    try {
      if ((await fetch(`${base}/health`)).ok) break;
    } catch {}
    await new Promise((r) => setTimeout(r, 100));
  }
  const server = { proc, base, port, log };
  servers.push(server);
  return server;
}

async function stopServer(server) {
  const exited = new Promise((r) => server.proc.on('exit', (code, sig) => r({ code, sig })));
  server.proc.kill('SIGTERM');
  const t = setTimeout(() => server.proc.kill('SIGKILL'), 10000);
  const r = await exited;
  clearTimeout(t);
  return r;
}

async function metrics(base) {
  const text = await (await fetch(`${base}/metrics`)).text();
  const values = new Map();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    values.set(line.slice(0, i), Number(line.slice(i + 1)));
  }
  return values;
}

function threadsOf(pid) {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  return Number(status.match(/Threads:\s+(\d+)/)[1]);
}


async function postJson(base, path, body, headers = {}) {
  const res = await fetch(base + path, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  let json = null;
  const text = await res.text();
  try {
    json = JSON.parse(text);
  } catch {}
  return { status: res.status, json, text, headers: res.headers };
}

const nonce = () => Math.random().toString(36).slice(2, 10);
const userMsg = (content) => [{ role: 'user', content }];

const main = await startServer(['--mtp-depth', '2', '--max-body-bytes', '1048576']);
const { base } = main;
const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 });
const anthropic = new Anthropic({ baseURL: base, apiKey: 'unused', maxRetries: 0 });

await test('models list and get', async () => {
  const list = await openai.models.list();
  assert.equal(list.data.length, 1);
  const id = list.data[0].id;
  assert.equal((await openai.models.retrieve(id)).id, id);
  await assert.rejects(openai.models.retrieve('no-such-model'), (e) => e.status === 404);
});

await test('chat: non-streaming with usage', async () => {
  const r = await openai.chat.completions.create({
    model: 'x', messages: userMsg('def add(a, b):'), max_tokens: 12, temperature: 0,
  });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(r.usage.prompt_tokens > 5);
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 12);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  if (r.choices[0].finish_reason === 'length') assert.equal(r.usage.completion_tokens, 12);
});

await test('chat: streaming equals non-streaming (greedy), include_usage', async () => {
  const body = { model: 'x', messages: userMsg('import os\n'), max_tokens: 16, temperature: 0 };
  const full = await openai.chat.completions.create(body);
  const stream = await openai.chat.completions.create({
    ...body, stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let reasoning = '';
  let usage = null;
  let finish = null;
  let chunks = 0;
  for await (const c of stream) {
    ++chunks;
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      text += ch.delta?.content ?? '';
      reasoning += ch.delta?.reasoning_content ?? '';
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  assert.ok(chunks >= 3);
  assert.equal(text, full.choices[0].message.content);
  assert.equal(reasoning, full.choices[0].message.reasoning_content ?? '');
  assert.equal(finish, full.choices[0].finish_reason);
  assert.deepEqual(
    [usage.prompt_tokens, usage.completion_tokens],
    [full.usage.prompt_tokens, full.usage.completion_tokens]);
});

await test('completions: non-streaming and streaming', async () => {
  const body = { model: 'x', prompt: 'def fib(n):\n', max_tokens: 10, temperature: 0 };
  const r = await openai.completions.create(body);
  assert.equal(r.object, 'text_completion');
  assert.ok(r.usage.completion_tokens >= 1);
  let text = '';
  for await (const c of await openai.completions.create({ ...body, stream: true }))
    text += c.choices[0]?.text ?? '';
  assert.equal(text, r.choices[0].text);
});

await test('stop sequences (OpenAI and Anthropic, streaming and not)', async () => {
  const body = { model: 'x', prompt: 'class Stack:\n    def', max_tokens: 24, temperature: 0 };
  const free = (await openai.completions.create(body)).choices[0].text;
  assert.ok(free.length >= 6, `generated text too short: ${JSON.stringify(free)}`);
  const stop = free.slice(3, 5);
  const expected = free.slice(0, free.indexOf(stop));
  const r = await openai.completions.create({ ...body, stop: [stop, 'never-there'] });
  assert.equal(r.choices[0].text, expected);
  assert.equal(r.choices[0].finish_reason, 'stop');
  let text = '';
  for await (const c of await openai.completions.create({ ...body, stop, stream: true }))
    text += c.choices[0]?.text ?? '';
  assert.equal(text, expected);

  // Where the template opens a think block by default, thinking off, so that text comes.
  const noThink = profile.thinksByDefault ? { thinking: { type: 'disabled' } } : {};
  const a = await anthropic.messages.create({
    model: 'x', max_tokens: 24, temperature: 0, messages: userMsg('class Stack:'), ...noThink,
  });
  // The text block (the model may think first: a thinking block comes before it).
  const textOf = (m) => m.content.find((b) => b.type === 'text')?.text ?? '';
  const atext = textOf(a);
  if (atext.length >= 4) {
    const astop = atext.slice(2, 4);
    const b = await anthropic.messages.create({
      model: 'x', max_tokens: 24, temperature: 0, messages: userMsg('class Stack:'), ...noThink,
      stop_sequences: [astop],
    });
    assert.equal(b.stop_reason, 'stop_sequence');
    assert.equal(b.stop_sequence, astop);
    assert.equal(textOf(b), atext.slice(0, atext.indexOf(astop)));
  }
});

// A turn that ends on a stop sequence is a finished turn: its state (prompt + the tokens up to
// and including the match) is published to the bank. (It used to end as a cancellation and be
// dropped.)
await test('a turn ended by a stop sequence is banked', async () => {
  const prompt = `# ${nonce()}\nclass Queue:\n    def`;
  const body = { model: 'x', prompt, max_tokens: 24, temperature: 0 };
  const free = (await openai.completions.create(body)).choices[0].text;
  assert.ok(free.length >= 8, `generated text too short: ${JSON.stringify(free)}`);
  const stop = free.slice(4, 6);
  const key = 'flashserve_session_commits_total{result="published"}';
  const before = await metrics(base);
  const r = await openai.completions.create({ ...body, stop: [stop] });
  assert.equal(r.choices[0].finish_reason, 'stop');
  const after = await metrics(base);
  assert.equal(after.get(key) - before.get(key), 1, 'the stop-sequence turn was not banked');
  assert.equal(after.get('flashserve_session_commits_total{result="dropped"}'),
    before.get('flashserve_session_commits_total{result="dropped"}'));
});

await test('seed reproducibility (sampled)', async () => {
  const body = {
    model: 'x', messages: userMsg('def main():'), max_tokens: 16, temperature: 1.0, top_p: 0.95,
  };
  // The whole output: reasoning (a template may open the think block) and content.
  const texts = [];
  for (const seed of [7, 7, 8, 9, 10]) {
    const m = (await openai.chat.completions.create({ ...body, seed })).choices[0].message;
    texts.push((m.reasoning_content ?? '') + '|' + (m.content ?? ''));
  }
  assert.equal(texts[0], texts[1]);
  assert.ok(new Set(texts.slice(1)).size > 1, 'different seeds all gave the same text');
  const s = await collectChat(await openai.chat.completions.create({ ...body, seed: 7, stream: true }));
  assert.equal(s.msg.reasoning_content + '|' + s.msg.content, texts[0]);
});

await test('anthropic: non-streaming and the streaming event sequence', async () => {
  const body = {
    model: 'x', max_tokens: 10, temperature: 0, system: 'You write Python.',
    messages: userMsg([{ type: 'text', text: 'def sort(xs):' }]),
  };
  const m = await anthropic.messages.create(body);
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.ok(['end_turn', 'max_tokens'].includes(m.stop_reason));
  assert.ok(m.usage.input_tokens > 5 && m.usage.output_tokens >= 1);
  const events = [];
  const stream = anthropic.messages.stream(body);
  for await (const e of stream) events.push(e.type);
  const final = await stream.finalMessage();
  assert.equal(final.content[0].text, m.content[0].text);
  assert.equal(final.usage.output_tokens, m.usage.output_tokens);
  assert.equal(events[0], 'message_start');
  assert.equal(events[1], 'content_block_start');
  assert.deepEqual(events.slice(-3), ['content_block_stop', 'message_delta', 'message_stop']);
  assert.ok(events.slice(2, -3).every((t) => t === 'content_block_delta'));
});

await test('anthropic: count_tokens equals the usage of the same messages', async () => {
  const body = { model: 'x', system: 'Be brief.', messages: userMsg('def count(xs):') };
  const counted = await anthropic.messages.countTokens(body);
  const m = await anthropic.messages.create({ ...body, max_tokens: 2 });
  assert.equal(counted.input_tokens, m.usage.input_tokens);
  const bad = await postJson(base, '/v1/messages/count_tokens', { messages: 5 });
  assert.equal(bad.status, 400);
  assert.equal(bad.json.type, 'error');
});

// --- Agents' request shapes (issue 12): tools, tool_choice forcing, thinking, logprobs. The
// assertions hold whatever the embedded model writes: a forced call either parses (a tool_use
// block / tool_calls) or comes back as text.
const weatherTool = {
  name: 'get_weather',
  description: 'Get the current weather in a given location',
  input_schema: {
    type: 'object',
    properties: { location: { type: 'string', description: 'The city and state' } },
    required: ['location'],
  },
};
const openaiWeatherTool = {
  type: 'function',
  function: { name: weatherTool.name, description: weatherTool.description, parameters: weatherTool.input_schema },
};

// A message's content as the Anthropic SDK's stream accumulator sees it, minus its private fields.
const plainContent = (content) => JSON.parse(JSON.stringify(content));

await test('anthropic: Claude Code-shaped request (system message in messages, cache_control, tools, adaptive thinking, unused fields), streamed and not', async () => {
  const body = {
    model: 'claude-sonnet-4-5-20250929', max_tokens: 24, temperature: 0,
    system: [
      { type: 'text', text: 'You are a coding agent.', cache_control: { type: 'ephemeral' } },
      { type: 'text', text: `Session ${nonce()}.`, cache_control: { type: 'ephemeral' } },
    ],
    messages: [
      { role: 'user', content: [{ type: 'text', text: 'def add(a, b):', cache_control: { type: 'ephemeral' } }] },
      { role: 'system', content: 'Answer in Python.' },
    ],
    tools: [weatherTool, { name: 'Bash', description: 'Run a shell command', input_schema: { type: 'object', properties: { command: { type: 'string' } }, required: ['command'] }, cache_control: { type: 'ephemeral' } }],
    thinking: { type: 'adaptive' },
    context_management: { edits: [{ type: 'clear_thinking_20251015', keep: 'all' }] },
    output_config: { effort: 'medium' },
    metadata: { user_id: 'user_x_account__session_y' },
    a_future_field: { nested: [1, 2] },
  };
  const m = await anthropic.messages.create(body);
  assert.equal(m.type, 'message');
  assert.ok(['end_turn', 'max_tokens', 'tool_use'].includes(m.stop_reason), m.stop_reason);
  assert.equal(m.usage.cache_creation_input_tokens, 0);
  assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens,
    (await anthropic.messages.countTokens({ ...body, max_tokens: undefined })).input_tokens);
  const stream = anthropic.messages.stream(body);
  const types = [];
  for await (const e of stream) types.push(e.type);
  const final = await stream.finalMessage();
  assert.deepEqual(plainContent(final.content), plainContent(m.content));
  assert.equal(final.stop_reason, m.stop_reason);
  assert.equal(types[0], 'message_start');
  assert.deepEqual(types.slice(-2), ['message_delta', 'message_stop']);
});

await test('anthropic: tool_choice "tool" forces the call; streaming gives the body; tool_use/tool_result/thinking history is accepted', async () => {
  const body = {
    model: 'x', max_tokens: 40, temperature: 0, tools: [weatherTool],
    tool_choice: { type: 'tool', name: 'get_weather', disable_parallel_tool_use: true },
    messages: userMsg(`What is the weather in Paris? ${nonce()}`),
  };
  const m = await anthropic.messages.create(body);
  const call = m.content.find((b) => b.type === 'tool_use');
  if (call) {
    assert.equal(m.stop_reason === 'tool_use' || m.stop_reason === 'max_tokens', true, m.stop_reason);
    assert.equal(call.name, 'get_weather');
    assert.match(call.id, /^toolu_/);
    assert.equal(typeof call.input, 'object');
  } else {
    // The model did not write a valid call: the forced opening and its text come back as text.
    assert.ok(m.content[0].text.startsWith(profile.forcedCallPrefix('get_weather')), JSON.stringify(m.content));
  }
  const stream = anthropic.messages.stream(body);
  const final = await stream.finalMessage();
  // The same blocks (a call's id is new in every response).
  const noIds = (content) => plainContent(content).map((b) => (b.type === 'tool_use' ? { ...b, id: 'toolu_' } : b));
  assert.deepEqual(noIds(final.content), noIds(m.content));

  // The next turn of such a conversation, as a client sends it (Anthropic's tool-use guide).
  const history = {
    model: 'x', max_tokens: 8, temperature: 0, tools: [weatherTool], thinking: { type: 'enabled', budget_tokens: 1024 },
    messages: [
      { role: 'user', content: 'What is the weather in Paris?' },
      { role: 'assistant', content: [
        { type: 'thinking', thinking: 'I should call get_weather.', signature: 'fs1-0000000000000000' },
        { type: 'redacted_thinking', data: 'opaque' },
        { type: 'tool_use', id: 'toolu_01', name: 'get_weather', input: { location: 'Paris' } }] },
      { role: 'user', content: [
        { type: 'tool_result', tool_use_id: 'toolu_01', content: [{ type: 'text', text: '14 degrees' }] },
        { type: 'tool_result', tool_use_id: 'toolu_02', content: 'timeout', is_error: true }] },
    ],
  };
  const h = await anthropic.messages.create(history);
  assert.equal(h.type, 'message');
  const bad = await postJson(base, '/v1/messages', {
    ...history, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'iVBOR' } }] }],
  });
  assert.equal(bad.status, 400);
  assert.match(bad.json.error.message, /messages\[0\]\.content\[0\].*image.*text only/);
});

await test('anthropic: thinking budget_tokens cuts the reasoning, then the model answers', async () => {
  const body = { model: 'x', max_tokens: 60, temperature: 0, messages: userMsg(`hello ${nonce()}`) };
  const free = await anthropic.messages.create({ ...body, thinking: { type: 'adaptive' } });
  const bounded = await anthropic.messages.create({ ...body, thinking: { type: 'enabled', budget_tokens: 3 } });
  const thinking = (m) => m.content.find((b) => b.type === 'thinking')?.thinking ?? '';
  assert.ok(thinking(free).length > 0, `the embedded model thinks first: ${JSON.stringify(free.content)}`);
  assert.ok(thinking(bounded).length > 0 && thinking(bounded).length < thinking(free).length,
    `${JSON.stringify(thinking(bounded))} vs ${JSON.stringify(thinking(free))}`);
  assert.ok(thinking(free).startsWith(thinking(bounded)));
  assert.ok(bounded.content.some((b) => b.type === 'text' && b.text.length > 0), JSON.stringify(bounded.content));
  // Streamed, the same blocks.
  const streamed = await anthropic.messages.stream({ ...body, thinking: { type: 'enabled', budget_tokens: 3 } }).finalMessage();
  assert.deepEqual(plainContent(streamed.content), plainContent(bounded.content));
});

await test('anthropic: the second turn is a RAM hit under api="messages" and reports cache_read_input_tokens', async () => {
  const key = (tier) => `flashserve_session_lookups_total{api="messages",tier="${tier}"}`;
  const before = await metrics(base);
  const messages = [{ role: 'user', content: `# ${nonce()}\ndef parse(line):` }];
  const t1 = await anthropic.messages.create({ model: 'x', max_tokens: 6, temperature: 0, messages });
  assert.equal(t1.usage.cache_read_input_tokens, 0);
  messages.push({ role: 'assistant', content: t1.content });
  messages.push({ role: 'user', content: 'and test it' });
  const t2 = await anthropic.messages.create({ model: 'x', max_tokens: 6, temperature: 0, messages });
  const after = await metrics(base);
  assert.equal(after.get(key('cold')) - before.get(key('cold')), 1);
  assert.equal(after.get(key('ram')) - before.get(key('ram')), 1);
  assert.ok(t2.usage.cache_read_input_tokens >= t1.usage.input_tokens,
    `turn 2 read ${t2.usage.cache_read_input_tokens} cached tokens of turn 1's ${t1.usage.input_tokens}`);
});

// Accumulates streamed OpenAI chat chunks into one message, as agents do.
async function collectChat(stream) {
  const msg = { content: '', reasoning_content: '', tool_calls: [] };
  let finish = null;
  const logprobs = [];
  for await (const c of stream) {
    const ch = c.choices[0];
    if (!ch) continue;
    if (ch.finish_reason) finish = ch.finish_reason;
    if (ch.logprobs?.content) logprobs.push(...ch.logprobs.content);
    const d = ch.delta ?? {};
    msg.content += d.content ?? '';
    msg.reasoning_content += d.reasoning_content ?? '';
    for (const t of d.tool_calls ?? []) {
      if (t.id) {
        assert.equal(t.index, msg.tool_calls.length, 'a new call takes the next index');
        assert.equal(t.type, 'function');
        assert.equal(t.function.arguments, '');
        msg.tool_calls.push({ id: t.id, type: 'function', function: { name: t.function.name, arguments: '' } });
      } else {
        msg.tool_calls[t.index].function.arguments += t.function.arguments;
      }
    }
  }
  return { msg, finish, logprobs };
}

await test('openai: forced tool_choice (function and required); streamed tool_calls deltas give the body', async () => {
  for (const tool_choice of [{ type: 'function', function: { name: 'get_weather' } }, 'required']) {
    const body = {
      model: 'x', max_tokens: 80, temperature: 0, tools: [openaiWeatherTool], tool_choice, parallel_tool_calls: false,
      messages: [{ role: 'developer', content: 'Use tools.' }, ...userMsg(`Weather in Paris? ${nonce()}`)],
    };
    const r = await openai.chat.completions.create(body);
    const m = r.choices[0].message;
    if (m.tool_calls?.length) {
      assert.ok(['tool_calls', 'length'].includes(r.choices[0].finish_reason));
      // Forced by name, and 'required' with one tool is that tool.
      assert.equal(m.tool_calls[0].function.name, 'get_weather');
      // The arguments are the model's text (as OpenAI's: not guaranteed to be valid JSON, and cut
      // short by max_tokens on finish "length"); when they parse, they are an object.
      const args = m.tool_calls[0].function.arguments;
      assert.equal(typeof args, 'string');
      let parsed;
      try { parsed = JSON.parse(args); } catch { parsed = undefined; }
      if (parsed !== undefined) assert.equal(typeof parsed, 'object');
    } else {
      assert.ok(m.content.startsWith(profile.forcedCallPrefix()), JSON.stringify(m));
    }
    const s = await collectChat(await openai.chat.completions.create({ ...body, stream: true }));
    assert.equal(s.finish, r.choices[0].finish_reason);
    assert.equal(s.msg.content, m.content ?? '');
    assert.equal(s.msg.reasoning_content, m.reasoning_content ?? '');
    assert.deepEqual(s.msg.tool_calls.map((c) => [c.function.name, c.function.arguments]),
      (m.tool_calls ?? []).map((c) => [c.function.name, c.function.arguments]));
  }
  // A conversation with the assistant's tool_calls and the tool's answer (OpenAI's guide).
  const r = await openai.chat.completions.create({
    model: 'x', max_tokens: 6, temperature: 0, tools: [openaiWeatherTool], tool_choice: 'auto',
    messages: [
      ...userMsg('What is the weather like in Paris today?'),
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"location":"Paris, France"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: '14' },
    ],
  });
  assert.equal(r.object, 'chat.completion');
});

await test('openai: logprobs and top_logprobs (non-streaming equals streaming; greedy picks the top alternative)', async () => {
  const body = { model: 'x', messages: userMsg('def square(x):'), max_tokens: 10, temperature: 0, logprobs: true, top_logprobs: 3 };
  const r = await openai.chat.completions.create(body);
  const lps = r.choices[0].logprobs.content;
  assert.equal(lps.length, r.usage.completion_tokens);
  for (const t of lps) {
    assert.ok(t.logprob <= 0);
    assert.equal(t.top_logprobs.length, 3);
    if (!t.token.includes('\ufffd')) assert.deepEqual([...Buffer.from(t.token)], t.bytes);
    for (let i = 1; i < 3; ++i) assert.ok(t.top_logprobs[i - 1].logprob >= t.top_logprobs[i].logprob);
    assert.ok(t.top_logprobs.reduce((a, x) => a + Math.exp(x.logprob), 0) <= 1 + 1e-6);
    // Greedy without penalties: the emitted token is the most likely one.
    assert.ok(Math.abs(t.logprob - t.top_logprobs[0].logprob) < 1e-9, JSON.stringify(t));
  }
  // The tokens' bytes are the generated text (and the end-of-turn token's, when it ended so).
  assert.ok(Buffer.concat(lps.map((t) => Buffer.from(t.bytes))).toString().startsWith(r.choices[0].message.content));
  const s = await collectChat(await openai.chat.completions.create({ ...body, stream: true }));
  assert.deepEqual(s.logprobs.map((t) => [t.token, t.logprob]), lps.map((t) => [t.token, t.logprob]));
  const plain = await openai.chat.completions.create({ ...body, logprobs: undefined, top_logprobs: undefined });
  assert.equal(plain.choices[0].logprobs, null);
  const c = await openai.completions.create({ model: 'x', prompt: 'def cube(x):', max_tokens: 5, temperature: 0, logprobs: 2 });
  assert.equal(c.choices[0].logprobs.tokens.length, c.usage.completion_tokens);
  assert.equal(Object.keys(c.choices[0].logprobs.top_logprobs[0]).length <= 2, true);
});

await test('max_tokens beyond the context is clamped, not refused (a small-context server); MTP is on by default', async () => {
  const s = await startServer(['--max-context', '160']);
  try {
    assert.match(s.log(), /mtp depth 3/, 'serve defaults to the MTP depth of run when the checkpoint has a head');
    const a = new Anthropic({ baseURL: s.base, apiKey: 'unused', maxRetries: 0 });
    // Streamed, as Claude Code sends it (the SDK refuses a non-streaming 32000-token request).
    const m = await a.messages.stream({ model: 'x', max_tokens: 32000, temperature: 0, messages: userMsg('def f():') }).finalMessage();
    assert.ok(['max_tokens', 'end_turn'].includes(m.stop_reason));
    if (m.stop_reason === 'max_tokens') assert.equal(m.usage.input_tokens + m.usage.output_tokens, 160);
    const o = new OpenAI({ baseURL: `${s.base}/v1`, apiKey: 'unused', maxRetries: 0 });
    const r = await o.chat.completions.create({ model: 'x', max_completion_tokens: 30000, temperature: 0, messages: userMsg('def g():') });
    if (r.choices[0].finish_reason === 'length') assert.equal(r.usage.total_tokens, 160);
    // Above --max-tokens-limit too (Qwen Code retries a turn with max_tokens 64000).
    const h = await o.chat.completions.create({ model: 'x', max_tokens: 1e9, temperature: 0, messages: userMsg('def h():') });
    if (h.choices[0].finish_reason === 'length') assert.equal(h.usage.total_tokens, 160);
  } finally {
    assert.equal((await stopServer(s)).code, 0);
  }
});

// The agents' recorded tool-turn requests (tests/agents/fixtures: 12-14 tools, the call and its
// result in the history, ~17k tokens), sent as they arrived but with a small max_tokens: answered
// 200 with a complete stream; Claude Code's count_tokens too.
await test('agents\' recorded requests: answered 200, streamed to the end', async () => {
  const dir = new URL('../agents/fixtures/', import.meta.url);
  // The recorded prompts are 17k tokens and more: a model with a smaller context refuses them
  // with a clear 400 (the tiny random models have 4096).
  const ctx = Number(main.log().match(/context (\d+)/)[1]);
  for (const name of ['claude-code-3.json', 'qwen-code-3.json']) {
    const f = JSON.parse(readFileSync(new URL(name, dir), 'utf8'));
    const anthropicPath = f.path.startsWith('/v1/messages');
    if (anthropicPath) {
      const counted = await postJson(base, '/v1/messages/count_tokens?beta=true', { ...f.body, max_tokens: undefined, stream: undefined });
      assert.equal(counted.status, 200, `${name}: ${counted.text.slice(0, 300)}`);
      assert.ok(counted.json.input_tokens > 10000);
    }
    const r = await postJson(base, f.path, { ...f.body, max_tokens: 16 });
    if (ctx < 10000) {
      assert.equal(r.status, 400, `${name}: ${r.text.slice(0, 300)}`);
      assert.equal(anthropicPath ? r.json.error.type : r.json.error.code,
        anthropicPath ? 'invalid_request_error' : 'context_length_exceeded', r.text.slice(0, 300));
      continue;
    }
    assert.equal(r.status, 200, `${name}: ${r.text.slice(0, 300)}`);
    assert.ok(anthropicPath ? r.text.includes('event: message_stop') : r.text.includes('data: [DONE]'), `${name}: ${r.text.slice(-300)}`);
    assert.ok(!r.text.includes('"error"'), `${name}: ${r.text.slice(0, 300)}`);
  }
});

await test('fuzz: 150 mutated bodies (bytes, values, nesting, key counts, Unicode, size) get JSON answers (200 or 4xx), never a crash or a hang', async () => {
  const seeds = [
    ['/v1/chat/completions', { model: 'x', messages: userMsg('hi'), max_tokens: 2, temperature: 0.5, stop: ['a'] }],
    ['/v1/completions', { model: 'x', prompt: 'x = ', max_tokens: 2, top_p: 0.5 }],
    ['/v1/messages', { model: 'x', max_tokens: 2, system: 's', messages: userMsg([{ type: 'text', text: 'q' }]) }],
  ];
  let state = 12345;
  const rand = (n) => ((state = (state * 1103515245 + 12345) % 2147483648) % n);
  const failures = [];
  for (let i = 0; i < 150; ++i) {
    const [path, body] = seeds[i % seeds.length];
    let text = JSON.stringify(body);
    const kind = rand(7);
    const at = rand(text.length);
    if (kind === 0) text = text.slice(0, at);
    else if (kind === 1) {
      text = text.slice(0, at) + String.fromCharCode(rand(128)) + text.slice(at + 1);
    } else if (kind === 2) {
      text = text.slice(0, at) + ['null', '[]', '{}', '-1', '1e309', '"\\u0000"', 'true'][rand(7)] + text.slice(at);
    } else if (kind === 3) {
      // Nesting, closed or not, anywhere (the depth limit is 64).
      const d = [63, 64, 65, 1000, 100000][rand(5)];
      text = text.slice(0, at) + '['.repeat(d) + (rand(2) ? ']'.repeat(d) : '') + text.slice(at);
    } else if (kind === 4) {
      // Many keys (linear-time parsing), as a value or spliced into an object.
      const n = [1, 1000, 40000][rand(3)];
      text = text.slice(0, at) + '{' + Array.from({ length: n }, (_, i) => `"k${i}":${i}`).join(',') + '}' + text.slice(at);
    } else if (kind === 5) {
      // Unicode edge cases where a string may be.
      const u = ['"\\ud800"', '"\\udfff\\ud800"', '"\\ud83d\\ude00"', '"\uffff\ufeff"', '"\u0301\u200d"', '"\\u0000\\u001f"'][rand(6)];
      text = text.slice(0, at) + u + text.slice(at);
    } else {
      // Size: a long string near the body limit (1 MiB on this server) or over it.
      text = text.slice(0, at) + JSON.stringify('x'.repeat([1000, 900000, 1200000][rand(3)])) + text.slice(at);
    }
    const r = await postJson(base, path, text);
    if (!(r.status === 200 || (r.status >= 400 && r.status < 500)) || r.json === null)
      failures.push(`${path} ${JSON.stringify(text)} -> ${r.status} ${r.text.slice(0, 120)}`);
  }
  assert.deepEqual(failures, []);
  assert.ok((await fetch(`${base}/health`)).ok);
});

// Hostile shapes rather than random bytes: deep nesting (the body that used to kill the server
// with ~120k '['), huge key counts (quadratic parsing), big bodies near the limit and Unicode
// edge cases, in every field position the parsers read. Each must get a JSON answer quickly.
await test('fuzz: nesting, size, key-count and Unicode mutations get JSON answers, the server stays up', async () => {
  const deep = (d, inner = '"x"') => '['.repeat(d) + inner + ']'.repeat(d);
  const deepObj = (d) => '{"a":'.repeat(d) + '1' + '}'.repeat(d);
  const manyKeys = (n) => '{' + Array.from({ length: n }, (_, i) => `"k${i}":${i}`).join(',') + '}';
  const wrapChat = (content, extra = '') =>
    `{"model":"x","max_tokens":2,"messages":[{"role":"user","content":${content}}]${extra}}`;
  const cases = [
    ['/v1/chat/completions', wrapChat(deep(120000)), 400],
    ['/v1/chat/completions', wrapChat('"hi"', `,"tools":[${deep(100000)}]`), 400],
    ['/v1/chat/completions', '['.repeat(240000), 400],
    ['/v1/chat/completions', wrapChat(deepObj(70000)), 400],
    ['/v1/completions', `{"prompt":"x","max_tokens":2,"stop":${deep(5000)}}`, 400],
    ['/v1/messages', `{"max_tokens":2,"messages":[{"role":"user","content":${deep(80000)}}]}`, 400],
    ['/v1/messages', `{"max_tokens":2,"system":${deepObj(10000)},"messages":[{"role":"user","content":"q"}]}`, 400],
    ['/v1/chat/completions', wrapChat(deep(60)), 400],  // within the depth limit, still not a string
    ['/v1/chat/completions', wrapChat('"hi"', `,"metadata":${manyKeys(50000)}`), 200],
    ['/v1/chat/completions', manyKeys(60000).slice(0, -1) + ',"messages":[{"role":"user","content":"hi"}],"max_tokens":2}', 200],
    ['/v1/completions', `{"prompt":"x","max_tokens":2,"logit_bias":${manyKeys(50000)}}`, 200],
    ['/v1/chat/completions', wrapChat(JSON.stringify('y'.repeat(1000000 - 200))), 400],  // context exceeded
    ['/v1/chat/completions', wrapChat(JSON.stringify('y'.repeat(1100000))), 413],
    ['/v1/chat/completions', wrapChat('"\\ud83d\\ude00 \\u00e9 \u65e5\u672c \ud83c\udff3\ufe0f\u200d\ud83c\udf08"'), 200],
    ['/v1/chat/completions', wrapChat('"\\ud800 lone surrogate"'), 400],
    ['/v1/chat/completions', wrapChat('"\\udfff"'), 400],
    ['/v1/chat/completions', wrapChat('"nul \\u0000 inside"'), 200],
    ['/v1/messages', `{"max_tokens":2,"messages":[{"role":"user","content":"\u0301\u0301 combining \ufeff bom \u2028 sep"}]}`, 200],
    ['/v1/chat/completions', wrapChat('"x"', ',"stop":["\\ud83d\\ude00"]'), 200],
  ];
  const failures = [];
  for (const [path, text, want] of cases) {
    const t0 = performance.now();
    const r = await postJson(base, path, text);
    const ms = performance.now() - t0;
    if (r.status !== want || r.json === null || ms > 10000)
      failures.push(`${path} ${text.slice(0, 80)}... (${text.length} bytes) -> ${r.status} in ${Math.round(ms)} ms: ${r.text.slice(0, 160)}`);
  }
  // Invalid UTF-8 bytes (not expressible as a JS string): a raw body.
  const raw = Buffer.concat([Buffer.from('{"max_tokens":2,"messages":[{"role":"user","content":"'), Buffer.from([0xff, 0xfe, 0xc0, 0x80]), Buffer.from('"}]}')]);
  const r = await fetch(`${base}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: raw });
  if (r.status !== 400) failures.push(`invalid UTF-8 -> ${r.status}`);
  await r.text();
  assert.deepEqual(failures, []);
  assert.ok((await fetch(`${base}/health`)).ok);
});

await test('multi-turn: the second turn is a RAM session hit', async () => {
  const before = await metrics(base);
  const messages = [
    { role: 'system', content: `session ${nonce()}` },
    { role: 'user', content: 'def parse(line):' },
  ];
  const t1 = await openai.chat.completions.create({ model: 'x', messages, max_tokens: 8, temperature: 0 });
  assert.equal(t1.usage.prompt_tokens_details.cached_tokens, 0);
  const mid = await metrics(base);
  messages.push({ role: 'assistant', content: t1.choices[0].message.content });
  messages.push({ role: 'user', content: 'and now test it' });
  const t2 = await openai.chat.completions.create({ model: 'x', messages, max_tokens: 8, temperature: 0 });
  const after = await metrics(base);
  const ram = 'flashserve_session_lookups_total{api="chat",tier="ram"}';
  const cold = 'flashserve_session_lookups_total{api="chat",tier="cold"}';
  assert.equal(mid.get(cold) - before.get(cold), 1, 'turn 1 is cold');
  assert.equal(after.get(ram) - mid.get(ram), 1, 'turn 2 is a RAM hit');
  assert.ok(t2.usage.prompt_tokens_details.cached_tokens >= t1.usage.prompt_tokens,
    `turn 2 reused ${t2.usage.prompt_tokens_details.cached_tokens} of turn 1's ${t1.usage.prompt_tokens} prompt tokens`);
});

const badChat = [
  // [description, body (object or raw string), expected status, expected param or null]
  ['invalid JSON', '{"messages": [', 400, null],
  ['empty body', '', 400, null],
  ['array body', '[]', 400, null],
  ['number body', '42', 400, null],
  ['no messages', { model: 'x' }, 400, 'messages'],
  ['messages not a list', { messages: 'hi' }, 400, 'messages'],
  ['messages empty', { messages: [] }, 400, 'messages'],
  ['message not an object', { messages: [5] }, 400, 'messages'],
  ['message without role', { messages: [{ content: 'x' }] }, 400, 'messages'],
  ['unknown role', { messages: [{ role: 'wizard', content: 'x' }] }, 400, 'messages'],
  ['content a number', { messages: [{ role: 'user', content: 5 }] }, 400, 'messages'],
  ['max_tokens 0', { messages: userMsg('x'), max_tokens: 0 }, 400, 'max_tokens'],
  ['max_tokens negative', { messages: userMsg('x'), max_tokens: -3 }, 400, 'max_tokens'],
  ['max_tokens string', { messages: userMsg('x'), max_tokens: '10' }, 400, 'max_tokens'],
  ['max_tokens fraction', { messages: userMsg('x'), max_tokens: 1.5 }, 400, 'max_tokens'],
  ['max_completion_tokens 0', { messages: userMsg('x'), max_completion_tokens: 0 }, 400, 'max_completion_tokens'],
  ['temperature negative', { messages: userMsg('x'), temperature: -1 }, 400, 'temperature'],
  ['temperature 3', { messages: userMsg('x'), temperature: 3 }, 400, 'temperature'],
  ['temperature string', { messages: userMsg('x'), temperature: 'hot' }, 400, 'temperature'],
  ['top_p 0', { messages: userMsg('x'), top_p: 0 }, 400, 'top_p'],
  ['top_p 1.5', { messages: userMsg('x'), top_p: 1.5 }, 400, 'top_p'],
  ['top_k string', { messages: userMsg('x'), top_k: 'a' }, 400, 'top_k'],
  ['top_k -5', { messages: userMsg('x'), top_k: -5 }, 400, 'top_k'],
  ['min_p 2', { messages: userMsg('x'), min_p: 2 }, 400, 'min_p'],
  ['presence_penalty 3', { messages: userMsg('x'), presence_penalty: 3 }, 400, 'presence_penalty'],
  ['frequency_penalty -3', { messages: userMsg('x'), frequency_penalty: -3 }, 400, 'frequency_penalty'],
  ['n 2', { messages: userMsg('x'), n: 2 }, 400, 'n'],
  ['stop a number', { messages: userMsg('x'), stop: 5 }, 400, 'stop'],
  ['stop list of numbers', { messages: userMsg('x'), stop: [1] }, 400, 'stop'],
  ['stop empty string', { messages: userMsg('x'), stop: [''] }, 400, 'stop'],
  ['stop too many', { messages: userMsg('x'), stop: Array.from({ length: 20 }, (_, i) => `s${i}`) }, 400, 'stop'],
  ['stream a string', { messages: userMsg('x'), stream: 'yes' }, 400, 'stream'],
  ['stream_options a string', { messages: userMsg('x'), stream_options: 'x' }, 400, 'stream_options'],
  ['include_usage a string', { messages: userMsg('x'), stream_options: { include_usage: 'y' } }, 400, 'stream_options.include_usage'],
  ['seed a string', { messages: userMsg('x'), seed: 'abc' }, 400, 'seed'],
  ['model a number', { messages: userMsg('x'), model: 5 }, 400, 'model'],
  ['logprobs a string', { messages: userMsg('x'), logprobs: 'yes' }, 400, 'logprobs'],
  ['top_logprobs over 20', { messages: userMsg('x'), logprobs: true, top_logprobs: 21 }, 400, 'top_logprobs'],
  ['tool_choice unknown', { messages: userMsg('x'), tools: [openaiWeatherTool], tool_choice: 'maybe' }, 400, 'tool_choice'],
  ['tool_choice names a missing tool', { messages: userMsg('x'), tools: [openaiWeatherTool], tool_choice: { type: 'function', function: { name: 'nope' } } }, 400, 'tool_choice'],
  ['tool without a name', { messages: userMsg('x'), tools: [{ type: 'function', function: {} }] }, 400, 'tools[0].function.name'],
  ['tools not a list', { messages: userMsg('x'), tools: 'x' }, 400, 'tools'],
  ['prompt over the context', { messages: userMsg('x1 y2 '.repeat(20000)), max_tokens: 4 }, 400, 'messages'],  // 80k tokens
];
const badCompletion = [
  ['no prompt', { model: 'x' }, 400, 'prompt'],
  ['prompt a number', { prompt: 5 }, 400, 'prompt'],
  ['prompt token ids', { prompt: [1, 2, 3] }, 400, 'prompt'],
  ['prompt empty', { prompt: '' }, 400, 'prompt'],
  ['echo', { prompt: 'x', echo: true }, 400, 'echo'],
  ['max_tokens 0', { prompt: 'x', max_tokens: 0 }, 400, 'max_tokens'],
];
const badMessages = [
  ['invalid JSON', '{', 400],
  ['no max_tokens', { messages: userMsg('x') }, 400],
  ['max_tokens 0', { messages: userMsg('x'), max_tokens: 0 }, 400],
  ['messages empty', { messages: [], max_tokens: 5 }, 400],
  ['only a system message', { messages: [{ role: 'system', content: 'x' }], max_tokens: 5 }, 400],
  ['tool_choice a string', { messages: userMsg('x'), max_tokens: 5, tools: [weatherTool], tool_choice: 'auto' }, 400],
  ['thinking enabled without a budget', { messages: userMsg('x'), max_tokens: 5, thinking: { type: 'enabled' } }, 400],
  ['tool without input_schema', { messages: userMsg('x'), max_tokens: 5, tools: [{ name: 'f' }] }, 400],
  ['tool_result is_error a string', { messages: [{ role: 'user', content: [{ type: 'tool_result', tool_use_id: 't', is_error: 'y' }] }], max_tokens: 5 }, 400],
  ['image block', { messages: [{ role: 'user', content: [{ type: 'image', source: {} }] }], max_tokens: 5 }, 400],
  ['system a number', { system: 5, messages: userMsg('x'), max_tokens: 5 }, 400],
  ['temperature 1.5', { messages: userMsg('x'), max_tokens: 5, temperature: 1.5 }, 400],
  ['stop_sequences a string', { messages: userMsg('x'), max_tokens: 5, stop_sequences: 'x' }, 400],
  ['top_k a string', { messages: userMsg('x'), max_tokens: 5, top_k: 'x' }, 400],
  ['content missing', { messages: [{ role: 'user' }], max_tokens: 5 }, 400],
];

await test(`bad input: ${badChat.length + badCompletion.length + badMessages.length + 5} malformed requests, right status and error shape`, async () => {
  const failures = [];
  const checkOpenAi = (what, r, status, param) => {
    const e = r.json?.error;
    if (r.status !== status || !e || typeof e.message !== 'string' || typeof e.type !== 'string' ||
        !('param' in e) || !('code' in e) || (param && e.param !== param))
      failures.push(`${what}: ${r.status} ${r.text.slice(0, 200)}`);
  };
  for (const [what, body, status, param] of badChat)
    checkOpenAi(`chat ${what}`, await postJson(base, '/v1/chat/completions', body), status, param);
  for (const [what, body, status, param] of badCompletion)
    checkOpenAi(`completions ${what}`, await postJson(base, '/v1/completions', body), status, param);
  for (const [what, body, status] of badMessages) {
    const r = await postJson(base, '/v1/messages', body);
    if (r.status !== status || r.json?.type !== 'error' || typeof r.json?.error?.type !== 'string' ||
        typeof r.json?.error?.message !== 'string')
      failures.push(`messages ${what}: ${r.status} ${r.text.slice(0, 200)}`);
  }
  const big = { messages: userMsg('x'.repeat(2 << 20)) };
  checkOpenAi('body over the limit', await postJson(base, '/v1/chat/completions', big), 413, null);
  const bigA = await postJson(base, '/v1/messages', { messages: userMsg('x'.repeat(2 << 20)), max_tokens: 5 });
  if (bigA.status !== 413 || bigA.json?.type !== 'error') failures.push(`messages body over the limit: ${bigA.status}`);
  checkOpenAi('unknown route', await postJson(base, '/v1/nothing', {}), 404, null);
  const getModel = await fetch(`${base}/v1/models/unknown`);
  checkOpenAi('unknown model', { status: getModel.status, text: '', json: await getModel.json() }, 404, 'model');
  // The real clients surface these as typed errors with the status.
  await assert.rejects(
    openai.chat.completions.create({ model: 'x', messages: userMsg('x'), temperature: 9 }),
    (e) => e.status === 400 && /temperature/.test(e.message));
  await assert.rejects(
    anthropic.messages.create({ model: 'x', messages: userMsg('x'), max_tokens: -1 }),
    (e) => e.status === 400 && e.error?.error?.type === 'invalid_request_error');
  assert.deepEqual(failures, []);
  assert.ok((await fetch(`${base}/health`)).ok, 'the server still answers');
});

await test('client disconnect mid-stream cancels the generation', async () => {
  const key = 'flashserve_finish_total{reason="cancelled"}';
  const before = (await metrics(base)).get(key) ?? 0;
  const controller = new AbortController();
  // A code completion: the embedded model writes code at length (its chat answers are short).
  const stream = await openai.completions.create(
    { model: 'x', prompt: 'def fib(n):\n', max_tokens: 3000, temperature: 0, stream: true },
    { signal: controller.signal });
  let n = 0;
  try {
    for await (const c of stream) {
      if (c.choices[0]?.text && ++n >= 5) controller.abort();
    }
  } catch (e) {
    assert.ok(/abort/i.test(String(e.name) + String(e.message)), String(e));
  }
  let after = before;
  for (let i = 0; i < 50 && after === before; ++i) {
    await new Promise((r) => setTimeout(r, 100));
    after = (await metrics(base)).get(key) ?? 0;
  }
  assert.equal(after, before + 1, 'the generation was cancelled');
  const m = await metrics(base);
  assert.ok(m.get('flashserve_generated_tokens_total') > 0);
});

await test('load: 200 requests from 8 concurrent clients, streaming and not', async () => {
  const threadsBefore = threadsOf(main.proc.pid);
  const total = 200;
  const clients = 8;
  let next = 0;
  const errors = [];
  const t0 = performance.now();
  await Promise.all(Array.from({ length: clients }, async (_, c) => {
    const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 });
    while (next < total) {
      const i = next++;
      try {
        const body = { model: 'x', messages: userMsg(`# task ${i % 17}\ndef f${i % 5}(`), max_tokens: 4 + (i % 5), temperature: (i % 3) * 0.4, seed: i };
        if (i % 2) {
          let got = false;
          for await (const ch of await client.chat.completions.create({ ...body, stream: true }))
            if (ch.choices[0]?.finish_reason) got = true;
          if (!got) errors.push(`${i}: no finish_reason`);
        } else {
          const r = await client.chat.completions.create(body);
          if (!r.choices[0].finish_reason) errors.push(`${i}: no finish_reason`);
        }
      } catch (e) {
        errors.push(`${i} (client ${c}): ${e.status ?? ''} ${e.message}`);
      }
    }
  }));
  const seconds = (performance.now() - t0) / 1000;
  figures.load_requests = total;
  figures.load_clients = clients;
  figures.load_seconds = Number(seconds.toFixed(2));
  figures.load_requests_per_s = Number((total / seconds).toFixed(1));
  assert.deepEqual(errors, []);
  await new Promise((r) => setTimeout(r, 300));
  const threadsAfter = threadsOf(main.proc.pid);
  figures.threads_before = threadsBefore;
  figures.threads_after = threadsAfter;
  // httplib's pool is fixed; a thread per request would show here.
  assert.ok(threadsAfter <= threadsBefore + 2, `threads ${threadsBefore} -> ${threadsAfter}`);
  const m = await metrics(base);
  const ttftSum = m.get('flashserve_time_to_first_token_seconds_sum');
  const ttftCount = m.get('flashserve_time_to_first_token_seconds_count');
  figures.mean_ttft_ms_all_requests = Number((1000 * ttftSum / ttftCount).toFixed(2));
  figures.mtp_drafted_depth1 = m.get('flashserve_mtp_drafted_total{depth="1"}');
  figures.mtp_accepted_depth1 = m.get('flashserve_mtp_accepted_total{depth="1"}');
  assert.ok(figures.mtp_drafted_depth1 > 0, 'MTP drafts are counted');
  assert.ok((m.get('flashserve_requests_total{endpoint="/v1/chat/completions",status="200"}') ?? 0) >= total);
});

await test('single-request TTFT on an idle server (streaming, cold prompt)', async () => {
  const samples = [];
  for (let i = 0; i < 5; ++i) {
    const t0 = performance.now();
    const s = await openai.chat.completions.create({
      model: 'x', messages: userMsg(`${nonce()} def g():`), max_tokens: 8, temperature: 0, stream: true,
    });
    let first = null;
    // The first generated text, visible or reasoning.
    for await (const c of s) {
      const d = c.choices[0]?.delta;
      if (first === null && (d?.content || d?.reasoning_content)) first = performance.now() - t0;
    }
    if (first !== null) samples.push(first);
  }
  samples.sort((a, b) => a - b);
  figures.idle_ttft_ms_median = Number(samples[Math.floor(samples.length / 2)].toFixed(1));
});

await test('metrics: Prometheus text with the documented series', async () => {
  const text = await (await fetch(`${base}/metrics`)).text();
  for (const name of ['flashserve_requests_total', 'flashserve_prompt_tokens_total',
    'flashserve_generated_tokens_total', 'flashserve_time_to_first_token_seconds_bucket',
    'flashserve_inter_token_latency_seconds_bucket', 'flashserve_mtp_drafted_total',
    'flashserve_mtp_accepted_total', 'flashserve_session_lookups_total',
    'flashserve_checkpoint_rejections_total'])
    assert.ok(text.includes(name), name);
  assert.ok(/# TYPE flashserve_time_to_first_token_seconds histogram/.test(text));
});

await test('disk tier: a restart restores the conversation from disk; a corrupt checkpoint is refused and counted', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'flashserve-api-sessions-'));
  try {
    const messages = [
      { role: 'system', content: `disk ${nonce()}` },
      { role: 'user', content: 'def load(path):' },
    ];
    const turn = async (server) => {
      const c = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'unused', maxRetries: 0 });
      return c.chat.completions.create({ model: 'x', messages, max_tokens: 6, temperature: 0 });
    };
    const a = await startServer(['--session-dir', dir, '--session-disk-mb', '64']);
    const t1 = await turn(a);
    assert.equal((await stopServer(a)).code, 0);  // persists the RAM bank on the way out
    assert.ok(readdirSync(dir).some((f) => f.endsWith('.fsck')), 'checkpoints were written');

    messages.push({ role: 'assistant', content: t1.choices[0].message.content });
    messages.push({ role: 'user', content: 'again' });
    const b = await startServer(['--session-dir', dir, '--session-disk-mb', '64']);
    const t2 = await turn(b);
    const mb = await metrics(b.base);
    assert.equal(mb.get('flashserve_session_lookups_total{api="chat",tier="disk"}'), 1, 'turn 2 after a restart is a disk hit');
    assert.ok(t2.usage.prompt_tokens_details.cached_tokens >= t1.usage.prompt_tokens);
    assert.equal((await stopServer(b)).code, 0);

    // Flip one payload byte of every checkpoint: each must be refused on load, never trusted.
    for (const f of readdirSync(dir).filter((f) => f.endsWith('.fsck'))) {
      const path = join(dir, f);
      const size = statSync(path).size;
      const fd = openSync(path, 'r+');
      const byte = Buffer.alloc(1);
      const { readSync } = await import('node:fs');
      readSync(fd, byte, 0, 1, size - 3);
      byte[0] ^= 0x5a;
      writeSync(fd, byte, 0, 1, size - 3);
      closeSync(fd);
    }
    const c = await startServer(['--session-dir', dir, '--session-disk-mb', '64']);
    const t3 = await turn(c);
    const mc = await metrics(c.base);
    assert.equal(t3.choices[0].message.content, t2.choices[0].message.content, 'the cold recompute gives the same text');
    assert.equal(mc.get('flashserve_session_lookups_total{api="chat",tier="cold"}'), 1);
    let rejected = 0;
    for (const [k, v] of mc) if (k.startsWith('flashserve_checkpoint_rejections_total{')) rejected += v;
    assert.ok(rejected >= 1, 'the corrupt checkpoint is counted by reason');
    assert.equal((await stopServer(c)).code, 0);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

await test('second server: API key, CORS, a full queue answers 503 with Retry-After', async () => {
  const s = await startServer(['--api-key', 'sekret', '--cors', '--max-queue', '1']);
  try {
    const noKey = await postJson(s.base, '/v1/chat/completions', { messages: userMsg('x') });
    assert.equal(noKey.status, 401);
    assert.equal(typeof noKey.json.error.message, 'string');
    const noKeyA = await postJson(s.base, '/v1/messages', { messages: userMsg('x'), max_tokens: 2 });
    assert.equal(noKeyA.json.error.type, 'authentication_error');
    const ok = new OpenAI({ baseURL: `${s.base}/v1`, apiKey: 'sekret', maxRetries: 0 });
    const r = await ok.chat.completions.create({ model: 'x', messages: userMsg('x'), max_tokens: 2 });
    assert.equal(r.choices.length, 1);
    const okA = new Anthropic({ baseURL: s.base, apiKey: 'sekret', maxRetries: 0 });
    assert.equal((await okA.messages.create({ model: 'x', messages: userMsg('x'), max_tokens: 2 })).type, 'message');
    const pre = await fetch(`${s.base}/v1/chat/completions`, { method: 'OPTIONS', headers: { Origin: 'http://a.example' } });
    assert.equal(pre.status, 204);
    assert.equal(pre.headers.get('access-control-allow-origin'), '*');
    // One long generation runs, one waits, the rest are refused.
    const controller = new AbortController();
    const long = () => fetch(`${s.base}/v1/chat/completions`, {
      method: 'POST', signal: controller.signal,
      headers: { 'content-type': 'application/json', authorization: 'Bearer sekret' },
      body: JSON.stringify({ messages: userMsg('long'), max_tokens: 2000, temperature: 0.7, stream: true }),
    }).then((res) => ({ status: res.status, retry: res.headers.get('retry-after'), res })).catch((e) => ({ status: 0, e }));
    const first = long();
    await new Promise((r) => setTimeout(r, 300));
    // Six at once: even if the first ended early, at most two of them can be taken.
    const rest = await Promise.all(Array.from({ length: 6 }, long));
    const statuses = rest.map((x) => x.status);
    assert.ok(statuses.includes(503), `statuses ${statuses}`);
    const refused = rest.find((x) => x.status === 503);
    assert.equal(refused.retry, '1');
    assert.equal((await refused.res.json()).error.code, 'queue_full');
    controller.abort();
    await first;
    await Promise.all(rest.map((x) => x.res?.body?.cancel().catch(() => {})));
  } finally {
    const r = await stopServer(s);
    assert.equal(r.code, 0, `second server exit ${JSON.stringify(r)}\n${s.log()}`);
  }
});

// Thinking switched on and off through each API's field: off, no reasoning comes back and the
// text does; on, a template that opens the think block (GLM 5.3, DeepSeek V4) makes the output
// reasoning first, which a random model (it never writes </think>) keeps to the end.
await test('thinking on and off: reasoning fields produced and omitted (chat, Anthropic, streamed and not)', async () => {
  const body = { model: 'x', messages: userMsg(`Why? ${nonce()}`), max_tokens: 8, temperature: 0 };
  // Qwen's template closes an empty think block when thinking is off and leaves the rest to the
  // model; the others' templates decide, and a random model never opens a block itself.
  const decided = profile.family !== 'qwen' || !profile.trained;
  for (const off of [{ reasoning_effort: 'none' }, { chat_template_kwargs: { enable_thinking: false } }]) {
    const r = await openai.chat.completions.create({ ...body, ...off });
    const m = r.choices[0].message;
    if (decided) assert.ok(!m.reasoning_content, JSON.stringify(m));
    if (!profile.trained) assert.ok(m.content.length > 0, JSON.stringify(m));
    const s = await collectChat(await openai.chat.completions.create({ ...body, ...off, stream: true }));
    assert.equal(s.msg.reasoning_content, m.reasoning_content ?? '');
    assert.equal(s.msg.content, m.content ?? '');
  }
  const a = await anthropic.messages.create({ ...body, thinking: { type: 'disabled' } });
  if (decided) assert.ok(!a.content.some((b) => b.type === 'thinking'), JSON.stringify(a.content));
  if (profile.family === 'qwen') return;  // Qwen's template leaves thinking on to the model
  const on = await openai.chat.completions.create({ ...body, chat_template_kwargs: { enable_thinking: true } });
  assert.ok(on.choices[0].message.reasoning_content.length > 0, JSON.stringify(on.choices[0].message));
  if (!profile.trained) {
    assert.equal(on.choices[0].message.content, '');
    assert.equal(on.choices[0].finish_reason, 'length');
  }
  const s = await collectChat(await openai.chat.completions.create({ ...body, chat_template_kwargs: { enable_thinking: true }, stream: true }));
  assert.equal(s.msg.reasoning_content, on.choices[0].message.reasoning_content);
  assert.equal(s.msg.content, on.choices[0].message.content ?? '');
  const at = await anthropic.messages.create({ ...body, thinking: { type: 'enabled', budget_tokens: 1024 } });
  assert.equal(at.content[0].type, 'thinking', JSON.stringify(at.content));
  assert.ok(at.content[0].thinking.length > 0);
  const streamed = await anthropic.messages.stream({ ...body, thinking: { type: 'enabled', budget_tokens: 1024 } }).finalMessage();
  assert.deepEqual(plainContent(streamed.content), plainContent(at.content));
  // The template's default when the request says nothing.
  const dflt = (await openai.chat.completions.create(body)).choices[0].message;
  if (profile.thinksByDefault) assert.ok(dflt.reasoning_content.length > 0, JSON.stringify(dflt));
  else if (!profile.trained) assert.ok(!dflt.reasoning_content, JSON.stringify(dflt));
});

// A call the model writes by itself (tool_choice auto) needs a trained model.
if (profile.trained) {
  await test('openai: tool_choice auto: the model\'s own call parses (trained model)', async () => {
    const r = await openai.chat.completions.create({
      model: 'x', max_tokens: 60, temperature: 0, tools: [openaiWeatherTool],
      messages: userMsg('Use get_weather to get the weather in Paris.'),
    });
    const m = r.choices[0].message;
    if (m.tool_calls?.length) {
      assert.equal(r.choices[0].finish_reason, 'tool_calls');
      assert.equal(m.tool_calls[0].function.name, 'get_weather');
      assert.equal(typeof JSON.parse(m.tool_calls[0].function.arguments), 'object');
    }
  });
} else {
  skip('openai: tool_choice auto: the model\'s own call parses', 'random weights write no tool call of their own (the forced-call and parser checks run; tests/unit/test_output_parser.cpp and test_chat.cpp parse each family\'s calls)');
}

const exit = await stopServer(main);
await test('server stops cleanly on SIGTERM', async () => {
  assert.equal(exit.code, 0, `exit ${JSON.stringify(exit)}\n${main.log()}`);
});
clearTimeout(globalTimer);
const s = summary();
console.log(JSON.stringify(s));
process.exit(s.failed ? 1 : 0);
