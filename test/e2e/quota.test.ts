/**
 * What clients see of their quota (DESIGN section 11) through the official openai@6
 * client: the key's own x-ratelimit-* figures on forwarded responses (replacing the
 * upstream's), none for a key without limits, and GET /v1/key answered by keyward with
 * figures that go down as the key is used — never forwarded, never the key or its hash.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { makeKeyHasher } from '../../src/auth/hash.js';
import { startFakeUpstream, type FakeUpstream, type Handler } from '../helpers/upstream.js';
import { startHarness, type Harness } from '../helpers/sidecar.js';

/** An upstream that sends its own rate-limit headers, as provider gateways do. */
const chatWithItsOwnLimits: Handler = (req, res, rec) => {
  const own = { 'x-ratelimit-limit-requests': '10000', 'x-ratelimit-remaining-requests': '9999', 'x-ratelimit-reset-requests': '6ms' };
  if (req.method === 'GET' && req.url === '/v1/models') {
    const list = JSON.stringify({ object: 'list', data: [{ id: 'gpt-4o-mini', object: 'model', created: 1, owned_by: 'upstream' }] });
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(list), ...own });
    return void res.end(list);
  }
  const body = JSON.parse(rec.body.toString('utf8')) as { model: string };
  const text = JSON.stringify({
    id: 'chatcmpl-q', object: 'chat.completion', created: 1, model: body.model,
    choices: [{ index: 0, message: { role: 'assistant', content: 'ok', refusal: null }, finish_reason: 'stop', logprobs: null }],
    usage: { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 },
  });
  res.writeHead(200, {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(text),
    'x-ratelimit-limit-requests': '10000',
    'x-ratelimit-remaining-requests': '9999',
    'x-ratelimit-reset-requests': '6ms',
  });
  res.end(text);
};

let up: FakeUpstream;
let h: Harness;
const client = (key: string) => new OpenAI({ apiKey: key, baseURL: `${h.url}/v1`, maxRetries: 0, timeout: 5_000 });
const ask = (key: string) => client(key).chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }], max_tokens: 50 }).withResponse();
const keyInfo = async (key: string) => {
  const r = await fetch(`${h.url}/v1/key`, { headers: { authorization: `Bearer ${key}` } });
  return { status: r.status, text: await r.text(), headers: r.headers };
};

before(async () => {
  up = await startFakeUpstream(chatWithItsOwnLimits);
  h = await startHarness({
    upstream: up.url,
    keys: {
      k_limited: { rpm: 5, tpm: 10_000, concurrency: 3, models: ['gpt-4o*'] },
      k_free: {},
      k_team: { project: 'p_q', budget: 2, spent: 0.5 },
      k_tpm: { rpm: 100, tpm: 1000 },
      k_conc: { rpm: 100, concurrency: 1 },
    },
    records: [{ type: 'project', id: 'p_q', status: 'enabled', budget: null, spent: 0 }],
  });
});

after(async () => {
  await h.close();
  await up.close();
});

describe('quota headers and GET /v1/key', () => {
  test("the openai client reads the key's own rate-limit figures, not the upstream's", async () => {
    const first = await ask(h.keys.k_limited!);
    const hd = first.response.headers;
    assert.equal(hd.get('x-ratelimit-limit-requests'), '5');
    assert.equal(hd.get('x-ratelimit-remaining-requests'), '4');
    assert.match(hd.get('x-ratelimit-reset-requests') ?? '', /^\d+(\.\d+)?(ms|s)$/);
    assert.equal(hd.get('x-ratelimit-limit-tokens'), '10000');
    const tokensLeft = Number(hd.get('x-ratelimit-remaining-tokens'));
    assert.ok(tokensLeft < 10_000 && tokensLeft > 9_000, `remaining tokens ${tokensLeft}`);
    assert.match(hd.get('x-ratelimit-reset-tokens') ?? '', /^(\d+m)?\d+(\.\d+)?(ms|s)$/);
    const second = await ask(h.keys.k_limited!);
    assert.equal(second.response.headers.get('x-ratelimit-remaining-requests'), '3');
  });

  test("a model listing carries the key's own figures too, and takes nothing from them", async () => {
    const before = JSON.parse((await keyInfo(h.keys.k_limited!)).text) as { remaining: { requests: number } };
    const { data, response } = await client(h.keys.k_limited!).models.list().withResponse();
    assert.deepEqual(data.data.map((m) => m.id), ['gpt-4o-mini']);
    assert.equal(response.headers.get('x-ratelimit-limit-requests'), '5', "the key's RPM, not the upstream's 10000");
    assert.equal(response.headers.get('x-ratelimit-remaining-requests'), String(before.remaining.requests));
    assert.equal(response.headers.get('x-ratelimit-limit-tokens'), '10000');
    const after = JSON.parse((await keyInfo(h.keys.k_limited!)).text) as { remaining: { requests: number } };
    assert.ok(after.remaining.requests >= before.remaining.requests, 'the listing took no request from the bucket');
  });

  test('a key without limits gets no rate-limit headers, and the upstream\'s are not passed on', async () => {
    const r = await ask(h.keys.k_free!);
    assert.equal(r.data.choices[0]!.message.content, 'ok');
    for (const name of ['x-ratelimit-limit-requests', 'x-ratelimit-remaining-requests', 'x-ratelimit-reset-requests', 'x-ratelimit-limit-tokens']) {
      assert.equal(r.response.headers.get(name), null, name);
    }
  });

  test('GET /v1/key shows the figures going down, is never forwarded, and never holds the key or its hash', async () => {
    const key = h.keys.k_limited!;
    const forwarded = up.received.length;
    const before = JSON.parse((await keyInfo(key)).text) as { remaining: { requests: number; tokens: number } };
    await ask(key);
    const info = await keyInfo(key);
    assert.equal(info.status, 200);
    assert.equal(info.headers.get('content-type'), 'application/json');
    const v = JSON.parse(info.text) as Record<string, unknown> & { remaining: { requests: number; tokens: number }; limits: unknown };
    assert.equal(v.id, 'k_limited');
    assert.deepEqual(v.limits, { rpm: 5, tpm: 10_000, concurrency: 3 });
    assert.deepEqual(v.models, ['gpt-4o*']);
    assert.equal(v.remaining.requests, before.remaining.requests - 1);
    assert.ok(v.remaining.tokens < before.remaining.tokens);
    assert.equal(v.budget, null);
    assert.equal(v.balance, 10, 'the personal key shows its wallet');
    assert.equal(up.received.length, forwarded + 1, 'only the chat request reached the upstream');
    assert.ok(!info.text.includes(key));
    assert.ok(!info.text.includes(makeKeyHasher({ hash: 'sha256' })(key)));
  });

  test("GET /v1/key: a team key's budget with what remains", async () => {
    const v = JSON.parse((await keyInfo(h.keys.k_team!)).text) as { budget: Record<string, unknown>; balance: unknown; remaining: unknown };
    assert.deepEqual(v.budget, { limit: 2, spent: 0.5, remaining: 1.5, period: null, resets_at: null });
    assert.equal(v.balance, null);
    assert.deepEqual(v.remaining, { requests: null, tokens: null });
  });

  test("a 429 for the key's TPM carries the key's figures, tokens remaining 0; a concurrency 429 carries none", async () => {
    // 50 output tokens and a small prompt: about 70 of 1000 tokens a request.
    const first = await ask(h.keys.k_tpm!);
    const left = Number(first.response.headers.get('x-ratelimit-remaining-tokens'));
    assert.ok(left > 900 && left < 1000, `remaining tokens ${left}`);
    const big = await client(h.keys.k_tpm!)
      .chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }], max_tokens: 990 })
      .then(() => null, (e: unknown) => e);
    assert.ok(big instanceof OpenAI.RateLimitError, `expected a RateLimitError, got ${String(big)}`);
    const hd = big.headers!;
    assert.equal(hd.get('x-keyward-error'), 'tpm_exceeded');
    assert.deepEqual(
      ['x-ratelimit-limit-tokens', 'x-ratelimit-remaining-tokens', 'x-ratelimit-limit-requests', 'x-ratelimit-remaining-requests'].map((n) => hd.get(n)),
      ['1000', '0', '100', '99'],
      'the refused bucket shows 0; the RPM bucket as it is (the refusal took nothing)',
    );
    assert.match(hd.get('x-ratelimit-reset-tokens') ?? '', /^\d+(\.\d+)?(ms|s)$/);

    // A concurrency refusal says nothing of RPM or TPM: only Retry-After.
    const held = new Promise<void>((resolve) => up.arrivals.once('head', () => resolve()));
    let release = () => {};
    up.setHandler(async (req, res, rec) => {
      await new Promise<void>((r) => (release = r));
      return chatWithItsOwnLimits(req, res, rec);
    });
    const slow = ask(h.keys.k_conc!);
    await held;
    const conc = await fetch(`${h.url}/v1/chat/completions`, {
      method: 'POST', headers: { authorization: `Bearer ${h.keys.k_conc}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o-mini', messages: [] }),
    });
    await conc.arrayBuffer();
    assert.equal(conc.status, 429);
    assert.equal(conc.headers.get('x-keyward-error'), 'concurrency_exceeded');
    assert.ok(Number(conc.headers.get('retry-after')) >= 1);
    assert.equal(conc.headers.get('x-ratelimit-remaining-requests'), null);
    up.setHandler(chatWithItsOwnLimits);
    release();
    assert.equal((await slow).response.status, 200);
  });

  test('GET /v1/key without a key is 401; another method is 404', async () => {
    assert.equal((await fetch(`${h.url}/v1/key`)).status, 401);
    assert.equal((await fetch(`${h.url}/v1/key`, { method: 'POST', headers: { authorization: `Bearer ${h.keys.k_free}` } })).status, 404);
  });
});
