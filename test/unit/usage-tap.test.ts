import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import * as zlib from 'node:zlib';
import { estimateTokens } from '../../src/policy/estimate.js';
import { createUsageTap } from '../../src/proxy/usage/tap.js';
import { JSON_CT, SSE_CT, read, sse, tapIn, tapped } from '../helpers/usage-tap.js';
import { lastUsageObject } from '../../src/proxy/usage/scan.js';

// ---- real-shaped payloads -------------------------------------------------------------------

const chatCompletion = {
  id: 'chatcmpl-abc123', object: 'chat.completion', created: 1741569952, model: 'gpt-4.1-2025-04-14',
  choices: [{ index: 0, message: { role: 'assistant', content: 'The "usage" of a word: {"usage": 1}', refusal: null, annotations: [] }, logprobs: null, finish_reason: 'stop' }],
  usage: {
    prompt_tokens: 19, completion_tokens: 10, total_tokens: 29,
    prompt_tokens_details: { cached_tokens: 0, audio_tokens: 0 },
    completion_tokens_details: { reasoning_tokens: 0, audio_tokens: 0, accepted_prediction_tokens: 0, rejected_prediction_tokens: 0 },
  },
  service_tier: 'default', system_fingerprint: 'fp_abc',
};
const completion = {
  id: 'cmpl-uqkvlQyYK7bGYrRHQ0eXlWi7', object: 'text_completion', created: 1589478378, model: 'gpt-3.5-turbo-instruct',
  choices: [{ text: '\n\nThis is indeed a test', index: 0, logprobs: null, finish_reason: 'length' }],
  usage: { prompt_tokens: 5, completion_tokens: 7, total_tokens: 12 },
};
const embeddings = {
  object: 'list',
  data: [{ object: 'embedding', embedding: [0.0023064255, -0.009327292, -0.0028842222], index: 0 }],
  model: 'text-embedding-3-small',
  usage: { prompt_tokens: 8, total_tokens: 8 },
};
const responsesJson = {
  id: 'resp_67ccd2bed1ec8190', object: 'response', created_at: 1741476542, status: 'completed', error: null,
  model: 'gpt-4.1-2025-04-14',
  output: [{ type: 'message', id: 'msg_67ccd2bf', status: 'completed', role: 'assistant', content: [{ type: 'output_text', text: 'Hi.', annotations: [] }] }],
  usage: { input_tokens: 36, input_tokens_details: { cached_tokens: 12 }, output_tokens: 87, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 123 },
  user: null, metadata: {},
};
const messagesJson = {
  id: 'msg_013Zva2CMHLNnXjNJJKqJ2EF', type: 'message', role: 'assistant', model: 'claude-sonnet-4-5',
  content: [{ type: 'text', text: 'Hi! My name is Claude.' }],
  stop_reason: 'end_turn', stop_sequence: null,
  usage: { input_tokens: 2095, cache_creation_input_tokens: 100, cache_read_input_tokens: 1000, output_tokens: 503, service_tier: 'standard' },
};

const chatStream = (withUsage: boolean): string =>
  sse([
    { data: { id: 'chatcmpl-1', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o', choices: [{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }], usage: null } },
    { data: { id: 'chatcmpl-1', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o', choices: [{ index: 0, delta: { content: 'Hello "usage": {' }, finish_reason: null }], usage: null } },
    { data: { id: 'chatcmpl-1', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o', choices: [{ index: 0, delta: {}, finish_reason: 'stop' }], usage: null } },
    ...(withUsage ? [{ data: { id: 'chatcmpl-1', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o', choices: [], usage: { prompt_tokens: 11, completion_tokens: 3, total_tokens: 14 } } }] : []),
    { data: '[DONE]' },
  ]);

const responsesStream = (text = 'Hi'): string =>
  sse([
    { event: 'response.created', data: { type: 'response.created', sequence_number: 0, response: { id: 'resp_1', object: 'response', status: 'in_progress', output: [], usage: null } } },
    { event: 'response.output_text.delta', data: { type: 'response.output_text.delta', sequence_number: 1, item_id: 'msg_1', output_index: 0, content_index: 0, delta: text } },
    {
      event: 'response.completed',
      data: {
        type: 'response.completed', sequence_number: 2,
        response: {
          id: 'resp_1', object: 'response', status: 'completed',
          output: [{ type: 'message', id: 'msg_1', role: 'assistant', content: [{ type: 'output_text', text, annotations: [] }] }],
          usage: { input_tokens: 37, input_tokens_details: { cached_tokens: 0 }, output_tokens: 11, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 48 },
          user: null, metadata: {},
        },
      },
    },
  ]);

const messagesEvents: { event: string; data: unknown }[] = [
  { event: 'message_start', data: { type: 'message_start', message: { id: 'msg_1', type: 'message', role: 'assistant', content: [], model: 'claude-sonnet-4-5', stop_reason: null, stop_sequence: null, usage: { input_tokens: 472, cache_creation_input_tokens: 20, cache_read_input_tokens: 8, output_tokens: 2 } } } },
  { event: 'content_block_start', data: { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } } },
  { event: 'ping', data: { type: 'ping' } },
  { event: 'content_block_delta', data: { type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: 'Hello' } } },
  { event: 'content_block_stop', data: { type: 'content_block_stop', index: 0 } },
  { event: 'message_delta', data: { type: 'message_delta', delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: 8 } } },
  { event: 'message_delta', data: { type: 'message_delta', delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: 15 } } },
  { event: 'message_stop', data: { type: 'message_stop' } },
];

// ---- tests ------------------------------------------------------------------------------------

describe('usage tap: JSON', () => {
  test('chat.completions, completions, embeddings', () => {
    assert.deepEqual(read(JSON.stringify(chatCompletion), { contentType: JSON_CT }), { input_tokens: 19, output_tokens: 10 });
    assert.deepEqual(read(JSON.stringify(completion, null, 2), { contentType: JSON_CT }), { input_tokens: 5, output_tokens: 7 });
    assert.deepEqual(read(JSON.stringify(embeddings), { contentType: 'application/json; charset=utf-8' }), { input_tokens: 8, output_tokens: 0 });
  });

  test('responses API and messages (cache writes and reads count as input)', () => {
    assert.deepEqual(read(JSON.stringify(responsesJson), { contentType: JSON_CT }), { input_tokens: 36, output_tokens: 87 });
    assert.deepEqual(read(JSON.stringify(messagesJson), { contentType: JSON_CT }), { input_tokens: 2095 + 100 + 1000, output_tokens: 503 });
  });

  test('no usage, error bodies and bodies cut short give null', () => {
    assert.equal(read('{"error":{"message":"nope","type":"invalid_request_error"}}', { contentType: JSON_CT }), null);
    const body = JSON.stringify(chatCompletion);
    assert.equal(read(body.slice(0, body.indexOf('"usage"') + 30), { contentType: JSON_CT }), null);
    assert.equal(read('', { contentType: JSON_CT }), null);
  });

  test('a body larger than the kept window is still read from its tail', () => {
    const big = { ...chatCompletion, choices: [{ index: 0, message: { role: 'assistant', content: 'x'.repeat(3 << 20) } }] };
    const body = Buffer.from(JSON.stringify(big));
    assert.deepEqual(tapIn(body, { contentType: JSON_CT }, 65_536).usage, { input_tokens: 19, output_tokens: 10 });
    assert.deepEqual(tapIn(body, { contentType: JSON_CT }, 1_000_003).usage, { input_tokens: 19, output_tokens: 10 });
    const embeds = { ...embeddings, data: Array.from({ length: 2000 }, (_, i) => ({ object: 'embedding', index: i, embedding: Array(200).fill(0.0123456) })) };
    assert.deepEqual(tapIn(JSON.stringify(embeds), { contentType: JSON_CT }, 16_384).usage, { input_tokens: 8, output_tokens: 0 });
  });
});

describe('usage tap: SSE', () => {
  test('chat completions stream with stream_options.include_usage', () => {
    assert.deepEqual(read(chatStream(true), { contentType: SSE_CT }), { input_tokens: 11, output_tokens: 3 });
    assert.deepEqual(read(chatStream(true).replaceAll('\n', '\r\n'), { contentType: SSE_CT }), { input_tokens: 11, output_tokens: 3 });
  });

  test('responses API: response.completed carries response.usage', () => {
    assert.deepEqual(read(responsesStream(), { contentType: SSE_CT }), { input_tokens: 37, output_tokens: 11 });
  });

  test('responses API: a response.completed event larger than the kept window', () => {
    const body = Buffer.from(responsesStream('y'.repeat(2 << 20)));
    assert.deepEqual(tapIn(body, { contentType: SSE_CT }, 65_536).usage, { input_tokens: 37, output_tokens: 11 });
  });

  test('messages: message_start input (with cache) and the last cumulative message_delta output', () => {
    assert.deepEqual(read(sse(messagesEvents), { contentType: SSE_CT }), { input_tokens: 500, output_tokens: 15 });
  });

  test('messages: each count message_delta gives replaces message_start\'s, the others stay (as the official SDK reads them)', () => {
    const events = [...messagesEvents];
    events[6] = { event: 'message_delta', data: { type: 'message_delta', delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { input_tokens: 600, cache_read_input_tokens: 8, output_tokens: 15 } } };
    // 600 + message_start's cache_creation_input_tokens 20 + 8
    assert.deepEqual(read(sse(events), { contentType: SSE_CT }), { input_tokens: 628, output_tokens: 15 });
    // null is no count: message_start's stand (the SDK's types allow null there)
    events[6] = { event: 'message_delta', data: { type: 'message_delta', delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { input_tokens: null, cache_creation_input_tokens: null, cache_read_input_tokens: null, output_tokens: 9 } } };
    assert.deepEqual(read(sse(events), { contentType: SSE_CT }), { input_tokens: 500, output_tokens: 9 });
  });

  test('a stream that opens with a byte order mark is read from its first event', () => {
    const one = sse([{ data: { id: 'chatcmpl-1', object: 'chat.completion.chunk', choices: [], usage: { prompt_tokens: 11, completion_tokens: 3 } } }]);
    assert.deepEqual(read(`\ufeff${one}`, { contentType: SSE_CT }), { input_tokens: 11, output_tokens: 3 });
  });

  test('streams cut short give null, or a messages stream the input its message_start reported', () => {
    assert.equal(read(chatStream(false), { contentType: SSE_CT }), null);
    const cut = sse(messagesEvents.slice(0, 4)); // after message_start, before any message_delta
    const t = tapped(cut, { contentType: SSE_CT });
    assert.equal(t.inputOnly, true);
    assert.equal(t.usage?.input_tokens, 472 + 20 + 8); // message_start's, cache included
    const r = responsesStream();
    assert.equal(read(r.slice(0, r.indexOf('"usage":{"input_tokens"') + 20), { contentType: SSE_CT }), null);
  });

  test('a final event without its blank line still counts when complete', () => {
    const body = chatStream(true).replace(/data: \[DONE\]\n\n$/, '').replace(/\n\n$/, '');
    assert.deepEqual(read(body, { contentType: SSE_CT }), { input_tokens: 11, output_tokens: 3 });
  });
});

describe('usage tap: content-encoding and content types', () => {
  const json = Buffer.from(JSON.stringify(messagesJson));
  const stream = Buffer.from(chatStream(true));

  test('gzip, deflate (zlib and raw) and br are read', () => {
    const want = { input_tokens: 3195, output_tokens: 503 };
    assert.deepEqual(read(zlib.gzipSync(json), { contentType: JSON_CT, contentEncoding: 'gzip' }), want);
    assert.deepEqual(read(zlib.deflateSync(json), { contentType: JSON_CT, contentEncoding: 'deflate' }), want);
    assert.deepEqual(read(zlib.deflateRawSync(json), { contentType: JSON_CT, contentEncoding: 'deflate' }), want);
    assert.deepEqual(read(zlib.brotliCompressSync(json), { contentType: JSON_CT, contentEncoding: 'br' }), want);
    assert.deepEqual(read(zlib.gzipSync(stream), { contentType: SSE_CT, contentEncoding: 'gzip' }), { input_tokens: 11, output_tokens: 3 });
  });

  test('a gzip stream cut short gives what was complete, or null', () => {
    const gz = zlib.gzipSync(stream);
    assert.equal(read(gz.subarray(0, 20), { contentType: SSE_CT, contentEncoding: 'gzip' }), null);
    assert.equal(read(zlib.gzipSync(Buffer.from(chatStream(false))), { contentType: SSE_CT, contentEncoding: 'gzip' }), null);
    assert.equal(read(Buffer.from('not gzip at all'), { contentType: JSON_CT, contentEncoding: 'gzip' }), null);
  });

  test('nothing to read: other content types and unknown encodings', () => {
    assert.equal(createUsageTap({ contentType: 'text/plain' }), null);
    assert.equal(createUsageTap({ contentType: 'audio/mpeg' }), null);
    assert.equal(createUsageTap({}), null);
    assert.equal(createUsageTap({ contentType: JSON_CT, contentEncoding: 'zstd' }), null);
    assert.ok(createUsageTap({ contentType: 'application/vnd.api+json', contentEncoding: 'identity' }));
  });

  test('the tap never alters the bytes it sees', () => {
    const tap = createUsageTap({ contentType: SSE_CT })!;
    const chunk = Buffer.from(chatStream(true));
    const copy = Buffer.from(chunk);
    tap.push(chunk);
    tap.end();
    assert.ok(chunk.equals(copy));
  });
});

test('lastUsageObject skips quoted and malformed occurrences', () => {
  assert.deepEqual(lastUsageObject('{"a":"usage","usage":{"input_tokens":1},"b":"\\"usage\\": {"}'), { input_tokens: 1 });
  assert.equal(lastUsageObject('{"usage": "none"}'), undefined);
  assert.equal(lastUsageObject('"usage": {"input_tokens": 1'), undefined);
});

test('estimateTokens: ceil(bytes / 4) plus the output cap', () => {
  assert.equal(estimateTokens({ bodyBytes: 0, maxOutputTokens: null }), 0);
  assert.equal(estimateTokens({ bodyBytes: 1, maxOutputTokens: null }), 1);
  assert.equal(estimateTokens({ bodyBytes: 400, maxOutputTokens: 1024 }), 1124);
  assert.equal(estimateTokens({ bodyBytes: 401, maxOutputTokens: 0 }), 101);
});
