/**
 * A pass-through in front of a real console that records every usage event the console
 * acknowledged, with its arrival time, and can go away and come back on the same port: to
 * the sidecars behind it, that is the console's outage (connections refused), while the
 * console itself keeps its state.
 */
import http, { type Server } from 'node:http';
import { once } from 'node:events';

export interface Delivery {
  requestId: string;
  /** performance.now() when the console answered the batch */
  at: number;
}

export interface ConsoleFront {
  url: string;
  deliveries: Delivery[];
  /** performance.now() of each usage POST's arrival */
  posts: number[];
  down(): Promise<void>;
  up(): Promise<void>;
  close(): Promise<void>;
}

export async function startConsoleFront(target: string): Promise<ConsoleFront> {
  const t = new URL(target);
  const deliveries: Delivery[] = [];
  const posts: number[] = [];
  const makeServer = (): Server =>
    http.createServer((req, res) => {
      const isUsage = req.method === 'POST' && req.url?.startsWith('/sync/v1/usage');
      if (isUsage) posts.push(performance.now());
      const chunks: Buffer[] = [];
      const out = http.request({ host: t.hostname, port: t.port, method: req.method, path: req.url, headers: req.headers }, (pr) => {
        res.writeHead(pr.statusCode ?? 502, pr.headers);
        pr.pipe(res);
        if (isUsage && pr.statusCode === 200) {
          pr.once('end', () => {
            const at = performance.now();
            for (const line of Buffer.concat(chunks).toString('utf8').split('\n').filter(Boolean)) {
              deliveries.push({ requestId: (JSON.parse(line) as { request_id: string }).request_id, at });
            }
          });
        }
      });
      out.on('error', () => res.destroy());
      req.on('data', (c: Buffer) => isUsage && chunks.push(c));
      req.pipe(out);
      res.once('close', () => out.destroy());
    });
  let server = makeServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const port = (server.address() as { port: number }).port;
  let isUp = true;
  const down = async (): Promise<void> => {
    if (!isUp) return;
    isUp = false;
    const closed = new Promise<void>((r) => server.close(() => r()));
    server.closeAllConnections();
    await closed;
  };
  return {
    url: `http://127.0.0.1:${port}`,
    deliveries,
    posts,
    down,
    async up() {
      if (isUp) return;
      server = makeServer();
      server.listen(port, '127.0.0.1');
      await once(server, 'listening');
      isUp = true;
    },
    close: down,
  };
}
