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
