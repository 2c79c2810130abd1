/**
 * Worker threads on a replica's file (worker.ts runs in them): started niced, under tsx
 * when keyward runs from source, and tracked by the replica, whose close() waits for them.
 */
import { Worker, type MessagePort } from 'node:worker_threads';
import type { ReplicaStore } from './store.js';

// The worker is niced first thing (Linux lets one thread be niced through its thread id),
// before it loads or compiles anything, so on a small machine the main thread, which serves
// requests, wins the CPU over this bulk job; threads and processes it starts inherit that.
// Under tsx (tests, `npx tsx src/cli.ts`) the worker is TypeScript and needs tsx's loader
// registered inside it: inherited --import flags do not reach a worker's entry module.
const HERE = import.meta.url;
const FROM_SOURCE = HERE.endsWith('.ts');
const BOOT = `
const { workerData } = require('node:worker_threads');
try {
  const tid = Number(/task\\/(\\d+)$/.exec(require('node:fs').readlinkSync('/proc/thread-self'))[1]);
  if (tid > 0) require('node:os').setPriority(tid, 10);
} catch {}
(async () => {
  if (workerData.tsx) (await import(workerData.tsx)).register();
  await import(workerData.entry);
})();
`;
// Resolved once at load: resolving through the module loader later would block the event loop.
const TSX_API = FROM_SOURCE ? import.meta.resolve('tsx/esm/api') : null;
const WORKER_ENTRY = new URL(FROM_SOURCE ? './worker.ts' : './worker.js', HERE).href;

interface SpawnOptions {
  replica: ReplicaStore;
  kind: 'keyward-snapshot' | 'keyward-changes' | 'keyward-fold';
  data: Record<string, unknown>;
  transfer?: MessagePort[];
}

/** A worker on the replica's path, and its exit, which the replica's close() waits for. */
export function spawn(opts: SpawnOptions): { worker: Worker; exited: Promise<void> } {
  // A closed replica's close() has already resolved: it could not wait for this worker.
  if (!opts.replica.db.open) throw new Error('the replica is closed');
  const workerData = { ...opts.data, dbPath: opts.replica.db.name, entry: WORKER_ENTRY, tsx: TSX_API, kind: opts.kind };
  const worker = new Worker(BOOT, { eval: true, workerData, transferList: opts.transfer ?? [] });
  const exited = new Promise<void>((resolve) => worker.once('exit', () => resolve()));
  opts.replica.track(exited);
  return { worker, exited };
}
