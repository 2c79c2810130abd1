/**
 * What a response's own figures cannot settle on their own (DESIGN section 6: no forwarded
 * model request is settled at zero output or goes unbilled), through a real sidecar and an
 * upstream scripted per case, read back from the usage events the console would receive.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { startHarness, waitForLine, type Harness } from '../helpers/sidecar.js';
import { startFakeUpstream, type FakeUpstream, type Handler } from '../helpers/upstream.js';
import { bearer, send } from '../helpers/http.js';

let up: FakeUpstream;
let h: Harness;
before(async () => {
  up = await startFakeUpstream();
  h = await startHarness({ upstream: up.url, keys: { k: {} } });
});
after(async () => {
  await h.close();
  await up.close();
});

const json = (body: unknown): Handler => (_q, res) => {
  const text = JSON.stringify(body);
  res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
};

/** The usage event of one request to `path` with `body`, answered by `answer`. */
async function billed(path: string, body: Record<string, unknown>, answer: Handler) {
  up.setHandler(answer);
  const r = await send(h.url, { method: 'POST', path, headers: { ...bearer(h.keys.k!), 'content-type': 'application/json' }, body: JSON.stringify(body) });
  assert.equal(r.status, 200);
  const line = await waitForLine(h, (l) => l.msg === 'request' && l.req_id === r.headers['x-request-id']);
  const ev = h.usage.find((e) => e.request_id === line.req_id);
  assert.ok(ev, 'a usage event');
  return ev;
}

test('a background response answers before it generates: billed the whole reservation, not one token', async () => {
  const ev = await billed('/v1/responses', { model: 'gpt-4o', input: 'write a novel', background: true, max_output_tokens: 30_000 }, json({ id: 'resp_1', object: 'response', status: 'queued', output: [], usage: null }));
  assert.equal(ev.output_tokens, 30_000);
  assert.equal(ev.estimated, true);
});

test('a reported zero output beside generated text is billed the text', async () => {
  const content = 'x'.repeat(400);
  const ev = await billed('/v1/chat/completions', { model: 'gpt-4o', messages: [] }, json({ choices: [{ message: { role: 'assistant', content } }], usage: { prompt_tokens: 11, completion_tokens: 0 } }));
  assert.deepEqual([ev.input_tokens, ev.output_tokens, ev.estimated], [11, 100, true]);
});

test('a reported figure past any real request is held to 10 M tokens', async () => {
  const ev = await billed('/v1/chat/completions', { model: 'gpt-4o', messages: [] }, json({ choices: [{ message: { content: 'hi' } }], usage: { prompt_tokens: 11, completion_tokens: 1e308 } }));
  assert.deepEqual([ev.input_tokens, ev.output_tokens, ev.estimated], [11, 10_000_000, true]);
});

test('a messages stream whose message_delta says null for its input keeps message_start\'s', async () => {
  const events = [
    { type: 'message_start', message: { id: 'm', type: 'message', role: 'assistant', content: [], usage: { input_tokens: 20, cache_creation_input_tokens: 5000, cache_read_input_tokens: 70000, output_tokens: 1 } } },
    { type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: 'Hello' } },
    { type: 'message_delta', delta: { stop_reason: 'end_turn' }, usage: { input_tokens: null, cache_creation_input_tokens: null, cache_read_input_tokens: null, output_tokens: 9 } },
    { type: 'message_stop' },
  ];
  const ev = await billed('/v1/messages', { model: 'claude-sonnet-4-5', max_tokens: 100, stream: true, messages: [] }, (_q, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.end(events.map((e) => `event: ${e.type}\ndata: ${JSON.stringify(e)}\n\n`).join(''));
  });
  assert.deepEqual([ev.input_tokens, ev.output_tokens, ev.estimated], [75_020, 9, undefined]);
});
