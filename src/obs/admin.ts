/**
 * The admin listener (DESIGN section 9): /healthz, /readyz, /metrics. Never on the
 * proxy port, so a route table mistake cannot expose it.
 */
import { createServer, type Server } from 'node:http';
import type { Exposition } from './metrics.js';

export interface AdminOptions {
  host: string;
  port: number;
  /** what /metrics serves: this process's metrics, or the cluster primary's sum of its workers' */
  exposition: Exposition;
  /** null when ready, else why not (replica never synced, draining) */
  notReadyReason: () => string | null;
}

export interface AdminServer {
  server: Server;
  port: number;
  close(): Promise<void>;
}

function send(res: import('node:http').ServerResponse, status: number, body: string, type = 'application/json') {
  res.writeHead(status, { 'content-type': type, 'content-length': Buffer.byteLength(body), 'cache-control': 'no-store' });
  res.end(body);
}

export async function startAdmin(opts: AdminOptions): Promise<AdminServer> {
  const server = createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    if (req.method !== 'GET' && req.method !== 'HEAD') return send(res, 405, '{"error":"method not allowed"}');
    if (path === '/healthz') return send(res, 200, '{"status":"ok"}');
    if (path === '/readyz') {
      const reason = opts.notReadyReason();
      return reason === null ? send(res, 200, '{"status":"ready"}') : send(res, 503, JSON.stringify({ status: 'not_ready', reason }));
    }
    if (path === '/metrics') {
      opts.exposition.metrics().then(
        (text) => send(res, 200, text, opts.exposition.contentType),
        (err: Error) => send(res, 500, JSON.stringify({ error: err.message })),
      );
      return;
    }
    send(res, 404, '{"error":"not found"}');
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port, opts.host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const addr = server.address();
  return {
    server,
    port: typeof addr === 'object' && addr ? addr.port : opts.port,
    close: () => closeAdmin(server),
  };
}

/** How long a request in flight on the admin port (a scrape) may take once it closes. */
const ADMIN_CLOSE_MS = 1000;

/**
 * Stops listening and ends every connection: idle ones at once, the rest after
 * ADMIN_CLOSE_MS. `server.close()` alone waits for each kept-alive or half-sent connection
 * (Node stops timing them out once it closes), so one idle client would hold the exit.
 */
function closeAdmin(server: Server): Promise<void> {
  return new Promise<void>((resolve) => {
    const cut = setTimeout(() => server.closeAllConnections(), ADMIN_CLOSE_MS).unref();
    server.close(() => {
      clearTimeout(cut);
      resolve();
    });
    server.closeIdleConnections();
  });
}
