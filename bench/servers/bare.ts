/**
 * The baseline: a bare http-proxy-3 pass-through with the same keep-alive pool settings and
 * server timeouts keyward uses (src/proxy/upstream/agent.ts, src/app/sidecar.ts), and nothing
 * else: no routing, credentials, limits, body reads, usage tap or logging. Only what
 * http-proxy-3 and Node document: createProxyServer, web() with per-call options (target,
 * agent) and its error callback, close(); a plain http.Agent.
 *   node --import tsx bench/servers/bare.ts <upstream url> [extra µs] [parts]
 * `extra µs` (bench/headroom.ts): each request first spins the event loop for that long, a
 * known amount of main-thread work added to a proxy that does nothing else.
 * `parts` (bench/instructions.ts), comma-separated, each one of keyward's forwarding choices
 * added to the bare proxy alone: `agent` (keyward's upstream agent, src/proxy/upstream/agent.ts,
 * with its default upstream timeout) and `lines` (the outgoing header object rebuilt from the
 * raw lines before the `stream` pass, as src/proxy/upstream/forward.ts does).
 */
import http, { createServer } from 'node:http';
import { createProxyServer } from 'http-proxy-3';
import { createUpstreamAgent } from '../../src/proxy/upstream/agent.js';
import { outgoingHeaders } from '../../src/proxy/upstream/header-lines.js';
import { serveForParent } from './common.js';

const target = new URL(process.argv[2] ?? 'http://127.0.0.1:4000');
const extraMs = Number(process.argv[3] ?? 0) / 1000;
const parts = new Set((process.argv[4] ?? '').split(',').filter(Boolean));
const agent = parts.has('agent')
  ? createUpstreamAgent({ tls: false, timeoutMs: 600_000 })
  : new http.Agent({ keepAlive: true, keepAliveMsecs: 1000, maxSockets: Infinity, maxFreeSockets: 256, scheduling: 'lifo' });
const proxy = createProxyServer({ xfwd: false, changeOrigin: false, ws: false });
if (parts.has('lines')) {
  proxy.before('web', 'stream', (req) => {
    req.headers = outgoingHeaders(req.rawHeaders, { known: Object.keys(req.headers) });
  });
}

const server = createServer({ keepAliveTimeout: 65_000, requestTimeout: 0, headersTimeout: 60_000 }, (req, res) => {
  if (extraMs > 0) for (const until = performance.now() + extraMs; performance.now() < until; );
  proxy.web(req, res, { target, agent }, () => {
    if (res.headersSent) return void res.destroy();
    res.writeHead(502, { 'content-type': 'application/json' });
    res.end('{"error":"upstream"}');
  });
});
serveForParent(server, () => {
  agent.destroy();
  proxy.close();
});
