import assert from 'node:assert/strict';
import { test } from 'node:test';
import { topLevelSpans } from '../../src/proxy/usage/scan.js';
import { createUsageTap, type Usage } from '../../src/proxy/usage/tap.js';

const spanText = (body: string, which: 'usage' | 'response'): string | null => {
  const buf = Buffer.from(body);
  const spans = topLevelSpans(buf);
  assert.ok(spans, `spans of ${body}`);
  const s = spans[which]; // byte offsets
  return s === null ? null : buf.toString('utf8', s[0], s[1]).trim();
};

test('topLevelSpans: the last top-level usage and response values, nested and quoted ones ignored', () => {
  const body = JSON.stringify({
    choices: [{ message: { content: 'a "usage": {"prompt_tokens": 99} in text', usage: { prompt_tokens: 98 } } }],
    meta: { usage: { prompt_tokens: 97 } },
    usage: { prompt_tokens: 1, completion_tokens: 2 },
  });
  assert.equal(spanText(body, 'usage'), '{"prompt_tokens":1,"completion_tokens":2}');
  assert.equal(spanText(body, 'response'), null);
  // JSON.parse keeps the last of duplicate keys, and so does the scan
  assert.equal(spanText('{"usage": {"a":1}, "x": [1, {"usage": 3}], "usage" : null }', 'usage'), 'null');
  assert.equal(spanText('{"usage":5}', 'usage'), '5');
  assert.equal(spanText(' {"type":"response","response":{"id":"r","usage":{"input_tokens":3}}}\n', 'response'), '{"id":"r","usage":{"input_tokens":3}}');
  assert.equal(spanText('{"a":"b\\\\","usage":{"x":"}"}}', 'usage'), '{"x":"}"}');
});

test('topLevelSpans: null for anything but one whole object, and for escaped top-level keys', () => {
  for (const body of [
    '{"usage":{"prompt_tokens":1}', // cut short
    '{"choices":[{"text":"ab', // cut inside a string
    '{"usage":{"prompt_tokens":1]}', // mismatched brackets
    '{"usage":{"prompt_tokens":1}} x', // something after the object
    '[{"usage":{"prompt_tokens":1}}]', // not an object
    '\ufeff{"usage":{}}', // a byte order mark: JSON.parse refuses it too
    '{"us\\u0061ge":{"prompt_tokens":1}}', // an escape could spell the key
    '',
  ]) {
    assert.equal(topLevelSpans(Buffer.from(body)), null, body);
  }
});

test('topLevelSpans: brackets nested to 31 deep are walked and matched; deeper, it declines and the tap parses the body whole', () => {
  /** `inner` inside `depth` brackets, arrays and objects in turn */
  const nest = (depth: number, inner: string): string => {
    let v = inner;
    for (let d = 0; d < depth; d++) v = d % 2 ? `[${v}]` : `{"k":${v}}`;
    return v;
  };
  // `usage` after a value 31 brackets deep, the outer object's included
  const deepest = `{"a":${nest(30, '1')},"usage":{"prompt_tokens":4}}`;
  assert.equal(spanText(deepest, 'usage'), '{"prompt_tokens":4}');
  const tooDeep = `{"a":${nest(31, '1')},"usage":{"prompt_tokens":4}}`;
  assert.equal(topLevelSpans(Buffer.from(tooDeep)), null);
  const tap = createUsageTap({ contentType: 'application/json' })!;
  tap.push(Buffer.from(tooDeep));
  assert.deepEqual(tap.end().usage, { input_tokens: 4, output_tokens: 0 });
  // a wrong closing bracket is caught at every depth, the deepest included
  for (const depth of [2, 17, 30]) {
    const good = `{"a":${nest(depth, '1')}}`;
    assert.ok(topLevelSpans(Buffer.from(good)), good);
    const at = good.indexOf('1') + 1; // the innermost closing bracket
    const swapped = good.slice(0, at) + (good[at] === ']' ? '}' : ']') + good.slice(at + 1);
    assert.equal(topLevelSpans(Buffer.from(swapped)), null, swapped);
  }
});

/**
 * The usage the tap reads by parsing the body whole, as it did before the scan: an escaped
 * top-level key (`"\u0078"`, an extra "x") makes the scan decline, and changes no usage.
 */
function parsedUsage(body: string): Usage | null {
  const tap = createUsageTap({ contentType: 'application/json' })!;
  assert.equal(body[0], '{');
  const declined = `{"\\u0078":0,${body.slice(1)}`;
  assert.equal(topLevelSpans(Buffer.from(declined)), null);
  tap.push(Buffer.from(declined));
  return tap.end().usage;
}

test('the JSON tap reads the same usage with the scan as a full parse does', () => {
  const bodies = [
    { usage: { prompt_tokens: 12, completion_tokens: 3, total_tokens: 15 }, choices: [{ message: { content: 'Hello!' } }] },
    { type: 'message', content: [{ type: 'text', text: 'hi' }], usage: { input_tokens: 5, cache_read_input_tokens: 2, output_tokens: 4 } },
    { object: 'response', response: { usage: { input_tokens: 9, output_tokens: 1 } } },
    { response: { usage: { input_tokens: 9, output_tokens: 1 } }, usage: { input_tokens: 1, output_tokens: 1 } },
    { response: 'text', usage: null },
    { usage: { prompt_tokens: 2.5, completion_tokens: -1 } },
    { usage: 'none', choices: [{ text: 'abc' }] },
    { nested: { usage: { prompt_tokens: 7 } } },
    { 'ünïcode "key"': '\u2028', usage: { prompt_tokens: 1, completion_tokens: 1 } },
  ].map((b) => JSON.stringify(b, null, 1));
  for (const body of bodies) {
    const tap = createUsageTap({ contentType: 'application/json' })!;
    tap.push(Buffer.from(body));
    assert.deepEqual(tap.end().usage, parsedUsage(body), body);
  }
});

test('a whole JSON body that reports usage is billed by it: its text is not counted', () => {
  const tap = createUsageTap({ contentType: 'application/json' })!;
  tap.push(Buffer.from('{"choices":[{"message":{"content":"Hello!"}}],"usage":{"prompt_tokens":12,"completion_tokens":3}}'));
  assert.deepEqual(tap.end(), { usage: { input_tokens: 12, output_tokens: 3 }, textChars: null });
});

test('topLevelSpans: strings of every length around the byte walk, with escapes and quotes at each position, end where JSON.parse says', () => {
  // JSON.stringify writes each with its escapes: backslashes land on every side of the walk's end
  const pieces = ['\\', '"', '\\"', '}', '"usage":{"x":1}', 'é', '\n'];
  for (let len = 0; len <= 80; len++) {
    for (const piece of pieces) {
      for (let at = Math.max(0, len - 40); at <= len; at += 3) {
        const text = `${'a'.repeat(at)}${piece}${'b'.repeat(len - at)}`;
        const body = JSON.stringify({ id: text, usage: { prompt_tokens: len, completion_tokens: at } });
        assert.equal(spanText(body, 'usage'), `{"prompt_tokens":${len},"completion_tokens":${at}}`, body);
        // the same string cut short: no closing quote anywhere
        assert.equal(topLevelSpans(Buffer.from(body.slice(0, body.indexOf(',"usage"') - 1))), null, body);
      }
    }
  }
});
