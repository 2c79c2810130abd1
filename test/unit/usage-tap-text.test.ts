/**
 * The usage tap's count of generated text, which bills responses that report no usage
 * (DESIGN section 6), and usage figures that are no count.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { JSON_CT, SSE_CT, read, sse, tapIn, tapped } from '../helpers/usage-tap.js';

describe('generated text seen, for responses that report no usage', () => {
  test('chat stream deltas (content, tool-call arguments), no usage chunk', () => {
    const body = sse([
      { data: { object: 'chat.completion.chunk', choices: [{ delta: { role: 'assistant', content: 'Hello' } }] } },
      { data: { object: 'chat.completion.chunk', choices: [{ delta: { content: ', world' } }] } },
      { data: { object: 'chat.completion.chunk', choices: [{ delta: { tool_calls: [{ function: { arguments: '{"a":1}' } }] } }] } },
      { data: '[DONE]' },
    ]);
    assert.deepEqual(tapped(body, { contentType: SSE_CT }), { usage: null, textChars: 12 + 7 });
  });

  test('reasoning deltas (`delta.reasoning`) and transcription deltas count', () => {
    const chat = sse([{ data: { object: 'chat.completion.chunk', choices: [{ delta: { reasoning: 'Let me think' } }] } }, { data: '[DONE]' }]);
    assert.deepEqual(tapped(chat, { contentType: SSE_CT }), { usage: null, textChars: 12 });
    const transcript = sse([{ data: { type: 'transcript.text.delta', delta: 'Hello there' } }]);
    assert.deepEqual(tapped(transcript, { contentType: SSE_CT }), { usage: null, textChars: 11 });
  });

  test('a JSON body reporting zero output: its text is counted too (billing holds the two together)', () => {
    const body = JSON.stringify({ choices: [{ message: { content: 'Forty characters of generated text here.' } }], usage: { prompt_tokens: 11, completion_tokens: 0 } });
    assert.deepEqual(tapped(body, { contentType: 'application/json' }), { usage: { input_tokens: 11, output_tokens: 0 }, textChars: 40 });
    // a usage that names no output (embeddings) is not a zero to check: the body is not parsed
    const embeddings = JSON.stringify({ object: 'list', data: [{ embedding: [0.1, 0.2] }], usage: { prompt_tokens: 8, total_tokens: 8 } });
    assert.deepEqual(tapped(embeddings, { contentType: 'application/json' }), { usage: { input_tokens: 8, output_tokens: 0 }, textChars: null });
  });

  test('messages stream: text deltas count, the start and stop events do not; cut before message_delta', () => {
    const body = sse([
      { event: 'message_start', data: { type: 'message_start', message: { content: [], usage: { input_tokens: 9, output_tokens: 1 } } } },
      { event: 'content_block_delta', data: { type: 'content_block_delta', delta: { type: 'text_delta', text: 'abcd' } } },
      { event: 'content_block_delta', data: { type: 'content_block_delta', delta: { type: 'input_json_delta', partial_json: '{"x"' } } },
    ]);
    assert.deepEqual(tapped(body, { contentType: SSE_CT }), { usage: { input_tokens: 9, output_tokens: 1 }, textChars: 8, inputOnly: true });
  });

  test('SSE lines may end in CR alone, or CRLF, split anywhere: the same events are read', () => {
    const events = [
      { data: { object: 'chat.completion.chunk', choices: [{ delta: { content: 'Hello' } }] } },
      { data: { object: 'chat.completion.chunk', choices: [], usage: { prompt_tokens: 5000, completion_tokens: 10000 } } },
      { data: '[DONE]' },
    ];
    const want = { usage: { input_tokens: 5000, output_tokens: 10000 }, textChars: 5 };
    // tapped() also feeds it byte by byte: a CRLF split between two chunks is one line end
    for (const eol of ['\n', '\r', '\r\n']) assert.deepEqual(tapped(sse(events, eol), { contentType: SSE_CT }), want, JSON.stringify(eol));
  });

  test('responses stream: deltas count once, the done events that repeat them do not', () => {
    const body = sse([
      { data: { type: 'response.output_text.delta', delta: 'abc' } },
      { data: { type: 'response.output_text.delta', delta: 'de' } },
      { data: { type: 'response.output_text.done', text: 'abcde' } },
    ]);
    assert.equal(tapped(body, { contentType: SSE_CT }).textChars, 5);
  });

  test('whole JSON bodies: chat, messages, responses, transcription', () => {
    const chat = { choices: [{ message: { content: 'four' } }] };
    const messages = { content: [{ type: 'text', text: 'six 66' }, { type: 'tool_use', input: { q: 1 } }] };
    const responses = { output: [{ content: [{ type: 'output_text', text: 'xyz' }] }, { type: 'function_call', arguments: '{}' }] };
    assert.deepEqual(tapped(JSON.stringify(chat), { contentType: JSON_CT }), { usage: null, textChars: 4 });
    assert.equal(tapped(JSON.stringify(messages), { contentType: JSON_CT }).textChars, 6 + JSON.stringify({ q: 1 }).length);
    assert.equal(tapped(JSON.stringify(responses), { contentType: JSON_CT }).textChars, 5);
    assert.equal(tapped(JSON.stringify({ text: 'hello there' }), { contentType: JSON_CT }).textChars, 11);
  });

  test('an SSE event too large to keep, with no usage, cannot be read: null, not the text of the other events', () => {
    const small = `data: ${JSON.stringify({ object: 'chat.completion.chunk', choices: [{ delta: { content: 'Hi' } }] })}\n\n`;
    const huge = `data: ${JSON.stringify({ object: 'chat.completion.chunk', choices: [{ delta: { content: 'x'.repeat(2 << 20) } }] })}\n\n`;
    assert.equal(tapIn(small + huge, { contentType: SSE_CT }, 65_536).textChars, null);
    // one endless data line, never ended
    assert.equal(tapIn(`data: "${'y'.repeat(3 << 20)}`, { contentType: SSE_CT }, 65_536).textChars, null);
    // past the bounds with its usage in the tail: billed by that usage
    const withUsage = `data: ${JSON.stringify({ choices: [{ delta: { content: 'z'.repeat(2 << 20) } }], usage: { prompt_tokens: 3, completion_tokens: 4 } })}\n\n`;
    assert.deepEqual(tapIn(withUsage, { contentType: SSE_CT }, 65_536).usage, { input_tokens: 3, output_tokens: 4 });
    // small events only: their text, as before
    assert.equal(tapIn(small + 'data: [DONE]\n\n', { contentType: SSE_CT }, 7).textChars, 2);
  });

  test('a JSON body cut short, or too large to keep, cannot be read: null, not zero', () => {
    assert.equal(tapped('{"choices":[{"message":{"content":"ab', { contentType: JSON_CT }).textChars, null);
    const huge = JSON.stringify({ choices: [{ message: { content: 'x'.repeat(2 << 20) } }] });
    assert.equal(tapIn(huge, { contentType: JSON_CT }, 65_536).textChars, null);
  });
});

test('usage the console would refuse (fractional, huge) is read as whole, bounded tokens', async () => {
  const { usageEvent } = await import('../../src/protocol/usage.js');
  for (const usage of [{ prompt_tokens: 1.5, completion_tokens: 2.2 }, { input_tokens: 1e300, output_tokens: 1e300, cache_read_input_tokens: 1e300 }]) {
    const got = tapIn(JSON.stringify({ usage }), { contentType: JSON_CT }, 1 << 20).usage!;
    const event = { request_id: 'r', key_id: 'k_1', model: 'm', input_tokens: got.input_tokens, output_tokens: got.output_tokens, status: 200, at: new Date().toISOString() };
    assert.ok(usageEvent.safeParse(event).success, JSON.stringify(got));
  }
  assert.deepEqual(tapIn(JSON.stringify({ usage: { prompt_tokens: 1.5, completion_tokens: 2.2 } }), { contentType: JSON_CT }, 3).usage, { input_tokens: 2, output_tokens: 3 });
});

test('a usage object with a figure that is not a count (negative, a string, 1e400) is no report: the estimate bills it', () => {
  const bad = [
    '{"usage":{"prompt_tokens":-10,"completion_tokens":-20}}',
    '{"usage":{"prompt_tokens":"400","completion_tokens":20}}',
    '{"usage":{"prompt_tokens":1e400,"completion_tokens":1}}',
    '{"usage":{"input_tokens":10,"output_tokens":"NaN"}}',
  ];
  for (const body of bad) assert.equal(read(body, { contentType: JSON_CT }), null, body);
  assert.equal(read('data: {"choices":[],"usage":{"prompt_tokens":-1,"completion_tokens":5}}\n\ndata: [DONE]\n\n', { contentType: SSE_CT }), null, 'SSE');
  const messages = (out: string) =>
    `event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":12,"output_tokens":1}}}\n\nevent: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":${out}}}\n\n`;
  assert.equal(read(messages('"many"'), { contentType: SSE_CT }), null, 'a messages stream\'s final count');
  assert.deepEqual(read(messages('30'), { contentType: SSE_CT }), { input_tokens: 12, output_tokens: 30 });
  // Left out or null is none (Anthropic's cache fields are often null), and 0 is a count.
  assert.deepEqual(read('{"usage":{"input_tokens":10,"output_tokens":0,"cache_creation_input_tokens":null}}', { contentType: JSON_CT }), { input_tokens: 10, output_tokens: 0 });
  assert.deepEqual(read('{"usage":{"completion_tokens":7}}', { contentType: JSON_CT }), { input_tokens: 0, output_tokens: 7 });
});
