/**
 * DESIGN section 4: no key and no prefix of a key reaches a log line. A client that puts
 * its own key (or another it carries) into a field it chooses (its request id, the path,
 * the model, attribution headers) gets that field written as `[redacted]`; an attribution
 * URL loses its user-info; a request id holding the key is replaced by one the sidecar makes.
 * The usage event sent to the console names the model as the access line does.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { startHarness, waitForLine, type Harness } from '../helpers/sidecar.js';
import { send } from '../helpers/http.js';
import { keyless, keyPrefixes, withoutUserInfo } from '../../src/proxy/key-in-fields.js';
import { generateKey } from '../../src/auth/keyformat.js';

let up: FakeUpstream;
let h: Harness;
const SECRET = 'sk-kwtest-TEAMSECRET0123456789';
const SCOPED = 'sk-kwtest-SCOPEDKEY987654321';

before(async () => {
  up = await startFakeUpstream();
  h = await startHarness({ upstream: up.url, keys: { k_team: { secret: SECRET }, k_scoped: { secret: SCOPED, models: ['gpt-4o*'] } } });
});
after(async () => {
  await h.close();
  await up.close();
});

test('the presented key in the request id, model, path and attribution is not logged', async () => {
  const line = waitForLine(h, (l) => l.key_id === 'k_team' && l.route === 'chat.completions');
  const res = await send(h.url, {
    method: 'POST',
    path: `/v1/chat/completions`,
    headers: {
      authorization: `Bearer ${SECRET}`, 'content-type': 'application/json',
      'x-request-id': SECRET, 'x-app-name': `tool ${SECRET.slice(0, 12)}`, 'x-app-url': `https://u:${SECRET}@apps.example/x`,
    },
    body: JSON.stringify({ model: SECRET, messages: [] }),
  });
  assert.equal(res.status, 200, 'forwarded: the model name is the client\'s business');
  assert.match(String(res.headers['x-request-id']), /^[0-9a-f-]{36}$/, 'a request id of the sidecar\'s own');
  const l = await line;
  assert.deepEqual([l.model, l.app_name, l.app_url], ['[redacted]', '[redacted]', 'https://apps.example/x'], 'the URL lost its user-info, and the key with it');
  assert.equal(l.req_id, res.headers['x-request-id']);
  const event = h.usage.find((e) => e.request_id === l.req_id);
  assert.equal(event?.model, '[redacted]', 'the usage event the console keeps and shows');
  const listed = waitForLine(h, (x) => x.route === 'models' && x.path !== '/v1/models');
  await send(h.url, { path: `/v1/models/${SECRET}`, headers: { authorization: `Bearer ${SECRET}` } });
  assert.equal((await listed).path, '[redacted]');
  const notFound = waitForLine(h, (x) => x.status === 404 && x.code === 'not_found');
  assert.equal((await send(h.url, { path: `/v2/${SECRET}`, headers: { authorization: `Bearer ${SECRET}` } })).status, 404);
  assert.equal((await notFound).path, '[redacted]');
  const all = h.logs.join('\n');
  assert.ok(!all.includes(SECRET.slice(0, 8)), 'no prefix of the key in any log line');
});

test('attribution without the key is logged as sent, its URL without user-info', async () => {
  const line = waitForLine(h, (l) => l.app_name === 'my tool');
  const res = await send(h.url, { path: '/v1/models', headers: { authorization: `Bearer ${SECRET}`, 'x-request-id': 'trace-42', 'x-app-name': 'my tool', 'x-app-url': 'https://ops:hunter2@apps.example/x?q=1' } });
  assert.equal(res.status, 200);
  const l = await line;
  assert.deepEqual([l.req_id, l.app_url, l.path], ['trace-42', 'https://apps.example/x?q=1', '/v1/models']);
});

test('the parts: the keys of both credential headers, their first 8 characters; user-info', () => {
  const keys = keyPrefixes(['Authorization', 'Bearer sk-abcdefghij', 'X-Api-Key', ' sk-ant-api03-zz ', 'Cookie', 'api_key=x']);
  assert.deepEqual(keys, ['sk-abcde', 'sk-ant-a']);
  assert.equal(keyless('gpt-4o', keys), 'gpt-4o');
  assert.equal(keyless('x sk-ant-a y', keys), '[redacted]');
  assert.equal(keyless(null, keys), null);
  assert.deepEqual(keyPrefixes(['authorization', 'Basic dXNlcg==', 'host', 'h']), ['dXNlcg=='], 'a Basic user name of 4 characters is not taken for a key');
  assert.equal(withoutUserInfo('http://a:b@h:8080/p@q'), 'http://h:8080/p@q');
  assert.equal(withoutUserInfo('mailto:ops@example.com'), 'mailto:ops@example.com');
});

test('a key sent the wrong way is still hidden: any Authorization scheme, Basic decoded, other vendors\' key headers', () => {
  const key = 'sk-abcdefghijkl';
  const basic = Buffer.from(`apikey:${key}`).toString('base64');
  assert.deepEqual(keyPrefixes(['Authorization', key]), ['sk-abcde'], 'no scheme: the value is the key');
  assert.deepEqual(keyPrefixes(['Authorization', `Basic ${key}`]), ['sk-abcde'], 'a key where Basic\'s base64 belongs');
  assert.deepEqual(keyPrefixes(['Proxy-Authorization', `Basic ${basic}`]), [basic.slice(0, 8), basic.slice(8, 16), 'sk-abcde'], 'Basic decoded: the password (the user name is too short)');
  assert.deepEqual(keyPrefixes(['Authorization', `Token ${key}`, 'api-key', key, 'X-Goog-Api-Key', key]), ['sk-abcde', 'sk-abcde', 'sk-abcde']);
  assert.deepEqual(keyPrefixes(['Content-Type', 'application/json', 'Accept', '*/*']), []);
});

test('text shaped like a console key is hidden whether or not the request carries it', () => {
  const key = generateKey();
  assert.equal(keyless(`/v1/models/${key}`, []), '[redacted]');
  assert.equal(keyless(`x ${key.slice(0, 8)}`, []), '[redacted]', 'its first 8 characters');
  assert.equal(keyless('kw_', []), 'kw_', 'the prefix alone is not a key');
  assert.equal(keyless('gpt-4o', []), 'gpt-4o');
});

test('a key written without its first characters, or percent-encoded, is hidden as well', () => {
  const key = generateKey();
  const keys = keyPrefixes(['Authorization', `Bearer ${key}`]);
  assert.deepEqual(keys, [key.slice(0, 8), key.slice(8, 16)]);
  assert.equal(keyless(`/v1/files/${key.slice(3)}`, keys), '[redacted]', 'the secret without kw_');
  assert.equal(keyless(`/v1/files/${key.slice(7)}`, keys), '[redacted]', 'without its first 7 characters');
  assert.equal(keyless(`/v1/files/kw%5F${key.slice(3)}`, keys), '[redacted]', '_ as %5F');
  assert.equal(keyless(`/v1/files/kw%5f${key.slice(3)}`, []), '[redacted]', 'a console key\'s shape, encoded, carried or not');
  assert.equal(keyless(`/v1/files/kw%255F${key.slice(3)}`, []), '[redacted]', 'encoded twice');
  assert.equal(keyless(`/v1/files/${encodeURIComponent(key.slice(0, 4))}%${key.slice(4)}`, keys), '[redacted]', 'a stray % does not hide it');
  assert.equal(keyless('/v1/files/file-%41bc%zz', keys), '/v1/files/file-%41bc%zz', 'other escapes are logged as sent');
  const other = 'sk-litellm-0123456789abcdef';
  assert.deepEqual(keyPrefixes(['X-LiteLLM-API-Key', `Bearer ${other}`]), ['sk-litel', 'lm-01234'], 'LiteLLM\'s header, Bearer or not');
  assert.deepEqual(keyPrefixes(['x-litellm-api-key', other]), ['sk-litel', 'lm-01234']);
});

test('a key in the path, encoded or cut short, reaches no access line', async () => {
  const paths = [`/v1/files/kw%5F${SECRET.slice(3)}`, `/v1/files/${SECRET.slice(3)}`, `/v2/${SECRET.slice(5)}`];
  for (const [i, path] of paths.entries()) {
    const line = waitForLine(h, (l) => l.req_id === `in-path-${i}`);
    await send(h.url, { path, headers: { authorization: `Bearer ${SECRET}`, 'x-request-id': `in-path-${i}` } });
    assert.equal((await line).path, '[redacted]', path);
  }
});

test('a model refused for scope is named in the answer, unless it holds a key', async () => {
  const other = generateKey();
  for (const [model, shown] of [[SCOPED, '[redacted]'], [`${SCOPED.slice(0, 10)}x`, '[redacted]'], [other, '[redacted]'], ['claude-3', 'claude-3']] as const) {
    const res = await send(h.url, {
      method: 'POST', path: '/v1/chat/completions',
      headers: { authorization: `Bearer ${SCOPED}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', fallbacks: [model], messages: [] }),
    });
    assert.equal(res.status, 403);
    assert.equal((JSON.parse(res.body.toString()) as { error: { code: string; message: string } }).error.message, `This key may not use the model "${shown}".`);
    assert.ok(!res.body.includes(SCOPED.slice(0, 8)) && !res.body.includes(other.slice(0, 8)), 'no key and no prefix of one in the body');
  }
  const res = await send(h.url, { method: 'POST', path: '/v1/chat/completions', headers: { authorization: `Bearer ${SCOPED}`, 'content-type': 'application/json' }, body: JSON.stringify({ model: SCOPED, messages: [] }) });
  assert.equal(res.status, 403);
  assert.ok(!res.body.includes(SCOPED.slice(0, 8)), 'the model field itself');
});

test('a console-shaped key in a path sent with no credential is not logged', async () => {
  const key = generateKey();
  const line = waitForLine(h, (l) => l.status === 401 && l.path === '[redacted]');
  const res = await send(h.url, { path: `/v1/models/${key}`, headers: { authorization: key } });
  assert.equal(res.status, 401);
  await line;
  assert.ok(!h.logs.join('\n').includes(key.slice(0, 8)));
});

test('a key outside ASCII is hidden in fields decoded as UTF-8: the header was read a byte a character', () => {
  const key = 'ÄäÖöÜüßÄäÖöÜüßÄäÖöÜüß';
  const asRead = Buffer.from(`Bearer ${key}`, 'utf8').toString('latin1');
  const keys = keyPrefixes(['Authorization', asRead]);
  assert.equal(keyless(`app ${key}`, keys), '[redacted]', 'an attribution header or a model as JSON decodes it');
  assert.equal(keyless(key.slice(8, 20), keys), '[redacted]', 'its second part too');
  assert.equal(keyless('Äpfel und Birnen', keys), 'Äpfel und Birnen');
});
