/**
 * Snapshot worker: applies a whole NDJSON snapshot to the replica file in one transaction
 * on its own connection, off the main thread. In WAL mode the main thread keeps reading
 * the old data until the commit, then sees the new data at once (a swap, never a mix).
 *
 * The parent streams the bytes in over a MessagePort. applySnapshot takes a synchronous
 * record iterator inside its transaction, so this thread pulls each chunk synchronously
 * (receiveMessageOnPort), sleeping on a shared counter (Atomics.wait) until the parent
 * posts the next one: constant memory however large the snapshot is. Every line is
 * validated with the protocol's parsers; the first bad line rolls everything back.
 *
 * The same worker also applies one large change batch (given as its JSON text, parsed and
 * validated here), so a console that sends thousands of changes at once cannot stall the
 * event loop either, and checkpoints the WAL after commits of the main thread (foldSoon).
 *
 * Spawned by snapshot-apply.ts; not imported by anything else.
 */
import { isMainThread, parentPort, receiveMessageOnPort, workerData, type MessagePort } from 'node:worker_threads';
import { applyChanges, applySnapshot } from './apply.js';
import { openDatabase } from './open.js';
import { isBusy } from './replica-file.js';
import { LineSplitter, readSnapshot, SnapshotError, type NumberedLine, type SnapshotItem } from '../protocol/ndjson.js';
import { parseChangeBatch, type SyncRecord } from '../protocol/records.js';

export interface WorkerInput {
  dbPath: string;
  source: string;
  port: MessagePort;
  /** Int32 counter the parent bumps (and notifies) after each message it posts */
  signal: SharedArrayBuffer;
  maxLineBytes: number;
  /** page cache of this connection while it loads; index inserts of a million random hashes need it */
  cacheMb: number;
}

/** Parent → worker on `port`. */
export type ChunkMessage = { t: 'chunk'; data: Uint8Array } | { t: 'end' } | { t: 'abort'; reason: string };

/** Worker → parent on `parentPort`. */
export type WorkerMessage =
  | { t: 'credit' }
  | { t: 'done'; version: number; keys: number; projects: number; wallets: number; prices: number; applyMs: number }
  /** busy: another connection held the file's write lock past the busy timeout (a passing state, not bad data) */
  | { t: 'error'; message: string; line?: number; busy?: boolean };

export interface ChangesInput {
  dbPath: string;
  source: string;
  /** the /changes answer as received */
  text: string;
}

export type ChangesResult =
  | { t: 'applied'; version: number; changes: number; applied: boolean }
  /** the batch does not parse or validate: retrying it cannot help */
  | { t: 'invalid'; message: string }
  | { t: 'error'; message: string };

class Aborted extends Error {}

function receiver(input: WorkerInput): () => ChunkMessage {
  const counter = new Int32Array(input.signal);
  return () => {
    for (;;) {
      const seen = Atomics.load(counter, 0);
      const m = receiveMessageOnPort(input.port);
      if (m) return m.message as ChunkMessage;
      // The timeout only guards against a lost wake-up; the parent notifies after every post.
      Atomics.wait(counter, 0, seen, 1000);
    }
  };
}

/** Numbered lines from the chunk stream, pulled as the snapshot reader asks for them. */
function* lines(input: WorkerInput, next: () => ChunkMessage): Generator<NumberedLine> {
  const splitter = new LineSplitter(input.maxLineBytes);
  for (;;) {
    const msg = next();
    if (msg.t === 'abort') throw new Aborted(msg.reason);
    if (msg.t === 'end') return yield* splitter.end();
    parentPort!.postMessage({ t: 'credit' } satisfies WorkerMessage);
    yield* splitter.push(msg.data);
  }
}

function* records(items: Generator<SnapshotItem>): Generator<{ line: number; record: SyncRecord }> {
  for (const item of items) if (item.type === 'record') yield item;
}

/**
 * After the swap, copy the snapshot's WAL frames into the database file here, off the
 * main thread. Left over, they would be checkpointed by the main thread's next commit (a
 * long stall there), and a million-key WAL would stay on disk. A reader can hold frames
 * back for a moment, so it retries briefly; the parent waits for this before its next write.
 */
function foldWal(db: ReturnType<typeof openDatabase>): void {
  const pause = new Int32Array(new SharedArrayBuffer(4));
  for (let attempt = 0; attempt < 50; attempt++) {
    try {
      const [r] = db.pragma('wal_checkpoint(TRUNCATE)') as { busy: number; log: number; checkpointed: number }[];
      if (r && r.busy === 0) return;
    } catch {
      /* SQLITE_BUSY: try again */
    }
    Atomics.wait(pause, 0, 0, 20);
  }
}

function run(input: WorkerInput): WorkerMessage {
  const db = openDatabase(input.dbPath);
  db.pragma(`cache_size = -${Math.max(2, Math.round(input.cacheMb)) * 1024}`);
  try {
    const items = readSnapshot(lines(input, receiver(input)));
    const first = items.next();
    // readSnapshot yields the meta record first or throws
    const { version, tag } = first.value as Extract<SnapshotItem, { type: 'meta' }>;
    const started = performance.now();
    const counts = applySnapshot(db, { version, tag, records: records(items), source: input.source });
    const applyMs = Math.round(performance.now() - started);
    parentPort!.postMessage({ t: 'done', version, ...counts, applyMs } satisfies WorkerMessage);
    foldWal(db);
    return { t: 'done', version, ...counts, applyMs };
  } catch (err) {
    const line = err instanceof SnapshotError ? err.line : (err as { position?: number }).position;
    const message = err instanceof Error ? err.message : String(err);
    return { t: 'error', message, ...(line !== undefined ? { line } : {}), ...(isBusy(err) ? { busy: true } : {}) };
  } finally {
    db.close();
  }
}

function runChanges(input: ChangesInput): ChangesResult {
  let value: unknown;
  try {
    value = JSON.parse(input.text);
  } catch {
    return { t: 'invalid', message: 'change batch is not valid JSON' };
  }
  const parsed = parseChangeBatch(value);
  if (!parsed.ok) return { t: 'invalid', message: parsed.error };
  const db = openDatabase(input.dbPath);
  try {
    const applied = applyChanges(db, parsed.value, { source: input.source });
    return { t: 'applied', version: parsed.value.version, changes: parsed.value.changes.length, applied };
  } catch (err) {
    const message = err instanceof Error ? err.message : String(err);
    // A lock held past the busy timeout passes; the same batch applies once it is released.
    return isBusy(err) ? { t: 'error', message: `the replica file stayed locked by another connection: ${message}` } : { t: 'invalid', message };
  } finally {
    db.close();
  }
}

const kind = isMainThread ? null : (workerData as { kind?: string } | null)?.kind;
if (parentPort && kind === 'keyward-snapshot') {
  const result = run(workerData as WorkerInput);
  if (result.t === 'error') parentPort.postMessage(result);
  parentPort.close();
} else if (parentPort && kind === 'keyward-changes') {
  parentPort.postMessage(runChanges(workerData as ChangesInput));
  parentPort.close();
} else if (parentPort && kind === 'keyward-fold') {
  const db = openDatabase((workerData as { dbPath: string }).dbPath);
  try {
    db.pragma('wal_checkpoint(PASSIVE)');
  } finally {
    db.close();
  }
  parentPort.close();
}
