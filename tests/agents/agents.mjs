// The three coding agents as the agent tests run them: headless, in a fresh HOME and working
// directory, pointed at one loopback model server with no login, with telemetry, update checks and
// plugin syncs turned off, and with a permission setting that lets the shell tool run without a
// prompt. Each agent entry says how to configure it (files in HOME, environment, argv) and how to
// read its JSON output back into {answer, toolCalls, toolOutputs, isError}.
//
// The tool turn's prompt names the agent's own shell tool and its exact arguments (README.md lists
// them; the embedded model is trained on this pattern).
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const bin = (name) => join(here, 'node_modules', '.bin', name);

export const TOOL_MARKER = 'flashserve-tool-ok';
export const PLAIN_PROMPT = 'Reply with one short sentence: what is 2 + 3?';
// The arguments as one writes JSON by hand (and as Python's json.dumps does): `{"k": "v", ...}`.
const argsText = (args) =>
  `{${Object.entries(args).map(([k, v]) => `${JSON.stringify(k)}: ${JSON.stringify(v)}`).join(', ')}}`;
export const toolPrompt = (agent) =>
  `Use the ${agent.shellTool} tool with arguments ${argsText(agent.toolArgs)} and tell me what it printed.`;

// Model calls one turn may make where the agent can limit them (Claude Code, Qwen Code; Codex
// has no such setting): the tool turn needs two.
const MAX_MODEL_TURNS = 4;

// The model name every agent is told to use; flashserve answers whatever model a request names.
export const MODEL = 'flashserve';
const API_KEY = 'sk-flashserve-test';

// JSON lines of a stream-json / --json output; other lines (warnings) are skipped.
function jsonLines(stdout) {
  const out = [];
  for (const line of stdout.split('\n')) {
    if (!line.startsWith('{')) continue;
    try {
      out.push(JSON.parse(line));
    } catch {}
  }
  return out;
}

const textOf = (content) =>
  typeof content === 'string'
    ? content
    : Array.isArray(content)
      ? content.map((b) => (typeof b === 'string' ? b : (b.text ?? ''))).join('\n')
      : '';

// Claude Code's and Qwen Code's stream-json transcripts share a shape: assistant/user messages
// with Anthropic-style content blocks (tool_use, tool_result), then one `result` event.
function parseClaudeStyle(stdout) {
  const events = jsonLines(stdout);
  const toolOutputs = [];
  const toolCalls = [];
  for (const e of events) {
    for (const b of Array.isArray(e.message?.content) ? e.message.content : []) {
      if (e.type === 'user' && b.type === 'tool_result') toolOutputs.push(textOf(b.content));
      if (e.type === 'assistant' && b.type === 'tool_use') toolCalls.push({ name: b.name, input: b.input });
    }
  }
  const result = events.findLast((e) => e.type === 'result');
  return {
    answer: typeof result?.result === 'string' ? result.result : '',
    isError: !result || result.is_error === true || result.subtype !== 'success',
    toolCalls,
    toolOutputs,
  };
}

export const AGENTS = Object.fromEntries(Object.entries({
  'claude-code': {
    package: '@anthropic-ai/claude-code',
    bin: bin('claude'),
    api: 'anthropic',
    shellTool: 'Bash',
    toolArgs: { command: `echo ${TOOL_MARKER}` },
    configure({ home, base }) {
      return {
        env: {
          ANTHROPIC_BASE_URL: base,
          ANTHROPIC_API_KEY: API_KEY,
          // Every model role (main, the small fast one for titles and side calls, subagents) is
          // the one model flashserve serves.
          ANTHROPIC_MODEL: MODEL,
          ANTHROPIC_SMALL_FAST_MODEL: MODEL,
          ANTHROPIC_DEFAULT_HAIKU_MODEL: MODEL,
          ANTHROPIC_DEFAULT_SONNET_MODEL: MODEL,
          ANTHROPIC_DEFAULT_OPUS_MODEL: MODEL,
          CLAUDE_CODE_SUBAGENT_MODEL: MODEL,
          CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1',
          DISABLE_AUTOUPDATER: '1',
          DISABLE_TELEMETRY: '1',
          DISABLE_ERROR_REPORTING: '1',
          CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY: '1',
          // One attempt: a refused request is the finding, not something to retry for minutes.
          CLAUDE_CODE_MAX_RETRIES: '0',
        },
        // --allowedTools lets Bash run unprompted (--dangerously-skip-permissions is refused when
        // running as root, as CI does).
        // --max-turns: a model that keeps calling tools ends the turn with an error result, not
        // at the test's timeout.
        args: (prompt) => ['-p', prompt, '--output-format', 'stream-json', '--verbose', '--allowedTools', 'Bash',
          '--max-turns', String(MAX_MODEL_TURNS)],
      };
    },
    parse: parseClaudeStyle,
  },

  codex: {
    package: '@openai/codex',
    bin: bin('codex'),
    api: 'responses',
    shellTool: 'exec_command',
    toolArgs: { cmd: `echo ${TOOL_MARKER}` },
    configure({ home, base }) {
      const codexHome = join(home, '.codex');
      mkdirSync(codexHome, { recursive: true });
      // A custom provider on the Responses API (Codex's only wire API); analytics (OTLP metrics)
      // and the curated-plugin sync (git/GitHub/chatgpt.com) off, no update check.
      writeFileSync(
        join(codexHome, 'config.toml'),
        [
          `model = "${MODEL}"`,
          'model_provider = "flashserve"',
          'check_for_update_on_startup = false',
          '',
          '[model_providers.flashserve]',
          'name = "flashserve"',
          `base_url = "${base}/v1"`,
          'env_key = "FLASHSERVE_API_KEY"',
          'wire_api = "responses"',
          'request_max_retries = 0',
          'stream_max_retries = 0',
          '',
          '[analytics]',
          'enabled = false',
          '',
          '[features]',
          'plugins = false',
          '',
        ].join('\n'),
      );
      return {
        env: { CODEX_HOME: codexHome, FLASHSERVE_API_KEY: API_KEY },
        // The default sandbox (read-only, bubblewrap) and approval policy (never, in exec) run a
        // read-only command like echo without a prompt; --strict-config makes a config key this
        // version does not know an error rather than silently ignored.
        args: (prompt) => ['exec', '--skip-git-repo-check', '--strict-config', '--json', prompt],
      };
    },
    parse(stdout) {
      const events = jsonLines(stdout);
      const toolOutputs = [];
      const toolCalls = [];
      let answer = '';
      for (const e of events) {
        if (e.type !== 'item.completed' || !e.item) continue;
        if (e.item.type === 'command_execution') {
          toolCalls.push({ name: 'exec_command', input: { cmd: e.item.command } });
          toolOutputs.push(e.item.aggregated_output ?? '');
        }
        if (e.item.type === 'agent_message') answer = e.item.text ?? '';
      }
      const failed = events.some((e) => e.type === 'turn.failed' || e.type === 'error');
      const completed = events.some((e) => e.type === 'turn.completed');
      return { answer, isError: failed || !completed, toolCalls, toolOutputs };
    },
  },

  'qwen-code': {
    package: '@qwen-code/qwen-code',
    bin: bin('qwen'),
    api: 'openai',
    shellTool: 'run_shell_command',
    toolArgs: { command: `echo ${TOOL_MARKER}` },
    configure({ home, base }) {
      const dir = join(home, '.qwen');
      mkdirSync(dir, { recursive: true });
      // OpenAI-compatible auth from the environment; usage statistics (a RUM endpoint) and
      // telemetry off, no update check, no chat recording; the background memory agents off (each
      // is one more full-context request per turn); the bundled ripgrep is not executable as npm
      // installs it, so the built-in grep.
      writeFileSync(
        join(dir, 'settings.json'),
        JSON.stringify(
          {
            security: { auth: { selectedType: 'openai' } },
            general: { enableAutoUpdate: false, chatRecording: false },
            privacy: { usageStatisticsEnabled: false },
            telemetry: { enabled: false },
            tools: { useRipgrep: false },
            memory: { enableManagedAutoMemory: false, enableManagedAutoDream: false, enableAutoSkill: false },
          },
          null,
          2,
        ),
      );
      return {
        env: {
          OPENAI_BASE_URL: `${base}/v1`,
          OPENAI_API_KEY: API_KEY,
          OPENAI_MODEL: MODEL,
          QWEN_CODE_SUPPRESS_YOLO_WARNING: '1',
        },
        // --yolo: headless Qwen Code leaves the tools that need approval (run_shell_command, edit,
        // write_file) out of the request unless they are approved up front.
        args: (prompt) => ['--yolo', '--output-format', 'stream-json', '--max-session-turns', String(MAX_MODEL_TURNS),
          '-p', prompt],
      };
    },
    parse: parseClaudeStyle,
  },
}).map(([name, a]) => [name, { name, ...a }]));

export const installed = (agent) => existsSync(agent.bin);

// The process groups of the agents running now (each agent leads its own, with the helpers it
// starts), for a caller that must stop everything at once: killAgents().
const liveGroups = new Set();
const killGroup = (pgid) => {
  try {
    process.kill(-pgid, 'SIGKILL');
  } catch {}
};
export function killAgents() {
  for (const g of liveGroups) killGroup(g);
}

// Runs one headless turn of `agent` against the model server at `base` (the recorder), with
// HOME `dir`/home and working directory `dir`/work (made if missing; a second turn in the same
// `dir` is a second prompt in the same project), with nothing of this process's environment but
// PATH's node. Every proxy variable points at `base` too, so a connection beyond loopback is
// recorded and refused there. Resolves with {code, signal, timedOut, ms, stdout, stderr, home,
// work, ...agent.parse(stdout)}.
export async function runAgent(agent, { base, dir, prompt, timeoutMs }) {
  const home = join(dir, 'home');
  const work = join(dir, 'work');
  mkdirSync(home, { recursive: true });
  mkdirSync(work, { recursive: true });
  const { env, args } = agent.configure({ home, base });
  const proxy = Object.fromEntries(
    ['HTTPS_PROXY', 'HTTP_PROXY', 'ALL_PROXY'].flatMap((k) => [[k, base], [k.toLowerCase(), base]]),
  );
  const childEnv = {
    PATH: `${dirname(process.execPath)}:/usr/local/bin:/usr/bin:/bin`,
    HOME: home,
    USER: process.env.USER ?? 'root',
    SHELL: '/bin/bash',
    TERM: 'dumb',
    LANG: 'C.UTF-8',
    NO_COLOR: '1',
    ...proxy,
    NO_PROXY: '127.0.0.1,localhost,::1',
    no_proxy: '127.0.0.1,localhost,::1',
    ...env,
  };
  const t0 = performance.now();
  // Its own process group: Codex and Qwen Code start helpers, which a timeout must end too.
  const child = spawn(agent.bin, args(prompt), { cwd: work, env: childEnv, stdio: ['ignore', 'pipe', 'pipe'],
    detached: true });
  liveGroups.add(child.pid);
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d) => (stdout += d));
  child.stderr.on('data', (d) => (stderr += d));
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    killGroup(child.pid);
  }, timeoutMs);
  const { code, signal } = await new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  clearTimeout(timer);
  // Helpers left behind would hold the output pipes open.
  killGroup(child.pid);
  liveGroups.delete(child.pid);
  await new Promise((resolve) => {
    if (child.stdout.closed && child.stderr.closed) return resolve();
    const t = setTimeout(resolve, 2000);
    child.on('close', () => {
      clearTimeout(t);
      resolve();
    });
  });
  const ms = Math.round(performance.now() - t0);
  return { code, signal, timedOut, ms, stdout, stderr, home, work, ...agent.parse(stdout) };
}
