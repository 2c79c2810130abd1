/**
 * Sidecar-side helpers for sync tests: replicas in temp dirs, waiting on replica change
 * events (no sleeps), and prebuilt NDJSON snapshots of any size.
 */
import { createHash } from 'node:crypto';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { ReplicaStore } from '../../src/replica/store.js';
import type { KeyFacts } from '../../src/policy/facts.js';

export const sha256 = (s: string) => createHash('sha256').update(s, 'utf8').digest('hex');

/** Resolves with the ms it took once `pred` holds after a replica change; rejects after `timeoutMs`. */
export function whenReplica(replica: ReplicaStore, pred: () => boolean, timeoutMs = 5000): Promise<number> {
  const started = performance.now();
  return new Promise((resolve, reject) => {
    if (pred()) return resolve(0);
    const off = replica.onChange(() => {
      if (!pred()) return;
      off();
      clearTimeout(timer);
      resolve(performance.now() - started);
    });
    const timer = setTimeout(() => {
      off();
      reject(new Error(`replica condition not met within ${timeoutMs} ms`));
    }, timeoutMs);
  });
}

export function lookupSecret(replica: ReplicaStore, secret: string): KeyFacts | null {
  return replica.lookup(sha256(secret));
}

/** NDJSON snapshot with `keys` team keys in one project, cut into ~64 KiB chunks. */
export function buildSnapshot(opts: { keys: number; version: number }): Buffer[] {
  const chunks: Buffer[] = [];
  let buf = `{"type":"meta","version":${opts.version}}\n{"type":"project","id":"p_big","status":"enabled","budget":null,"spent":0}\n`;
  for (let i = 0; i < opts.keys; i++) {
    buf += `{"type":"key","id":"k_${i}","hash":"${sha256(`key-${i}`)}","kind":"team","user":null,"project":"p_big","status":"active","budget":null,"spent":0,"models":null,"routing":null,"rpm":60,"tpm":null,"concurrency":null}\n`;
    if (buf.length >= 65536) {
      chunks.push(Buffer.from(buf));
      buf = '';
    }
  }
  chunks.push(Buffer.from(buf));
  return chunks;
}

/**
 * A stand-in console that serves a prebuilt snapshot and answers long polls with no
 * changes, so a test measures the sidecar's side alone.
 */
export async function serveSnapshot(opts: { chunks: Buffer[]; version: number }): Promise<{ url: string; close(): Promise<void> }> {
  const server: Server = createServer((req, res) => {
    if (req.url === '/sync/v1/snapshot') {
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      let i = 0;
      const pump = () => {
        while (i < opts.chunks.length) if (!res.write(opts.chunks[i++]!)) return void res.once('drain', pump);
        res.end();
      };
      return pump();
    }
    if (req.url?.startsWith('/sync/v1/changes')) {
      const wait = Number(new URL(req.url, 'http://x').searchParams.get('waitMs') ?? 0);
      const timer = setTimeout(() => res.end(JSON.stringify({ version: opts.version, changes: [] })), wait);
      res.on('close', () => clearTimeout(timer));
      return;
    }
    res.writeHead(404).end();
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: () => new Promise((r) => {
      server.closeAllConnections();
      server.close(() => r());
    }),
  };
}

/** Longest event-loop stall while `work` runs, probed every 2 ms. */
export async function measureStall<T>(work: () => Promise<T>): Promise<{ result: T; maxStallMs: number }> {
  let last = performance.now();
  let max = 0;
  const probe = setInterval(() => {
    const now = performance.now();
    max = Math.max(max, now - last - 2);
    last = now;
  }, 2);
  try {
    const result = await work();
    // A block right before `work` settles shows only here: the probe has not run since.
    max = Math.max(max, performance.now() - last - 2);
    return { result, maxStallMs: max };
  } finally {
    clearInterval(probe);
  }
}

/**
 * For state with no event to await (a client's status after a network failure): checks
 * every 10 ms, up to `timeoutMs`. Returns whether `pred` came true.
 */
export async function until(pred: () => boolean, timeoutMs = 5000): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (!pred() && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
  return pred();
}
