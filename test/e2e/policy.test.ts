/**
 * A key's network policy and per-model limits through the official clients (openai@6,
 * @anthropic-ai/sdk@1), a real sidecar and a fake upstream that counts what reached it:
 * - `ips`: the client address is the socket peer, or — only when the peer is a trusted
 *   proxy — the right-most X-Forwarded-For entry that is not itself trusted; outside
 *   the key's ranges it is 403 ip_not_allowed (DESIGN section 4).
 * - browsers: a request with Origin is 403 browser_request_refused under refuseBrowsers,
 *   unless the key has allowBrowser.
 * - modelLimits: `gpt-4o*` at 2 rpm refuses the third gpt-4o-mini call with 429
 *   rpm_exceeded while another model still passes (DESIGN section 6).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { startHarness, type Harness } from '../helpers/sidecar.js';
import { apiLike } from '../helpers/api-like.js';

let up: FakeUpstream;
/** trusts 127.0.0.1 (the test itself) as a proxy in front */
let behindProxy: Harness;
/** trusts nobody: X-Forwarded-For is never believed */
let direct: Harness;

const KEYS = {
  k_office: { ips: ['10.20.0.0/16', '2001:db8::/32'] },
  k_web: { allowBrowser: true },
  k_plain: {},
  k_models: { modelLimits: [{ models: 'gpt-4o*', rpm: 2, tpm: null }] },
};

before(async () => {
  up = await startFakeUpstream(apiLike);
  behindProxy = await startHarness({ upstream: up.url, keys: KEYS, config: { server: { port: 0, trustedProxies: ['127.0.0.1/32'] } } });
  direct = await startHarness({ upstream: up.url, keys: KEYS });
});
after(async () => {
  await behindProxy.close();
  await direct.close();
  await up.close();
});

const openai = (h: Harness, key: string, headers: Record<string, string> = {}) =>
  new OpenAI({ apiKey: h.keys[key]!, baseURL: `${h.url}/v1`, maxRetries: 0, timeout: 10_000, defaultHeaders: headers });
const anthropic = (h: Harness, key: string, headers: Record<string, string> = {}) =>
  new Anthropic({ apiKey: h.keys[key]!, baseURL: h.url, maxRetries: 0, timeout: 10_000, defaultHeaders: { 'keyward-version': '2023-06-01', ...headers } });
const chat = (c: OpenAI, model = 'gpt-4o-mini') => c.chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 5 });
const message = (c: Anthropic) => c.messages.create({ model: 'claude-haiku-4-5', max_tokens: 5, messages: [{ role: 'user', content: 'hi' }] });

/** Runs `call`, which must be refused, and checks that nothing reached the upstream. */
async function refused(call: () => Promise<unknown>): Promise<InstanceType<typeof OpenAI.APIError> | InstanceType<typeof Anthropic.APIError>> {
  const before = up.received.length;
  const err = await call().then(() => assert.fail('expected a refusal'), (e: unknown) => e);
  assert.ok(err instanceof OpenAI.APIError || err instanceof Anthropic.APIError, `expected an API error, got ${String(err)}`);
  assert.equal(up.received.length, before, 'a refused request never reaches the upstream');
  return err;
}

describe('network policy: ips and X-Forwarded-For', () => {
  test('behind a trusted proxy, the forwarded address inside the key\'s ranges passes (IPv4 and IPv6)', async () => {
    const before = up.received.length;
    const r = await chat(openai(behindProxy, 'k_office', { 'x-forwarded-for': '10.20.30.40' }));
    assert.equal(r.choices[0]!.message.content, 'ok');
    const m = await message(anthropic(behindProxy, 'k_office', { 'x-forwarded-for': '2001:db8::7' }));
    assert.equal(m.content[0]!.type, 'text');
    // a chain through another trusted hop: the right-most untrusted entry is the client
    await chat(openai(behindProxy, 'k_office', { 'x-forwarded-for': '10.20.1.1, 127.0.0.1' }));
    assert.equal(up.received.length, before + 3);
    assert.equal(up.received.at(-1)!.headers['x-forwarded-for'], '10.20.1.1, 127.0.0.1', 'forwarded unchanged');
  });

  test('behind a trusted proxy, an address outside the ranges is 403 ip_not_allowed, also when an allowed one is spoofed further left', async () => {
    for (const xff of ['192.168.1.9', '10.20.0.1, 192.168.1.9', '10.21.0.1']) {
      const err = await refused(() => chat(openai(behindProxy, 'k_office', { 'x-forwarded-for': xff })));
      assert.ok(err instanceof OpenAI.PermissionDeniedError, xff);
      assert.equal(err.status, 403);
      assert.equal(err.code, 'ip_not_allowed', xff);
      assert.equal(err.headers.get('x-should-retry'), 'false');
    }
    const err = await refused(() => message(anthropic(behindProxy, 'k_office', { 'x-forwarded-for': '172.16.0.1' })));
    assert.ok(err instanceof Anthropic.PermissionDeniedError);
    assert.equal((err.error as { error: { type: string } }).error.type, 'permission_error');
    assert.equal(err.headers?.get('x-keyward-error'), 'ip_not_allowed');
  });

  test('without a forwarded address the peer (127.0.0.1) is the client: outside the ranges, 403', async () => {
    const err = await refused(() => chat(openai(behindProxy, 'k_office')));
    assert.equal(err.status, 403);
    assert.equal((err as InstanceType<typeof OpenAI.APIError>).code, 'ip_not_allowed');
  });

  test('a sidecar that trusts no proxy ignores X-Forwarded-For: an allowed address there does not help', async () => {
    const err = await refused(() => chat(openai(direct, 'k_office', { 'x-forwarded-for': '10.20.30.40' })));
    assert.equal(err.status, 403);
    assert.equal((err as InstanceType<typeof OpenAI.APIError>).code, 'ip_not_allowed');
    // a key without ranges is not affected by any of this
    assert.equal((await chat(openai(direct, 'k_plain', { 'x-forwarded-for': '10.20.30.40' }))).choices[0]!.message.content, 'ok');
  });
});

describe('browsers', () => {
  test('a request with Origin is 403 browser_request_refused for a key that does not allow browsers (both clients)', async () => {
    const err = await refused(() => chat(openai(direct, 'k_plain', { origin: 'https://app.example' })));
    assert.ok(err instanceof OpenAI.PermissionDeniedError);
    assert.equal(err.code, 'browser_request_refused');
    const m = await refused(() => message(anthropic(direct, 'k_plain', { origin: 'https://app.example' })));
    assert.ok(m instanceof Anthropic.PermissionDeniedError);
    assert.equal(m.headers?.get('x-keyward-error'), 'browser_request_refused');
  });

  test('the same request passes for a key with allowBrowser, Origin forwarded', async () => {
    const r = await chat(openai(direct, 'k_web', { origin: 'https://app.example' }));
    assert.equal(r.choices[0]!.message.content, 'ok');
    assert.equal(up.received.at(-1)!.headers.origin, 'https://app.example');
    const m = await message(anthropic(direct, 'k_web', { origin: 'https://app.example' }));
    assert.equal(m.stop_reason, 'end_turn');
  });

  test('without Origin, the key that does not allow browsers passes (Node fetch\'s own sec-fetch-mode is not a browser)', async () => {
    assert.equal((await chat(openai(direct, 'k_plain'))).choices[0]!.message.content, 'ok');
  });
});

describe('per-model limits', () => {
  test('gpt-4o* at 2 rpm: the third gpt-4o-mini call is 429 rpm_exceeded, gpt-4o shares that limit, another model passes', async () => {
    const c = openai(behindProxy, 'k_models');
    const before = up.received.length;
    await chat(c, 'gpt-4o-mini');
    await chat(c, 'gpt-4o-mini');
    const err = await refused(() => chat(c, 'gpt-4o-mini'));
    assert.ok(err instanceof OpenAI.RateLimitError);
    assert.equal(err.code, 'rpm_exceeded');
    assert.ok(Number(err.headers.get('retry-after')) >= 1);
    assert.ok(Number(err.headers.get('retry-after-ms')) > 0);
    const same = await refused(() => chat(c, 'gpt-4o'));
    assert.equal((same as InstanceType<typeof OpenAI.APIError>).code, 'rpm_exceeded', 'the glob\'s limit covers every model it matches');
    // outside the glob only the key's own limits apply (none here)
    for (let i = 0; i < 3; i++) assert.equal((await chat(c, 'o3-mini')).choices[0]!.message.content, 'ok');
    assert.equal(up.received.length, before + 5);
  });
});
