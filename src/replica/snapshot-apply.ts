/**
 * Applies a snapshot stream (an HTTP body, a file) to a replica without blocking the
 * event loop: the bytes go to a worker thread (worker.ts) that validates and writes them
 * in one transaction on its own connection; once it commits, the replica notices the
 * external write at once and clears its cache. A bad snapshot is rejected whole and the
 * old replica stays. In-memory replicas (tests, demos) are applied on this thread.
 */
import { MessageChannel, type MessagePort } from 'node:worker_threads';
import { InvalidBatchError, UnusableDataError, type SnapshotApplied } from '../protocol/writer.js';
import { collectSnapshot, LineSplitter, readSnapshot, SnapshotError, type NumberedLine } from '../protocol/ndjson.js';
import type { ReplicaStore } from './store.js';
import type { ChangesResult, ChunkMessage, WorkerMessage } from './worker.js';
import { spawn } from './threads.js';
import { isBusy } from './replica-file.js';

async function* prepend(head: Uint8Array[], body: AsyncIterable<Uint8Array>): AsyncGenerator<Uint8Array> {
  yield* head;
  yield* body;
}

export class SnapshotApplyError extends UnusableDataError {
  constructor(
    message: string,
    readonly line?: number,
  ) {
    super(message);
    this.name = 'SnapshotApplyError';
  }
}

export interface ApplySnapshotStreamOptions {
  replica: ReplicaStore;
  body: AsyncIterable<Uint8Array>;
  /** recorded in the replica's meta row, e.g. "console" or "import" */
  source: string;
  signal?: AbortSignal;
  /** chunks handed to the worker but not yet taken: bounds memory when the worker is slower than the network */
  maxInFlight?: number;
  maxLineBytes?: number;
  /**
   * Hand each chunk's memory to the worker instead of copying it (the chunks become
   * unusable here). Keeps the event loop's heap free of snapshot bytes, so it is not
   * garbage-collected over and over; only for chunks nobody else holds, like a fetch body's.
   */
  transferChunks?: boolean;
  /** the worker connection's page cache in MiB, held only while it loads: a large snapshot loads faster with more of its pages in memory */
  cacheMb?: number;
}

/** The least time between two checkpoints handed to a worker. */
const FOLD_EVERY_MS = 1_000;
const folding = new WeakMap<ReplicaStore, { running: boolean; last: number }>();

/**
 * After a commit on this thread, checkpoints the replica's WAL on a worker. The main
 * connection never checkpoints itself (store.ts turns SQLite's automatic checkpoint off):
 * inside a commit, a checkpoint copies up to a thousand pages into the database file and
 * syncs it, which stalled the event loop 50 to 160 ms (DESIGN section 7 allows 50). A
 * passive checkpoint blocks no reader or writer; one runs at a time, at most one a second.
 */
export function foldSoon(replica: ReplicaStore): Promise<void> | null {
  // A worker opens the path: while the file served is not the one there, it would fold another file.
  if (!replica.db.open || replica.db.memory || replica.detached()) return null;
  const state = folding.get(replica) ?? { running: false, last: -Infinity };
  folding.set(replica, state);
  const now = performance.now();
  if (state.running || now - state.last < FOLD_EVERY_MS) return null;
  state.running = true;
  state.last = now;
  // Not unref'd: the process waits for a passive checkpoint (milliseconds) before it exits.
  const { worker, exited } = spawn({ replica, kind: 'keyward-fold', data: {} });
  worker.once('error', () => {});
  return exited.then(() => void (state.running = false));
}

/**
 * Parses, validates and applies one change batch (the /changes answer's text) on a worker
 * thread, atomically; for batches too large to apply on the event loop within its budget.
 * Resolves with whether the batch was newer than the replica; throws InvalidBatchError for
 * a batch that does not validate or apply (retrying it cannot help).
 */
export async function applyChangeTextOffThread(opts: { replica: ReplicaStore; text: string; source: string }): Promise<{ version: number; changes: number; applied: boolean }> {
  if (opts.replica.db.memory) throw new Error('an in-memory replica cannot be written by another thread');
  const { worker } = spawn({ replica: opts.replica, kind: 'keyward-changes', data: { source: opts.source, text: opts.text } });
  const result = await new Promise<ChangesResult>((resolve) => {
    worker.once('message', resolve);
    worker.once('error', (err) => resolve({ t: 'error', message: `change worker failed: ${err.message}` }));
    worker.once('exit', () => resolve({ t: 'error', message: 'change worker exited without an answer' }));
  });
  if (result.t === 'invalid') throw new InvalidBatchError(result.message);
  if (result.t === 'error') throw new Error(result.message);
  if (result.applied) opts.replica.checkExternalWrites();
  return { version: result.version, changes: result.changes, applied: result.applied };
}

async function applyInThread(opts: ApplySnapshotStreamOptions, started: number, head: Uint8Array[]): Promise<SnapshotApplied> {
  const splitter = new LineSplitter(opts.maxLineBytes ?? 1 << 20);
  const lines: NumberedLine[] = [];
  // What the splitter refuses (bytes that are not UTF-8, a line past its bound) is bad data,
  // not a failed fetch: it is not fetched again at once. A failure of the body itself stays a fetch error.
  const split = (chunk: Uint8Array): void => {
    try {
      lines.push(...splitter.push(chunk));
    } catch (err) {
      if (err instanceof SnapshotError) throw new SnapshotApplyError(err.message, err.line);
      throw new SnapshotApplyError('the snapshot is not UTF-8 text (a compressed body sent without its Content-Encoding?)');
    }
  };
  for (const chunk of head) split(chunk);
  for await (const chunk of opts.body) split(chunk);
  try {
    lines.push(...splitter.end());
    const { version, tag, records } = collectSnapshot(readSnapshot(lines));
    const counts = opts.replica.applySnapshot({ version, tag, records, source: opts.source });
    void foldSoon(opts.replica);
    return { version, ...counts, totalMs: Math.round(performance.now() - started), offThread: false };
  } catch (err) {
    // A lock another connection holds is not bad data: retried as soon as a fetch failure would be.
    if (isBusy(err)) throw new Error('snapshot not applied: the replica file is locked by another connection', { cause: err });
    throw new SnapshotApplyError((err as Error).message, (err as { line?: number; position?: number }).line ?? (err as { position?: number }).position);
  }
}

/**
 * Below this a snapshot is applied on this thread: applying it takes less than starting a
 * worker would, and stays well inside the 50 ms the event loop may stall (DESIGN section 7)
 * on a busy machine.
 */
const SMALL_SNAPSHOT_BYTES = 128 * 1024;

/**
 * A replica file past this size is replaced on a worker even by a small snapshot: emptying
 * its tables is what takes the time then (about 45 ms for 100,000 keys).
 */
const SMALL_REPLICA_BYTES = 4 * 1024 * 1024;

/** The file's pages, free ones included: a size that errs on the large side. */
const replicaBytes = (replica: ReplicaStore): number =>
  (replica.db.pragma('page_count', { simple: true }) as number) * (replica.db.pragma('page_size', { simple: true }) as number);

/** Reads up to `limit` bytes; `done` tells whether that was the whole stream. */
async function readHead(it: AsyncIterator<Uint8Array>, limit: number): Promise<{ head: Uint8Array[]; done: boolean }> {
  const head: Uint8Array[] = [];
  let size = 0;
  while (size <= limit) {
    const r = await it.next();
    if (r.done) return { head, done: true };
    head.push(r.value);
    size += r.value.length;
  }
  return { head, done: false };
}

export async function applySnapshotStream(opts: ApplySnapshotStreamOptions): Promise<SnapshotApplied> {
  const started = performance.now();
  const it = opts.body[Symbol.asyncIterator]();
  const rest: AsyncIterable<Uint8Array> = { [Symbol.asyncIterator]: () => it };
  const { head, done } = await readHead(it, SMALL_SNAPSHOT_BYTES);
  // A detached replica's snapshot goes to the file at the path, which a worker opens (store.ts, detached).
  const small = done && replicaBytes(opts.replica) <= SMALL_REPLICA_BYTES && !opts.replica.detached();
  if (opts.replica.db.memory || small) return applyInThread({ ...opts, body: rest }, started, head);
  return applyInWorker({ ...opts, body: rest }, started, head);
}

/** The worker thread that applies one snapshot, and the channel its chunks go over. */
class SnapshotWorker {
  /** the worker's answer (done, or why not); the first one counts */
  outcome: WorkerMessage | null = null;
  /** resolves with the worker's answer, or an error when it failed or exited without one */
  readonly finished: Promise<WorkerMessage>;
  readonly exited: Promise<void>;
  private readonly port: MessagePort;
  /** the counter the worker sleeps on between chunks */
  private readonly counter: Int32Array;
  /** chunks sent and not yet taken (the worker credits each one it takes) */
  private inFlight = 0;
  private creditWaiter: (() => void) | null = null;

  constructor(private readonly opts: ApplySnapshotStreamOptions) {
    const { port1, port2 } = new MessageChannel();
    const signal = new SharedArrayBuffer(4);
    this.port = port1;
    this.counter = new Int32Array(signal);
    const { worker, exited } = spawn({
      replica: opts.replica,
      kind: 'keyward-snapshot',
      data: { source: opts.source, port: port2, signal, maxLineBytes: opts.maxLineBytes ?? 1 << 20, cacheMb: opts.cacheMb ?? 128 },
      transfer: [port2],
    });
    this.exited = exited;
    this.finished = new Promise<WorkerMessage>((resolve) => {
      const settle = (m: WorkerMessage) => {
        this.outcome ??= m;
        resolve(this.outcome);
        this.creditWaiter?.();
      };
      worker.on('message', (m: WorkerMessage) => {
        if (m.t !== 'credit') return settle(m);
        this.inFlight--;
        this.creditWaiter?.();
      });
      worker.on('error', (err) => settle({ t: 'error', message: `snapshot worker failed: ${err.message}` }));
      worker.on('exit', () => settle({ t: 'error', message: 'snapshot worker exited without an answer' }));
    });
  }

  send(m: ChunkMessage): void {
    const data = m.t === 'chunk' ? m.data : null;
    const whole = data !== null && data.byteOffset === 0 && data.byteLength === data.buffer.byteLength && data.buffer instanceof ArrayBuffer;
    this.port.postMessage(m, this.opts.transferChunks && whole ? [data.buffer as ArrayBuffer] : []);
    Atomics.add(this.counter, 0, 1);
    Atomics.notify(this.counter, 0);
  }

  /** Sends a chunk, then waits while too many are untaken, unless the worker has answered. */
  async sendChunk(chunk: Uint8Array): Promise<void> {
    this.send({ t: 'chunk', data: chunk });
    this.inFlight++;
    const maxInFlight = this.opts.maxInFlight ?? 64;
    while (this.inFlight >= maxInFlight && this.outcome === null) await new Promise<void>((r) => (this.creditWaiter = r));
    this.creditWaiter = null;
  }

  close(): void {
    this.port.close();
  }
}

function throwIfAborted(signal: AbortSignal | undefined): void {
  if (signal?.aborted) throw signal.reason ?? new Error('aborted');
}

/** Sends every chunk, then the end; stops reading once the worker has answered (it rejected the snapshot). */
async function feed(w: SnapshotWorker, chunks: AsyncIterable<Uint8Array>, signal: AbortSignal | undefined): Promise<void> {
  for await (const chunk of chunks) {
    if (w.outcome !== null) break;
    throwIfAborted(signal);
    await w.sendChunk(chunk);
  }
  throwIfAborted(signal);
  w.send({ t: 'end' });
}

async function applyInWorker(opts: ApplySnapshotStreamOptions, started: number, head: Uint8Array[]): Promise<SnapshotApplied> {
  const w = new SnapshotWorker(opts);
  try {
    try {
      await feed(w, prepend(head, opts.body), opts.signal);
    } catch (err) {
      // The source failed (network, abort): the worker rolls back and the old replica stays.
      w.send({ t: 'abort', reason: err instanceof Error ? err.message : String(err) });
      await w.finished;
      await w.exited;
      throw err;
    }
    const result = await w.finished;
    // Readers see the new data now; the caller's next write waits until the worker has also
    // folded the WAL back, or that write would block this thread on the worker's checkpoint.
    if (result.t === 'done') {
      if (opts.replica.detached()) opts.replica.reattach();
      else opts.replica.checkExternalWrites();
    }
    await w.exited;
    if (result.t === 'error' && result.busy) throw new Error(`snapshot not applied: ${result.message}`);
    if (result.t !== 'done') throw new SnapshotApplyError(result.t === 'error' ? result.message : 'unexpected worker answer', result.t === 'error' ? result.line : undefined);
    return { version: result.version, keys: result.keys, projects: result.projects, wallets: result.wallets, prices: result.prices, totalMs: Math.round(performance.now() - started), offThread: true };
  } finally {
    w.close();
  }
}
