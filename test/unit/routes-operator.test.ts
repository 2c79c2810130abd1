/** Operator routes on top of the default table, and the classification memory. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { buildRules, classify, DEFAULT_RULES, type RouteClass } from '../../src/routes.js';

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

test('buildRules: operator routes extend the table and never replace a built-in route', () => {
  // A wide files route once took every model path and skipped scope, budgets and token limits.
  const rules = buildRules([custom('/v1/*', { class: 'files' }), custom('/v1/messages', { credentials: 'bearer', style: 'openai', methods: ['POST'] })]);
  const chat = classify(rules, 'POST', '/v1/chat/completions');
  assert.ok(chat.ok && chat.route.name === 'chat.completions' && chat.route.class === 'model', JSON.stringify(chat));
  const m = classify(rules, 'POST', '/v1/messages');
  assert.ok(m.ok && m.route.name === 'messages' && m.route.credentials === 'messages');
  const ct = classify(rules, 'POST', '/v1/messages/count_tokens');
  assert.ok(ct.ok && ct.route.name === 'messages.count_tokens');
  const added = classify(rules, 'POST', '/v1/batches');
  assert.ok(added.ok && added.route.name === 'custom:/v1' && added.route.class === 'files', 'a path the table does not answer takes the operator route');
  const everything = classify(buildRules([custom('/*', { class: 'listing' })]), 'GET', '/v2/x');
  assert.ok(everything.ok && everything.route.name === 'custom:/*', 'a route on every path is named for logs and metrics');
});

test('buildRules: no operator route takes over /v1/key, on any method; it is never forwarded', () => {
  for (const wide of ['/v1/*', '/v1/key/*', '/*']) {
    const rules = buildRules([custom(wide, { class: 'listing' })]);
    const key = classify(rules, 'GET', '/v1/key');
    assert.ok(key.ok && key.route.class === 'self', JSON.stringify(key));
    for (const method of ['HEAD', 'POST', 'PUT', 'DELETE', 'OPTIONS']) {
      const other = classify(rules, method, '/v1/key');
      assert.equal(!other.ok && other.code, 'not_found', `${method} /v1/key under ${wide}`);
    }
  }
  const rules = buildRules([custom('/v1/*', { class: 'listing' })]);
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

test('buildRules: methods restrict an operator route; a method the table leaves out is added', () => {
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
  const rules = buildRules([custom('/v1/rerank', { methods: ['POST'] })]);
  const own = classify(rules, 'POST', '/v1/rerank');
  assert.ok(own.ok && own.route.name === 'custom:/v1/rerank');
  assert.equal(classify(DEFAULT_RULES, 'POST', '/v1/rerank').ok, false, 'the default table answers for itself');
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
