/**
 * Bad input and every denial, through a real sidecar: the documented status, code,
 * body style and headers, and nothing forwarded.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { FakeUpstream } from '../helpers/upstream.js';
import { startBehindUpstream, startHarness, waitForLine, type Harness } from '../helpers/sidecar.js';
import { bearer, send, type RawRequest } from '../helpers/http.js';

let up: FakeUpstream;
let h: Harness;
let close: () => Promise<void>;

before(async () => {
  ({ up, h, close } = await startBehindUpstream({
    config: { server: { port: 0, maxJsonBodyBytes: 4096 } },
    records: [
      { type: 'wallet', user: 'u_broke', balance: 0 },
      { type: 'project', id: 'p_on', status: 'enabled', budget: 100, spent: 10 },
      { type: 'project', id: 'p_off', status: 'disabled', budget: null, spent: 0 },
      { type: 'project', id: 'p_spent', status: 'enabled', budget: 50, spent: 50 },
    ],
    keys: {
      k_ok: {},
      k_deleted: { status: 'deleted' },
      k_broke: { user: 'u_broke' },
      k_team: { project: 'p_on', budget: 5, spent: 1, models: ['gpt-4o*', 'claude-*'] },
      k_team_spent: { project: 'p_on', budget: 5, spent: 5 },
      k_off: { project: 'p_off' },
      k_proj_spent: { project: 'p_spent' },
    },
  }));
});
after(() => close());

const chat = (key: string | null, body: unknown = { model: 'gpt-4o', messages: [] }, extra: Record<string, string> = {}): RawRequest => ({
  method: 'POST',
  path: '/v1/chat/completions',
  headers: { ...(key ? bearer(key) : {}), 'content-type': 'application/json', ...extra },
  body: typeof body === 'string' ? body : JSON.stringify(body),
});

const messages = (headers: Record<string, string | string[]>, body: unknown = { model: 'claude-3-5-sonnet', max_tokens: 5, messages: [] }): RawRequest => ({
  method: 'POST',
  path: '/v1/messages',
  headers: { 'content-type': 'application/json', ...headers },
  body: JSON.stringify(body),
});

interface Case {
  name: string;
  req: () => RawRequest;
  status: number;
  code: string;
  style?: 'openai' | 'messages';
  message?: RegExp;
}

const K = (id: string) => h.keys[id]!;

const cases: Case[] = [
  { name: 'unknown path', req: () => ({ path: '/v2/models', headers: bearer(K('k_ok')) }), status: 404, code: 'not_found' },
  { name: 'dot segment', req: () => ({ path: '/v1/files/../models', headers: bearer(K('k_ok')) }), status: 400, code: 'invalid_path' },
  { name: 'encoded dot', req: () => ({ path: '/v1/files/%2e%2e/models', headers: bearer(K('k_ok')) }), status: 400, code: 'invalid_path' },
  { name: 'encoded slash', req: () => ({ path: '/v1/files/a%2Fb', headers: bearer(K('k_ok')) }), status: 400, code: 'invalid_path' },
  { name: 'backslash', req: () => ({ path: '/v1/files\\x', headers: bearer(K('k_ok')) }), status: 400, code: 'invalid_path' },
  { name: 'double-encoded dots', req: () => ({ path: '/v1/models/%252e%252e/files', headers: bearer(K('k_ok')) }), status: 400, code: 'invalid_path', message: /%25/ },
  { name: 'a path parameter after dots', req: () => ({ path: '/v1/models/..;/files', headers: bearer(K('k_ok')) }), status: 400, code: 'invalid_path', message: /semicolon/ },
  { name: 'a fragment, which the forwarded path would lose', req: () => ({ path: '/v1/files/abc#/content', headers: bearer(K('k_ok')) }), status: 400, code: 'invalid_path', message: /cut or re-encode/ },
  { name: 'braces, which the forwarded path would re-encode', req: () => ({ path: '/v1/files/a{b}', headers: bearer(K('k_ok')) }), status: 400, code: 'invalid_path' },
  { name: 'absolute-form target', req: () => ({ path: 'http://example.test/v1/models', headers: bearer(K('k_ok')) }), status: 400, code: 'invalid_path' },
  { name: 'missing key', req: () => chat(null), status: 401, code: 'missing_api_key' },
  { name: 'empty bearer', req: () => chat(null, undefined, { authorization: 'Bearer ' }), status: 401, code: 'missing_api_key' },
  { name: 'key in the query string', req: () => ({ path: `/v1/models?api_key=${K('k_ok')}` }), status: 401, code: 'missing_api_key' },
  { name: 'key in a cookie', req: () => ({ path: '/v1/models', headers: { cookie: `api_key=${K('k_ok')}` } }), status: 401, code: 'missing_api_key' },
  { name: 'x-api-key on a bearer route', req: () => ({ path: '/v1/models', headers: { 'x-api-key': K('k_ok') } }), status: 401, code: 'missing_api_key', message: /Authorization/ },
  { name: 'two Authorization lines', req: () => ({ path: '/v1/models', headers: { authorization: [`Bearer ${K('k_ok')}`, `Bearer ${K('k_team')}`] } }), status: 401, code: 'conflicting_api_keys' },
  { name: 'two x-api-key lines', req: () => messages({ 'x-api-key': [K('k_ok'), K('k_ok')] }), status: 401, code: 'conflicting_api_keys', style: 'messages' },
  { name: 'x-api-key and an x_api_key line (one name to CGI-style upstreams)', req: () => messages({ 'x-api-key': K('k_ok'), x_api_key: K('k_team') }), status: 401, code: 'conflicting_api_keys', style: 'messages' },
  { name: 'x-api-key and Bearer differ', req: () => messages({ 'x-api-key': K('k_ok'), authorization: `Bearer ${K('k_team')}` }), status: 401, code: 'conflicting_api_keys', style: 'messages', message: /different keys/ },
  // an upstream gateway that reads api-key (Azure-style), x-goog-api-key or its own header would act on a key never checked
  { name: 'another known key in api-key', req: () => messages({ 'x-api-key': K('k_ok'), 'api-key': K('k_team') }), status: 401, code: 'conflicting_api_keys', style: 'messages', message: /api-key header/ },
  { name: 'another known key in x-api-key on a bearer route', req: () => chat(K('k_ok'), undefined, { 'x-api-key': K('k_team') }), status: 401, code: 'conflicting_api_keys', message: /x-api-key header/ },
  { name: 'another known key in x_api_key on a bearer route (x-api-key to CGI-style upstreams)', req: () => chat(K('k_ok'), undefined, { x_api_key: K('k_team') }), status: 401, code: 'conflicting_api_keys', message: /x_api_key header/ },
  { name: 'unknown key', req: () => chat('kw_nope'), status: 401, code: 'invalid_api_key' },
  { name: 'provider-looking key', req: () => chat('sk-ant-api03-abcdefghijklmnop'), status: 401, code: 'invalid_api_key', message: /Anthropic/ },
  { name: 'deleted key', req: () => chat(K('k_deleted')), status: 401, code: 'api_key_deleted' },
  { name: 'personal key, empty wallet', req: () => chat(K('k_broke')), status: 402, code: 'insufficient_balance' },
  { name: 'team key, disabled project', req: () => chat(K('k_off')), status: 402, code: 'project_disabled' },
  { name: 'team key, disabled project, files', req: () => ({ path: '/v1/files', headers: bearer(K('k_off')) }), status: 403, code: 'project_disabled' },
  { name: 'team key budget spent', req: () => chat(K('k_team_spent')), status: 402, code: 'key_budget_exhausted' },
  { name: 'project budget spent', req: () => chat(K('k_proj_spent')), status: 402, code: 'project_budget_exhausted' },
  { name: 'invalid JSON', req: () => chat(K('k_ok'), '{"model": "gpt-4o",'), status: 400, code: 'invalid_request' },
  { name: 'duplicated model', req: () => chat(K('k_ok'), '{"model":"gpt-4o","model":"o1"}'), status: 400, code: 'invalid_request', message: /more than once/ },
  { name: 'non-string model', req: () => chat(K('k_ok'), { model: ['gpt-4o'] }), status: 400, code: 'invalid_request' },
  { name: 'missing model', req: () => chat(K('k_ok'), { messages: [] }), status: 400, code: 'invalid_request' },
  { name: 'oversized body', req: () => chat(K('k_ok'), { model: 'gpt-4o', pad: 'x'.repeat(5000) }), status: 413, code: 'body_too_large' },
  { name: 'model outside the scope', req: () => chat(K('k_team'), { model: 'o1' }), status: 403, code: 'model_not_allowed' },
  // a request without a body selects no model: past a scoped key only on a stored response
  { name: 'bodiless image request, scoped key', req: () => ({ method: 'POST', path: '/v1/images/generations', headers: { ...bearer(K('k_team')), 'content-length': '0' } }), status: 403, code: 'model_not_allowed' },
  { name: 'bodiless audio request, scoped key', req: () => ({ method: 'POST', path: '/v1/audio/speech', headers: bearer(K('k_team')) }), status: 403, code: 'model_not_allowed' },
  { name: 'GET on a model-required route', req: () => ({ method: 'GET', path: '/v1/chat/completions', headers: bearer(K('k_ok')) }), status: 400, code: 'invalid_request', message: /model/ },
  { name: 'DELETE on a model-required route', req: () => ({ method: 'DELETE', path: '/v1/embeddings', headers: bearer(K('k_team')) }), status: 400, code: 'invalid_request' },
  { name: 'messages route, messages style', req: () => messages({ 'x-api-key': 'kw_nope' }), status: 401, code: 'invalid_api_key', style: 'messages' },
  { name: 'count_tokens, budget spent', req: () => ({ ...messages({ 'x-api-key': K('k_team_spent') }), path: '/v1/messages/count_tokens' }), status: 402, code: 'key_budget_exhausted', style: 'messages' },
];

describe('denials', () => {
  for (const c of cases) {
    test(`${c.name}: ${c.status} ${c.code}`, async () => {
      const before = up.received.length;
      const res = await send(h.url, c.req());
      assert.equal(res.status, c.status);
      assert.equal(res.headers['x-keyward-error'], c.code);
      assert.match(String(res.headers['content-type']), /^application\/json/);
      const body = res.json<Record<string, any>>();
      if ((c.style ?? 'openai') === 'messages') {
        assert.equal(body.type, 'error');
        assert.equal(typeof body.error.type, 'string');
        if (c.message) assert.match(body.error.message, c.message);
      } else {
        assert.equal(body.error.code, c.code);
        if (c.message) assert.match(body.error.message, c.message);
      }
      if ([401, 402, 403].includes(c.status)) assert.equal(res.headers['x-should-retry'], 'false');
      for (const key of Object.values(h.keys)) assert.ok(!res.body.toString().includes(key), 'the body leaked a key');
      assert.equal(up.received.length, before, 'a denied request reached the upstream');
    });
  }

  test('an absolute-form target with a key in its user-info: 400, and its access line keeps no key, query or fragment', async () => {
    const key = K('k_ok');
    const line = waitForLine(h, (l) => l.msg === 'request' && l.code === 'invalid_path' && String(l.path).startsWith('http:'));
    const res = await send(h.url, { path: `http://user:${key}@example.test/v1/models?api_key=${key}#${key}`, headers: bearer(key) });
    assert.equal(res.status, 400);
    const logged = await line;
    assert.equal(logged.path, 'http://example.test/v1/models');
    assert.ok(!JSON.stringify(logged).includes(key), 'the access line holds the key');
  });

  test('lowercase bearer scheme is accepted; listing needs only a known key', async () => {
    const res = await send(h.url, { path: '/v1/models', headers: { authorization: `bearer ${K('k_broke')}` } });
    assert.equal(res.status, 200);
  });

  test('x-api-key and Bearer with the same key are accepted on messages', async () => {
    const res = await send(h.url, messages({ 'x-api-key': K('k_team'), authorization: `Bearer ${K('k_team')}` }));
    assert.equal(res.status, 200);
  });
});

describe('readiness', () => {
  test('a sidecar whose replica never synced answers 503 not_ready and /readyz 503', async () => {
    const empty = await startHarness({ upstream: up.url, keys: { k: {} }, empty: true });
    try {
      const res = await send(empty.url, { path: '/v1/models', headers: bearer(empty.keys.k!) });
      assert.equal(res.status, 503);
      assert.equal(res.headers['x-keyward-error'], 'not_ready');
      const admin = `http://127.0.0.1:${empty.sidecar.adminPort}`;
      assert.equal((await send(admin, { path: '/readyz' })).status, 503);
      assert.equal((await send(admin, { path: '/healthz' })).status, 200);
      empty.replica.applySnapshot({ version: 3, records: [], source: 'test' });
      assert.equal((await send(admin, { path: '/readyz' })).status, 200);
    } finally {
      await empty.close();
    }
  });
});

describe('key format and peppered hashes', () => {
  test('keys.format keyward refuses a mistyped key without a lookup; hmac-sha256 with a pepper authenticates', async () => {
    const hk = await startHarness({
      upstream: up.url,
      config: { keys: { format: 'keyward', hash: 'hmac-sha256', pepper: 'pepper-0123456789abcdef' } },
      keys: { k_ok: {}, k_odd: { secret: 'legacy-key-of-another-shape' } },
    });
    try {
      const ok = hk.keys.k_ok!;
      assert.equal((await send(hk.url, { path: '/v1/models', headers: bearer(ok) })).status, 200);
      // one character changed: the checksum fails, so no lookup happens at all
      const typo = ok.slice(0, 10) + (ok[10] === 'a' ? 'b' : 'a') + ok.slice(11);
      const res = await send(hk.url, { path: '/v1/models', headers: bearer(typo) });
      assert.equal(res.status, 401);
      assert.equal(res.headers['x-keyward-error'], 'invalid_api_key');
      // a key of another shape is refused even though the replica knows its hash
      assert.equal((await send(hk.url, { path: '/v1/models', headers: bearer('legacy-key-of-another-shape') })).status, 401);
    } finally {
      await hk.close();
    }
  });
});

describe('requests without a body on model routes', () => {
  test('a call on a stored response passes a scoped key and reaches the upstream as sent', async () => {
    const before = up.received.length;
    const res = await send(h.url, { method: 'GET', path: '/v1/responses/resp_1', headers: bearer(K('k_team')) });
    assert.equal(res.status, 200);
    assert.equal(up.received.length, before + 1);
    assert.equal(up.received.at(-1)!.url, '/v1/responses/resp_1');
  });

  test('an empty chunked body is no body: a cancel passes a scoped key as with Content-Length: 0', async () => {
    for (const framing of [{ 'content-length': '0' }, { 'transfer-encoding': 'chunked' }]) {
      const before = up.received.length;
      const res = await send(h.url, { method: 'POST', path: '/v1/responses/resp_1/cancel', headers: { ...bearer(K('k_team')), ...framing }, body: '' });
      assert.equal(res.status, 200, `${JSON.stringify(framing)}: ${res.headers['x-keyward-error']}`);
      assert.equal(up.received.length, before + 1);
      assert.equal(up.received.at(-1)!.body.length, 0);
    }
  });
});
