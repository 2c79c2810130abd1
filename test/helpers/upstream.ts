/**
 * A fake upstream that records exactly what it received (method, raw target, raw
 * headers, body bytes and their sha256), so tests can prove forwarding changed nothing.
 * Handlers script the answer per test.
 */
import { createHash } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { EventEmitter, once } from 'node:events';

export interface Received {
  method: string;
  url: string;
  rawHeaders: string[];
  headers: IncomingMessage['headers'];
  body: Buffer;
  sha256: string;
  /** resolves when the upstream saw the request end or the connection close */
  closed: Promise<'complete' | 'aborted'>;
}

export type Handler = (req: IncomingMessage, res: ServerResponse, rec: Received) => void | Promise<void>;

export interface FakeUpstream {
  url: string;
  port: number;
  received: Received[];
  /** next request's arrival */
  nextRequest(): Promise<Received>;
  /**
   * 'head' (req, res, rec) as soon as a request's head arrives, before its body: for tests
   * that watch a body stream in, or answer before it has ended.
   */
  arrivals: EventEmitter;
  setHandler(h: Handler): void;
  close(): Promise<void>;
}

/** Answers 200 with `body` as JSON, its length declared. */
export function answerJson(res: ServerResponse, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

export const echoJson: Handler = (_req, res, rec) => answerJson(res, { ok: true, sha256: rec.sha256, bytes: rec.body.length });

export async function startFakeUpstream(handler: Handler = echoJson): Promise<FakeUpstream> {
  let current = handler;
  const received: Received[] = [];
  const waiters: ((r: Received) => void)[] = [];
  const arrivals = new EventEmitter();
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    let resolveClosed!: (v: 'complete' | 'aborted') => void;
    const rec: Received = {
      method: req.method ?? '',
      url: req.url ?? '',
      rawHeaders: [...req.rawHeaders],
      headers: req.headers,
      body: Buffer.alloc(0),
      sha256: '',
      closed: new Promise((r) => (resolveClosed = r)),
    };
    res.once('close', () => resolveClosed(res.writableFinished ? 'complete' : 'aborted'));
    arrivals.emit('head', req, res, rec);
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      rec.body = Buffer.concat(chunks);
      rec.sha256 = createHash('sha256').update(rec.body).digest('hex');
      received.push(rec);
      waiters.shift()?.(rec);
      Promise.resolve(current(req, res, rec)).catch(() => res.destroy());
    });
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const addr = server.address();
  const port = typeof addr === 'object' && addr ? addr.port : 0;
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    received,
    nextRequest: () => new Promise((r) => waiters.push(r)),
    arrivals,
    setHandler: (h) => (current = h),
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

export const sha256 = (b: Buffer | string) => createHash('sha256').update(b).digest('hex');
