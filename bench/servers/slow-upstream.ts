/**
 * The memory benchmark's upstream.
 *   POST /v1/chat/completions  with `"stream":true` in the body: an SSE stream that sends one
 *                              event at once, then one every second, and never ends by itself
 *                              (streams stay open until the client goes away); else a small
 *                              JSON completion.
 *   POST /v1/files             reads and discards the body, answers {"bytes": <received>}.
 */
import { createServer } from 'node:http';
import { serveForParent } from './common.js';

const event = 'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n';

const completion = Buffer.from(JSON.stringify({ id: 'chatcmpl-bench', object: 'chat.completion', choices: [{ index: 0, message: { role: 'assistant', content: 'hi' } }], usage: { prompt_tokens: 5, completion_tokens: 1, total_tokens: 6 } }));

const server = createServer({ keepAliveTimeout: 65_000, requestTimeout: 0, headersTimeout: 60_000 }, (req, res) => {
  let bytes = 0;
  let head = '';
  req.on('data', (c: Buffer) => {
    bytes += c.length;
    if (head.length < 4096) head += c.toString('latin1');
  });
  req.on('end', () => {
    if (req.url?.startsWith('/v1/files')) {
      const body = JSON.stringify({ bytes });
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
      res.end(body);
      return;
    }
    if (!head.includes('"stream":true')) {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': completion.length });
      res.end(completion);
      return;
    }
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
    res.write(event);
    const timer = setInterval(() => res.write(event), 1_000);
    res.on('close', () => clearInterval(timer));
  });
});
serveForParent(server);
