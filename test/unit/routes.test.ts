import { test } from 'node:test';
import assert from 'node:assert/strict';
import { buildRules, checkPath, classify, DEFAULT_RULES, type RouteClass } from '../../src/routes.js';

type Want = { name: string; cls: RouteClass; creds: 'bearer' | 'messages'; style: 'openai' | 'messages'; countTokens?: boolean };

const listing: Omit<Want, 'name'> = { cls: 'listing', creds: 'bearer', style: 'openai' };
const model: Omit<Want, 'name'> = { cls: 'model', creds: 'bearer', style: 'openai' };
const files: Omit<Want, 'name'> = { cls: 'files', creds: 'bearer', style: 'openai' };
const msgs: Omit<Want, 'name'> = { cls: 'model', creds: 'messages', style: 'messages' };

// DESIGN section 3, one row per path/method the default table names.
const KNOWN: [method: string, target: string, want: Want][] = [
  ['GET', '/v1/models', { name: 'models', ...listing }],
  ['GET', '/v1/models/gpt-4o', { name: 'models', ...listing }],
  ['GET', '/v1/models/ft:gpt-4o:org:x', { name: 'models', ...listing }],
  ['POST', '/v1/chat/completions', { name: 'chat.completions', ...model }],
  ['POST', '/v1/completions', { name: 'completions', ...model }],
  ['POST', '/v1/embeddings', { name: 'embeddings', ...model }],
  ['POST', '/v1/responses', { name: 'responses', ...model }],
  ['GET', '/v1/responses/resp_123', { name: 'responses', ...model }],
  ['POST', '/v1/responses/resp_123/cancel', { name: 'responses', ...model }],
  ['DELETE', '/v1/responses/resp_123', { name: 'responses', ...model }],
  ['POST', '/v1/moderations', { name: 'moderations', ...model }],
  ['POST', '/v1/images/generations', { name: 'images', ...model }],
  ['POST', '/v1/images/edits', { name: 'images', ...model }],
  ['POST', '/v1/audio/transcriptions', { name: 'audio', ...model }],
  ['POST', '/v1/audio/speech', { name: 'audio', ...model }],
  ['POST', '/v1/messages', { name: 'messages', ...msgs, countTokens: false }],
  ['POST', '/v1/messages/count_tokens', { name: 'messages.count_tokens', ...msgs, countTokens: true }],
  ['POST', '/v1/files', { name: 'files', ...files }],
  ['GET', '/v1/files', { name: 'files', ...files }],
  ['GET', '/v1/files/file-abc', { name: 'files', ...files }],
  ['GET', '/v1/files/file-abc/content', { name: 'files', ...files }],
  ['DELETE', '/v1/files/file-abc', { name: 'files', ...files }],
  ['POST', '/v1/uploads', { name: 'uploads', ...files }],
  ['POST', '/v1/uploads/upload_1/parts', { name: 'uploads', ...files }],
  ['POST', '/v1/uploads/upload_1/complete', { name: 'uploads', ...files }],
  ['POST', '/v1/uploads/upload_1/cancel', { name: 'uploads', ...files }],
];

for (const [method, target, want] of KNOWN) {
  test(`default table: ${method} ${target} -> ${want.name}`, () => {
    const c = classify(DEFAULT_RULES, method, target);
    assert.ok(c.ok, `expected a route, got ${JSON.stringify(c)}`);
    assert.equal(c.route.name, want.name);
    assert.equal(c.route.class, want.cls);
    assert.equal(c.route.credentials, want.creds);
    assert.equal(c.route.style, want.style);
    assert.equal(c.route.countTokens, want.countTokens ?? false);
    assert.equal(c.path, target);
  });
}

const NOT_FOUND: [string, string][] = [
  ['POST', '/v1/images'],
  ['POST', '/v1/audio'],
  ['GET', '/v2/x'],
  ['GET', '/v1/messages'],
  ['PUT', '/v1/messages'],
  ['GET', '/v1/messages/count_tokens'],
  ['POST', '/v1/messages/batches'],
  ['POST', '/v1/chat/completions/x'],
  ['GET', '/healthz'],
  ['GET', '/readyz'],
  ['GET', '/metrics'],
  ['GET', '/'],
  ['POST', '/v1/models'],
  ['DELETE', '/v1/models/gpt-4o'],
  ['GET', '/v1/modelsx'],
  ['GET', '/v1/filesx'],
  // files routes: only the methods the files and uploads APIs use
  ['DELETE', '/v1/files'],
  ['PUT', '/v1/files'],
  ['HEAD', '/v1/files'],
  ['OPTIONS', '/v1/files/file-abc'],
  ['POST', '/v1/files/file-abc'],
  ['PATCH', '/v1/files/file-abc'],
  ['HEAD', '/v1/files/file-abc'],
  ['DELETE', '/v1/files/file-abc/content'],
  ['GET', '/v1/files/a/b'],
  ['GET', '/v1/uploads'],
  ['DELETE', '/v1/uploads/upload_1'],
  ['GET', '/v1/uploads/upload_1/parts'],
  ['POST', '/v1/uploads/upload_1/other'],
  ['POST', '/v1/uploadsx'],
  ['POST', '/v1/imagesx'],
  ['POST', '/v1/audiox/speech'],
  ['POST', '/v1/responsesx'],
  ['POST', '/V1/chat/completions'],
  ['POST', '/v1/Chat/Completions'],
  ['POST', '/v1'],
];

for (const [method, target] of NOT_FOUND) {
  test(`404 not_found: ${method} ${target}`, () => {
    const c = classify(DEFAULT_RULES, method, target);
    assert.equal(c.ok, false);
    assert.equal(!c.ok && c.code, 'not_found');
  });
}

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

test('precedence: count_tokens is its own route, never the plain messages route', () => {
  const ct = classify(DEFAULT_RULES, 'POST', '/v1/messages/count_tokens');
  const m = classify(DEFAULT_RULES, 'POST', '/v1/messages');
  assert.ok(ct.ok && m.ok);
  assert.equal(ct.route.countTokens, true);
  assert.equal(m.route.countTokens, false);
  assert.equal(ct.route.modelRequired, true);
  assert.equal(m.route.modelRequired, true);
});

test('precedence: POST /v1/responses requires a model, subpaths and other methods do not', () => {
  const post = classify(DEFAULT_RULES, 'POST', '/v1/responses');
  assert.ok(post.ok);
  assert.equal(post.route.modelRequired, true);
  for (const [method, t] of [['POST', '/v1/responses/r_1/cancel'], ['GET', '/v1/responses/r_1'], ['GET', '/v1/responses/r_1/input_items']]) {
    const c = classify(DEFAULT_RULES, method!, t!);
    assert.ok(c.ok, t);
    assert.equal(c.route.name, 'responses');
    assert.equal(c.route.class, 'model');
    assert.equal(c.route.modelRequired, false, t);
    assert.equal(c.route.storedCall, true, `${t} is a call on a stored response`);
  }
  const bare = classify(DEFAULT_RULES, 'GET', '/v1/responses');
  assert.ok(bare.ok && bare.route.class === 'model' && !bare.route.storedCall, 'the bare path is no stored response');
});

test('model-required flags on the OpenAI model routes', () => {
  for (const t of ['/v1/chat/completions', '/v1/completions', '/v1/embeddings']) {
    const c = classify(DEFAULT_RULES, 'POST', t);
    assert.ok(c.ok && c.route.modelRequired, t);
  }
  for (const t of ['/v1/moderations', '/v1/images/generations', '/v1/audio/speech']) {
    const c = classify(DEFAULT_RULES, 'POST', t);
    assert.ok(c.ok && !c.route.modelRequired, t);
  }
});

const custom = (path: string, over: Partial<Parameters<typeof buildRules>[0][number]> = {}) => ({
  path,
  class: 'model' as RouteClass,
  credentials: 'bearer' as const,
  style: 'openai' as const,
  countTokens: false,
  modelRequired: false,
  ...over,
});

test('buildRules: no extras is the default table', () => {
  assert.deepEqual(buildRules([]), [...DEFAULT_RULES]);
});

test('buildRules: operator routes win over the defaults', () => {
  const rules = buildRules([custom('/v1/messages', { credentials: 'bearer', style: 'openai', methods: ['POST'] }), custom('/v1/files/*', { class: 'model' })]);
  const m = classify(rules, 'POST', '/v1/messages');
  assert.ok(m.ok);
  assert.equal(m.route.name, 'custom:/v1/messages');
  assert.equal(m.route.credentials, 'bearer');
  assert.equal(m.route.style, 'openai');
  const f = classify(rules, 'GET', '/v1/files/file-1');
  assert.ok(f.ok);
  assert.equal(f.route.class, 'model');
  // count_tokens is not shadowed by an exact /v1/messages rule
  const ct = classify(rules, 'POST', '/v1/messages/count_tokens');
  assert.ok(ct.ok && ct.route.name === 'messages.count_tokens');
});

test('buildRules: no operator route takes over GET /v1/key, which is never forwarded', () => {
  const rules = buildRules([custom('/v1/*', { class: 'listing' })]);
  const key = classify(rules, 'GET', '/v1/key');
  assert.ok(key.ok && key.route.class === 'self', JSON.stringify(key));
  const other = classify(rules, 'GET', '/v1/other');
  assert.ok(other.ok && other.route.name === 'custom:/v1', 'the wide route still takes everything else');
});

test('buildRules: a `/*` suffix is a prefix match on whole segments, bare prefix included', () => {
  const rules = buildRules([custom('/v1/rerank/*', { class: 'model', modelRequired: true })]);
  for (const t of ['/v1/rerank', '/v1/rerank/a', '/v1/rerank/a/b/c']) {
    const c = classify(rules, 'POST', t);
    assert.ok(c.ok, t);
    assert.equal(c.route.name, 'custom:/v1/rerank');
    assert.equal(c.route.modelRequired, true);
  }
  for (const t of ['/v1/rerankx', '/v1/reran']) assert.equal(classify(rules, 'POST', t).ok, false, t);
  // a trailing slash is an empty segment, refused before any rule is tried
  const trailing = classify(rules, 'POST', '/v1/rerank/');
  assert.equal(!trailing.ok && trailing.code, 'invalid_path');
});

test('buildRules: an exact operator path is not a prefix', () => {
  const rules = buildRules([custom('/v1/rerank', { class: 'listing' })]);
  assert.ok(classify(rules, 'POST', '/v1/rerank').ok);
  const sub = classify(rules, 'POST', '/v1/rerank/x');
  assert.equal(!sub.ok && sub.code, 'not_found');
});

test('buildRules: methods restrict an operator route; others fall through to the defaults', () => {
  const rules = buildRules([custom('/v1/models', { methods: ['POST'], class: 'model', countTokens: true, credentials: 'messages', style: 'messages' })]);
  const post = classify(rules, 'POST', '/v1/models');
  assert.ok(post.ok);
  assert.equal(post.route.class, 'model');
  assert.equal(post.route.countTokens, true);
  assert.equal(post.route.credentials, 'messages');
  assert.equal(post.route.style, 'messages');
  const get = classify(rules, 'GET', '/v1/models');
  assert.ok(get.ok);
  assert.equal(get.route.name, 'models');
  assert.equal(get.route.class, 'listing');
  const put = classify(rules, 'PUT', '/v1/models');
  assert.equal(!put.ok && put.code, 'not_found');
});

test('buildRules: operator routes still get the path checks', () => {
  const rules = buildRules([custom('/v1/x/*')]);
  for (const t of ['/v1/x/../y', '/v1/x/%2e', '/v1/x\\y', 'http://h/v1/x']) {
    const c = classify(rules, 'POST', t);
    assert.equal(!c.ok && c.code, 'invalid_path', t);
  }
});

test('classify remembers per rule table: a repeat is the same answer, another table answers for itself', () => {
  const first = classify(DEFAULT_RULES, 'POST', '/v1/messages');
  assert.equal(classify(DEFAULT_RULES, 'POST', '/v1/messages'), first, 'the remembered answer');
  assert.ok(Object.isFrozen(first), 'shared answers cannot be changed by one request');
  const rules = buildRules([custom('/v1/messages', { credentials: 'bearer', style: 'openai', methods: ['POST'] })]);
  const own = classify(rules, 'POST', '/v1/messages');
  assert.ok(own.ok && own.route.name === 'custom:/v1/messages');
  assert.ok(first.ok && first.route.name === 'messages');
  // the method is part of what is remembered
  const get = classify(DEFAULT_RULES, 'GET', '/v1/messages');
  assert.equal(!get.ok && get.code, 'not_found');
});

test('classify stays right past its memory bound (endless distinct paths)', () => {
  const rules = buildRules([]);
  const chat = classify(rules, 'POST', '/v1/chat/completions');
  for (let i = 0; i < 3000; i++) {
    const c = classify(rules, 'GET', `/v1/files/file-${i}`);
    assert.ok(c.ok && c.route.class === 'files');
  }
  assert.deepEqual(classify(rules, 'POST', '/v1/chat/completions'), chat);
  const bad = classify(rules, 'GET', '/v1/%2e%2e/models');
  assert.equal(!bad.ok && bad.code, 'invalid_path');
});
