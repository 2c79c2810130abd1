/**
 * Sync benchmark: a console (child process, so its work does not count against the
 * sidecar's event loop) holding N keys, and a sidecar sync client in this process.
 *
 *   npx tsx bench/sync.ts [--keys 1000000] [--changes 50]
 *
 * Reports: time to apply the snapshot (first sync, then a re-snapshot over a full
 * replica as after a 410), the longest event-loop stall meanwhile, reads served from the
 * old replica during the apply, and the latency of single changes from the console's
 * admin API to the sidecar's replica.
 */
import { spawn } from 'node:child_process';
import { randomBytes, createHash } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { createInterface } from 'node:readline';
import { openConsoleDb } from '../src/console/db.js';
import { consoleConfigSchema } from '../src/console/config.js';
import { startConsole } from '../src/app/console.js';
import { ReplicaStore } from '../src/replica/store.js';
import { createSyncClient } from '../src/sync/client.js';
import { replicaWriter } from '../src/replica/writer.js';

const arg = (name: string, def: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : def;
};
const sha = (s: string) => createHash('sha256').update(s).digest('hex');
const SYNC = `sync-${'s'.repeat(20)}`;
const ADMIN = `admin-${'a'.repeat(20)}`;

/** Child: fills a console store with N team keys by SQL (fast), then serves it. */
async function consoleChild(dir: string, n: number): Promise<void> {
  const path = join(dir, 'console.sqlite');
  const db = openConsoleDb(path);
  const t0 = performance.now();
  db.transaction(() => {
    db.prepare(`INSERT INTO projects (id, status, budget, spent, created_at) VALUES ('p_bench', 'enabled', NULL, 0, 0)`).run();
    const ins = db.prepare(`INSERT INTO keys (id, hash, kind, project_id, status, spent, rpm, created_at) VALUES (?, ?, 'team', 'p_bench', 'active', 0, 600, 0)`);
    for (let i = 0; i < n; i++) ins.run(`k_${i}`, sha(`bench-${i}`));
    db.prepare(`INSERT INTO changes (entity, body) VALUES ('project:p_bench', '{"op":"upsert","type":"project","id":"p_bench","status":"enabled","budget":null,"spent":0}')`).run();
  })();
  db.close();
  const config = consoleConfigSchema.parse({
    listen: { host: '127.0.0.1', port: 0 },
    store: { path },
    masterKeyEnv: 'BENCH_MASTER_KEY',
    auth: { syncTokens: [SYNC], adminTokens: [ADMIN] },
    pricing: { unpriced: { inputPerMillion: 0, outputPerMillion: 0 } },
  });
  const c = await startConsole({ config, env: { BENCH_MASTER_KEY: randomBytes(32).toString('hex') } });
  process.stdout.write(JSON.stringify({ url: c.url, filledMs: Math.round(performance.now() - t0) }) + '\n');
  process.once('SIGTERM', () => void c.close().then(() => process.exit(0)));
}

async function measure<T>(work: () => Promise<T>) {
  const h = monitorEventLoopDelay({ resolution: 1 });
  let last = performance.now();
  let max = 0;
  const probe = setInterval(() => {
    const now = performance.now();
    max = Math.max(max, now - last - 2);
    last = now;
  }, 2);
  h.enable();
  const elu0 = performance.eventLoopUtilization();
  const t0 = performance.now();
  const result = await work();
  const ms = performance.now() - t0;
  max = Math.max(max, performance.now() - last - 2);
  const elu = performance.eventLoopUtilization(elu0).utilization;
  h.disable();
  clearInterval(probe);
  return { result, ms, maxStallMs: max, eldMaxMs: h.max / 1e6, eldP99Ms: h.percentile(99) / 1e6, elu };
}

const stallText = (m: { maxStallMs: number; eldMaxMs: number; eldP99Ms: number; elu?: number }) =>
  `max event-loop stall ${m.maxStallMs.toFixed(1)} ms (delay histogram max ${m.eldMaxMs.toFixed(1)}, p99 ${m.eldP99Ms.toFixed(1)}${m.elu === undefined ? '' : `; loop busy ${(m.elu * 100).toFixed(1)}%`})`;

const pct = (xs: number[], p: number) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(p * xs.length))]!;

async function main(): Promise<void> {
  if (process.argv[2] === '--console-child') return consoleChild(process.argv[3]!, Number(process.argv[4]));
  const n = arg('keys', 1_000_000);
  const changes = arg('changes', 50);
  const dir = mkdtempSync(join(tmpdir(), 'kw-bench-sync-'));
  const child = spawn(process.execPath, [...process.execArgv, new URL(import.meta.url).pathname, '--console-child', dir, String(n)], { stdio: ['ignore', 'pipe', 'inherit'] });
  try {
    const first = await new Promise<string>((resolve, reject) => {
      createInterface({ input: child.stdout! }).once('line', resolve);
      child.once('exit', (code) => reject(new Error(`console child exited ${code}`)));
    });
    const { url, filledMs } = JSON.parse(first) as { url: string; filledMs: number };
    console.log(`console: ${n} keys written in ${filledMs} ms, serving at ${url}`);

    // Control: how much an idle event loop stalls on this machine right now (other load, scheduling).
    const idle = await measure(() => new Promise((r) => setTimeout(r, 3000)));
    console.log(`baseline, idle loop for 3 s: ${stallText(idle)}`);

    const replica = new ReplicaStore({ path: join(dir, 'replica.sqlite') });
    const client = createSyncClient({ url, token: SYNC, waitMs: 25_000, target: replicaWriter(replica) });
    const initial = await measure(() => client.start());
    console.log(`initial snapshot: ${n} keys applied in ${initial.ms.toFixed(0)} ms; ${stallText(initial)}`);
    await client.stop();

    // Re-snapshot over a full replica (what a 410 leads to), reading old data meanwhile.
    let reads = 0;
    let misses = 0;
    const reader = setInterval(() => {
      for (let i = 0; i < 20; i++) {
        if (!replica.lookup(sha(`bench-${Math.floor(Math.random() * n)}`))) misses++;
        reads++;
      }
    }, 1);
    const again = createSyncClient({ url, token: SYNC, waitMs: 25_000, target: replicaWriter(replica) });
    const resnap = await measure(() => again.start());
    clearInterval(reader);
    console.log(`re-snapshot over a full replica: ${resnap.ms.toFixed(0)} ms; ${stallText(resnap)}; ${reads} lookups served meanwhile, ${misses} misses`);

    // Single changes: admin API write -> replica shows it.
    const lat: number[] = [];
    for (let i = 0; i < changes; i++) {
      const id = `k_${i}`;
      const seen = new Promise<number>((resolve) => {
        const t0 = performance.now();
        const off = replica.onChange(() => {
          if (replica.lookup(sha(`bench-${i}`))?.key.rpm === 1000 + i) {
            off();
            resolve(performance.now() - t0);
          }
        });
      });
      const res = await fetch(`${url}/admin/v1/keys/${id}`, { method: 'PATCH', headers: { authorization: `Bearer ${ADMIN}`, 'content-type': 'application/json' }, body: JSON.stringify({ rpm: 1000 + i }) });
      if (!res.ok) throw new Error(`PATCH ${res.status}`);
      lat.push(await seen);
    }
    console.log(`single change console -> replica (${changes} changes): p50 ${pct(lat, 0.5).toFixed(1)} ms, p90 ${pct(lat, 0.9).toFixed(1)} ms, max ${Math.max(...lat).toFixed(1)} ms`);
    await again.stop();
    await replica.close();
  } finally {
    child.kill('SIGTERM');
    await new Promise((r) => child.once('exit', r));
    rmSync(dir, { recursive: true, force: true });
  }
}

await main();
