/**
 * `keyward demo` (what `npm start` runs): a fresh replica with demo keys, the sample
 * upstream and the sidecar, all on loopback, with curl lines that show each outcome.
 * Needs nothing but this package: no Redis, no console.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { generateKey } from '../auth/keyformat.js';
import { makeKeyHasher } from '../auth/hash.js';
import { configSchema } from '../config/schema.js';
import { createLogger } from '../obs/logger.js';
import { startSidecar } from '../proxy/server.js';
import { ReplicaStore } from '../replica/store.js';
import type { SyncRecord } from '../sync/protocol.js';
import { startDemoUpstream } from './upstream.js';

interface DemoKeys {
  ok: string;
  broke: string;
  scoped: string;
}

function demoSnapshot(keys: DemoKeys): SyncRecord[] {
  const hash = makeKeyHasher({ hash: 'sha256' });
  const key = (id: string, secret: string, extra: Partial<Extract<SyncRecord, { type: 'key' }>>): SyncRecord => ({
    type: 'key', id, hash: hash(secret), kind: 'personal', user: null, project: null, status: 'active', budget: null, spent: 0,
    models: null, routing: null, rpm: 60, tpm: 100_000, concurrency: 4, ...extra,
  } as SyncRecord);
  return [
    { type: 'wallet', user: 'u_alice', balance: 25 },
    { type: 'wallet', user: 'u_bob', balance: 0 },
    { type: 'project', id: 'p_demo', status: 'enabled', budget: 100, spent: 0 },
    key('k_alice', keys.ok, { user: 'u_alice' }),
    key('k_bob', keys.broke, { user: 'u_bob' }),
    key('k_team', keys.scoped, { kind: 'team', project: 'p_demo', models: ['demo-model', 'gpt-4o-mini*'] }),
  ];
}

async function listenWithFallback<T>(start: (port: number) => Promise<T>, port: number): Promise<T> {
  try {
    return await start(port);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EADDRINUSE') throw err;
    return start(0); // the usual port is taken: any port will do for a demo
  }
}

export async function runDemo(opts: { port?: number; adminPort?: number; log?: (line: string) => void } = {}) {
  const say = opts.log ?? ((line: string) => process.stdout.write(`${line}\n`));
  const dir = mkdtempSync(join(tmpdir(), 'keyward-demo-'));
  const upstream = await startDemoUpstream();
  const keys: DemoKeys = { ok: generateKey(), broke: generateKey(), scoped: generateKey() };
  const replica = new ReplicaStore({ path: join(dir, 'replica.sqlite') });
  replica.applySnapshot({ version: 1, records: demoSnapshot(keys).map((record, i) => ({ line: i + 2, record })), source: 'demo' });

  const config = (port: number, adminPort: number) =>
    configSchema.parse({
      server: { port },
      admin: { port: adminPort },
      upstreams: { default: { url: upstream.url } },
      replica: { path: join(dir, 'replica.sqlite') },
      logging: { level: 'info' },
    });
  const logger = createLogger({ level: 'info', destination: process.stderr });
  const sidecar = await listenWithFallback(
    (port) => listenWithFallback((adminPort) => startSidecar({ config: config(port, adminPort), logger, replica }), opts.adminPort ?? 9090),
    opts.port ?? 8080,
  );
  const base = sidecar.url;
  const body = (model: string) => `-H 'content-type: application/json' -d '{"model":"${model}","messages":[{"role":"user","content":"hi"}]}'`;
  say(`keyward demo: sidecar ${base} (admin http://127.0.0.1:${sidecar.adminPort}), demo upstream ${upstream.url}`);
  say('Demo keys (they live only in this demo replica):');
  say(`  alice (personal, balance 25):   ${keys.ok}`);
  say(`  bob   (personal, balance 0):    ${keys.broke}`);
  say(`  team  (models demo-model, gpt-4o-mini*): ${keys.scoped}`);
  say('Try:');
  say(`  200  curl -s ${base}/v1/chat/completions -H 'authorization: Bearer ${keys.ok}' ${body('demo-model')}`);
  say(`  401  curl -s ${base}/v1/models -H 'authorization: Bearer not-a-real-key'`);
  say(`  402  curl -s ${base}/v1/chat/completions -H 'authorization: Bearer ${keys.broke}' ${body('demo-model')}`);
  say(`  403  curl -s ${base}/v1/chat/completions -H 'authorization: Bearer ${keys.scoped}' ${body('gpt-4o')}`);
  say(`       curl -s http://127.0.0.1:${sidecar.adminPort}/metrics`);
  say('Access log lines go to stderr. Ctrl-C stops the demo.');
  return {
    sidecar,
    upstream,
    keys,
    async close() {
      await sidecar.close({ graceMs: 1000 });
      replica.close();
      await upstream.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
