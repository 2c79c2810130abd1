/**
 * A `serve --workers` primary's /metrics (src/app/worker-scrapes.ts) with workers that
 * answer scrapes in process: totals add up the live workers and every worker that exited,
 * as last scraped, also after many exits have been added up into one entry.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { Worker } from 'node:cluster';
import { Counter, Registry } from 'prom-client';
import { WorkerScrapes } from '../../src/app/worker-scrapes.js';

/** A worker whose registry counts `n` requests; it answers each scrape once `gate` (if any) opens. */
function fakeWorker(id: number, n: number, scrapes: () => WorkerScrapes, gate: () => Promise<void> = () => Promise.resolve()): Worker {
  const registry = new Registry();
  new Counter({ name: 'keyward_requests_total', help: 'h', registers: [registry] }).inc(n);
  return {
    id,
    isConnected: () => true,
    send(msg: { id: number }, cb: (err: Error | null) => void) {
      void gate()
        .then(() => registry.getMetricsAsJSON())
        .then((metrics) => scrapes().answered(msg.id, { metrics: metrics as never, decisions: [] }));
      cb(null);
      return true;
    },
  } as unknown as Worker;
}

const total = (text: string): number => Number(/^keyward_requests_total (\d+)/m.exec(text)?.[1] ?? 0);

test('workers that exited stay in the totals as last scraped, also once added up into one', async () => {
  const live = new Map<number, Worker>();
  const scrapes: WorkerScrapes = new WorkerScrapes({ own: new Registry(), workers: () => live.values() });
  let counted = 0;
  for (let id = 1; id <= 20; id++) {
    live.set(id, fakeWorker(id, id, () => scrapes));
    counted += id;
    assert.equal(total(await scrapes.metrics()), counted, `after worker ${id} started`);
    live.delete(id);
    scrapes.retire(id);
    assert.equal(total(await scrapes.metrics()), counted, `after worker ${id} exited`);
  }
  // a worker never scraped before it exited leaves nothing, and takes nothing away
  scrapes.retire(99);
  assert.equal(total(await scrapes.metrics()), counted);
});

test('a worker that answers a scrape and exits before the others answer is counted once in it', async () => {
  const live = new Map<number, Worker>();
  const scrapes: WorkerScrapes = new WorkerScrapes({ own: new Registry(), workers: () => live.values() });
  let open: () => void = () => {};
  let slow = false;
  live.set(1, fakeWorker(1, 10, () => scrapes));
  live.set(2, fakeWorker(2, 100, () => scrapes, () => (slow ? new Promise<void>((r) => (open = r)) : Promise.resolve())));
  assert.equal(total(await scrapes.metrics()), 110);
  slow = true;
  const during = scrapes.metrics();
  await new Promise((r) => setImmediate(r)); // worker 1 has answered, worker 2 not yet
  live.delete(1);
  scrapes.retire(1);
  open();
  assert.equal(total(await during), 110);
  slow = false;
  assert.equal(total(await scrapes.metrics()), 110);
});

test('a worker that cannot answer a scrape counts as its last answer: the totals never fall and come back', async () => {
  const live = new Map<number, Worker>();
  const scrapes: WorkerScrapes = new WorkerScrapes({ own: new Registry(), workers: () => live.values() });
  let mode: 'ok' | 'empty' | 'unreachable' = 'ok';
  const registry = new Registry();
  const counter = new Counter({ name: 'keyward_requests_total', help: 'h', registers: [registry] });
  counter.inc(7);
  live.set(1, fakeWorker(1, 3, () => scrapes));
  live.set(2, {
    id: 2,
    isConnected: () => true,
    send(msg: { id: number }, cb: (err: Error | null) => void) {
      if (mode === 'unreachable') return void cb(new Error('channel closed'));
      // A worker whose registry could not be read answers with no metrics; an answer crosses IPC as a copy.
      void registry.getMetricsAsJSON().then((metrics) => scrapes.answered(msg.id, { metrics: (mode === 'ok' ? structuredClone(metrics) : []) as never, decisions: [] }));
      cb(null);
      return true;
    },
  } as unknown as Worker);
  assert.equal(total(await scrapes.metrics()), 10);
  counter.inc(5);
  mode = 'empty';
  assert.equal(total(await scrapes.metrics()), 10, 'worker 2 as last answered, not 3 alone');
  mode = 'unreachable';
  assert.equal(total(await scrapes.metrics()), 10);
  mode = 'ok';
  assert.equal(total(await scrapes.metrics()), 15);
});
