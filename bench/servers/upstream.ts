/**
 * The benchmark's upstream: as little work as a server can do per request. Reads the
 * body, answers a small chat.completion JSON with usage, keeps the connection alive.
 */
import { createServer } from 'node:http';
import { serveForParent } from './common.js';

const body = Buffer.from(
  JSON.stringify({
    id: 'chatcmpl-bench', object: 'chat.completion', created: 0, model: 'gpt-4o-mini',
    choices: [{ index: 0, message: { role: 'assistant', content: 'Hello!' }, finish_reason: 'stop' }],
    usage: { prompt_tokens: 12, completion_tokens: 3, total_tokens: 15 },
  }),
);
const headers = { 'content-type': 'application/json', 'content-length': String(body.length) };

const server = createServer({ keepAliveTimeout: 65_000, requestTimeout: 0, headersTimeout: 60_000 }, (req, res) => {
  req.on('data', () => undefined);
  req.on('end', () => {
    res.writeHead(200, headers);
    res.end(body);
  });
});
serveForParent(server);
