// A stand-in model for the agent tests: answers a coding agent's request with the smallest valid
// response of the API its path names (Anthropic Messages, OpenAI chat completions, OpenAI
// Responses), streamed when the request asks for it. It plays the model the agent tests expect
// (and the embedded model is trained to be): when the last user text reads
//   Use the TOOL tool with arguments ARGS and tell me what it printed.
// it calls TOOL with ARGS; when the last message is a tool result, it answers quoting that result;
// otherwise it answers FAKE_ANSWER. Used to record the agents' requests (capture.mjs) and to check
// the harness itself (run.mjs --fake-model), never as the server under test.

export const FAKE_ANSWER = 'flashserve-fake-model-ok';

export const TOOL_PROMPT = /Use the (\S+) tool with arguments (\{.*?\}) and tell me what it printed\./s;
let seq = 0;
let ids = 0;
const newId = (prefix) => `${prefix}_${++ids}`;

// What the "model" does next for a conversation, given its last user text and the tool result
// it was just handed (if any): {kind: 'text', text} or {kind: 'tool', name, args}.
function decide(lastUserText, toolResult) {
  if (toolResult !== undefined) return { kind: 'text', text: `The tool printed: ${toolResult.trim()}` };
  const m = lastUserText && lastUserText.match(TOOL_PROMPT);
  if (m) {
    try {
      return { kind: 'tool', name: m[1], args: JSON.parse(m[2]) };
    } catch {}
  }
  return { kind: 'text', text: FAKE_ANSWER };
}

// Text of a content value: a string, or an array of blocks/parts with .text.
function textOf(content) {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  return content
    .map((b) => (typeof b === 'string' ? b : typeof b.text === 'string' ? b.text : b.content ? textOf(b.content) : ''))
    .join('\n');
}

// Anthropic: a tool_result block in the last user message is the tool result. (Claude Code puts
// a system-role message after it.)
function decideAnthropic(body) {
  const last = [...(body.messages || [])].reverse().find((m) => m.role === 'user');
  if (!last) return decide('');
  if (Array.isArray(last.content)) {
    const tr = last.content.find((b) => b.type === 'tool_result');
    if (tr) return decide('', textOf(tr.content));
  }
  return decide(textOf(last.content));
}

// OpenAI chat: a trailing tool message is the tool result.
function decideChat(body) {
  const msgs = body.messages || [];
  const last = msgs.at(-1);
  if (last && last.role === 'tool') return decide('', textOf(last.content));
  const user = [...msgs].reverse().find((m) => m.role === 'user');
  return decide(user ? textOf(user.content) : '');
}

// Responses: input is a string or a list of items; a trailing function_call_output is the result.
function decideResponses(body) {
  if (typeof body.input === 'string') return decide(body.input);
  const items = body.input || [];
  const last = items.at(-1);
  if (last && last.type === 'function_call_output') {
    const o = last.output;
    return decide('', typeof o === 'string' ? o : textOf(o?.content ?? o));
  }
  const user = [...items].reverse().find((i) => (i.type === 'message' || !i.type) && i.role === 'user');
  return decide(user ? textOf(user.content) : '');
}

function sse(res, event, data) {
  if (event) res.write(`event: ${event}\n`);
  res.write(`data: ${typeof data === 'string' ? data : JSON.stringify(data)}\n\n`);
}

function anthropic(body, res) {
  const d = decideAnthropic(body);
  const id = newId('msg');
  const block =
    d.kind === 'tool'
      ? { type: 'tool_use', id: newId('toolu'), name: d.name, input: d.args }
      : { type: 'text', text: d.text };
  const stop = d.kind === 'tool' ? 'tool_use' : 'end_turn';
  const usage = { input_tokens: 10, output_tokens: 5, cache_creation_input_tokens: 0, cache_read_input_tokens: 0 };
  if (!body.stream) {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ id, type: 'message', role: 'assistant', model: body.model, content: [block],
      stop_reason: stop, stop_sequence: null, usage }));
    return;
  }
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  sse(res, 'message_start', { type: 'message_start', message: { id, type: 'message', role: 'assistant',
    model: body.model, content: [], stop_reason: null, stop_sequence: null, usage: { ...usage, output_tokens: 0 } } });
  if (d.kind === 'tool') {
    sse(res, 'content_block_start', { type: 'content_block_start', index: 0, content_block: { ...block, input: {} } });
    sse(res, 'content_block_delta', { type: 'content_block_delta', index: 0,
      delta: { type: 'input_json_delta', partial_json: JSON.stringify(d.args) } });
  } else {
    sse(res, 'content_block_start', { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } });
    sse(res, 'content_block_delta', { type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: d.text } });
  }
  sse(res, 'content_block_stop', { type: 'content_block_stop', index: 0 });
  sse(res, 'message_delta', { type: 'message_delta', delta: { stop_reason: stop, stop_sequence: null },
    usage: { output_tokens: 5 } });
  sse(res, 'message_stop', { type: 'message_stop' });
  res.end();
}

function chat(body, res) {
  const d = decideChat(body);
  const id = newId('chatcmpl');
  const created = Math.floor(Date.now() / 1000);
  const toolCall = d.kind === 'tool'
    ? { id: newId('call'), type: 'function', function: { name: d.name, arguments: JSON.stringify(d.args) } }
    : null;
  const finish = toolCall ? 'tool_calls' : 'stop';
  const usage = { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 };
  if (!body.stream) {
    const message = toolCall ? { role: 'assistant', content: null, tool_calls: [toolCall] }
                             : { role: 'assistant', content: d.text };
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ id, object: 'chat.completion', created, model: body.model,
      choices: [{ index: 0, message, finish_reason: finish }], usage }));
    return;
  }
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  const chunk = (delta, finish_reason = null, extra = {}) =>
    sse(res, null, { id, object: 'chat.completion.chunk', created, model: body.model,
      choices: [{ index: 0, delta, finish_reason }], ...extra });
  chunk({ role: 'assistant', content: '' });
  if (toolCall) chunk({ tool_calls: [{ index: 0, ...toolCall }] });
  else chunk({ content: d.text });
  chunk({}, finish);
  if (body.stream_options?.include_usage)
    sse(res, null, { id, object: 'chat.completion.chunk', created, model: body.model, choices: [], usage });
  sse(res, null, '[DONE]');
  res.end();
}

function responses(body, res) {
  const d = decideResponses(body);
  const id = newId('resp');
  const base = { id, object: 'response', created_at: Math.floor(Date.now() / 1000), model: body.model,
    status: 'in_progress', output: [], error: null, incomplete_details: null };
  const item = d.kind === 'tool'
    ? { id: newId('fc'), type: 'function_call', status: 'completed', call_id: newId('call'), name: d.name,
        arguments: JSON.stringify(d.args) }
    : { id: newId('msg'), type: 'message', status: 'completed', role: 'assistant',
        content: [{ type: 'output_text', text: d.text, annotations: [] }] };
  const usage = { input_tokens: 10, input_tokens_details: { cached_tokens: 0 }, output_tokens: 5,
    output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 15 };
  const done = { ...base, status: 'completed', output: [item], usage };
  if (!body.stream) {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify(done));
    return;
  }
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  let n = 0;
  const ev = (type, data) => sse(res, type, { type, sequence_number: n++, ...data });
  ev('response.created', { response: base });
  ev('response.in_progress', { response: base });
  if (d.kind === 'tool') {
    ev('response.output_item.added', { output_index: 0, item: { ...item, status: 'in_progress', arguments: '' } });
    ev('response.function_call_arguments.delta', { item_id: item.id, output_index: 0, delta: item.arguments });
    ev('response.function_call_arguments.done', { item_id: item.id, output_index: 0, arguments: item.arguments });
  } else {
    ev('response.output_item.added', { output_index: 0, item: { ...item, status: 'in_progress', content: [] } });
    ev('response.content_part.added', { item_id: item.id, output_index: 0, content_index: 0,
      part: { type: 'output_text', text: '', annotations: [] } });
    ev('response.output_text.delta', { item_id: item.id, output_index: 0, content_index: 0, delta: d.text });
    ev('response.output_text.done', { item_id: item.id, output_index: 0, content_index: 0, text: d.text });
    ev('response.content_part.done', { item_id: item.id, output_index: 0, content_index: 0, part: item.content[0] });
  }
  ev('response.output_item.done', { output_index: 0, item });
  ev('response.completed', { response: done });
  res.end();
}

// Answers one request (already read into `body`) if its method and path are a model API's;
// returns false for anything else.
export function answerAsFakeModel(method, path, body, res) {
  const json = (value) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify(value));
  };
  if (method === 'POST' && path.endsWith('/messages/count_tokens'))
    json({ input_tokens: Math.ceil(JSON.stringify(body).length / 4) });
  else if (method === 'POST' && path.endsWith('/messages')) anthropic(body, res);
  else if (method === 'POST' && path.endsWith('/chat/completions')) chat(body, res);
  else if (method === 'POST' && path.endsWith('/responses')) responses(body, res);
  else if (method === 'GET' && path.endsWith('/models'))
    json({ object: 'list', data: [{ id: 'flashserve', object: 'model', created: 0, owned_by: 'flashserve' }] });
  else return false;
  return true;
}
