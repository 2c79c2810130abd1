/**
 * The official @anthropic-ai/sdk@1 client through a real sidecar in front of an upstream
 * that answers like the Messages API and records what it received: messages (JSON and
 * SSE), count_tokens, the key sent as x-api-key or as the SDK's default header, the
 * `keyward-version` header forwarded and logged, and denials surfacing as the SDK's
 * error classes without reaching the upstream.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic, { APIError } from '@anthropic-ai/sdk';
import type { FakeUpstream, Handler } from '../helpers/upstream.js';
import { startHarness, waitForLine, type Harness } from '../helpers/sidecar.js';
import { deniedUnforwarded, startSdkBed } from '../helpers/sdk-bed.js';
import { startDemoUpstream } from '../../src/app/demo-upstream.js';

const VERSION = '2023-06-01';

/** Answers the way the Messages API does, from the body the fake upstream already read. */
const messagesLike: Handler = (req, res, rec) => {
  const path = rec.url.split('?')[0]!;
  const json = (status: number, body: unknown) => {
    const text = JSON.stringify(body);
    res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text), 'request-id': 'req_e2e' });
    res.end(text);
  };
  const body = req.method === 'POST' ? (JSON.parse(rec.body.toString('utf8')) as { model: string; stream?: boolean }) : null;
  const input = Math.ceil(rec.body.length / 4);
  if (body && path === '/v1/messages/count_tokens') return json(200, { input_tokens: input });
  if (body && path === '/v1/messages') {
    const message = { id: 'msg_e2e', type: 'message', role: 'assistant', model: body.model, stop_sequence: null };
    if (!body.stream) {
      return json(200, { ...message, content: [{ type: 'text', text: 'Hello there, friend.' }], stop_reason: 'end_turn', usage: { input_tokens: input, output_tokens: 6, cache_creation_input_tokens: 0, cache_read_input_tokens: 0 } });
    }
    res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', 'request-id': 'req_e2e' });
    const ev = (type: string, data: Record<string, unknown>) => res.write(`event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`);
    ev('message_start', { message: { ...message, content: [], stop_reason: null, usage: { input_tokens: input, output_tokens: 1 } } });
    ev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } });
    ev('ping', {});
    for (const text of ['Hello ', 'there, ', 'friend.']) ev('content_block_delta', { index: 0, delta: { type: 'text_delta', text } });
    ev('content_block_stop', { index: 0 });
    ev('message_delta', { delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: 6 } });
    ev('message_stop', {});
    res.end();
    return;
  }
  json(404, { type: 'error', error: { type: 'not_found_error', message: `no ${path} here` } });
};

let up: FakeUpstream;
let h: Harness;
let close: () => Promise<void>;

type Options = NonNullable<ConstructorParameters<typeof Anthropic>[0]>;

/**
 * A client that sends its key as x-api-key. (This SDK sends `apiKey` as Authorization:
 * Bearer; a hand-set X-Api-Key with Authorization nulled is its way to send x-api-key.)
 */
const xApiKeyClient = (key: string, extra: Options = {}) =>
  new Anthropic({
    apiKey: key,
    baseURL: h.url,
    maxRetries: 0,
    timeout: 5_000,
    ...extra,
    defaultHeaders: { 'x-api-key': key, authorization: null, 'keyward-version': VERSION },
  });

/** The SDK out of the box: `apiKey` only. */
const defaultClient = (key: string) =>
  new Anthropic({ apiKey: key, baseURL: h.url, maxRetries: 0, timeout: 5_000, defaultHeaders: { 'keyward-version': VERSION } });

before(async () => {
  ({ up, h, close } = await startSdkBed(messagesLike, ['claude-haiku-*']));
});
after(() => close());

const params = (extra: Partial<Anthropic.MessageCreateParamsNonStreaming> = {}): Anthropic.MessageCreateParamsNonStreaming => ({
  model: 'claude-haiku-4-5',
  max_tokens: 64,
  messages: [{ role: 'user', content: 'Say hello' }],
  ...extra,
});

describe('@anthropic-ai/sdk@1 through keyward', () => {
  test('messages.create, non-streaming, key in x-api-key: headers forwarded, usage and api_version logged', async () => {
    const before = up.received.length;
    const { data, response } = await xApiKeyClient(h.keys.k_ok!)
      .messages.create(params(), { headers: { 'x-request-id': 'e2e-msg-json' } })
      .withResponse();
    assert.equal(response.status, 200);
    assert.equal(data.content[0]?.type, 'text');
    assert.equal((data.content[0] as Anthropic.TextBlock).text, 'Hello there, friend.');
    assert.equal(up.received.length, before + 1);
    const rec = up.received.at(-1)!;
    assert.equal(rec.method, 'POST');
    assert.equal(rec.url, '/v1/messages');
    assert.equal(rec.headers['x-api-key'], h.keys.k_ok);
    assert.equal(rec.headers.authorization, undefined);
    assert.equal(rec.headers['keyward-version'], VERSION, 'keyward-version forwarded unchanged');
    assert.equal(typeof rec.headers['anthropic-version'], 'string', "the SDK's own anthropic-version forwarded too");
    const sent = JSON.parse(rec.body.toString('utf8')) as Record<string, unknown>;
    assert.equal(sent.model, 'claude-haiku-4-5');
    assert.equal(sent.max_tokens, 64);
    const line = await waitForLine(h, (l) => l.req_id === 'e2e-msg-json');
    assert.equal(line.status, 200);
    assert.equal(line.route, 'messages');
    assert.equal(line.key_id, 'k_ok');
    assert.equal(line.api_version, VERSION);
    assert.equal(line.input_tokens, data.usage.input_tokens);
    assert.equal(line.output_tokens, data.usage.output_tokens);
  });

  test('messages.create, streaming: events in order, usage from the stream in the access log', async () => {
    const stream = await xApiKeyClient(h.keys.k_ok!).messages.create(
      { ...params(), stream: true },
      { headers: { 'x-request-id': 'e2e-msg-sse' } },
    );
    const types: string[] = [];
    let text = '';
    let input = -1;
    let output = -1;
    for await (const ev of stream) {
      types.push(ev.type);
      if (ev.type === 'message_start') input = ev.message.usage.input_tokens;
      if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') text += ev.delta.text;
      if (ev.type === 'message_delta') output = ev.usage.output_tokens;
    }
    assert.equal(text, 'Hello there, friend.');
    assert.equal(types[0], 'message_start');
    assert.equal(types.at(-1), 'message_stop');
    const rec = up.received.at(-1)!;
    assert.equal((JSON.parse(rec.body.toString('utf8')) as { stream: boolean }).stream, true);
    assert.equal(rec.headers['keyward-version'], VERSION);
    const line = await waitForLine(h, (l) => l.req_id === 'e2e-msg-sse');
    assert.equal(line.status, 200);
    assert.equal(line.api_version, VERSION);
    assert.equal(line.input_tokens, input);
    assert.equal(line.output_tokens, output);
  });

  test('messages.stream helper: finalMessage carries the streamed usage', async () => {
    const final = await xApiKeyClient(h.keys.k_ok!).messages.stream(params(), { headers: { 'x-request-id': 'e2e-msg-helper' } }).finalMessage();
    assert.equal((final.content[0] as Anthropic.TextBlock).text, 'Hello there, friend.');
    const line = await waitForLine(h, (l) => l.req_id === 'e2e-msg-helper');
    assert.equal(line.output_tokens, final.usage.output_tokens);
    assert.equal(line.input_tokens, final.usage.input_tokens);
  });

  test('messages.countTokens: forwarded, logged, never charged as usage', async () => {
    const counted = await xApiKeyClient(h.keys.k_ok!).messages.countTokens(
      { model: 'claude-haiku-4-5', messages: [{ role: 'user', content: 'Count me' }] },
      { headers: { 'x-request-id': 'e2e-count' } },
    );
    assert.ok(counted.input_tokens > 0);
    const rec = up.received.at(-1)!;
    assert.equal(rec.url, '/v1/messages/count_tokens');
    assert.equal(rec.headers['x-api-key'], h.keys.k_ok);
    assert.equal(rec.headers['keyward-version'], VERSION);
    const line = await waitForLine(h, (l) => l.req_id === 'e2e-count');
    assert.equal(line.status, 200);
    assert.equal(line.route, 'messages.count_tokens');
    assert.equal(line.api_version, VERSION);
    assert.equal(h.usage.find((u) => u.request_id === 'e2e-count'), undefined, 'no usage event for count_tokens');
  });

  test("the SDK's default credential header (apiKey) is accepted too", async () => {
    const msg = await defaultClient(h.keys.k_ok!).messages.create(params(), { headers: { 'x-request-id': 'e2e-msg-default' } });
    assert.equal(msg.type, 'message');
    const rec = up.received.at(-1)!;
    // Whichever header this SDK version puts the key in, it arrives unchanged.
    const carried = rec.headers['x-api-key'] ?? rec.headers.authorization?.replace(/^Bearer /, '');
    assert.equal(carried, h.keys.k_ok);
    assert.equal(rec.headers['keyward-version'], VERSION);
    const line = await waitForLine(h, (l) => l.req_id === 'e2e-msg-default');
    assert.equal(line.key_id, 'k_ok');
  });

  test('the upstream sees the same headers as when the SDK talks to it directly', async () => {
    const direct = new Anthropic({ apiKey: h.keys.k_ok!, baseURL: up.url, maxRetries: 0, timeout: 5_000, defaultHeaders: { 'keyward-version': VERSION } });
    await direct.messages.create(params(), { headers: { 'x-request-id': 'e2e-same' } });
    const straight = up.received.at(-1)!;
    await defaultClient(h.keys.k_ok!).messages.create(params(), { headers: { 'x-request-id': 'e2e-same' } });
    const proxied = up.received.at(-1)!;
    const strip = (headers: Record<string, unknown>) => {
      const { host: _host, connection: _connection, ...rest } = headers;
      return rest;
    };
    assert.deepEqual(strip(proxied.headers), strip(straight.headers));
    assert.equal(proxied.headers['anthropic-version'], straight.headers['anthropic-version']);
    assert.equal(proxied.sha256, straight.sha256);
  });
});

describe('@anthropic-ai/sdk@1: denials surface as the SDK error classes and are never forwarded', () => {
  /** Runs `call`, expects it to throw `cls`, and checks that nothing reached the upstream. */
  const denied = <E extends APIError>(cls: abstract new (...args: never[]) => E, call: () => Promise<unknown>) => deniedUnforwarded(up, cls, call);
  /** The messages-style error body: {"type":"error","error":{"type":…,"message":…}} */
  const bodyType = (err: APIError) => (err.error as { type?: string; error?: { type?: string } } | undefined);

  test('unknown key: AuthenticationError 401 authentication_error', async () => {
    const err = await denied(Anthropic.AuthenticationError, () => xApiKeyClient('kw-not-a-real-key-000000000000').messages.create(params()));
    assert.equal(err.status, 401);
    assert.equal(bodyType(err)?.type, 'error');
    assert.equal(bodyType(err)?.error?.type, 'authentication_error');
    assert.equal(err.headers?.get('x-keyward-error'), 'invalid_api_key');
    assert.equal(err.headers?.get('x-should-retry'), 'false');
    const count = await denied(Anthropic.AuthenticationError, () =>
      xApiKeyClient('kw-not-a-real-key-000000000000').messages.countTokens({ model: 'claude-haiku-4-5', messages: [{ role: 'user', content: 'x' }] }),
    );
    assert.equal(count.status, 401);
  });

  test('x-api-key and Authorization with different keys: AuthenticationError 401 conflicting_api_keys', async () => {
    const c = new Anthropic({
      apiKey: h.keys.k_ok!, baseURL: h.url, maxRetries: 0, timeout: 5_000,
      defaultHeaders: { 'x-api-key': h.keys.k_scoped!, authorization: `Bearer ${h.keys.k_ok}`, 'keyward-version': VERSION },
    });
    const err = await denied(Anthropic.AuthenticationError, () => c.messages.create(params()));
    assert.equal(err.headers?.get('x-keyward-error'), 'conflicting_api_keys');
  });

  test('model outside the key scope: PermissionDeniedError 403 permission_error', async () => {
    const err = await denied(Anthropic.PermissionDeniedError, () => xApiKeyClient(h.keys.k_scoped!).messages.create(params({ model: 'claude-opus-4-1' })));
    assert.equal(err.status, 403);
    assert.equal(bodyType(err)?.error?.type, 'permission_error');
    assert.equal(err.headers?.get('x-keyward-error'), 'model_not_allowed');
  });

  test('rpm 1: the second request is RateLimitError 429 rate_limit_error with Retry-After', async () => {
    const c = xApiKeyClient(h.keys.k_rpm1!);
    await c.messages.create(params());
    const err = await denied(Anthropic.RateLimitError, () => c.messages.create(params()));
    assert.equal(err.status, 429);
    assert.equal(bodyType(err)?.error?.type, 'rate_limit_error');
    assert.equal(err.headers?.get('x-keyward-error'), 'rpm_exceeded');
    assert.ok(Number(err.headers?.get('retry-after')) >= 1);
  });

  test('empty wallet: status 402 billing_error', async () => {
    // this SDK version has a class of its own for 402
    const err = await denied(Anthropic.PaymentRequiredError, () => xApiKeyClient(h.keys.k_broke!).messages.create(params()));
    assert.equal(err.status, 402);
    assert.equal(bodyType(err)?.error?.type, 'billing_error');
    assert.equal(err.headers?.get('x-keyward-error'), 'insufficient_balance');
  });

  test('streaming request denied before the stream starts: the error is thrown, not streamed', async () => {
    const err = await denied(Anthropic.PermissionDeniedError, async () => {
      const s = await xApiKeyClient(h.keys.k_scoped!).messages.create({ ...params({ model: 'claude-opus-4-1' }), stream: true });
      for await (const _ of s) void _;
    });
    assert.equal(err.status, 403);
  });
});

describe('@anthropic-ai/sdk@1 against the demo upstream', () => {
  test('messages.vendor names the version header (DESIGN section 2): `anthropic` reads the SDK\'s own anthropic-version, not keyward-version', async () => {
    const hv = await startHarness({ upstream: up.url, keys: { k_v: {} }, config: { messages: { vendor: 'anthropic' } } });
    try {
      const c = new Anthropic({ apiKey: hv.keys.k_v!, baseURL: hv.url, maxRetries: 0, timeout: 5_000, defaultHeaders: { 'keyward-version': '1999-01-01' } });
      const { response } = await c.messages.create(params(), { headers: { 'x-request-id': 'e2e-vendor' } }).withResponse();
      assert.equal(response.status, 200);
      const rec = up.received.at(-1)!;
      const sdkVersion = rec.headers['anthropic-version'];
      assert.equal(typeof sdkVersion, 'string');
      assert.equal(rec.headers['keyward-version'], '1999-01-01', 'forwarded unchanged all the same');
      const line = await waitForLine(hv, (l) => l.req_id === 'e2e-vendor');
      assert.equal(line.api_version, sdkVersion);
    } finally {
      await hv.close();
    }
  });

  test('messages.create JSON and stream, and countTokens parse', async () => {
    const demo = await startDemoUpstream();
    const hd = await startHarness({ upstream: demo.url, keys: { k_demo: {} } });
    try {
      const c = new Anthropic({
        apiKey: hd.keys.k_demo!, baseURL: hd.url, maxRetries: 0, timeout: 5_000,
        defaultHeaders: { 'x-api-key': hd.keys.k_demo!, authorization: null, 'keyward-version': VERSION },
      });
      const msg = await c.messages.create(params({ model: 'demo-model' }));
      assert.equal(msg.content[0]?.type, 'text');
      const final = await c.messages.stream(params({ model: 'demo-model' })).finalMessage();
      assert.equal(final.usage.output_tokens, 8);
      const counted = await c.messages.countTokens({ model: 'demo-model', messages: [{ role: 'user', content: 'x' }] });
      assert.ok(counted.input_tokens > 0);
    } finally {
      await hd.close();
      await demo.close();
    }
  });
});
