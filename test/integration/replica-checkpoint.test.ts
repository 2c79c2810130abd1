/**
 * The replica's WAL is checkpointed on a worker, never inside a commit of the main
 * connection (DESIGN section 7: applying a batch never stalls the event loop past 50 ms),
 * and a change batch of many short changes is applied off the event loop however few
 * characters it has.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ReplicaStore } from '../../src/replica/store.js';
import { applyChangeTextOffThread, foldSoon } from '../../src/replica/snapshot-apply.js';
import { replicaWriter } from '../../src/replica/writer.js';
import { parseSnapshotText } from '../../src/protocol/ndjson.js';
import { buildSnapshot } from '../helpers/console-replica.js';

const dir = mkdtempSync(join(tmpdir(), 'kw-checkpoint-'));
after(() => rmSync(dir, { recursive: true, force: true }));

const fileBytes = (replica: ReplicaStore) => statSync(replica.db.name).size;
const pageBytes = (replica: ReplicaStore) =>
  (replica.db.pragma('page_count', { simple: true }) as number) * (replica.db.pragma('page_size', { simple: true }) as number);

test('commits on the main connection leave the WAL to a worker, which folds it into the file', async () => {
  const replica = new ReplicaStore({ path: join(dir, 'fold.sqlite') });
  assert.equal(replica.db.pragma('wal_autocheckpoint', { simple: true }), 0, 'the main connection never checkpoints');
  // 20,000 keys: past SQLite's automatic checkpoint of 1,000 pages, which would have run inside this commit.
  replica.applySnapshot({ ...parseSnapshotText(Buffer.concat(buildSnapshot({ keys: 20_000, version: 1 })).toString()), source: 'test' });
  assert.ok(fileBytes(replica) < pageBytes(replica) / 2, `the pages are still in the WAL: file ${fileBytes(replica)} of ${pageBytes(replica)}`);
  const folded = foldSoon(replica);
  assert.ok(folded, 'a checkpoint is handed to a worker');
  assert.equal(foldSoon(replica), null, 'one at a time');
  await folded;
  assert.equal(fileBytes(replica), pageBytes(replica), 'the worker copied every page into the file');
  assert.equal(replica.lookup(replica.db.prepare("SELECT hash FROM keys WHERE id = 'k_19999'").pluck().get() as string)?.key.id, 'k_19999');
  await replica.close();
});

test('a change batch of many short changes goes to the worker, whatever its length in characters', async () => {
  const replica = new ReplicaStore({ path: join(dir, 'many.sqlite') });
  const writer = replicaWriter(replica);
  replica.applySnapshot({ ...parseSnapshotText(Buffer.concat(buildSnapshot({ keys: 1_000, version: 1 })).toString()), source: 'test' });
  const deletes = (from: number, n: number) => Array.from({ length: n }, (_, i) => ({ op: 'delete', type: 'key', id: `k_${from + i}` }));
  const few = await writer.applyChangeText(JSON.stringify({ version: 2, changes: deletes(0, 10) }), 'test');
  assert.equal(few.offThread, false, 'a few changes are applied here');
  const text = JSON.stringify({ version: 3, changes: deletes(10, 900) });
  assert.ok(text.length < 96 * 1024, 'short enough to have been applied on the event loop');
  const many = await writer.applyChangeText(text, 'test');
  assert.deepEqual([many.offThread, many.changes, many.applied], [true, 900, true]);
  // a deleted key stays as a tombstone (it answers api_key_deleted)
  assert.equal(replica.db.prepare("SELECT COUNT(*) FROM keys WHERE status = 'deleted'").pluck().get(), 910);
  await replica.close();
});

test('close resolves once no checkpoint worker has the path open, and none starts after it', async () => {
  const replica = new ReplicaStore({ path: join(dir, 'closing.sqlite') });
  replica.applySnapshot({ ...parseSnapshotText(Buffer.concat(buildSnapshot({ keys: 10, version: 1 })).toString()), source: 'test' });
  const fold = foldSoon(replica);
  assert.ok(fold, 'a checkpoint is running on a worker');
  let folded = false;
  void fold.then(() => (folded = true));
  // A caller that removes the replica's directory next must not race a worker that reopens its files.
  await replica.close();
  assert.equal(folded, true, 'close waited for the worker');
  assert.equal(foldSoon(replica), null, 'a closed replica is not checkpointed');
  const batch = JSON.stringify({ version: 2, changes: [{ op: 'delete', type: 'key', id: 'k_1' }] });
  await assert.rejects(applyChangeTextOffThread({ replica, text: batch, source: 'test' }), /the replica is closed/, 'nor given a worker close() could not wait for');
});
