/**
 * The official openai@6 client through a real sidecar in front of an upstream that
 * answers like the OpenAI API and records what it received: listing, chat (JSON and
 * SSE with usage), file upload byte for byte, and every denial surfacing as the SDK's
 * own error class with the right status and code, never reaching the upstream.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import OpenAI, { APIError, toFile } from 'openai';
import { sha256, type FakeUpstream, type Handler } from '../helpers/upstream.js';
import { startHarness, waitForLine, type Harness } from '../helpers/sidecar.js';
import { deniedUnforwarded, startSdkBed } from '../helpers/sdk-bed.js';
import { startDemoUpstream } from '../../src/app/demo-upstream.js';

/** Answers the way the OpenAI API does, from the body the fake upstream already read. */
const openaiLike: Handler = (req, res, rec) => {
  const path = rec.url.split('?')[0]!;
  const json = (status: number, body: unknown) => {
    const text = JSON.stringify(body);
    res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text), 'x-request-id': `up-${rec.sha256.slice(0, 8)}` });
    res.end(text);
  };
  if (req.method === 'GET' && path === '/v1/models') {
    return json(200, { object: 'list', data: [{ id: 'gpt-4o-mini', object: 'model', created: 1, owned_by: 'e2e' }, { id: 'gpt-4o', object: 'model', created: 2, owned_by: 'e2e' }] });
  }
  if (req.method === 'POST' && path === '/v1/chat/completions') {
    const body = JSON.parse(rec.body.toString('utf8')) as { model: string; stream?: boolean };
    const prompt = Math.ceil(rec.body.length / 4);
    const usage = { prompt_tokens: prompt, completion_tokens: 7, total_tokens: prompt + 7 };
    const base = { id: 'chatcmpl-e2e', created: 1, model: body.model };
    if (!body.stream) {
      return json(200, { ...base, object: 'chat.completion', choices: [{ index: 0, message: { role: 'assistant', content: 'Hello there, friend.', refusal: null }, finish_reason: 'stop', logprobs: null }], usage });
    }
    res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache' });
    const chunk = { ...base, object: 'chat.completion.chunk' };
    for (const word of ['Hello ', 'there, ', 'friend.']) {
      res.write(`data: ${JSON.stringify({ ...chunk, choices: [{ index: 0, delta: { content: word }, finish_reason: null }], usage: null })}\n\n`);
    }
    res.write(`data: ${JSON.stringify({ ...chunk, choices: [{ index: 0, delta: {}, finish_reason: 'stop' }], usage: null })}\n\n`);
    res.write(`data: ${JSON.stringify({ ...chunk, choices: [], usage })}\n\n`);
    res.end('data: [DONE]\n\n');
    return;
  }
  if (req.method === 'POST' && path === '/v1/files') {
    return json(200, { id: 'file-e2e', object: 'file', bytes: rec.body.length, created_at: 1, filename: 'x.bin', purpose: 'assistants', status: 'processed' });
  }
  json(404, { error: { message: `no ${path} here`, type: 'invalid_request_error', code: null, param: null } });
};

let up: FakeUpstream;
let h: Harness;
let close: () => Promise<void>;

const client = (key: string, extra: Partial<ConstructorParameters<typeof OpenAI>[0]> = {}) =>
  new OpenAI({ apiKey: key, baseURL: `${h.url}/v1`, maxRetries: 0, timeout: 5_000, ...extra });

before(async () => {
  ({ up, h, close } = await startSdkBed(openaiLike, ['gpt-4o-mini*']));
});
after(() => close());

describe('openai@6 through keyward', () => {
  test('models.list', async () => {
    const page = await client(h.keys.k_ok!).models.list();
    assert.deepEqual(page.data.map((m) => m.id), ['gpt-4o-mini', 'gpt-4o']);
    const rec = up.received.at(-1)!;
    assert.equal(rec.method, 'GET');
    assert.equal(rec.url, '/v1/models');
    assert.equal(rec.headers.authorization, `Bearer ${h.keys.k_ok}`);
  });

  test('chat.completions.create, non-streaming: answer, bytes and usage in the access log', async () => {
    const before = up.received.length;
    const { data, response } = await client(h.keys.k_ok!)
      .chat.completions.create(
        { model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'Say hello' }], max_completion_tokens: 20 },
        { headers: { 'x-request-id': 'e2e-openai-chat-json' } },
      )
      .withResponse();
    assert.equal(response.status, 200);
    assert.equal(data.choices[0]!.message.content, 'Hello there, friend.');
    assert.ok(data.usage);
    assert.equal(up.received.length, before + 1);
    const rec = up.received.at(-1)!;
    const sent = JSON.parse(rec.body.toString('utf8')) as Record<string, unknown>;
    assert.equal(sent.model, 'gpt-4o-mini');
    assert.equal(sent.max_completion_tokens, 20);
    assert.equal(rec.headers['x-request-id'], 'e2e-openai-chat-json');
    const line = await waitForLine(h, (l) => l.req_id === 'e2e-openai-chat-json');
    assert.equal(line.status, 200);
    assert.equal(line.route, 'chat.completions');
    assert.equal(line.key_id, 'k_ok');
    assert.equal(line.model, 'gpt-4o-mini');
    assert.equal(line.input_tokens, data.usage.prompt_tokens);
    assert.equal(line.output_tokens, data.usage.completion_tokens);
    assert.ok(!JSON.stringify(line).includes(h.keys.k_ok!), 'the key never reaches the log');
  });

  test('chat.completions.create, streaming with include_usage: chunks and usage in the access log', async () => {
    const stream = await client(h.keys.k_ok!).chat.completions.create(
      { model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'Stream hello' }], stream: true, stream_options: { include_usage: true } },
      { headers: { 'x-request-id': 'e2e-openai-chat-sse' } },
    );
    let text = '';
    let usage: OpenAI.CompletionUsage | null | undefined;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta.content ?? '';
      if (chunk.usage) usage = chunk.usage;
    }
    assert.equal(text, 'Hello there, friend.');
    assert.ok(usage, 'the final chunk carries usage');
    const rec = up.received.at(-1)!;
    const sent = JSON.parse(rec.body.toString('utf8')) as Record<string, unknown>;
    assert.equal(sent.stream, true);
    assert.deepEqual(sent.stream_options, { include_usage: true });
    const line = await waitForLine(h, (l) => l.req_id === 'e2e-openai-chat-sse');
    assert.equal(line.status, 200);
    assert.equal(line.input_tokens, usage.prompt_tokens);
    assert.equal(line.output_tokens, usage.completion_tokens);
    const event = h.usage.find((u) => u.request_id === 'e2e-openai-chat-sse');
    assert.ok(event, 'a usage event was emitted');
    assert.equal(event.input_tokens, usage.prompt_tokens);
    assert.equal(event.output_tokens, usage.completion_tokens);
  });

  test('files.create: the upstream gets the exact multipart bytes and boundary the client sent', async () => {
    // Every byte value, CRLFs and boundary-looking runs, then random bytes.
    const file = Buffer.concat([
      Buffer.from(Array.from({ length: 256 }, (_, i) => i)),
      Buffer.from('\r\n--\r\n------formdata-undici-0\r\n--\r\n'),
      randomBytes(200_000),
    ]);
    // The client's own fetch, teed: what goes on the wire is untouched, a clone is kept.
    const sent: { contentType: string | null; body: Buffer }[] = [];
    const capturing: typeof fetch = async (input, init) => {
      if (typeof input === 'string' && input.startsWith('data:')) return fetch(input, init);
      const request = new Request(input, init);
      if (request.method === 'POST') {
        const copy = request.clone();
        sent.push({ contentType: copy.headers.get('content-type'), body: Buffer.from(await copy.arrayBuffer()) });
      }
      return fetch(request);
    };
    const before = up.received.length;
    const created = await client(h.keys.k_ok!, { fetch: capturing }).files.create({ file: await toFile(file, 'x.bin'), purpose: 'assistants' });
    assert.equal(created.id, 'file-e2e');
    assert.equal(up.received.length, before + 1);
    assert.equal(sent.length, 1);
    const rec = up.received.at(-1)!;
    const out = sent[0]!;
    assert.equal(rec.method, 'POST');
    assert.equal(rec.url, '/v1/files');
    assert.match(out.contentType ?? '', /^multipart\/form-data; boundary=/);
    assert.equal(rec.headers['content-type'], out.contentType, 'boundary untouched');
    assert.equal(rec.body.length, out.body.length);
    assert.equal(rec.sha256, sha256(out.body), 'the upstream received the bytes the client sent');
    assert.equal(created.bytes, out.body.length);
    // and the file itself sits inside the body exactly once, intact
    const at = rec.body.indexOf(file);
    assert.ok(at > 0, 'file bytes present');
    assert.equal(rec.body.indexOf(file, at + 1), -1);
    const boundary = /boundary=(.+)$/.exec(out.contentType!)![1]!;
    assert.ok(rec.body.subarray(0, at).toString('latin1').includes(`--${boundary}\r\n`));
    assert.ok(rec.body.toString('latin1').includes('name="purpose"\r\n\r\nassistants\r\n'));
    assert.ok(rec.body.subarray(at + file.length).toString('latin1').startsWith(`\r\n--${boundary}`));
    assert.ok(rec.body.toString('latin1').endsWith(`\r\n--${boundary}--\r\n`));
  });
});

describe('openai@6: denials surface as the SDK error classes and are never forwarded', () => {
  /** Runs `call`, expects it to throw `cls`, and checks that nothing reached the upstream. */
  const denied = <E extends APIError>(cls: abstract new (...args: never[]) => E, call: () => Promise<unknown>) => deniedUnforwarded(up, cls, call);
  const chat = (c: OpenAI, model: unknown = 'gpt-4o-mini') =>
    c.chat.completions.create({ model: model as string, messages: [{ role: 'user', content: 'hi' }] });

  test('unknown key: AuthenticationError 401 invalid_api_key', async () => {
    const err = await denied(OpenAI.AuthenticationError, () => chat(client('kw-not-a-real-key-000000000000')));
    assert.equal(err.status, 401);
    assert.equal(err.code, 'invalid_api_key');
    assert.equal(err.type, 'authentication_error');
    assert.equal(err.headers?.get('x-keyward-error'), 'invalid_api_key');
    assert.equal(err.headers?.get('x-should-retry'), 'false');
    // listing routes check the key too
    const list = await denied(OpenAI.AuthenticationError, () => client('kw-not-a-real-key-000000000000').models.list());
    assert.equal(list.code, 'invalid_api_key');
  });

  test('model outside the key scope: PermissionDeniedError 403 model_not_allowed', async () => {
    const err = await denied(OpenAI.PermissionDeniedError, () => chat(client(h.keys.k_scoped!), 'gpt-4o'));
    assert.equal(err.status, 403);
    assert.equal(err.code, 'model_not_allowed');
    assert.equal(err.type, 'permission_error');
  });

  test('rpm 1: the second request is RateLimitError 429 rpm_exceeded with Retry-After', async () => {
    const c = client(h.keys.k_rpm1!);
    await chat(c);
    const err = await denied(OpenAI.RateLimitError, () => chat(c));
    assert.equal(err.status, 429);
    assert.equal(err.code, 'rpm_exceeded');
    assert.equal(err.type, 'rate_limit_error');
    assert.ok(Number(err.headers?.get('retry-after')) >= 1);
    assert.ok(Number(err.headers?.get('retry-after-ms')) >= 1);
  });

  test('empty wallet: APIError 402 insufficient_balance', async () => {
    const err = await denied(OpenAI.APIError, () => chat(client(h.keys.k_broke!)));
    assert.equal(err.status, 402);
    assert.equal(err.code, 'insufficient_balance');
    assert.equal(err.type, 'insufficient_quota');
  });

  test('model that is not a string: BadRequestError 400 invalid_request', async () => {
    const err = await denied(OpenAI.BadRequestError, () => chat(client(h.keys.k_ok!), ['gpt-4o-mini', 'gpt-4o']));
    assert.equal(err.status, 400);
    assert.equal(err.code, 'invalid_request');
    assert.equal(err.type, 'invalid_request_error');
  });

  test('denials are logged with their code and no key material', async () => {
    const line = await waitForLine(h, (l) => l.code === 'model_not_allowed');
    assert.equal(line.status, 403);
    assert.equal(line.key_id, 'k_scoped');
    for (const key of Object.values(h.keys)) assert.ok(!h.logs.some((l) => l.includes(key)));
  });
});

describe('openai@6 against the demo upstream', () => {
  test('models.list, chat (JSON and stream) and files.create parse', async () => {
    const demo = await startDemoUpstream();
    const hd = await startHarness({ upstream: demo.url, keys: { k_demo: {} } });
    try {
      const c = new OpenAI({ apiKey: hd.keys.k_demo!, baseURL: `${hd.url}/v1`, maxRetries: 0, timeout: 5_000 });
      assert.equal((await c.models.list()).data[0]?.id, 'demo-model');
      const done = await c.chat.completions.create({ model: 'demo-model', messages: [{ role: 'user', content: 'hi' }] });
      assert.ok(done.usage && done.usage.completion_tokens > 0);
      const stream = await c.chat.completions.create({ model: 'demo-model', messages: [{ role: 'user', content: 'hi' }], stream: true, stream_options: { include_usage: true } });
      let usage: OpenAI.CompletionUsage | undefined;
      for await (const chunk of stream) if (chunk.usage) usage = chunk.usage;
      assert.equal(usage?.completion_tokens, 8);
      const file = await c.files.create({ file: await toFile(randomBytes(4096), 'x.bin'), purpose: 'assistants' });
      assert.ok(file.bytes > 4096);
    } finally {
      await hd.close();
      await demo.close();
    }
  });
});
