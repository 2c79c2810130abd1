/**
 * A `serve --workers` primary's /metrics (src/app/worker-scrapes.ts): what is not simply
 * added up across processes. The replica version is the primary's alone (every worker reads
 * the same file), and a per-process limit is the lowest of them, not their sum.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { Worker } from 'node:cluster';
import { Gauge, Registry } from 'prom-client';
import { WorkerScrapes } from '../../src/app/worker-scrapes.js';

/** A registry with the two gauges a process of keyward exposes, at the values given. */
function registryWith(o: { version: number; maxFds: number }): Registry {
  const registry = new Registry();
  new Gauge({ name: 'keyward_replica_version', help: 'h', registers: [registry] }).set(o.version);
  new Gauge({ name: 'keyward_process_max_fds', help: 'h', registers: [registry] }).set(o.maxFds);
  return registry;
}

/** A worker that answers every scrape with its registry. */
function fakeWorker(id: number, registry: Registry, scrapes: () => WorkerScrapes): Worker {
  return {
    id,
    isConnected: () => true,
    send(msg: { id: number }, cb: (err: Error | null) => void) {
      void registry.getMetricsAsJSON().then((metrics) => scrapes().answered(msg.id, { metrics: metrics as never, decisions: [] }));
      cb(null);
      return true;
    },
  } as unknown as Worker;
}

const sample = (text: string, name: string): number => {
  const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(text);
  assert.ok(m, `${name} in the exposition`);
  return Number(m[1]);
};

test('with workers, /metrics shows the primary replica version once and the lowest fd limit, not sums', async () => {
  const live = new Map<number, Worker>();
  const scrapes: WorkerScrapes = new WorkerScrapes({ own: registryWith({ version: 7, maxFds: 4096 }), workers: () => live.values() });
  live.set(1, fakeWorker(1, registryWith({ version: 7, maxFds: 1024 }), () => scrapes));
  live.set(2, fakeWorker(2, registryWith({ version: 7, maxFds: 2048 }), () => scrapes));
  const text = await scrapes.metrics();
  // three processes reading one file at version 7: summed it would read 21
  assert.equal(sample(text, 'keyward_replica_version'), 7);
  // the limit that holds for every process is the lowest; summed it would read 7168
  assert.equal(sample(text, 'keyward_process_max_fds'), 1024);
});
