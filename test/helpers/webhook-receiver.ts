/**
 * A local webhook receiver for budget alerts: an HTTP server on port 0 that records every
 * POST (body bytes as received, headers, the status it answered, when it arrived) and can
 * fail the next N deliveries with 500 or leave every one unanswered (a dead webhook). By
 * default it answers 204; `status` (with `location`) scripts another answer for every POST.
 */
import { createServer, type IncomingHttpHeaders, type Server, type ServerResponse } from 'node:http';
import { EventEmitter, once } from 'node:events';

export interface Delivery {
  body: string;
  headers: IncomingHttpHeaders;
  /** what the receiver answered; 0 while it leaves the request hanging */
  status: number;
  /** performance.now() when the body had arrived */
  at: number;
}

export interface ReceiverOptions {
  /** the answer to every POST not failed by failNext (default 204) */
  status?: number;
  /** a Location header on that answer */
  location?: string;
}

export interface WebhookReceiver {
  url: string;
  /** every POST, in arrival order */
  received: Delivery[];
  /** the POSTs answered 2xx, their bodies parsed */
  accepted(): Record<string, unknown>[];
  /** the next `n` deliveries are answered 500 */
  failNext(n: number): void;
  /** from now on no delivery is answered (true), or every one is again (false) */
  hang(on: boolean): void;
  /** resolves once `cond` holds, checked at every delivery */
  until(cond: () => boolean, what: string, timeoutMs?: number): Promise<void>;
  close(): Promise<void>;
}

export async function startWebhookReceiver(opts: ReceiverOptions = {}): Promise<WebhookReceiver> {
  const received: Delivery[] = [];
  const events = new EventEmitter();
  const hanging = new Set<ServerResponse>();
  let failing = 0;
  let hangAll = false;
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const d: Delivery = { body: Buffer.concat(chunks).toString('utf8'), headers: req.headers, status: 0, at: performance.now() };
      received.push(d);
      if (hangAll) {
        hanging.add(res);
        res.on('close', () => hanging.delete(res));
      } else {
        const failed = failing > 0;
        if (failed) failing--;
        d.status = failed ? 500 : (opts.status ?? 204);
        res.writeHead(d.status, !failed && opts.location ? { location: opts.location } : {}).end();
      }
      events.emit('delivery');
    });
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address() as { port: number };
  return {
    url: `http://127.0.0.1:${port}/hooks/keyward`,
    received,
    accepted: () => received.filter((d) => d.status >= 200 && d.status < 300).map((d) => JSON.parse(d.body) as Record<string, unknown>),
    failNext(n) {
      failing = n;
    },
    hang(on) {
      hangAll = on;
    },
    until(cond, what, timeoutMs = 10_000) {
      if (cond()) return Promise.resolve();
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => {
          events.off('delivery', check);
          reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what}; received ${JSON.stringify(received.map((d) => d.body))}`));
        }, timeoutMs);
        const check = () => {
          if (!cond()) return;
          clearTimeout(timer);
          events.off('delivery', check);
          resolve();
        };
        events.on('delivery', check);
      });
    },
    async close() {
      for (const res of hanging) res.destroy();
      server.closeAllConnections();
      server.close();
      await once(server, 'close');
    },
  };
}
