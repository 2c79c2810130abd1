/**
 * The console history tag in the replica (sync protocol v1 addition, DESIGN section 7):
 * kept beside the version by every writer (snapshot and change batch, on this thread and
 * on the worker, and `keyward import`), null when the console named none; a replica file
 * from before it gains the column in place; a malformed tag is refused like any bad field.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import Database from 'better-sqlite3';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ReplicaStore } from '../../src/replica/store.js';
import { applyChangeTextOffThread, applySnapshotStream } from '../../src/replica/snapshot-apply.js';
import { replicaWriter } from '../../src/replica/writer.js';
import { SCHEMA_VERSION } from '../../src/replica/schema.js';
import { importSnapshotFile } from '../../src/app/import.js';
import { InvalidBatchError } from '../../src/protocol/writer.js';
import { buildSnapshot, sha256 } from '../helpers/console-replica.js';

let dir: string;
before(() => {
  dir = mkdtempSync(join(tmpdir(), 'kw-replica-tag-'));
});
after(() => rmSync(dir, { recursive: true, force: true }));

const wallet = { type: 'wallet', user: 'u_1', balance: 5 };
const key = (id: string) => ({
  type: 'key', id, hash: sha256(id), kind: 'personal', user: 'u_1', project: null, status: 'active', budget: null, spent: 0,
  models: null, routing: null, rpm: null, tpm: null, concurrency: null,
});
const snapshot = (meta: object, records: object[] = [wallet, key('k_1')]) => [{ type: 'meta', ...meta }, ...records].map((r) => JSON.stringify(r)).join('\n') + '\n';

async function* once(text: string) {
  yield Buffer.from(text);
}

test('a replica file from schema 3 gains the tag column in place: version kept, no tag; a tagged snapshot applied over it keeps its tag', async () => {
  const path = join(dir, 'schema3.sqlite');
  const made = new ReplicaStore({ path });
  await replicaWriter(made).applySnapshot({ body: once(snapshot({ version: 6 })), source: 'test' });
  await made.close();
  const older = new Database(path);
  older.exec('ALTER TABLE meta DROP COLUMN tag; PRAGMA user_version = 3;');
  older.close();

  const replica = new ReplicaStore({ path });
  assert.equal(replica.db.pragma('user_version', { simple: true }), SCHEMA_VERSION);
  assert.deepEqual([replica.status().ready, replica.status().version, replica.status().tag], [true, 6, null]);
  assert.ok(replica.lookup(sha256('k_1')), 'rows kept');
  const writer = replicaWriter(replica);
  await writer.applySnapshot({ body: once(snapshot({ version: 2, tag: '0a1b2c3d4e5f6071' }, [wallet, key('k_2')])), source: 'test' });
  assert.deepEqual([replica.status().version, writer.tag?.()], [2, '0a1b2c3d4e5f6071']);
  assert.equal(replica.lookup(sha256('k_1')), null);
  await replica.close();
  const again = new ReplicaStore({ path });
  assert.deepEqual([again.status().version, again.status().tag], [2, '0a1b2c3d4e5f6071'], 'kept across a reopen');
  await again.close();
});

test('change batches on this thread and on the worker keep the tag they carry, or none', async () => {
  const replica = new ReplicaStore({ path: join(dir, 'changes.sqlite') });
  const writer = replicaWriter(replica);
  await writer.applySnapshot({ body: once(snapshot({ version: 1, tag: 'aaaa' })), source: 'test' });
  assert.equal(writer.tag?.(), 'aaaa');
  await writer.applyChangeText(JSON.stringify({ version: 2, tag: 'bbbb', changes: [{ op: 'upsert', ...key('k_2') }] }), 'test');
  assert.deepEqual([replica.status().version, replica.status().tag], [2, 'bbbb']);
  await writer.applyChangeText(JSON.stringify({ version: 3, changes: [] }), 'test');
  assert.deepEqual([replica.status().version, replica.status().tag], [3, null], 'a batch without a tag leaves none');

  const text = JSON.stringify({ version: 4, tag: 'cccc', changes: [{ op: 'upsert', ...key('k_3') }] });
  assert.deepEqual(await applyChangeTextOffThread({ replica, text, source: 'test' }), { version: 4, changes: 1, applied: true });
  assert.deepEqual([replica.status().version, replica.status().tag], [4, 'cccc']);
  await replica.close();
});

test('the snapshot worker keeps the meta line tag', async () => {
  const replica = new ReplicaStore({ path: join(dir, 'worker.sqlite') });
  const chunks = buildSnapshot({ keys: 5000, version: 9 });
  chunks[0] = Buffer.from(chunks[0]!.toString('utf8').replace('{"type":"meta","version":9}', '{"type":"meta","version":9,"tag":"dddd"}'));
  const applied = await applySnapshotStream({ replica, body: (async function* () { yield* chunks; })(), source: 'test' });
  assert.equal(applied.offThread, true);
  assert.deepEqual([replica.status().version, replica.status().tag], [9, 'dddd']);
  await replica.close();
});

test('keyward import keeps the tag of the file', async () => {
  const file = join(dir, 'snapshot.ndjson');
  const path = join(dir, 'imported.sqlite');
  writeFileSync(file, snapshot({ version: 12, tag: 'eeee' }));
  await importSnapshotFile({ replicaPath: path, file });
  const replica = new ReplicaStore({ path });
  assert.deepEqual([replica.status().version, replica.status().tag], [12, 'eeee']);
  await replica.close();
  writeFileSync(file, snapshot({ version: 13 }));
  await importSnapshotFile({ replicaPath: path, file });
  const untagged = new ReplicaStore({ path });
  assert.deepEqual([untagged.status().version, untagged.status().tag], [13, null]);
  await untagged.close();
});

test('a malformed tag refuses the snapshot whole, or the batch, and the replica stays', async () => {
  const replica = new ReplicaStore({ path: join(dir, 'bad.sqlite') });
  const writer = replicaWriter(replica);
  await writer.applySnapshot({ body: once(snapshot({ version: 1, tag: 'ffff' })), source: 'test' });
  for (const tag of ['', 'x'.repeat(65), 7]) {
    await assert.rejects(writer.applySnapshot({ body: once(snapshot({ version: 2, tag })), source: 'test' }), /line 1: expected the meta record first: tag/);
    await assert.rejects(writer.applyChangeText(JSON.stringify({ version: 2, tag, changes: [] }), 'test'), InvalidBatchError);
  }
  assert.deepEqual([replica.status().version, replica.status().tag], [1, 'ffff']);
  await replica.close();
});
