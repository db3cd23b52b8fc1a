// Records the requests the real agents send, as fixtures for the server's request-shape tests:
// each agent runs its plain turn and its tool turn against the fake model (fake_model.mjs, which
// calls the tool when asked and then answers), and every request it made is written to
// fixtures/<agent>-<n>.json, with fixtures/README.md listing them.
//
//   node tests/agents/capture.mjs [--agent NAME] [--out DIR]
//
// Needs the agents installed (npm ci in tests/agents). The bodies hold the agent's temporary
// paths and ids; nothing else of this machine.
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { AGENTS, PLAIN_PROMPT, installed, runAgent, toolPrompt } from './agents.mjs';
import { startRecorder } from './recorder.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const argOf = (name, dflt) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : dflt;
};
const out = argOf('--out', join(here, 'fixtures'));
const only = argOf('--agent');
mkdirSync(out, { recursive: true });

const versionOf = (agent) =>
  JSON.parse(readFileSync(join(here, 'node_modules', ...agent.package.split('/'), 'package.json'), 'utf8')).version;

// What a request is, for the listing: the API call and, for a model call, which message ends it.
function describe(rec) {
  const b = rec.body ?? {};
  if (rec.outbound) return `outbound ${rec.method} ${rec.path} (refused)`;
  const last = (b.messages ?? (Array.isArray(b.input) ? b.input : [])).at(-1);
  let ends = '';
  if (last) {
    const blocks = Array.isArray(last.content) ? last.content.map((c) => c.type).join('+') : typeof last.content;
    ends = `, ends with ${last.role ?? last.type}${last.role ? ` (${blocks})` : ''}`;
  }
  const tools = Array.isArray(b.tools) ? `, ${b.tools.length} tools` : '';
  return `${rec.method} ${rec.path}: ${rec.bytes} bytes${tools}${ends}, stream ${b.stream === true}`;
}

const scratch = mkdtempSync(join(tmpdir(), 'flashserve-capture-'));
const listing = [];
try {
  for (const agent of Object.values(AGENTS)) {
    if (only && agent.name !== only) continue;
    if (!installed(agent)) {
      console.error(`${agent.name}: not installed (npm ci in tests/agents)`);
      process.exitCode = 1;
      continue;
    }
    const version = versionOf(agent);
    let n = 0;
    for (const [turn, prompt] of [['plain', PLAIN_PROMPT], ['tool', toolPrompt(agent)]]) {
      const recorder = await startRecorder();
      const dir = mkdtempSync(join(scratch, `${agent.name}-`));
      const r = await runAgent(agent, { base: recorder.base, dir, prompt, timeoutMs: 120000 });
      await recorder.close();
      console.error(`${agent.name} ${turn}: exit ${r.code}, ${r.ms} ms, ${recorder.records.length} requests, ` +
        `answer ${JSON.stringify(r.answer)}`);
      if (r.code !== 0) console.error(r.stderr);
      recorder.records.forEach((rec, i) => {
        const name = `${agent.name}-${++n}.json`;
        writeFileSync(join(out, name),
          JSON.stringify({ agent: agent.name, version, turn, request: i + 1, prompt, ...rec }, null, 2) + '\n');
        listing.push(`| \`${name}\` | ${agent.name} ${version} | ${turn} turn, request ${i + 1} | ${describe(rec)} |`);
      });
    }
  }
} finally {
  rmSync(scratch, { recursive: true, force: true });
}
if (!only)
  writeFileSync(join(out, 'README.md'), [
    '# Requests of the real coding agents',
    '',
    'Written by `node tests/agents/capture.mjs` (do not edit by hand): each agent pinned in',
    '`tests/agents/package.json` ran headless, configured as `tests/agents/agents.mjs` says, against',
    'the fake model of `tests/agents/fake_model.mjs`: a plain turn, then a tool turn in which the fake',
    'model calls the shell tool once and then answers. Each file is one request as it arrived:',
    '`method`, `path`, `headers` (credentials redacted), the parsed `body`, the `status` it was',
    'answered with, plus which agent, turn and prompt it belongs to, and the body\'s size in `bytes`.',
    '',
    '| file | agent | turn | request |',
    '|---|---|---|---|',
    ...listing,
    '',
  ].join('\n'));
