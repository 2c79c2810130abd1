/** The path checks of the default table (DESIGN section 3): dot segments, escapes, query strings. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { checkPath, classify, DEFAULT_RULES } from '../../src/routes.js';

const INVALID: string[] = [
  '/v1/./models',
  '/v1/../x',
  '/v1/models/..',
  '/v1/models/.',
  '/./v1/models',
  '/v1/files/../../etc/passwd',
  '/v1/%2e%2e/models',
  '/v1/%2E/models',
  '/v1/models%2Fx',
  '/v1/files%2fabc',
  '/v1/files/a%2f..%2fb',
  '/v1/files%5cabc',
  '/v1/files%5Cabc',
  '/v1/models%00',
  '/v1\\models',
  '/v1/files\\..\\x',
  'http://host/v1/models',
  'https://host:443/v1/chat/completions',
  'host/v1/models',
  '*',
  '',
  '//v1/models',
  '//host/v1/models',
  '/v1/chat completions',
  '/v1/models\t',
  // empty segments: an upstream that merges slashes or drops a trailing one reads another path
  '/v1//models',
  '/v1/chat//completions',
  '/v1/chat/completions/',
  '/v1/models/',
  '/v1/files/',
  '/v1/files/abc//content',
  // percent-encoded bytes outside ASCII: Unicode look-alikes of dots and slashes (fullwidth
  // dot and slash, two-dot leader, overlong UTF-8 of '.' and '/')
  '/v1/models/%EF%BC%8E%EF%BC%8E/chat',
  '/v1/files/a%EF%BC%8Fcontent',
  '/v1/files/%E2%80%A5/x',
  '/v1/models/%c0%ae%c0%ae',
  '/v1/models/%C0%AF',
  // raw characters outside ASCII (Node's parser refuses them on the wire; checked all the same)
  '/v1/models/\uff0e\uff0e',
  '/v1/files/a\u2215b',
  // encoded unreserved characters, which normalisers decode
  '/v1/%63hat/completions',
  '/v1/models/gpt%2D4o',
  '/v1/files/file%5Fabc',
  // double encoding: an upstream that decodes twice reads `..` or `/`
  '/v1/models/%252e%252e/files',
  '/v1/models/%252E%252E',
  '/v1/files/a%252fb',
  '/v1/models/gpt%25',
  // path parameters: servlet containers strip `;...` from a segment, so `..;` is `..` to them
  '/v1/models/..;/files',
  '/v1/models/.;/x',
  '/v1/responses/..;x=1/chat/completions',
  '/v1/models/gpt-4o;v=1',
  '/v1/chat/completions;jsessionid=x',
  // what a URL parser (which builds the forwarded path) would cut or re-encode
  '/v1/responses/#',
  '/v1/uploads/u1#/parts',
  '/v1/files/abc#/content',
  '/v1/files/a{b}',
  '/v1/models/a"b',
  '/v1/models/a<b>',
  '/v1/models/a^b',
  '/v1/models/a`b',
  '/v1/models/a|b',
  "/v1/models?name='x'",
  '/v1/models?q="x"',
  // malformed escapes
  '/v1/models/%zz',
  '/v1/models/gpt%4',
  '/v1/models/gpt%',
];

for (const target of INVALID) {
  test(`400 invalid_path: ${JSON.stringify(target)}`, () => {
    for (const method of ['GET', 'POST', 'OPTIONS']) {
      const c = classify(DEFAULT_RULES, method, target);
      assert.equal(c.ok, false);
      assert.equal(!c.ok && c.code, 'invalid_path', `${method} ${target}`);
      assert.ok(!c.ok && c.message.length > 0);
    }
    assert.equal(checkPath(target).ok, false);
  });
}

test('invalid_path wins over not_found: unknown paths with dot segments are 400', () => {
  for (const t of ['/nope/../v1/models', '/v2/%2e/x', '/healthz/..']) {
    const c = classify(DEFAULT_RULES, 'GET', t);
    assert.equal(!c.ok && c.code, 'invalid_path', t);
  }
});

test('escapes of reserved characters other than dot and slash stay allowed (a fine-tuned model id with a colon)', () => {
  for (const t of ['/v1/models/ft%3Agpt-4o%3Aorg', '/v1/files/file-abc%2Bdef/content']) {
    const c = classify(DEFAULT_RULES, 'GET', t);
    assert.ok(c.ok, t);
    assert.equal(c.path, t);
  }
});

test('dots inside a segment are not dot segments', () => {
  for (const t of ['/v1/models/gpt-4.1', '/v1/models/..x', '/v1/models/x..', '/v1/models/...']) {
    const c = classify(DEFAULT_RULES, 'GET', t);
    assert.ok(c.ok, t);
    assert.equal(c.path, t);
  }
});

test('query strings do not affect classification and are not part of the path', () => {
  const rows: [string, string, string, string][] = [
    ['GET', '/v1/models?limit=5', 'models', '/v1/models'],
    ['GET', '/v1/models?', 'models', '/v1/models'],
    ['POST', '/v1/messages?beta=true', 'messages', '/v1/messages'],
    ['POST', '/v1/messages/count_tokens?x=/../', 'messages.count_tokens', '/v1/messages/count_tokens'],
    ['POST', '/v1/chat/completions?api-version=%2e%2f', 'chat.completions', '/v1/chat/completions'],
    ['GET', '/v1/files?purpose=batch', 'files', '/v1/files'],
  ];
  for (const [method, target, name, path] of rows) {
    const c = classify(DEFAULT_RULES, method, target);
    assert.ok(c.ok, target);
    assert.equal(c.route.name, name);
    assert.equal(c.path, path);
    assert.deepEqual(checkPath(target), { ok: true, path });
  }
  const miss = classify(DEFAULT_RULES, 'GET', '/v1/messages?x=1');
  assert.equal(!miss.ok && miss.code, 'not_found');
  assert.equal(classify(DEFAULT_RULES, 'GET', '/v1/../models?x=1').ok, false);
});

// Each refusal names its own reason (without these checks the URL-rewrite fallback still
// refuses the target, but tells the client about "#, quotes, <>").
const REASONS: [string, RegExp][] = [
  ['/v1/../x', /dot segments/],
  ['/v1/files/../../etc/passwd', /dot segments/],
  ['/./v1/models', /dot segments/],
  ['http://host/v1/models', /absolute-form/],
  ['host/v1/models', /absolute-form/],
  ['*', /absolute-form/],
  ['/v1/chat completions', /control characters and spaces/],
  ['/v1/models\x7f', /control characters and spaces/],
];

test('checkPath: a refused target is told the reason it has', () => {
  for (const [target, reason] of REASONS) {
    const c = checkPath(target);
    assert.ok(!c.ok, target);
    assert.match(c.message, reason, target);
  }
});
