/**
 * Traces with `keyward serve --workers 2` (a real primary and two worker processes, the
 * real Redis, a replica fed by `keyward import`): each worker exports its own spans, and
 * the spans the workers could not deliver add up in the primary's /metrics.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { makeKeyHasher } from '../../src/auth/hash.js';
import { spawnSidecar, type SidecarProcess } from '../helpers/process.js';
import { accessOf, importReplica, metricSum, scrape } from '../helpers/instance.js';
import { bearer, send } from '../helpers/http.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { startOtlpReceiver, type OtlpReceiver } from '../helpers/otlp-receiver.js';

const REDIS = 'redis://127.0.0.1:6379';
const prefix = `kwtt${randomBytes(4).toString('hex')}`;
const secret = `sk-traced-${randomBytes(8).toString('hex')}`;

let dir: string;
let up: FakeUpstream;
let rx: OtlpReceiver;
let kw: SidecarProcess;
let workerPids: number[];

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'kw-traces-workers-'));
  up = await startFakeUpstream();
  rx = await startOtlpReceiver();
  const replica = join(dir, 'replica.sqlite');
  const snapshot = join(dir, 'snapshot.ndjson');
  const key = {
    type: 'key', id: 'k_traced', hash: makeKeyHasher({ hash: 'sha256' })(secret), kind: 'personal', user: 'u1', project: null, status: 'active',
    budget: null, spent: 0, models: null, routing: null, rpm: 1000, tpm: null, concurrency: null,
  };
  writeFileSync(snapshot, [{ type: 'meta', version: 1 }, { type: 'wallet', user: 'u1', balance: 100 }, key].map((r) => JSON.stringify(r)).join('\n') + '\n');
  await importReplica(snapshot, replica);
  const yaml =
    `server: { port: 0 }\nadmin: { port: 0 }\nupstreams: { default: { url: ${up.url} } }\nreplica: { path: ${replica} }\n` +
    `redis: { url: ${REDIS}, prefix: ${prefix}, timeoutMs: 1000 }\ntracing: { otlpUrl: ${rx.url} }\nlogging: { level: info }\n`;
  // The standard batch delay variable: spans leave each worker within 50 ms.
  kw = await spawnSidecar({ dir, name: 'traced-workers', yaml, args: ['--workers', '2'], env: { OTEL_BSP_SCHEDULE_DELAY: '50' } });
  const listening = kw.lines.map((l) => JSON.parse(l) as { msg?: string; pids?: number[] }).find((l) => l.msg === 'keyward listening')!;
  workerPids = listening.pids!;
  assert.equal(workerPids.length, 2);
});

after(async () => {
  await kw?.stop('SIGKILL');
  await up?.close();
  await rx?.close();
  const redis = new Redis(REDIS);
  const keys = await redis.keys(`{${prefix}:*`);
  if (keys.length > 0) await redis.del(...keys);
  redis.disconnect();
  rmSync(dir, { recursive: true, force: true });
});

/** `n` requests at once, each on its own connection (the cluster hands connections to the workers in turn). */
async function burst(n: number, tag: string): Promise<void> {
  const ids = Array.from({ length: n }, (_, i) => `${tag}-${prefix}-${i}`);
  const rs = await Promise.all(ids.map((id) => send(kw.url, { path: '/v1/models', headers: { ...bearer(secret), 'x-request-id': id } })));
  assert.deepEqual(rs.map((r) => r.status), Array(n).fill(200));
  const lines = await accessOf(kw, ids);
  assert.equal(new Set(lines.map((l) => l.worker)).size, 2, 'both workers served');
}

test('each worker exports its own spans', async () => {
  await burst(8, 'ok');
  const spans = await rx.waitForSpans(8);
  assert.equal(spans.length, 8);
  assert.deepEqual([...new Set(spans.map((s) => s.resource['process.pid'] as number))].sort(), [...workerPids].sort(), 'spans from both worker processes');
  for (const s of spans) {
    assert.equal(s.name, 'keyward listing');
    assert.equal(s.attributes['keyward.key_id'], 'k_traced');
  }
});

test('spans a refusing collector lost in either worker add up in the primary\'s keyward_trace_spans_dropped_total', async () => {
  assert.equal(metricSum(await scrape(kw), 'keyward_trace_spans_dropped_total'), 0);
  rx.refuse(400);
  await burst(8, 'refused');
  await rx.waitForSpans(16);
  assert.deepEqual([...new Set(rx.refused.map((s) => s.resource['process.pid'] as number))].sort(), [...workerPids].sort());
  // Each worker counts a refused batch when its answer arrives, a moment after the receiver sent it.
  const deadline = Date.now() + 10_000;
  const dropped = async () => metricSum(await scrape(kw), 'keyward_trace_spans_dropped_total');
  while ((await dropped()) < 8) assert.ok(Date.now() < deadline, 'the workers did not count the refused spans within 10 s');
  assert.equal(await dropped(), 8);
  rx.refuse(null);
  assert.equal(await kw.stop('SIGTERM'), 0);
});
