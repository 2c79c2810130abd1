/**
 * A small sample upstream for the demo and the benchmark: answers the listing, chat
 * completions (JSON and SSE, with usage), messages, count_tokens and files the way a
 * model gateway would. Every answer says it comes from the demo upstream.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';

function json(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

function readBody(req: IncomingMessage): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => resolve(Buffer.concat(chunks)));
    req.on('error', reject);
  });
}

function parse(buf: Buffer): Record<string, unknown> {
  try {
    const v: unknown = JSON.parse(buf.toString('utf8'));
    return v && typeof v === 'object' ? (v as Record<string, unknown>) : {};
  } catch {
    return {};
  }
}

const TEXT = 'Hello from the keyward demo upstream.';

function chat(res: ServerResponse, body: Record<string, unknown>, promptTokens: number): void {
  const model = String(body.model ?? 'demo-model');
  const usage = { prompt_tokens: promptTokens, completion_tokens: 8, total_tokens: promptTokens + 8 };
  if (body.stream !== true) {
    json(res, 200, {
      id: 'chatcmpl-demo', object: 'chat.completion', created: 0, model,
      choices: [{ index: 0, message: { role: 'assistant', content: TEXT }, finish_reason: 'stop' }],
      usage,
    });
    return;
  }
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  const base = { id: 'chatcmpl-demo', object: 'chat.completion.chunk', created: 0, model };
  for (const word of TEXT.split(' ')) {
    res.write(`data: ${JSON.stringify({ ...base, choices: [{ index: 0, delta: { content: `${word} ` }, finish_reason: null }] })}\n\n`);
  }
  res.write(`data: ${JSON.stringify({ ...base, choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] })}\n\n`);
  res.write(`data: ${JSON.stringify({ ...base, choices: [], usage })}\n\n`);
  res.end('data: [DONE]\n\n');
}

function messages(res: ServerResponse, body: Record<string, unknown>, inputTokens: number): void {
  const model = String(body.model ?? 'demo-model');
  const message = { id: 'msg_demo', type: 'message', role: 'assistant', model, stop_reason: 'end_turn', stop_sequence: null };
  if (body.stream !== true) {
    json(res, 200, { ...message, content: [{ type: 'text', text: TEXT }], usage: { input_tokens: inputTokens, output_tokens: 8 } });
    return;
  }
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  const ev = (type: string, data: unknown) => res.write(`event: ${type}\ndata: ${JSON.stringify(data)}\n\n`);
  ev('message_start', { type: 'message_start', message: { ...message, content: [], stop_reason: null, usage: { input_tokens: inputTokens, output_tokens: 1 } } });
  ev('content_block_start', { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } });
  ev('content_block_delta', { type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: TEXT } });
  ev('content_block_stop', { type: 'content_block_stop', index: 0 });
  ev('message_delta', { type: 'message_delta', delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: 8 } });
  ev('message_stop', { type: 'message_stop' });
  res.end();
}

export async function handleDemo(req: IncomingMessage, res: ServerResponse): Promise<void> {
  const buf = await readBody(req);
  const path = (req.url ?? '/').split('?')[0]!;
  const body = parse(buf);
  const tokens = Math.max(1, Math.ceil(buf.length / 4));
  if (path === '/v1/models') return json(res, 200, { object: 'list', data: [{ id: 'demo-model', object: 'model', created: 0, owned_by: 'demo-upstream' }] });
  if (path.startsWith('/v1/models/')) return json(res, 200, { id: path.slice(11), object: 'model', created: 0, owned_by: 'demo-upstream' });
  if (path === '/v1/chat/completions') return chat(res, body, tokens);
  if (path === '/v1/messages') return messages(res, body, tokens);
  if (path === '/v1/messages/count_tokens') return json(res, 200, { input_tokens: tokens });
  if (path === '/v1/files' && req.method === 'POST') {
    return json(res, 200, { id: 'file-demo', object: 'file', bytes: buf.length, created_at: 0, filename: 'upload', purpose: 'assistants', status: 'processed' });
  }
  json(res, 404, { error: { message: `demo upstream has no ${path}`, type: 'invalid_request_error', code: 'not_found' } });
}

export async function startDemoUpstream(opts: { host?: string; port?: number } = {}): Promise<{ server: Server; url: string; close(): Promise<void> }> {
  const server = createServer((req, res) => {
    handleDemo(req, res).catch(() => res.destroy());
  });
  server.keepAliveTimeout = 65_000;
  const host = opts.host ?? '127.0.0.1';
  await new Promise<void>((resolve) => server.listen(opts.port ?? 0, host, resolve));
  const addr = server.address();
  const port = typeof addr === 'object' && addr ? addr.port : 0;
  return {
    server,
    url: `http://${host}:${port}`,
    close: () => new Promise<void>((resolve) => {
      server.closeAllConnections();
      server.close(() => resolve());
    }),
  };
}
