// Overload test for `flashserve serve`: slow clients, a flood past the workers, clients that
// disconnect mid-request, twice over, on a server with 2 HTTP workers.
//
//   node overload.mjs --binary build/src/flashserve [--model DIR]
//
// Each round: 60 slowloris connections dribble a header while /health and a real request must
// still be answered, and the server must close them after its read timeout; 200 concurrent
// connections each post a generation: every answer is 200 or 503 (with Retry-After), both occur,
// /health answers during the flood; a non-streaming client that disconnects mid-generation gets
// its generation cancelled (flashserve_finish_total{reason="cancelled"}) and frees the engine;
// a request past its deadline is answered 504 and its generation cancelled; afterwards every
// request succeeds again. Across the two rounds the server's thread count is
// unchanged, its open connections return to zero and its resident memory stays flat. Every loop
// is bounded; a global timer kills the server if anything hangs. Prints one line per check and
// "N passed, M failed".
import { readFileSync } from 'node:fs';
import net from 'node:net';
import assert from 'node:assert/strict';
import { spawnServer } from './server.mjs';

const args = process.argv.slice(2);
const argOf = (name, dflt) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : dflt;
};
const binary = argOf('--binary');
const model = argOf('--model');
if (!binary) {
  console.error('usage: node overload.mjs --binary PATH [--model DIR]');
  process.exit(2);
}
let proc = null;
const globalTimer = setTimeout(() => {
  console.error('overload test: global timeout; killing the server');
  if (proc) proc.kill('SIGKILL');
  process.exit(1);
}, Number(argOf('--timeout-s', '150')) * 1000);

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const READ_TIMEOUT_MS = 1500;
const DEADLINE_S = 6;

async function startServer() {
  const server = await spawnServer(binary, [...(model ? ['--model', model] : []), '--mtp-depth', '0',
    '--http-threads', '2', '--max-queue', '1', '--read-timeout-ms', String(READ_TIMEOUT_MS),
    // A small RAM bank: what it keeps is bounded by its budget, so memory can be compared.
    '--session-ram-mb', '8', '--request-timeout-s', String(DEADLINE_S)]);
  proc = server.proc;
  return server;
}

// One request on its own connection; resolves with {status, headers, body} or {status: 0, error}.
function rawRequest(port, method, path, body, { timeoutMs = 30000, onConnect } = {}) {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    let data = Buffer.alloc(0);
    let settled = false;
    const done = (r) => {
      if (settled) return;
      settled = true;
      clearTimeout(t);
      s.destroy();
      resolve(r);
    };
    const t = setTimeout(() => done({ status: 0, error: 'timeout' }), timeoutMs);
    s.on('connect', () => {
      const b = body === undefined ? '' : typeof body === 'string' ? body : JSON.stringify(body);
      s.write(`${method} ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n` +
        `Content-Length: ${Buffer.byteLength(b)}\r\nConnection: close\r\n\r\n${b}`);
      if (onConnect) onConnect(s, done);
    });
    s.on('data', (d) => {
      data = Buffer.concat([data, d]);
      const r = parseResponse(data, false);
      if (r) done(r);
    });
    s.on('error', (e) => done({ status: 0, error: e.code || String(e) }));
    s.on('close', () => done(parseResponse(data, true) || { status: 0, error: 'closed' }));
  });
}

function parseResponse(buf, final) {
  const text = buf.toString('latin1');
  const end = text.indexOf('\r\n\r\n');
  if (end < 0) return null;
  const lines = text.slice(0, end).split('\r\n');
  const status = Number(lines[0].split(' ')[1]);
  const headers = {};
  for (const line of lines.slice(1)) {
    const i = line.indexOf(':');
    headers[line.slice(0, i).toLowerCase()] = line.slice(i + 1).trim();
  }
  const length = headers['content-length'];
  if (length !== undefined) {
    if (buf.length - (end + 4) < Number(length)) return null;
    return { status, headers, body: buf.slice(end + 4, end + 4 + Number(length)).toString() };
  }
  return final ? { status, headers, body: buf.slice(end + 4).toString() } : null;
}

async function metrics(port) {
  const r = await rawRequest(port, 'GET', '/metrics', undefined, { timeoutMs: 5000 });
  const values = new Map();
  for (const line of (r.body || '').split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    values.set(line.slice(0, i), Number(line.slice(i + 1)));
  }
  return values;
}

function procStatus(pid) {
  const s = readFileSync(`/proc/${pid}/status`, 'utf8');
  return {
    threads: Number(s.match(/Threads:\s+(\d+)/)[1]),
    rssKb: Number(s.match(/VmRSS:\s+(\d+)/)[1]),
  };
}

// /health must answer within `ms`, however busy the workers are.
async function healthWithin(port, ms) {
  const t0 = performance.now();
  const r = await rawRequest(port, 'GET', '/health', undefined, { timeoutMs: ms });
  assert.equal(r.status, 200, `/health: ${JSON.stringify(r)}`);
  return performance.now() - t0;
}

// Waits (bounded) until the engine is free again: a one-token request is answered 200. Each
// check starts from an idle server, however slowly the previous one's cancelled work winds down
// on a loaded machine.
async function settle(port) {
  for (let i = 0; i < 60; ++i) {
    const r = await rawRequest(port, 'POST', '/v1/chat/completions', chat('settle', 1));
    if (r.status === 200) return;
    await sleep(500);
  }
  throw new Error('the server did not become idle within 30 s');
}

const chat = (content, max_tokens) => ({
  messages: [{ role: 'user', content }],
  max_tokens,
  temperature: 0,
});
// A generation that runs to max_tokens: the embedded model ends a chat turn after a few tokens,
// but continues code greedily without an end (it repeats lines).
const longCompletion = (tag, max_tokens) => ({
  prompt: `# ${tag}\nimport os\nimport sys\n\n`,
  max_tokens,
  temperature: 0,
});

let passed = 0;
let failed = 0;
async function check(name, fn, { idle = true } = {}) {
  const t0 = performance.now();
  try {
    if (idle) await settle(server.port);
    await fn();
    ++passed;
    console.log(`ok    ${name} (${Math.round(performance.now() - t0)} ms)`);
  } catch (e) {
    ++failed;
    console.log(`FAIL  ${name}: ${e.stack || e}`);
  }
}

const server = await startServer();
const { port } = server;
for (let i = 0; i < 100; ++i) {
  if ((await rawRequest(port, 'GET', '/health', undefined, { timeoutMs: 1000 })).status === 200) break;
  await sleep(100);
}
// Warm up (first request pays one-time costs), then take the baseline.
await rawRequest(port, 'POST', '/v1/chat/completions', chat('warm up', 4));
const figures = { rounds: [] };

for (let round = 1; round <= 2; ++round) {
  const fig = {};
  await check(`round ${round}: 60 slowloris connections hold no worker and are closed after the read timeout`, async () => {
    const sockets = [];
    const closedAt = [];
    const t0 = performance.now();
    for (let i = 0; i < 60; ++i) {
      const s = net.connect(port, '127.0.0.1');
      s.on('error', () => {});
      s.on('close', () => closedAt.push(performance.now() - t0));
      s.on('connect', () => s.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n'));
      sockets.push(s);
    }
    const dribble = setInterval(() => {
      for (const s of sockets) if (!s.destroyed) s.write('X');
    }, 200);
    try {
      await sleep(200);
      for (let i = 0; i < 3; ++i) assert.ok((await healthWithin(port, 1000)) < 1000);
      const r = await rawRequest(port, 'POST', '/v1/chat/completions', chat('hello ' + round, 4));
      assert.equal(r.status, 200, JSON.stringify(r));
      // The server drops each of them once the read timeout has passed (plus slack for a busy
      // machine), though they keep sending.
      const limit = READ_TIMEOUT_MS + 3000;
      while (closedAt.length < sockets.length && performance.now() - t0 < limit) await sleep(100);
      assert.equal(closedAt.length, sockets.length, `${closedAt.length} of 60 closed by the server`);
      fig.slowloris_closed_after_ms = Math.round(Math.max(...closedAt));
    } finally {
      clearInterval(dribble);
      for (const s of sockets) s.destroy();
    }
  });

  await check(`round ${round}: a flood of 200 concurrent connections gets 200s and 503s with Retry-After, /health answers`, async () => {
    const before = await metrics(port);
    const flood = Array.from({ length: 200 }, (_, i) =>
      rawRequest(port, 'POST', '/v1/chat/completions', chat(`flood ${round} ${i}`, 24)));
    await sleep(50);
    const healthMs = await healthWithin(port, 2000);
    const results = await Promise.all(flood);
    const byStatus = {};
    for (const r of results) byStatus[r.status || r.error] = (byStatus[r.status || r.error] || 0) + 1;
    fig.flood = byStatus;
    fig.health_during_flood_ms = Math.round(healthMs);
    for (const r of results) {
      assert.ok(r.status === 200 || r.status === 503, `unexpected answer ${JSON.stringify(r)}`);
      if (r.status === 503) {
        assert.equal(r.headers['retry-after'], '1');
        assert.ok(JSON.parse(r.body).error, r.body);
      }
    }
    assert.ok(byStatus[200] >= 1, JSON.stringify(byStatus));
    assert.ok(byStatus[503] >= 100, JSON.stringify(byStatus));
    const after = await metrics(port);
    const overflow = (after.get('flashserve_http_overflow_total') || 0) -
      (before.get('flashserve_http_overflow_total') || 0);
    const refused = (after.get('flashserve_http_refused_total') || 0) -
      (before.get('flashserve_http_refused_total') || 0);
    // Three places answer 503: the gatherer (refused), the overflow threads, and a worker whose
    // job found the engine queue full; each is counted before its answer is sent.
    const queueFull = (after.get('flashserve_queue_full_total') || 0) -
      (before.get('flashserve_queue_full_total') || 0);
    assert.ok(overflow + refused + queueFull >= byStatus[503],
      `overflow ${overflow} refused ${refused} queue full ${queueFull}, 503s ${byStatus[503]}`);
  });

  await check(`round ${round}: a non-streaming client that disconnects mid-generation cancels it`, async () => {
    const key = 'flashserve_finish_total{reason="cancelled"}';
    const before = (await metrics(port)).get(key) || 0;
    const r = await rawRequest(port, 'POST', '/v1/completions', longCompletion(`long ${round}`, 4000), {
      onConnect: (s, done) => setTimeout(() => done({ status: -1, error: 'disconnected' }), 300),
    });
    assert.equal(r.status, -1);
    const t0 = performance.now();
    let now = before;
    while (now <= before && performance.now() - t0 < 5000) {
      await sleep(100);
      now = (await metrics(port)).get(key) || 0;
    }
    assert.ok(now > before, 'the generation was not cancelled within 5 s');
    fig.cancel_detected_ms = Math.round(performance.now() - t0);
  });

  await check(`round ${round}: a request past its deadline (--request-timeout-s ${DEADLINE_S}) gets 504 and is cancelled`, async () => {
    const key = 'flashserve_finish_total{reason="cancelled"}';
    const before = (await metrics(port)).get(key) || 0;
    const t0 = performance.now();
    const r = await rawRequest(port, 'POST', '/v1/completions', longCompletion(`slow ${round}`, 4000), { timeoutMs: 60000 });
    const ms = performance.now() - t0;
    assert.equal(r.status, 504, JSON.stringify(r).slice(0, 300));
    assert.equal(JSON.parse(r.body).error.code, 'request_timeout');
    assert.ok(ms >= DEADLINE_S * 1000 - 100 && ms < DEADLINE_S * 1000 + 5000,
      `answered after ${Math.round(ms)} ms`);
    let now = before;
    for (let i = 0; i < 50 && now <= before; ++i) {
      await sleep(100);
      now = (await metrics(port)).get(key) || 0;
    }
    assert.ok(now > before, 'the generation was not cancelled');
  });

  if (round === 1) {
    await check(`a streaming request past its deadline ends with an error event and is cancelled`, async () => {
      const key = 'flashserve_finish_total{reason="cancelled"}';
      const before = (await metrics(port)).get(key) || 0;
      const t0 = performance.now();
      const r = await rawRequest(port, 'POST', '/v1/completions',
        { ...longCompletion('slow stream', 4000), stream: true }, { timeoutMs: 60000 });
      const ms = performance.now() - t0;
      assert.equal(r.status, 200);
      assert.ok(r.body.includes('deadline'), r.body.slice(-300));
      assert.ok(ms >= DEADLINE_S * 1000 - 100 && ms < DEADLINE_S * 1000 + 5000,
        `ended after ${Math.round(ms)} ms`);
      let now = before;
      for (let i = 0; i < 50 && now <= before; ++i) {
        await sleep(100);
        now = (await metrics(port)).get(key) || 0;
      }
      assert.ok(now > before, 'the generation was not cancelled');
    });
  }

  await check(`round ${round}: the server recovers: 5 requests in a row succeed`, async () => {
    for (let i = 0; i < 5; ++i) {
      const r = await rawRequest(port, 'POST', '/v1/chat/completions', chat(`after ${round} ${i}`, 4));
      assert.equal(r.status, 200, JSON.stringify(r));
    }
  });

  await sleep(500);
  const m = await metrics(port);
  fig.open_connections = m.get('flashserve_http_open_connections');
  Object.assign(fig, procStatus(proc.pid));
  figures.rounds.push(fig);
}

await check('no thread, connection or memory growth from round 1 to round 2', async () => {
  const [a, b] = figures.rounds;
  assert.equal(b.threads, a.threads, `threads ${a.threads} -> ${b.threads}`);
  assert.ok(a.open_connections <= 1 && b.open_connections <= 1,
    `open connections ${a.open_connections}, ${b.open_connections} (the /metrics request itself)`);
  assert.ok(b.rssKb - a.rssKb < 16 * 1024, `RSS ${a.rssKb} kB -> ${b.rssKb} kB`);
}, { idle: false });

const exited = new Promise((r) => proc.on('exit', (code, sig) => r({ code, sig })));
proc.kill('SIGTERM');
const exit = await exited;
await check('server stops cleanly on SIGTERM after the overload', async () => {
  assert.equal(exit.code, 0, JSON.stringify(exit) + '\n' + server.log().slice(-2000));
}, { idle: false });
clearTimeout(globalTimer);
console.log(JSON.stringify(figures));
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
