// The real coding agents against `flashserve serve`: for each agent named, one plain turn and one
// tool turn, headless, each in the agent's own HOME and working directory (agents.mjs).
//
//   node tests/agents/run.mjs --binary build/src/flashserve --model models/qwen4-tiny-code \
//        [--agent claude-code|codex|qwen-code]... [--max-context N] [--max-tokens-limit N]
//        [--turn-timeout-s S]
//        [--timeout-s S] [--scratch DIR] [--keep] [--records DIR] [--fake-model]
//        [--turn plain|tool]...
//
// Starts the server on a free loopback port (tests/api/server.mjs) and a recorder in front of it
// (recorder.mjs), through which the agent talks, so that every request, its status and, for a
// refusal, the server's answer are known. A turn passes when the agent exits 0 within its
// timeout, prints a final answer, reports no error, and made no request that was refused and
// no connection beyond loopback. The tool turn also needs the agent's shell tool to have run
// (its transcript holds the tool's output, flashserve-tool-ok), the server to have received the
// tool result in a request, and the answer to quote it. After the turns the server's /metrics
// must count no 4xx/5xx in flashserve_requests_total and no generation that ran into the context
// limit, and its log must hold no error; it must stop cleanly on SIGTERM.
//
// --records DIR writes every request the agents made, with its status and the start and end of
// the server's answer, to DIR/<agent>.<turn>-<n>.json. --keep keeps the agents' HOME and working
// directories (under --scratch, default the system's temporary directory).
// --turn picks the turns (default both, plain first).
// --max-tokens-limit N is the server's --max-tokens-limit: the agents ask for 32000 tokens a reply
// (Qwen Code 64000 on a retry), and a reply of the tiny model that loops runs to the context limit
// (12,000 tokens, about 50 s on two cores) unless the server clamps it; clamped, a loop costs a
// few seconds and leaves the context room for the agent's next request.
// --attempts N (default 1) runs a failed turn again, in a fresh HOME and working directory, up to
// N times in all, when every problem is the model's content (no exit in time while it streamed,
// no tool call, no final answer or one without the tool's output, a reply cut at its token limit
// and what the agent did after it) and none is the protocol's (a refused request, an error
// result, an exit code, a connection beyond loopback). The agents put the working directory (a
// random temporary name) and the date into their prompts, so each run is a different greedy
// continuation for the 22 MB embedded model, and a few of them loop; a fresh directory is a
// fresh prompt. Every attempt is printed; the summary counts them.
// --fake-model runs the agents against fake_model.mjs instead of the server (checks the agents'
// configuration and this harness alone). Exits 77 (ctest: skipped) when an agent is not
// installed (npm ci in tests/agents; scripts/setup.sh does it).
import { mkdtempSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { AGENTS, PLAIN_PROMPT, TOOL_MARKER, installed, killAgents, runAgent, toolPrompt } from './agents.mjs';
import { startRecorder } from './recorder.mjs';
import { spawnServer } from '../api/server.mjs';

const args = process.argv.slice(2);
const argOf = (name, dflt) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : dflt;
};
const argsOf = (name) => args.flatMap((a, i) => (a === name ? [args[i + 1]] : []));
const fake = args.includes('--fake-model');
const binary = argOf('--binary');
const model = argOf('--model');
if (!fake && !binary) {
  console.error('usage: node run.mjs --binary PATH [--model DIR] [--agent NAME]... (or --fake-model)');
  process.exit(2);
}
const names = argsOf('--agent').length ? argsOf('--agent') : Object.keys(AGENTS);
for (const n of names) {
  if (!AGENTS[n]) {
    console.error(`unknown agent ${n}; known: ${Object.keys(AGENTS).join(', ')}`);
    process.exit(2);
  }
}
const agents = names.map((n) => AGENTS[n]);
const missing = agents.filter((a) => !installed(a));
if (missing.length) {
  console.log(`agent tests skipped: ${missing.map((a) => a.package).join(', ')} not installed ` +
    '(run npm ci in tests/agents; scripts/setup.sh does)');
  process.exit(77);
}
const turns = argsOf('--turn').length ? argsOf('--turn') : ['plain', 'tool'];
if (turns.some((t) => t !== 'plain' && t !== 'tool')) {
  console.error(`unknown turn in ${turns.join(', ')}; known: plain, tool`);
  process.exit(2);
}
const turnTimeoutMs = Number(argOf('--turn-timeout-s', '180')) * 1000;
const attempts = Math.max(1, Number(argOf('--attempts', '1')));
const recordsDir = argOf('--records');
if (recordsDir) mkdirSync(recordsDir, { recursive: true });

let server = null;
const globalTimer = setTimeout(() => {
  console.error('agent tests: global timeout; killing the agents and the server');
  killAgents();
  server?.proc.kill('SIGKILL');
  process.exit(1);
}, Number(argOf('--timeout-s', '600')) * 1000);

async function startFlashserve() {
  const extra = [...(model ? ['--model', model] : [])];
  for (const flag of ['--max-context', '--max-tokens-limit'])
    if (argOf(flag)) extra.push(flag, argOf(flag));
  const s = await spawnServer(binary, extra);
  for (let i = 0; i < 100; ++i) {
    try {
      if ((await fetch(`${s.base}/health`)).ok) break;
    } catch {}
    await new Promise((r) => setTimeout(r, 100));
  }
  return s;
}

async function stopFlashserve(s) {
  const exited = new Promise((r) => s.proc.on('exit', (code, sig) => r({ code, sig })));
  s.proc.kill('SIGTERM');
  const t = setTimeout(() => s.proc.kill('SIGKILL'), 10000);
  const r = await exited;
  clearTimeout(t);
  return r;
}

// The flashserve_requests_total{endpoint="...",status="..."} lines of /metrics, and the counters
// that say what the turns cost (prompt and generated tokens, finish reasons, warm prefixes).
async function serverMetrics(base) {
  const text = await (await fetch(`${base}/metrics`)).text();
  const requests = [];
  for (const m of text.matchAll(/^flashserve_requests_total\{endpoint="([^"]*)",status="(\d+)"\} (\d+)/gm))
    requests.push({ endpoint: m[1], status: Number(m[2]), count: Number(m[3]) });
  const figures = {};
  for (const m of text.matchAll(/^(flashserve_(?:prompt_tokens_total|generated_tokens_total|finish_total|session_lookups_total)(?:\{[^}]*\})?) (\d+)/gm))
    if (Number(m[2]) > 0) figures[m[1]] = Number(m[2]);
  return { requests, figures };
}

// Whether a request body hands the model a tool result holding `marker`, in the agent's API.
function carriesToolResult(api, body, marker) {
  const has = (v) => JSON.stringify(v ?? '').includes(marker);
  if (!body || typeof body !== 'object') return false;
  if (api === 'anthropic')
    return (body.messages ?? []).some((m) => Array.isArray(m.content) &&
      m.content.some((b) => b.type === 'tool_result' && has(b.content)));
  if (api === 'openai') return (body.messages ?? []).some((m) => m.role === 'tool' && has(m.content));
  return Array.isArray(body.input) && body.input.some((i) => i.type === 'function_call_output' && has(i.output));
}

const clip = (s, n = 600) => (s.length > n ? `${s.slice(0, n)}… (${s.length} chars)` : s);

// A record's line for a failure message: which request, its status, and the server's answer.
const describeRecord = (r) =>
  `${r.method} ${r.path}${r.bytes !== undefined ? ` (${r.bytes} bytes)` : ''} -> ${r.status ?? 'no answer'}` +
  (r.error ? `: ${clip(r.error)}` : '');

// Problems that are the model's content, not the protocol's (see --attempts).
const MODEL_PROBLEMS = [/^no exit within /, /^no final answer$/, /^no \S+ call \(calls: /,
  /^no tool output holding /, /^the server received no request carrying the tool result$/,
  /^the answer does not quote /, /^a reply was cut at its token limit /,
  /^refused after a reply cut at its token limit: /, /^exit \S+ after a reply cut at its token limit$/,
  /^the agent reported an error result after a reply cut at its token limit$/];
// An agent killed at the turn limit (the model still streaming) also reports an error result:
// that one follows from the kill.
const onlyModelProblems = (res) => {
  const own = res.problems.filter((p) => !/^(answer|agent stderr): /.test(p));
  const killed = own.some((p) => /^no exit within /.test(p));
  return own.length > 0 && own.every((p) => MODEL_PROBLEMS.some((re) => re.test(p)) ||
    (killed && /^the agent reported an error result$/.test(p)));
};

async function runTurn(agent, turn, recorder, dir) {
  const prompt = turn === 'tool' ? toolPrompt(agent) : PLAIN_PROMPT;
  const first = recorder.records.length;
  const started = Date.now();
  const r = await runAgent(agent, { base: recorder.base, dir, prompt, timeoutMs: turnTimeoutMs });
  const records = recorder.records.slice(first);
  let problems = [];
  // A reply the server cut at its token limit (the request's max_tokens, clamped by
  // --max-tokens-limit, or the context) is the model's loop: a turn is the model's to end. What an
  // agent does with the cut reply follows from that loop: Claude Code asks three more times, then
  // reports an error result and exits 1; Codex reports one and exits 1; Qwen Code asks four more
  // times and ends with no answer, or sends the conversation on and, cut at the context, gets
  // context_length_exceeded (clean-clone CI of session 15). Those count as the model's content
  // (see --attempts); any other exit, error or refusal is the protocol's.
  const cuts = records.map((rec, i) => ({ rec, i }))
    .filter(({ rec }) => !rec.outbound && rec.status < 400 && rec.answer?.cut);
  const cutAt = cuts.length ? cuts[0].i : -1;
  const afterCut = cutAt >= 0 ? ' after a reply cut at its token limit' : '';
  if (cuts.length)
    problems.push(`a reply was cut at its token limit (the model's loop): ` +
      cuts.map(({ rec, i }) => `request ${i + 1}, ${rec.answer.bytes} bytes`).join('; '));
  if (r.timedOut) problems.push(`no exit within ${turnTimeoutMs / 1000} s (killed)`);
  else if (r.code !== 0) problems.push(`exit ${r.code ?? r.signal}${afterCut}`);
  if (r.isError) problems.push(`the agent reported an error result${afterCut}`);
  if (!r.answer.trim()) problems.push('no final answer');
  records.forEach((rec, i) => {
    if (rec.outbound) problems.push(`connection beyond loopback: ${rec.method} ${rec.path}`);
    else if (!(rec.status < 400)) {
      const overflow = cutAt >= 0 && i > cutAt && rec.status === 400 &&
        /"code":"context_length_exceeded"/.test(rec.error ?? '');
      problems.push(`refused${overflow ? afterCut : ''}: ${describeRecord(rec)}`);
    }
  });
  // How far each accepted answer got, when the turn failed: the agent may have given up on a
  // stream still running, or refused one that ended.
  const answers = records
    .filter((rec) => !rec.outbound && rec.status < 400 && rec.answer)
    .map((rec) => `${rec.method} ${rec.path} -> ${rec.status}, ${rec.done ? 'ended' : 'still streaming'} after ` +
      `${rec.answer.bytes} bytes; first: ${clip(rec.answer.head, 700)} last: ${rec.answer.tail.slice(-700)}`);
  if (!records.some((rec) => !rec.outbound)) problems.push('no request reached the server');
  if (turn === 'tool') {
    const call = r.toolCalls.find((c) => c.name === agent.shellTool);
    if (!call) problems.push(`no ${agent.shellTool} call (calls: ${JSON.stringify(r.toolCalls)})`);
    if (!r.toolOutputs.some((o) => o.includes(TOOL_MARKER)))
      problems.push(`no tool output holding ${TOOL_MARKER} in the transcript (calls: ${clip(JSON.stringify(r.toolCalls), 400)}; ` +
        `outputs: ${clip(JSON.stringify(r.toolOutputs), 400)})`);
    if (!records.some((rec) => carriesToolResult(agent.api, rec.body, TOOL_MARKER)))
      problems.push('the server received no request carrying the tool result');
    if (!r.answer.includes(TOOL_MARKER)) problems.push(`the answer does not quote ${TOOL_MARKER}`);
  }
  if (recordsDir)
    records.forEach((rec, i) =>
      writeFileSync(join(recordsDir, `${agent.name}.${turn}-${i + 1}.json`), JSON.stringify(rec, null, 2) + '\n'));
  if (problems.length) {
    problems.push(...answers.map((a) => `answer: ${a}`));
    if (r.stderr.trim()) problems.push(`agent stderr: ${clip(r.stderr.trim(), 1500)}`);
  }
  // The same refusal, repeated by an agent's retries, once with its count.
  const counted = new Map();
  for (const p of problems) counted.set(p, (counted.get(p) ?? 0) + 1);
  problems = [...counted].map(([p, n]) => (n > 1 ? `${p} (x${n})` : p));
  return {
    name: `${agent.name}.${turn}`,
    ok: problems.length === 0,
    ms: r.ms,
    // Each request's size, status, when it was sent (ms after the agent started) and how long the
    // server took to answer it: where a turn's time went.
    requests: records.filter((rec) => !rec.outbound).map((rec) => ({ path: rec.path, bytes: rec.bytes,
      status: rec.status, sent_ms: rec.at - started, ...(rec.ms !== undefined ? { answer_ms: rec.ms } : {}) })),
    answer: clip(r.answer, 300),
    problems,
  };
}

// What the server counted during retried attempts (see --attempts): refusals by "endpoint
// status", and replies cut at their token limit.
const LENGTH_CUTS = 'flashserve_finish_total{reason="length"}';
const excused = { refused: new Map(), cuts: 0 };
function excuse(before, after) {
  const count = (m, key) => m.requests.filter((c) => `${c.endpoint} ${c.status}` === key)
    .reduce((n, c) => n + c.count, 0);
  for (const c of after.requests) {
    const key = `${c.endpoint} ${c.status}`;
    if (c.status < 400) continue;
    const d = count(after, key) - count(before, key);
    if (d > 0) excused.refused.set(key, (excused.refused.get(key) ?? 0) + d);
  }
  excused.cuts += (after.figures[LENGTH_CUTS] ?? 0) - (before.figures[LENGTH_CUTS] ?? 0);
}

const scratchRoot = argOf('--scratch', tmpdir());
mkdirSync(scratchRoot, { recursive: true });
const scratch = mkdtempSync(join(scratchRoot, 'flashserve-agents-'));
const results = [];
const serverChecks = [];
let serverFigures = null;
let exitCode = 0;
try {
  if (!fake) server = await startFlashserve();
  const recorder = await startRecorder({ upstream: server?.base });
  for (const agent of agents) {
    // Both turns of an agent in one HOME and working directory, as a user's two prompts in one
    // project would be: their prompts share a long prefix, which the server's session bank keeps.
    let agentScratch = mkdtempSync(join(scratch, `${agent.name}-`));
    for (const turn of turns) {
      for (let attempt = 1; ; ++attempt) {
        const before = server ? await serverMetrics(server.base) : null;
        const res = await runTurn(agent, turn, recorder, agentScratch);
        res.attempt = attempt;
        const retry = !res.ok && attempt < attempts && onlyModelProblems(res);
        // A retried attempt's refusals and cut replies are its content's, counted with it: the
        // server checks below leave them out (each is printed with the attempt).
        if (retry && before) excuse(before, await serverMetrics(server.base));
        console.log(`${res.ok ? 'ok  ' : retry ? 'RETRY' : 'FAIL'} ${res.name} (attempt ${attempt} of ` +
          `${attempts}, ${(res.ms / 1000).toFixed(1)} s, ${res.requests.length} requests) answer ` +
          JSON.stringify(res.answer));
        for (const p of res.problems) console.log(`     ${p}`);
        if (!retry) {
          results.push(res);
          break;
        }
        // A fresh HOME and working directory: a fresh prompt (see --attempts).
        agentScratch = mkdtempSync(join(scratch, `${agent.name}-`));
      }
    }
  }
  await recorder.close();
  if (server) {
    const m = await serverMetrics(server.base);
    serverFigures = m.figures;
    const bad = m.requests.filter((c) => c.status >= 400)
      .map((c) => ({ ...c, count: c.count - (excused.refused.get(`${c.endpoint} ${c.status}`) ?? 0) }))
      .filter((c) => c.count > 0);
    serverChecks.push({ name: 'metrics: no 4xx/5xx in flashserve_requests_total', ok: bad.length === 0,
      detail: bad.map((c) => `${c.endpoint} ${c.status} x${c.count}`).join(', ') });
    // A turn is the model's to end: an answer cut at its token limit is not one (each turn checks
    // its own replies; this counts what the server cut, whatever the recorder saw).
    const cut = (m.figures[LENGTH_CUTS] ?? 0) - excused.cuts;
    serverChecks.push({ name: 'metrics: no generation cut at its token limit (finish_total{reason="length"})',
      ok: cut === 0, detail: `${cut} cut` + (excused.cuts ? ` (and ${excused.cuts} in retried attempts)` : '') });
    const stopped = await stopFlashserve(server);
    const log = server.log();
    const errors = log.split('\n').filter((l) => /error|fatal|abort|exception|sanitizer|leak/i.test(l));
    serverChecks.push({ name: 'server log: no errors', ok: errors.length === 0, detail: errors.slice(0, 10).join(' | ') });
    serverChecks.push({ name: 'server stops cleanly on SIGTERM', ok: stopped.code === 0,
      detail: `exit ${stopped.code ?? stopped.sig}` });
    server = null;
    for (const c of serverChecks) console.log(`${c.ok ? 'ok  ' : 'FAIL'} ${c.name}${c.ok ? '' : `: ${c.detail}`}`);
  }
} catch (e) {
  console.log(`FAIL agent tests: ${e.stack ?? e}`);
  exitCode = 1;
} finally {
  if (server) await stopFlashserve(server);
  clearTimeout(globalTimer);
  if (!args.includes('--keep')) rmSync(scratch, { recursive: true, force: true });
}
const all = [...results, ...serverChecks];
const passed = all.filter((r) => r.ok).length;
const failed = all.length - passed;
console.log(JSON.stringify({ fake_model: fake, turns: results.map(({ name, ok, ms, attempt, requests }) => ({ name, ok, ms, attempt, requests })),
  server: serverFigures }));
console.log(`${passed} passed, ${failed} failed`);
process.exit(exitCode || (failed ? 1 : 0));
