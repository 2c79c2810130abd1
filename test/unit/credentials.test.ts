import { test } from 'node:test';
import assert from 'node:assert/strict';
import { extractCredential, unknownKeyDenial, type CredentialRule, type OtherKey } from '../../src/auth/credentials.js';

const K1 = 'kw_Z8p2QvT7mR4xW1nB6cY3dL9fH5jK0sA2eG8uI4oP7qE_3fK9aB';
const K2 = 'kw_Q1w2E3r4T5y6U7i8O9p0AsDfGhJkLzXcVbNmQwErTyU_9zZ1yY';

type Expect = { key: string; header: 'authorization' | 'x-api-key'; others?: OtherKey[] } | { code: 'missing_api_key' | 'conflicting_api_keys'; msg?: RegExp };

const ROWS: [name: string, rule: CredentialRule, raw: string[], want: Expect][] = [
  // bearer routes
  ['Bearer', 'bearer', ['Authorization', `Bearer ${K1}`], { key: K1, header: 'authorization' }],
  ['lowercase scheme', 'bearer', ['authorization', `bearer ${K1}`], { key: K1, header: 'authorization' }],
  ['uppercase scheme', 'bearer', ['AUTHORIZATION', `BEARER ${K1}`], { key: K1, header: 'authorization' }],
  ['mixed-case header name', 'bearer', ['AuThOrIzAtIoN', `BeArEr ${K1}`], { key: K1, header: 'authorization' }],
  ['extra spaces', 'bearer', ['Authorization', `  Bearer    ${K1}   `], { key: K1, header: 'authorization' }],
  ['tab after scheme', 'bearer', ['Authorization', `Bearer\t${K1}`], { key: K1, header: 'authorization' }],
  ['other headers around', 'bearer', ['Host', 'x', 'Cookie', `key=${K2}`, 'Authorization', `Bearer ${K1}`, 'Accept', '*/*'], { key: K1, header: 'authorization' }],
  ['no headers', 'bearer', [], { code: 'missing_api_key', msg: /Authorization/ }],
  ['empty key', 'bearer', ['Authorization', 'Bearer '], { code: 'missing_api_key' }],
  ['scheme only', 'bearer', ['Authorization', 'Bearer'], { code: 'missing_api_key' }],
  ['spaces only after scheme', 'bearer', ['Authorization', 'Bearer     '], { code: 'missing_api_key' }],
  ['empty header', 'bearer', ['Authorization', ''], { code: 'missing_api_key' }],
  ['Basic scheme', 'bearer', ['Authorization', 'Basic dXNlcjpwYXNz'], { code: 'missing_api_key', msg: /Bearer/ }],
  ['raw key without scheme', 'bearer', ['Authorization', K1], { code: 'missing_api_key', msg: /Bearer/ }],
  ['Bearerkey without separator', 'bearer', ['Authorization', `Bearer${K1}`], { code: 'missing_api_key' }],
  ['x-api-key only', 'bearer', ['x-api-key', K1], { code: 'missing_api_key', msg: /Authorization.*x-api-key/ }],
  ['x-api-key only, upper-case name', 'bearer', ['X-API-KEY', K1], { code: 'missing_api_key', msg: /Authorization.*x-api-key/ }],
  ['cookie is not a credential', 'bearer', ['Cookie', `api_key=${K1}`], { code: 'missing_api_key' }],
  ['Bearer is the key; a different x-api-key is another key, for the lookup', 'bearer', ['x-api-key', K2, 'Authorization', `Bearer ${K1}`], { key: K1, header: 'authorization', others: [{ header: 'x-api-key', value: K2 }] }],
  ['the same key in x-api-key is no other key', 'bearer', ['x-api-key', ` ${K1}`, 'Authorization', `Bearer ${K1}`], { key: K1, header: 'authorization' }],
  ['api-key, x-goog-api-key and x-litellm-api-key (Bearer or not) carry other keys', 'bearer', ['Authorization', `Bearer ${K1}`, 'Api-Key', K2, 'x-goog-api-key', 'AIzaSyExample', 'X-LiteLLM-API-Key', `Bearer ${K2}`, 'x-litellm-api-key', K1], { key: K1, header: 'authorization', others: [{ header: 'api-key', value: K2 }, { header: 'x-goog-api-key', value: 'AIzaSyExample' }, { header: 'x-litellm-api-key', value: K2 }] }],
  ['empty other key headers carry nothing', 'bearer', ['Authorization', `Bearer ${K1}`, 'api-key', ' ', 'x-api-key', ''], { key: K1, header: 'authorization' }],
  ['two Authorization lines', 'bearer', ['Authorization', `Bearer ${K1}`, 'authorization', `Bearer ${K2}`], { code: 'conflicting_api_keys' }],
  ['two identical Authorization lines', 'bearer', ['Authorization', `Bearer ${K1}`, 'Authorization', `Bearer ${K1}`], { code: 'conflicting_api_keys' }],
  ['two Authorization lines, one empty', 'bearer', ['Authorization', '', 'Authorization', `Bearer ${K1}`], { code: 'conflicting_api_keys' }],
  ['two x-api-key lines', 'bearer', ['Authorization', `Bearer ${K1}`, 'x-api-key', K1, 'X-Api-Key', K2], { code: 'conflicting_api_keys' }],
  // messages routes
  ['x-api-key', 'messages', ['x-api-key', K1], { key: K1, header: 'x-api-key' }],
  ['X-Api-Key casing', 'messages', ['X-Api-Key', K1], { key: K1, header: 'x-api-key' }],
  ['x-api-key with spaces', 'messages', ['x-api-key', `  ${K1} `], { key: K1, header: 'x-api-key' }],
  ['Bearer accepted', 'messages', ['Authorization', `Bearer ${K1}`], { key: K1, header: 'authorization' }],
  ['bearer lowercase accepted', 'messages', ['authorization', `bearer ${K1}`], { key: K1, header: 'authorization' }],
  ['both, same key', 'messages', ['Authorization', `Bearer ${K1}`, 'x-api-key', K1], { key: K1, header: 'x-api-key' }],
  ['api-key beside x-api-key is another key, for the lookup', 'messages', ['x-api-key', K1, 'api-key', K2], { key: K1, header: 'x-api-key', others: [{ header: 'api-key', value: K2 }] }],
  ['both, different keys', 'messages', ['x-api-key', K1, 'Authorization', `Bearer ${K2}`], { code: 'conflicting_api_keys', msg: /both.*different keys/i }],
  ['empty x-api-key, Bearer present', 'messages', ['x-api-key', '', 'Authorization', `Bearer ${K1}`], { key: K1, header: 'authorization' }],
  ['neither', 'messages', ['Content-Type', 'application/json'], { code: 'missing_api_key', msg: /x-api-key/ }],
  ['empty x-api-key only', 'messages', ['x-api-key', '   '], { code: 'missing_api_key' }],
  ['x-api-key beside an Authorization of another scheme', 'messages', ['x-api-key', K1, 'Authorization', 'Basic dXNlcjpwYXNz'], { code: 'conflicting_api_keys', msg: /another scheme/ }],
  ['x-api-key beside an empty Bearer', 'messages', ['x-api-key', K1, 'Authorization', 'Bearer '], { key: K1, header: 'x-api-key' }],
  ['a key outside ASCII, read as the UTF-8 its bytes spell', 'bearer', ['Authorization', `Bearer ${Buffer.from('kw-clé-123').toString('latin1')}`], { key: 'kw-clé-123', header: 'authorization' }],
  ['Basic only', 'messages', ['Authorization', 'Basic dXNlcjpwYXNz'], { code: 'missing_api_key' }],
  ['two x-api-key lines', 'messages', ['x-api-key', K1, 'x-api-key', K2], { code: 'conflicting_api_keys' }],
  ['two identical x-api-key lines', 'messages', ['x-api-key', K1, 'X-API-KEY', K1], { code: 'conflicting_api_keys' }],
  ['two Authorization lines', 'messages', ['x-api-key', K1, 'Authorization', `Bearer ${K1}`, 'Authorization', `Bearer ${K1}`], { code: 'conflicting_api_keys' }],
];

for (const [name, rule, raw, want] of ROWS) {
  test(`extractCredential (${rule}): ${name}`, () => {
    const got = extractCredential(raw, rule);
    if ('key' in want) {
      assert.deepEqual(got, { ok: true, key: want.key, header: want.header, others: want.others ?? [] });
      return;
    }
    assert.equal(got.ok, false, JSON.stringify(got));
    if (got.ok) return;
    assert.equal(got.denial.code, want.code);
    if (want.msg) assert.match(got.denial.message, want.msg);
    // a denial never echoes key material
    for (const k of [K1, K2]) {
      for (let n = 8; n <= k.length; n++) assert.ok(!got.denial.message.includes(k.slice(0, n)), `message leaks ${n} chars of a key`);
    }
  });
}

test('conflict between the two headers is described as different keys, not as a duplicate line', () => {
  const got = extractCredential(['x-api-key', K1, 'Authorization', `Bearer ${K2}`], 'messages');
  assert.ok(!got.ok);
  assert.match(got.denial.message, /x-api-key/);
  assert.match(got.denial.message, /Authorization/);
  assert.match(got.denial.message, /different/);
});

test('duplicate header lines are reported as such on both route kinds', () => {
  for (const rule of ['bearer', 'messages'] as const) {
    const a = extractCredential(['Authorization', `Bearer ${K1}`, 'Authorization', `Bearer ${K2}`], rule);
    assert.ok(!a.ok && a.denial.code === 'conflicting_api_keys' && /more than one authorization/i.test(a.denial.message), rule);
    const x = extractCredential(['x-api-key', K1, 'x-api-key', K2], rule);
    assert.ok(!x.ok && x.denial.code === 'conflicting_api_keys' && /more than one x-api-key/i.test(x.denial.message), rule);
  }
});

test('on messages routes an x_api_key line beside a key is a conflict: CGI-style upstreams read it as x-api-key', () => {
  for (const headers of [['x-api-key', K1, 'x_api_key', K2], ['X_API_KEY', K2, 'Authorization', `Bearer ${K1}`]]) {
    const m = extractCredential(headers, 'messages');
    assert.ok(!m.ok && m.denial.code === 'conflicting_api_keys' && /x_api_key/.test(m.denial.message), headers[0]);
  }
  // Bearer routes read Authorization alone; an x_api_key value is another key for the lookup, as x-api-key's is.
  assert.deepEqual(extractCredential(['Authorization', `Bearer ${K1}`, 'x_api_key', K2], 'bearer'), { ok: true, key: K1, header: 'authorization', others: [{ header: 'x_api_key', value: K2 }] });
  assert.deepEqual(extractCredential(['Authorization', `Bearer ${K1}`, 'X_Api_Key', ` ${K1} `], 'bearer'), { ok: true, key: K1, header: 'authorization', others: [] }, 'the same key is no other');
});

test('header names of other lengths or similar spellings are not credentials', () => {
  for (const name of ['Authorization2', 'Proxy-Authorization', 'x-api-keys', 'api-key', 'x_api_key', 'authorizatio']) {
    const b = extractCredential([name, `Bearer ${K1}`], 'bearer');
    const m = extractCredential([name, K1], 'messages');
    assert.ok(!b.ok && b.denial.code === 'missing_api_key', name);
    assert.ok(!m.ok && m.denial.code === 'missing_api_key', name);
  }
});

const PROVIDER: [key: string, marker: string, who: RegExp][] = [
  ['sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcdefghij', 'sk-ant-', /Anthropic/],
  ['sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789_-abcdefghij', 'sk-proj-', /OpenAI/],
  ['sk-svcacct-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789', 'sk-svcacct-', /OpenAI/],
  ['sk-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcdefghij', 'sk-', /OpenAI/],
  ['sk-or-v1-0123456789abcdef0123456789abcdef', 'sk-or-', /OpenRouter/],
  ['AIzaSyA-0123456789abcdefghijklmnopqrstu', 'AIza', /Google/],
  ['gsk_0123456789abcdefghijklmnopqrstuvwxyzABCD', 'gsk_', /Groq/],
  ['xai-0123456789abcdefghijklmnopqrstuvwxyzABCD', 'xai-', /xAI/],
];

for (const [key, marker, who] of PROVIDER) {
  test(`unknownKeyDenial: ${marker}… is called a provider key without echoing it`, () => {
    const msg = unknownKeyDenial(key).message;
    assert.match(msg, /looks like/);
    assert.match(msg, /provider key/i);
    assert.match(msg, who);
    assert.ok(!msg.includes(key));
    for (let n = marker.length + 1; n <= key.length; n++) assert.ok(!msg.includes(key.slice(0, n)), `leaks ${n} chars`);
  });
}

test('unknownKeyDenial: other keys get the plain message, never the key', () => {
  for (const key of [K1, 'my-own-key-1234567', 'sk-short', 'Bearer-ish', 'x'.repeat(300)]) {
    const msg = unknownKeyDenial(key).message;
    assert.match(msg, /^Invalid API key/);
    assert.doesNotMatch(msg, /looks like/);
    for (let n = 4; n <= key.length; n++) assert.ok(!msg.includes(key.slice(0, n)), `${key}: leaks ${n} chars`);
  }
});

test(
  'unknownKeyDenial: OpenAI admin and legacy user keys (sk-admin-, sk-None-) are recognised too',
  () => {
    for (const key of ['sk-admin-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789', 'sk-None-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789']) {
      assert.match(unknownKeyDenial(key).message, /looks like/, key);
    }
  },
);

// Node reads header values as latin1: a client's UTF-8 bytes arrive a character a byte.
const asNodeReadsIt = (s: string) => Buffer.from(s).toString('latin1');

test('extractCredential (bearer): another key outside ASCII is given as the UTF-8 its bytes spell', () => {
  for (const header of ['api-key', 'x-goog-api-key', 'x-api-key', 'x_api_key'] as const) {
    const e = extractCredential(['Authorization', `Bearer ${K1}`, header, asNodeReadsIt('kw-clé-456')], 'bearer');
    assert.deepEqual(e, { ok: true, key: K1, header: 'authorization', others: [{ header, value: 'kw-clé-456' }] }, header);
  }
  const litellm = extractCredential(['Authorization', `Bearer ${K1}`, 'x-litellm-api-key', `Bearer ${asNodeReadsIt('kw-clé-456')}`], 'bearer');
  assert.deepEqual(litellm, { ok: true, key: K1, header: 'authorization', others: [{ header: 'x-litellm-api-key', value: 'kw-clé-456' }] });
});

test('extractCredential (bearer): the same key outside ASCII in another header is no other key', () => {
  const key = asNodeReadsIt('kw-clé-123');
  assert.deepEqual(extractCredential(['Authorization', `Bearer ${key}`, 'api-key', key], 'bearer'), { ok: true, key: 'kw-clé-123', header: 'authorization', others: [] });
});
