/**
 * A replica file whose write lock another connection holds (a `keyward import` into the
 * same path, a sqlite3 shell, a backup tool): applying a snapshot or a change batch never
 * waits for the lock on the event loop (DESIGN section 7 allows a 50 ms stall), the wait
 * happens on a worker thread, and a lock is not taken for bad data (which would cost a
 * snapshot and the long backoff of data that cannot be applied).
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { ReplicaStore } from '../../src/replica/store.js';
import { replicaWriter } from '../../src/replica/writer.js';
import { applyChangeTextOffThread } from '../../src/replica/snapshot-apply.js';
import { parseSnapshotText } from '../../src/protocol/ndjson.js';
import { UnusableDataError } from '../../src/protocol/writer.js';
import { buildSnapshot, measureStall, sha256 } from '../helpers/console-replica.js';

const dir = mkdtempSync(join(tmpdir(), 'kw-locked-'));
after(() => rmSync(dir, { recursive: true, force: true }));

const project = '{"type":"project","id":"p","status":"enabled","budget":null,"spent":0}';
const key = (id: string, status: string) =>
  `{"type":"key","id":"${id}","hash":"${sha256(id)}","kind":"team","user":null,"project":"p","status":"${status}","budget":null,"spent":0,"models":null,"routing":null,"rpm":null,"tpm":null,"concurrency":null}`;
const snapshotText = (version: number) => `{"type":"meta","version":${version}}\n${project}\n${key('k_1', 'active')}\n`;

/**
 * Waiting for the lock on the event loop stalls it for the busy timeout (5 s: the release
 * below is a timer on the same loop). The bound leaves room for a busy CI machine, whose
 * own stalls are not this code's; DESIGN's 50 ms is measured with a quiet loop elsewhere.
 */
const STALL_BOUND_MS = 500;

/** A replica holding one active key at version 1, and a second connection to its file. */
function lockedReplica(name: string): { replica: ReplicaStore; other: Database.Database } {
  const replica = new ReplicaStore({ path: join(dir, `${name}.sqlite`), owner: true });
  replica.applySnapshot({ ...parseSnapshotText(snapshotText(1)), source: 'test' });
  const other = new Database(replica.db.name);
  // What a writer in another process holds while its transaction is open.
  other.prepare('BEGIN IMMEDIATE').run();
  return { replica, other };
}

test('a change batch meeting a lock another connection holds waits on a worker, not the event loop, and applies once the lock goes', async () => {
  const warm = new ReplicaStore({ path: join(dir, 'warm.sqlite') });
  warm.applySnapshot({ ...parseSnapshotText(snapshotText(1)), source: 'test' });
  // The first worker of a process loads its modules (tens of ms on this thread under tsx): not what is measured here.
  await applyChangeTextOffThread({ replica: warm, text: '{"version":2,"changes":[]}', source: 'test' });
  await warm.close();
  const { replica, other } = lockedReplica('changes');
  const writer = replicaWriter(replica);
  const batch = JSON.stringify({ version: 2, changes: [{ op: 'delete', type: 'key', id: 'k_1' }] });
  // Held well past 50 ms: waited for on the event loop, it would show as a stall this long.
  const release = setTimeout(() => other.prepare('COMMIT').run(), 600);
  const { result, maxStallMs } = await measureStall(() => writer.applyChangeText(batch, 'console'));
  clearTimeout(release);
  assert.equal(result.applied, true);
  assert.equal(replica.status().version, 2);
  assert.equal(replica.lookup(sha256('k_1'))?.key.status, 'deleted');
  assert.ok(maxStallMs < STALL_BOUND_MS, `the event loop stalled ${maxStallMs.toFixed(0)} ms waiting for the lock`);
  other.close();
  await replica.close();
});

test('a small snapshot meeting a lock fails at once as a passing failure (not bad data), and the old replica stays', async () => {
  const { replica, other } = lockedReplica('snapshot');
  const writer = replicaWriter(replica);
  const body = (async function* () {
    yield Buffer.from(snapshotText(5));
  })();
  const { result, maxStallMs } = await measureStall(() => writer.applySnapshot({ body, source: 'console' }).then(() => null, (err: unknown) => err));
  assert.ok(result instanceof Error, 'the snapshot is not applied under the lock');
  assert.ok(!(result instanceof UnusableDataError), `a lock is not bad data: ${(result as Error).message}`);
  assert.ok(maxStallMs < STALL_BOUND_MS, `the event loop stalled ${maxStallMs.toFixed(0)} ms waiting for the lock`);
  assert.equal(replica.status().version, 1);
  other.prepare('COMMIT').run();
  other.close();
  await replica.close();
});

test('a change batch whose lock outlasts the busy timeout is a passing failure, not a batch that can never apply', async () => {
  const { replica, other } = lockedReplica('outlasts');
  const writer = replicaWriter(replica);
  const batch = JSON.stringify({ version: 2, changes: [{ op: 'delete', type: 'key', id: 'k_1' }] });
  const err = await writer.applyChangeText(batch, 'console').then(() => null, (e: unknown) => e);
  assert.ok(err instanceof Error, 'not applied under the lock');
  assert.ok(!(err instanceof UnusableDataError), `a lock is not bad data: ${err.message}`);
  other.prepare('COMMIT').run();
  other.close();
  // Once released, the same batch applies.
  assert.equal((await writer.applyChangeText(batch, 'console')).applied, true);
  await replica.close();
});

test('a large snapshot whose lock outlasts the busy timeout fails on its worker as a passing failure, and the old replica stays', async () => {
  const { replica, other } = lockedReplica('large');
  const writer = replicaWriter(replica);
  // Past the size applied on this thread: the worker meets the lock.
  const body = (async function* () {
    yield* buildSnapshot({ keys: 3000, version: 5 });
  })();
  const err = await writer.applySnapshot({ body, source: 'console' }).then(() => null, (e: unknown) => e);
  assert.ok(err instanceof Error, 'not applied under the lock');
  assert.ok(!(err instanceof UnusableDataError), `a lock is not bad data: ${err.message}`);
  assert.equal(replica.status().version, 1);
  other.prepare('COMMIT').run();
  other.close();
  await replica.close();
});
