/** The default route table (DESIGN section 3): every named path and method, what is not found, precedence and model-required flags. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { classify, DEFAULT_RULES, type RouteClass } from '../../src/routes.js';

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
  ['POST', '/v1/responses/input_tokens', { name: 'responses.input_tokens', ...model, countTokens: true }],
  ['GET', '/v1/responses/input_tokens', { name: 'responses', ...model }],
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
