import { test } from 'node:test';
import assert from 'node:assert/strict';
import { inspectJson, topLevelKeys } from '../../src/proxy/json-scan.js';

type Want = { model: string | null; cap?: number | null } | { error: RegExp };

// Bodies are written as raw JSON text so escapes reach the scanner exactly as a client sends them.
const ROWS: [name: string, body: string, want: Want][] = [
  ['plain model', '{"model":"gpt-4o","messages":[]}', { model: 'gpt-4o' }],
  ['model last', '{"messages":[{"role":"user","content":"hi"}],"model":"claude-3"}', { model: 'claude-3' }],
  ['pretty printed', '{\n  "model" : "gpt-4o" ,\n  "stream": true\n}\n', { model: 'gpt-4o' }],
  ['escaped model value', '{"model":"gpt-\\u0034o"}', { model: 'gpt-4o' }],
  ['unicode model value', '{"model":"modèle-✓"}', { model: 'modèle-✓' }],
  ['no model', '{"messages":[]}', { model: null }],
  ['empty object', '{}', { model: null }],
  ['model only nested', '{"input":{"model":"x"}}', { model: null }],
  ['model under __proto__ is not top-level', '{"__proto__":{"model":"x"}}', { model: null }],
  // duplicates at the top level
  ['duplicate model', '{"model":"a","model":"b"}', { error: /more than once/ }],
  ['duplicate model, same value', '{"model":"a","model":"a"}', { error: /more than once/ }],
  ['duplicate via \\u escape', '{"model":"a","mod\\u0065l":"b"}', { error: /more than once/ }],
  ['duplicate via \\u escape first', '{"\\u006dodel":"a","model":"b"}', { error: /more than once/ }],
  ['duplicate, both escaped', '{"\\u006Dodel":"a","m\\u006fdel":"b"}', { error: /more than once/ }],
  ['duplicate, whitespace and newlines', '{\n "model": "a",\n "x": [1, {"model": "n"}],\n "model": "b"\n}', { error: /more than once/ }],
  ['duplicate after a string ending in a backslash', '{"a":"x\\\\","model":"a","mod\\u0065l":"b"}', { error: /more than once/ }],
  ['duplicate after tricky strings', '{"a":"\\"model\\":","model":"a","b":"{[,","model":"b"}', { error: /more than once/ }],
  // nested "model" keys are not duplicates
  ['nested in messages content', '{"model":"claude-3","messages":[{"role":"user","content":[{"type":"text","text":"hi","model":"z"}]}]}', { model: 'claude-3' }],
  ['nested object', '{"model":"a","metadata":{"model":"b","deep":{"model":"c"}}}', { model: 'a' }],
  ['nested escaped', '{"model":"a","metadata":{"mod\\u0065l":"b"}}', { model: 'a' }],
  ['nested in arrays', '{"x":[1,2,{"model":"q"},[{"model":"r"}]],"model":"m"}', { model: 'm' }],
  ['"model" as a value', '{"model":"a","role":"model","text":"model"}', { model: 'a' }],
  ['"model" inside a string', '{"prompt":"the \\"model\\": \\"x\\" key","model":"a"}', { model: 'a' }],
  ['backslash-ended string then model', '{"a":"x\\\\","b":"\\u0041","model":"m"}', { model: 'm' }],
  ['braces in strings', '{"a":"}}}]]]","b":"{{{[[[","model":"m","c":",,,"}', { model: 'm' }],
  // model must be one non-empty string
  ['model number', '{"model":4}', { error: /non-empty string/ }],
  ['model array', '{"model":["a","b"]}', { error: /non-empty string/ }],
  ['model null', '{"model":null}', { error: /non-empty string/ }],
  ['model object', '{"model":{"name":"a"}}', { error: /non-empty string/ }],
  ['model empty', '{"model":""}', { error: /non-empty string/ }],
  ['model boolean', '{"model":true}', { error: /non-empty string/ }],
  // not a JSON object
  ['invalid JSON', '{"model":', { error: /not valid JSON/ }],
  ['trailing comma', '{"model":"a",}', { error: /not valid JSON/ }],
  ['empty body', '', { error: /not valid JSON/ }],
  ['plain text', 'model=gpt-4o', { error: /not valid JSON/ }],
  ['two documents', '{"model":"a"}{"model":"b"}', { error: /not valid JSON/ }],
  ['top-level array', '[{"model":"a"}]', { error: /JSON object/ }],
  ['top-level string', '"model"', { error: /JSON object/ }],
  ['top-level null', 'null', { error: /JSON object/ }],
  ['top-level number', '42', { error: /JSON object/ }],
  // output caps
  ['max_tokens', '{"model":"a","max_tokens":1024}', { model: 'a', cap: 1024 }],
  ['max_completion_tokens', '{"model":"a","max_completion_tokens":50}', { model: 'a', cap: 50 }],
  ['max_output_tokens', '{"model":"a","max_output_tokens":70}', { model: 'a', cap: 70 }],
  ['max_tokens zero', '{"model":"a","max_tokens":0}', { model: 'a', cap: 0 }],
  ['fractional cap floored', '{"model":"a","max_tokens":12.7}', { model: 'a', cap: 12 }],
  ['no cap', '{"model":"a"}', { model: 'a', cap: null }],
  ['cap as a string is ignored', '{"model":"a","max_tokens":"100"}', { model: 'a', cap: null }],
  ['negative cap is ignored', '{"model":"a","max_tokens":-5}', { model: 'a', cap: null }],
  ['null cap is ignored', '{"model":"a","max_tokens":null}', { model: 'a', cap: null }],
  ['nested cap is ignored', '{"model":"a","options":{"max_tokens":9}}', { model: 'a', cap: null }],
  ['cap without model', '{"input":"x","max_output_tokens":33}', { model: null, cap: 33 }],
];

for (const [name, body, want] of ROWS) {
  test(`inspectJson: ${name}`, () => {
    const got = inspectJson(Buffer.from(body, 'utf8'));
    if ('error' in want) {
      assert.equal(got.ok, false, JSON.stringify(got));
      if (!got.ok) assert.match(got.message, want.error);
      return;
    }
    assert.ok(got.ok, JSON.stringify(got));
    assert.equal(got.model, want.model);
    if (want.cap !== undefined) assert.equal(got.maxOutputTokens, want.cap);
  });
}

test('inspectJson: error messages never echo the body', () => {
  const secret = 'sk-ant-api03-SECRETSECRETSECRET';
  for (const body of [`{"model":"${secret}","model":"x"}`, `{"model":["${secret}"]}`, `{"model":"${secret}"`]) {
    const got = inspectJson(Buffer.from(body));
    assert.ok(!got.ok);
    assert.ok(!got.message.includes('SECRET'));
  }
});

test('inspectJson: a large body with many nested "model" keys keeps the top-level one', () => {
  const messages = Array.from({ length: 2000 }, (_, i) => ({ role: 'user', content: [{ type: 'text', text: `m${i}`, model: `n${i}` }] }));
  const body = JSON.stringify({ messages, model: 'big', max_tokens: 7 });
  assert.deepEqual(inspectJson(Buffer.from(body)), { ok: true, model: 'big', maxOutputTokens: 7 });
  const dup = body.slice(0, -1) + ',"model":"other"}';
  assert.equal(inspectJson(Buffer.from(dup)).ok, false);
});

const KEYS: [string, string[]][] = [
  ['{}', []],
  ['{"a":1,"b":{"c":2},"d":[{"e":3}],"f":"g"}', ['a', 'b', 'd', 'f']],
  ['{ "a" : [ 1 , 2 ] , "b" : { "x" : [ { "y" : 1 } ] } , "c" : null }', ['a', 'b', 'c']],
  ['{"mod\\u0065l":1,"model":2}', ['model', 'model']],
  ['{"a\\"b":1,"c\\\\":2,"d":"e,\\"f\\":"}', ['a"b', 'c\\', 'd']],
  ['{"k":"v","arr":[{"inner":1},{"inner":2}],"last":true}', ['k', 'arr', 'last']],
];

for (const [text, want] of KEYS) {
  test(`topLevelKeys(${text})`, () => {
    assert.deepEqual(topLevelKeys(text), want);
    if (new Set(want).size === want.length) assert.deepEqual(Object.keys(JSON.parse(text) as object), want);
  });
}
