/**
 * Fake-upstream handlers that answer the way the OpenAI and Messages APIs do, from the
 * body the fake upstream already read: enough for the official SDKs to parse a reply.
 */
import type { Handler } from './upstream.js';

function json(res: Parameters<Handler>[1], status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

/** chat.completions (non-streaming), files.create, and messages; anything else 404. */
export const apiLike: Handler = (req, res, rec) => {
  const path = rec.url.split('?')[0]!;
  if (req.method === 'POST' && path === '/v1/chat/completions') {
    const body = JSON.parse(rec.body.toString('utf8')) as { model: string };
    const prompt = Math.ceil(rec.body.length / 4);
    return json(res, 200, {
      id: 'chatcmpl-e2e', object: 'chat.completion', created: 1, model: body.model,
      choices: [{ index: 0, message: { role: 'assistant', content: 'ok', refusal: null }, finish_reason: 'stop', logprobs: null }],
      usage: { prompt_tokens: prompt, completion_tokens: 2, total_tokens: prompt + 2 },
    });
  }
  if (req.method === 'POST' && path === '/v1/messages') {
    const body = JSON.parse(rec.body.toString('utf8')) as { model: string };
    return json(res, 200, {
      id: 'msg_e2e', type: 'message', role: 'assistant', model: body.model, stop_sequence: null,
      content: [{ type: 'text', text: 'ok' }], stop_reason: 'end_turn',
      usage: { input_tokens: Math.ceil(rec.body.length / 4), output_tokens: 2, cache_creation_input_tokens: 0, cache_read_input_tokens: 0 },
    });
  }
  if (req.method === 'POST' && path === '/v1/files') {
    return json(res, 200, { id: 'file-e2e', object: 'file', bytes: rec.body.length, created_at: 1, filename: 'upload.bin', purpose: 'assistants', status: 'processed' });
  }
  json(res, 404, { error: { message: `no ${path} here`, type: 'invalid_request_error', code: null, param: null } });
};
