/**
 * What the usage tap bills when a response reports no usage (DESIGN section 6): the generated
 * text the estimate counts, reasoning included, and the bound on what a compressed response
 * may hold in memory (past it the response is unreadable and billed the whole reservation).
 * Kept apart from usage-tap.test.ts, which is long enough.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as zlib from 'node:zlib';
import { randomBytes } from 'node:crypto';
import { JSON_CT, tapIn } from '../helpers/usage-tap.js';

const sse = (events: unknown[]): string => events.map((e) => `data: ${JSON.stringify(e)}\n\n`).join('') + 'data: [DONE]\n\n';

// Reasoning models send their thinking as `reasoning_content` (or `reasoning`): it is
// generated output, so a stream that never reports usage must still be billed for it.
test('a chat stream without usage: every kind of generated delta counts, reasoning_content and reasoning included', () => {
  const stream = sse([
    { choices: [{ index: 0, delta: { role: 'assistant', reasoning_content: 'r'.repeat(120) } }] },
    { choices: [{ index: 0, delta: { reasoning: 'q'.repeat(30) } }] },
    { choices: [{ index: 0, delta: { content: 'c'.repeat(40) } }] },
    { choices: [{ index: 0, delta: { refusal: 'n'.repeat(5) } }] },
    { choices: [{ index: 0, delta: { tool_calls: [{ index: 0, function: { arguments: 'a'.repeat(7) } }] } }] },
  ]);
  assert.deepEqual(tapIn(stream, { contentType: 'text/event-stream' }), { usage: null, textChars: 120 + 30 + 40 + 5 + 7 });
});

test('a whole chat response without usage counts its reasoning_content', () => {
  const body = JSON.stringify({ choices: [{ message: { role: 'assistant', content: 'c'.repeat(10), reasoning_content: 'r'.repeat(90) } }] });
  assert.deepEqual(tapIn(body, { contentType: JSON_CT }), { usage: null, textChars: 100 });
});

// The tap keeps a compressed body (at most 1 MiB of it) to inflate at the end: past that it
// must give up rather than hold an unbounded response in memory.
test('a compressed response past the 1 MiB bound is unreadable, even with usage at its end', () => {
  // random text does not compress, so the gzip body itself is past 1 MiB
  const filler = randomBytes(1100 * 1024).toString('base64');
  const usage = { prompt_tokens: 3, completion_tokens: 4 };
  const gz = zlib.gzipSync(JSON.stringify({ choices: [{ message: { content: filler } }], usage }));
  assert.ok(gz.length > 1 << 20, `compressed ${gz.length} bytes`);
  assert.deepEqual(tapIn(gz, { contentType: JSON_CT, contentEncoding: 'gzip' }), { usage: null, textChars: null });
  // the same shape within the bound is read
  const small = zlib.gzipSync(JSON.stringify({ choices: [{ message: { content: 'hi' } }], usage }));
  assert.deepEqual(tapIn(small, { contentType: JSON_CT, contentEncoding: 'gzip' }).usage, { input_tokens: 3, output_tokens: 4 });
});

test('a JSON body whose usage names no output figure, beside generated text: the text is counted (embeddings hold none)', () => {
  const chat = JSON.stringify({ choices: [{ message: { content: 'Forty characters of generated text here.' } }], usage: { prompt_tokens: 5, total_tokens: 10005 } });
  assert.deepEqual(tapIn(chat, { contentType: JSON_CT }), { usage: { input_tokens: 5, output_tokens: 0 }, textChars: 40 });
  const messages = JSON.stringify({ content: [{ type: 'text', text: 'abcdefgh' }], usage: { input_tokens: 5 } });
  assert.deepEqual(tapIn(messages, { contentType: JSON_CT }), { usage: { input_tokens: 5, output_tokens: 0 }, textChars: 8 });
});
