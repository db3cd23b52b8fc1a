// A loopback HTTP server between a coding agent and its model server that records every request
// the agent makes: method, path, headers (credentials redacted), the body's size in bytes, the
// parsed body, when it arrived (`at`, ms since the epoch) and how long its answer took (`ms`), the
// answer's status, its start and end, and for a refusal the answer's body. It forwards each request to `upstream`
// (flashserve), or with no upstream answers it as the fake model (fake_model.mjs).
//
// The agents run with HTTPS_PROXY/HTTP_PROXY pointing here too, so a connection one tries to open
// beyond loopback (telemetry, update checks, plugin sync) arrives as a CONNECT or an absolute-URL
// request: it is recorded with `outbound: true` and refused, never forwarded.
import { createServer, request as httpRequest } from 'node:http';
import zlib from 'node:zlib';
import { answerAsFakeModel } from './fake_model.mjs';

const SECRET_HEADERS = new Set(['authorization', 'x-api-key', 'cookie', 'proxy-authorization']);
// How much of the start and of the end of an answer a record keeps (enough for any error JSON,
// and for the last events of a stream).
const ANSWER_KEEP = 8192;
// How each API says that a reply was cut at its token limit (max_tokens or the context). Seen
// anywhere in the answer, not only in its kept end: the Responses API's last event repeats the
// whole request (its tools run to tens of kilobytes) after the `response.incomplete` type.
const CUT_MARKS = /"finish_reason":"length"|"stop_reason":"max_tokens"|"type":"response\.incomplete"/;

function redact(headers) {
  const out = {};
  for (const [k, v] of Object.entries(headers)) out[k] = SECRET_HEADERS.has(k) ? '<redacted>' : v;
  return out;
}

// A sink for the answer's bytes that keeps, decoded (the agents accept gzip, br, zstd), the text
// of a refusal in rec.error, and for any answer rec.answer = {bytes, head, tail, cut}: the decoded
// size, its first and last ANSWER_KEEP characters, and whether it said the reply was cut at its
// token limit (CUT_MARKS).
function watchAnswer(rec, encoding) {
  const decoders = { gzip: zlib.createGunzip, deflate: zlib.createInflate, br: zlib.createBrotliDecompress,
    zstd: zlib.createZstdDecompress };
  rec.answer = { bytes: 0, head: '', tail: '', cut: false };
  const keep = (chunk) => {
    const text = chunk.toString('utf8');
    // With the end of the text before it: a mark may straddle two chunks.
    if (!rec.answer.cut) rec.answer.cut = CUT_MARKS.test(rec.answer.tail.slice(-64) + text);
    rec.answer.bytes += chunk.length;
    if (rec.answer.head.length < ANSWER_KEEP) rec.answer.head += text.slice(0, ANSWER_KEEP - rec.answer.head.length);
    rec.answer.tail = (rec.answer.tail + text).slice(-ANSWER_KEEP);
    if (rec.status >= 400) rec.error = rec.answer.head;
  };
  if (!encoding || encoding === 'identity') return { write: keep, end: () => {} };
  if (!decoders[encoding]) {
    rec.answer.head = `(${encoding}-compressed; not decoded here)`;
    return { write: () => {}, end: () => {} };
  }
  const d = decoders[encoding]();
  d.on('data', keep);
  d.on('error', (e) => (rec.answer.head += ` (${encoding} does not decode: ${e.message})`));
  return { write: (c) => d.write(c), end: () => d.end() };
}

function parseBody(raw) {
  if (!raw.length) return null;
  const text = raw.toString('utf8');
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

// Resolves with {port, base, records, close()}; `records` grows as requests arrive (each record is
// pushed when its request has been read, and gets `status` when the answer starts).
export async function startRecorder({ upstream } = {}) {
  const records = [];
  const up = upstream ? new URL(upstream) : null;
  const server = createServer((req, res) => {
    // An agent killed at its timeout resets its connections; that ends the exchange, nothing more.
    req.on('error', () => {});
    res.on('error', () => {});
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      const raw = Buffer.concat(chunks);
      const rec = { method: req.method, path: req.url, headers: redact(req.headers), bytes: raw.length, body: parseBody(raw),
        at: Date.now() };
      records.push(rec);
      if (/^[a-z]+:\/\//i.test(req.url)) {
        // A proxied plain-HTTP request for some other host.
        rec.outbound = true;
        rec.status = 403;
        res.writeHead(403).end();
        return;
      }
      if (!up) {
        const path = req.url.split('?')[0];
        if (!answerAsFakeModel(req.method, path, rec.body, res)) {
          res.writeHead(404, { 'content-type': 'application/json' });
          res.end(JSON.stringify({ error: { message: `no route for ${req.method} ${path}` } }));
        }
        rec.status = res.statusCode;
        rec.done = true;
        rec.ms = Date.now() - rec.at;
        return;
      }
      const headers = { ...req.headers, host: up.host };
      const fwd = httpRequest(
        { host: up.hostname, port: up.port, method: req.method, path: req.url, headers },
        (ures) => {
          rec.status = ures.statusCode;
          res.writeHead(ures.statusCode, ures.headers);
          // What the server answers, decoded, for the failure report: a refusal's body, or how far
          // a stream got (its size, its first and last events) when the agent gave up on it.
          const answer = watchAnswer(rec, ures.headers['content-encoding']);
          ures.on('data', (c) => {
            answer.write(c);
            res.write(c);
          });
          ures.on('end', () => {
            rec.done = true;
            rec.ms = Date.now() - rec.at;
            answer.end();
            res.end();
          });
        },
      );
      fwd.on('error', (e) => {
        rec.status = 502;
        rec.error = `recorder: upstream ${upstream}: ${e.message}`;
        if (!res.headersSent) res.writeHead(502, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ error: { message: rec.error } }));
      });
      // The agent gave up (its own timeout): stop the upstream request too.
      res.on('close', () => fwd.destroy());
      fwd.end(raw);
    });
  });
  server.on('connect', (req, socket) => {
    socket.on('error', () => {});  // the agent may reset it first
    records.push({ method: 'CONNECT', path: req.url, headers: redact(req.headers), outbound: true, status: 403 });
    socket.end('HTTP/1.1 403 Forbidden\r\n\r\n');
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = server.address().port;
  return {
    port,
    base: `http://127.0.0.1:${port}`,
    records,
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(resolve);
      }),
  };
}
