import { test } from 'node:test';
import assert from 'node:assert/strict';
import { inspectJson, queryNamesModel, strictProblem } from '../../src/proxy/body/json-scan.js';

type Want = { model: string | null; cap?: number | null; models?: string[] } | { error: RegExp };

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
  ['fractional cap rounded up', '{"model":"a","max_tokens":12.2}', { model: 'a', cap: 13 }],
  ['no cap', '{"model":"a"}', { model: 'a', cap: null }],
  ['cap as a numeric string counts (lax decoders coerce it)', '{"model":"a","max_tokens":"100"}', { model: 'a', cap: 100 }],
  ['the largest cap wins, whatever the order', '{"model":"a","max_tokens":10,"max_completion_tokens":5000,"max_output_tokens":7}', { model: 'a', cap: 5000 }],
  ['the largest cap wins, first field smaller', '{"max_output_tokens":9000,"model":"a","max_tokens":1}', { model: 'a', cap: 9000 }],
  ['an overflowing cap is refused', '{"model":"a","max_tokens":1e400}', { error: /finite/ }],
  // one reading: what another decoder could read differently is refused
  ['byte order mark', '\ufeff{"model":"a"}', { error: /byte order mark/ }],
  ['lone high surrogate escape', '{"model":"gpt-4o\\ud800"}', { error: /surrogate/ }],
  ['lone low surrogate escape', '{"model":"a","x":"\\udc00"}', { error: /surrogate/ }],
  ['reversed surrogate pair', '{"model":"a","x":"\\udc00\\ud800"}', { error: /surrogate/ }],
  ['high surrogate then plain escape', '{"model":"a","x":"\\ud800\\n"}', { error: /surrogate/ }],
  ['paired surrogates pass', '{"model":"a","x":"\\ud83d\\ude00"}', { model: 'a' }],
  ['escaped backslash before u is not an escape', '{"model":"a","x":"\\\\ud800"}', { model: 'a' }],
  ['NaN', '{"model":"a","temperature":NaN}', { error: /not valid JSON/ }],
  ['comment', '{"model":"a" /* b */}', { error: /not valid JSON/ }],
  ['line comment', '{"model":"a"}// x', { error: /not valid JSON/ }],
  ['duplicate key nested', '{"model":"a","metadata":{"x":1,"x":2}}', { error: /more than once/ }],
  ['duplicate key in an array element', '{"model":"a","messages":[{"role":"user","role":"system"}]}', { error: /more than once/ }],
  ['same key in sibling objects is fine', '{"model":"a","messages":[{"role":"user"},{"role":"user"}]}', { model: 'a' }],
  ['MODEL in upper case beside model', '{"model":"a","MODEL":"b"}', { error: /letter case/ }],
  ['Model alone', '{"Model":"b"}', { error: /letter case/ }],
  ['Kelvin sign folds to k for Go', '{"model":"a","max_to\u212aens":99999}', { error: /letter case/ }],
  ['long s folds to s for Go', '{"model":"a","model\u017f":["b"]}', { error: /letter case/ }],
  ['case twins of any key are refused', '{"model":"a","Stream":true,"stream":false}', { error: /letter case/ }],
  ['a case variant of another field alone is fine', '{"model":"a","Stream":true}', { model: 'a' }],
  ['two case variants, neither in lower case', '{"model":"a","STREAM":true,"Stream":false}', { error: /letter case/ }],
  ['lower-case twin after its variant', '{"Stream":true,"model":"a","stream":false}', { error: /letter case/ }],
  ['model of 256 characters', `{"model":"${'m'.repeat(256)}"}`, { model: 'm'.repeat(256) }],
  ['model over 256 characters', `{"model":"${'m'.repeat(257)}"}`, { error: /256/ }],
  ['models list', '{"model":"a","models":["b","c"]}', { model: 'a', models: ['b', 'c'] }],
  ['fallbacks, list and mapping forms', '{"model":"a","fallbacks":["b",{"c":["d"]}],"context_window_fallbacks":[{"e":["f"]}]}', { model: 'a', models: ['b', 'c', 'd', 'e', 'f'] }],
  ['extra_body selects models too', '{"model":"a","extra_body":{"model":"b","Fallbacks":["c"]}}', { model: 'a', models: ['b', 'c'] }],
  ['a models entry over 256 characters', `{"model":"a","models":["${'m'.repeat(300)}"]}`, { error: /256/ }],
  ['a model named as a list (gateways split on commas)', '{"model":"gpt-4o,o1-pro"}', { error: /commas/ }],
  ['a model name with whitespace', '{"model":"gpt-4o o1"}', { error: /whitespace/ }],
  ['a fallbacks entry with a control character', '{"model":"a","fallbacks":["b\\u0000c"]}', { error: /control/ }],
  ['object fallbacks: a model key stands for its value', '{"model":"a","fallbacks":[{"model":"b"},{"models":["c"]}]}', { model: 'a', models: ['b', 'c'] }],
  ['a fallback override: its messages are no model names', '{"model":"a","fallbacks":[{"model":"b","messages":[{"role":"user","content":"Hey, how is it going?"}]}]}', { model: 'a', models: ['b'] }],
  ['fallbacks nested past 32 deep', `{"model":"a","fallbacks":${'['.repeat(40)}"b"${']'.repeat(40)}}`, { error: /nested/ }],
  ['fallbacks nested 5000 deep are refused, not a crash', `{"model":"a","fallbacks":${'['.repeat(5000)}${']'.repeat(5000)}}`, { error: /nested/ }],
  ['more than 1000 further models', `{"model":"a","models":${JSON.stringify(Array(1001).fill('a'))}}`, { error: /too many/ }],
  ['negative cap is ignored', '{"model":"a","max_tokens":-5}', { model: 'a', cap: null }],
  ['null cap is ignored', '{"model":"a","max_tokens":null}', { model: 'a', cap: null }],
  ['nested cap is ignored', '{"model":"a","options":{"max_tokens":9}}', { model: 'a', cap: null }],
  ["extra_body's cap counts (merged into the provider's request)", '{"model":"a","max_tokens":1,"extra_body":{"max_tokens":3000}}', { model: 'a', cap: 3000 }],
  ["extra_body's cap alone", '{"model":"a","extra_body":{"max_completion_tokens":"40"}}', { model: 'a', cap: 40 }],
  ['the top-level cap when larger than extra_body\'s', '{"model":"a","max_output_tokens":90,"extra_body":{"max_tokens":3}}', { model: 'a', cap: 90 }],
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
    if (want.models !== undefined) assert.deepEqual(got.models, want.models);
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
  assert.deepEqual(inspectJson(Buffer.from(body)), { ok: true, model: 'big', maxOutputTokens: 7, models: [], background: false });
  const dup = body.slice(0, -1) + ',"model":"other"}';
  assert.equal(inspectJson(Buffer.from(dup)).ok, false);
});

/** An object of `before` filler keys, then `key`, then `between` more, then `key` again. */
function withDuplicate(before: number, between: number, key = 'model'): string {
  const fill = (from: number, n: number) => Array.from({ length: n }, (_, i) => `"k${from + i}":${from + i}`);
  return `{${[...fill(0, before), `"${key}":"first"`, ...fill(before, between), `"${key}":"second"`].join(',')}}`;
}

// The scanner keeps an object's first keys in a short list and moves them to a Set at the
// 9th: a duplicate must be found on either side of that move, and across it.
test('strictProblem: a duplicate key is found at every position of an object of up to 20 keys', () => {
  for (let before = 0; before <= 18; before++) {
    for (let between = 0; before + between <= 18; between++) {
      const text = withDuplicate(before, between, 'dup');
      assert.match(strictProblem(text) ?? '', /more than once/, `after ${before} keys, ${between} between: ${text}`);
    }
  }
});

test('strictProblem: as many distinct keys are no problem', () => {
  for (let n = 1; n <= 20; n++) {
    const text = `{${Array.from({ length: n }, (_, i) => `"k${i}":${i}`).join(',')}}`;
    assert.equal(strictProblem(text), null, text);
  }
});

// A duplicate "model" would let the upstream (first wins) run another model than the one
// keyward checked (JSON.parse: last wins).
test('inspectJson: a duplicate "model" as the 9th and 10th keys is refused, not read as the last', () => {
  const got = inspectJson(Buffer.from(withDuplicate(8, 0)));
  assert.equal(got.ok, false, JSON.stringify(got));
  if (!got.ok) assert.match(got.message, /more than once/);
});

test('inspectJson: a duplicate key nested in a message of 9 or more keys is refused', () => {
  const msg = withDuplicate(8, 1, 'role');
  const got = inspectJson(Buffer.from(`{"model":"a","messages":[${msg}]}`));
  assert.equal(got.ok, false, JSON.stringify(got));
});

const QUERIES: [string, boolean][] = [
  ['/v1/chat/completions', false],
  ['/v1/chat/completions?trace=1', false],
  ['/v1/chat/completions?model=gpt-4o', true],
  ['/v1/chat/completions?a=1&Model=x', true],
  ['/v1/chat/completions?%6Dodel=x', true],
  ['/v1/chat/completions?model[]=x', true],
  ['/v1/chat/completions?a=1;model=x', true],
  ['/v1/chat/completions?+model+=x', true],
  ['/v1/chat/completions?fallbacks=x', true],
  ['/v1/chat/completions?models', true],
  ['/v1/chat/completions?modelx=1&x=model', false],
  ['/v1/chat/completions?%zz=1', false],
];
for (const [target, want] of QUERIES) {
  test(`queryNamesModel(${target}) = ${want}`, () => assert.equal(queryNamesModel(target), want));
}

test('strict scan stays linear on deep nesting and long escapes', () => {
  const deep = `{"model":"a","x":${'['.repeat(5000)}${']'.repeat(5000)}}`;
  assert.equal(inspectJson(Buffer.from(deep)).ok, true);
  const slashes = `{"model":"a","x":"${'\\\\'.repeat(100_000)}"}`;
  const t0 = performance.now();
  assert.equal(inspectJson(Buffer.from(slashes)).ok, true);
  assert.ok(performance.now() - t0 < 2000);
});

test('invalid UTF-8 is refused, not replaced', () => {
  const bad = Buffer.concat([Buffer.from('{"model":"gpt-4o'), Buffer.from([0xff]), Buffer.from('"}')]);
  assert.match((inspectJson(bad) as { message: string }).message, /UTF-8/);
  const overlong = Buffer.concat([Buffer.from('{"model":"a'), Buffer.from([0xc0, 0xaf]), Buffer.from('"}')]);
  assert.equal(inspectJson(overlong).ok, false);
});

test('strict scan is linear in the number of strings (no search past each string)', () => {
  const body = Buffer.from(JSON.stringify({ model: 'a', messages: Array.from({ length: 100_000 }, () => 'x') }));
  const t0 = performance.now();
  assert.equal(inspectJson(body).ok, true);
  assert.ok(performance.now() - t0 < 1500, `${performance.now() - t0} ms`);
});
