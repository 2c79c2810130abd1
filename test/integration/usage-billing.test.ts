/**
 * What a response's own figures cannot settle on their own (DESIGN section 6: no forwarded
 * model request is settled at zero output or goes unbilled), through a real sidecar and an
 * upstream scripted per case, read back from the usage events the console would receive;
 * and that what is billed reaches the key's TPM bucket, and the console once per request.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { startHarness, waitForLine, type Harness } from '../helpers/sidecar.js';
import { startFakeUpstream, type FakeUpstream, type Handler } from '../helpers/upstream.js';
import { bearer, send } from '../helpers/http.js';

let up: FakeUpstream;
let h: Harness;
before(async () => {
  up = await startFakeUpstream();
  h = await startHarness({ upstream: up.url, keys: { k: {}, k_tpm: { tpm: 10_000 } } });
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

/** Answers 200 with exactly these headers and bytes. */
const raw = (headers: Record<string, string>, body: string | Buffer): Handler => (_q, res) => {
  res.writeHead(200, { ...headers, 'content-length': Buffer.byteLength(body) });
  res.end(body);
};

/** The usage event of one request to `path` with `body`, answered by `answer`. */
async function billed(path: string, body: Record<string, unknown>, answer: Handler, key = h.keys.k!) {
  up.setHandler(answer);
  const r = await send(h.url, { method: 'POST', path, headers: { ...bearer(key), 'content-type': 'application/json' }, body: JSON.stringify(body) });
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

test("a messages stream that ends in an error event before its final counts: message_start's input, the output from the text", async () => {
  const events = [
    { type: 'message_start', message: { id: 'm', type: 'message', role: 'assistant', content: [], usage: { input_tokens: 100_000, output_tokens: 1 } } },
    { type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: 'x'.repeat(40) } },
    { type: 'error', error: { type: 'overloaded_error', message: 'Overloaded' } },
  ];
  const ev = await billed('/v1/messages', { model: 'claude-sonnet-4-5', max_tokens: 100, stream: true, messages: [] }, (_q, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.end(events.map((e) => `event: ${e.type}\ndata: ${JSON.stringify(e)}\n\n`).join(''));
  });
  assert.deepEqual([ev.input_tokens, ev.output_tokens, ev.estimated], [100_000, 10, true]);
});

test('a stream whose lines end in CR alone is read: its reported usage is billed', async () => {
  const chunks = [{ choices: [{ delta: { content: 'Hello' } }] }, { choices: [], usage: { prompt_tokens: 5000, completion_tokens: 10_000 } }];
  const ev = await billed('/v1/chat/completions', { model: 'gpt-4o', stream: true, messages: [] }, raw({ 'content-type': 'text/event-stream' }, chunks.map((c) => `data: ${JSON.stringify(c)}\r\r`).join('') + 'data: [DONE]\r\r'));
  assert.deepEqual([ev.input_tokens, ev.output_tokens, ev.estimated], [5000, 10_000, undefined]);
});

// A response the tap cannot read at all tells nothing of its output: billing it as zero
// output would let any upstream answer go free.
for (const [what, headers] of [
  ['a content coding the tap does not decode', { 'content-type': 'application/json', 'content-encoding': 'zstd' }],
  ['a content type the tap does not read', { 'content-type': 'application/octet-stream' }],
] as const) {
  test(`${what}: billed the whole reservation, estimated, not zero output`, async () => {
    const ev = await billed('/v1/chat/completions', { model: 'gpt-4o', max_tokens: 700, messages: [] }, raw(headers, Buffer.from('\x28\xb5\x2f\xfd opaque bytes')));
    assert.equal(ev.output_tokens, 700);
    assert.equal(ev.estimated, true);
  });
}

test("the key's TPM bucket is settled to the reported input and output, not the input alone", async () => {
  const answer = json({ choices: [{ message: { content: 'hi' } }], usage: { prompt_tokens: 100, completion_tokens: 3000 } });
  const ev = await billed('/v1/chat/completions', { model: 'gpt-4o', max_tokens: 10, messages: [] }, answer, h.keys.k_tpm!);
  assert.deepEqual([ev.input_tokens, ev.output_tokens], [100, 3000]);
  const me = await send(h.url, { path: '/v1/key', headers: bearer(h.keys.k_tpm!) });
  const remaining = me.json<{ remaining: { tokens: number } }>().remaining.tokens;
  // 3100 taken from 10000; the bucket refills about 167 a second meanwhile
  assert.ok(remaining <= 10_000 - 3100 + 500, `remaining ${remaining}`);
});

// The console applies each usage event once, by its event id: a client retrying with its own
// x-request-id must not make two requests' events look like one.
test('requests that share a client x-request-id get usage events with distinct event ids', async () => {
  up.setHandler(json({ choices: [{ message: { content: 'hi' } }], usage: { prompt_tokens: 5, completion_tokens: 6 } }));
  const id = 'client-retry-1';
  // a different model each time tells the two access lines apart
  for (const model of ['gpt-4o', 'gpt-4o-mini']) {
    const headers = { ...bearer(h.keys.k!), 'content-type': 'application/json', 'x-request-id': id };
    const r = await send(h.url, { method: 'POST', path: '/v1/chat/completions', headers, body: JSON.stringify({ model, messages: [] }) });
    assert.equal(r.status, 200);
    await waitForLine(h, (l) => l.msg === 'request' && l.req_id === id && l.model === model);
  }
  const events = h.usage.filter((e) => e.request_id === id);
  assert.equal(events.length, 2, "the request id is the client's");
  assert.notEqual(events[0]!.event_id, events[1]!.event_id);
  for (const e of events) assert.notEqual(e.event_id, id);
});

test('a client that leaves mid-stream (499) still sends the console a usage event for what was generated', { timeout: 10_000 }, async () => {
  const event = `data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: 'y'.repeat(80) } }] })}\n\n`;
  up.setHandler((_q, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write(event);
    // the rest never comes: the client leaves first
  });
  const body = JSON.stringify({ model: 'gpt-4o', stream: true, max_tokens: 900, messages: [] });
  const socket = net.connect(h.sidecar.port, '127.0.0.1');
  socket.on('error', () => {});
  let got = '';
  const seen = new Promise<void>((resolve) => socket.on('data', (b: Buffer) => ((got += b.toString('latin1')), got.includes('yyyy') && resolve())));
  socket.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
  await seen;
  socket.destroy();
  const line = await waitForLine(h, (l) => l.msg === 'request' && l.status === 499);
  const ev = h.usage.find((e) => e.request_id === line.req_id);
  assert.ok(ev, 'a usage event for the 499');
  assert.equal(ev.status, 499);
  assert.equal(ev.output_tokens, 20, 'ceil(80 characters / 4)');
  assert.equal(ev.estimated, true);
});
