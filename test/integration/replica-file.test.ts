/**
 * The replica's file changing under a running sidecar: deleted or replaced (the open
 * connection keeps the old file, while worker threads open the path), or damaged. Either
 * way the sidecar must not go on serving data its writes no longer reach (DESIGN sections 7
 * and 8: a deletion is in force within a second), nor answer every request with an error.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { closeSync, existsSync, fstatSync, mkdtempSync, openSync, readdirSync, rmSync, writeFileSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ReplicaStore } from '../../src/replica/store.js';
import { foldSoon } from '../../src/replica/snapshot-apply.js';
import { replicaWriter } from '../../src/replica/writer.js';
import { fileAt, sameFile, type FileIdentity } from '../../src/replica/replica-file.js';
import { createSyncClient } from '../../src/sync/client.js';
import { buildSnapshot, lookupSecret, until } from '../helpers/console-replica.js';
import { startConsoleFixture } from '../helpers/console-fixture.js';
import { parseSnapshotText } from '../../src/protocol/ndjson.js';
import { importSnapshotFile } from '../../src/app/import.js';

const dir = mkdtempSync(join(tmpdir(), 'kw-replica-file-'));
after(() => rmSync(dir, { recursive: true, force: true }));

const hashOf = (i: number) => createHash('sha256').update(`key-${i}`).digest('hex');
async function* chunks(bufs: Buffer[]): AsyncGenerator<Uint8Array> {
  yield* bufs;
}
const deletes = (from: number, n: number) => Array.from({ length: n }, (_, i) => ({ op: 'delete', type: 'key', id: `k_${from + i}` }));

test('a replica file deleted while running: batches still reach the file served, and a snapshot moves to the new one', async () => {
  const path = join(dir, 'deleted.sqlite');
  const replica = new ReplicaStore({ path });
  const writer = replicaWriter(replica);
  await writer.applySnapshot({ body: chunks(buildSnapshot({ keys: 1_000, version: 1 })), source: 'test' });
  for (const ext of ['', '-wal', '-shm']) rmSync(path + ext, { force: true });
  assert.equal(foldSoon(replica), null, 'no checkpoint worker: it would open (and create) a file at the path');
  // 300 changes would go to a worker, which would write the new file: applied to the one served instead.
  const r = await writer.applyChangeText(JSON.stringify({ version: 2, changes: deletes(0, 300) }), 'test');
  assert.equal(replica.lookup(hashOf(0))?.key.status, 'deleted', 'the deletion is in force');
  assert.equal(replica.status().version, 2);
  assert.deepEqual([r.applied, r.offThread], [true, false]);
  assert.equal(writer.needsSnapshot?.(), true, 'the file served is no longer at the path');
  // The snapshot goes to the file at the path, and the store serves that file from then on.
  await writer.applySnapshot({ body: chunks(buildSnapshot({ keys: 1_000, version: 7 })), source: 'test' });
  assert.equal(writer.needsSnapshot?.(), false);
  assert.equal(replica.status().version, 7);
  assert.equal(replica.lookup(hashOf(999))?.key.id, 'k_999');
  const big = await writer.applyChangeText(JSON.stringify({ version: 8, changes: deletes(0, 300) }), 'test');
  assert.deepEqual([big.applied, big.offThread], [true, true], 'workers write the file served again');
  assert.equal(replica.lookup(hashOf(1))?.key.status, 'deleted');
  await replica.close();
});

test('a replica file deleted under a syncing client: the next turn takes a snapshot into a new file at the path', async () => {
  // The sync client, not only the writer, acts on it: changes long-polled into the deleted
  // file would reach nothing a worker or a restart opens.
  const fx = await startConsoleFixture();
  const path = join(dir, 'synced.sqlite');
  const replica = new ReplicaStore({ path, owner: true });
  const client = createSyncClient({ url: fx.url, token: fx.tokens.sync, waitMs: 200, target: replicaWriter(replica), backoff: { baseMs: 20, maxMs: 100 } });
  try {
    await client.start();
    assert.equal(client.status().snapshots, 1);
    for (const ext of ['', '-wal', '-shm']) rmSync(path + ext, { force: true });
    const k = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'personal', user: 'dee' } })).body as { secret: string };
    assert.ok(await until(() => client.status().snapshots === 2, 5000), 'a snapshot follows, within a few polls');
    assert.ok(existsSync(path), 'the replica is at replica.path again');
    assert.equal(replicaWriter(replica).needsSnapshot?.(), false, 'the store serves the new file');
    assert.ok(await until(() => lookupSecret(replica, k.secret) !== null));
    // what a second process (a --workers worker, a restart) opens at the path has it too
    const reader = new ReplicaStore({ path });
    assert.ok(await until(() => lookupSecret(reader, k.secret) !== null));
    await reader.close();
  } finally {
    await client.stop();
    await replica.close();
    await fx.close();
  }
});

/** A replica of 3,000 keys whose every page past the first 8 (the schema and the meta row survive) is overwritten. */
async function damagedReplica(name: string): Promise<string> {
  const path = join(dir, name);
  const first = new ReplicaStore({ path });
  first.applySnapshot({ ...parseSnapshotText(Buffer.concat(buildSnapshot({ keys: 3_000, version: 3 })).toString()), source: 'test' });
  await foldSoon(first);
  await first.close();
  const fd = openSync(path, 'r+');
  const size = fstatSync(fd).size;
  for (let at = 8 * 4096; at < size; at += 4096) writeSync(fd, Buffer.alloc(4096, 0x5a), 0, 4096, at);
  closeSync(fd);
  return path;
}

test('a damaged replica is moved aside at the first lookup that meets the damage, and a snapshot fills a new one', async () => {
  const path = await damagedReplica('damaged.sqlite');
  const moved: string[] = [];
  const replica = new ReplicaStore({ path, owner: true, onDamaged: (to) => moved.push(to) });
  assert.equal(replica.status().ready, true, 'the meta row still reads');
  let failures = 0;
  for (let i = 2_999; i >= 0 && moved.length === 0; i -= 97) {
    try {
      replica.lookup(hashOf(i));
    } catch {
      failures++;
    }
  }
  assert.equal(failures, 1, 'one lookup met the damage');
  assert.equal(moved.length, 1);
  assert.ok(existsSync(moved[0]!), 'the damaged file is kept aside');
  assert.ok(readdirSync(dir).some((f) => f.startsWith('damaged.sqlite.damaged-')));
  assert.equal(replica.status().ready, false, 'not ready: nothing is served from a damaged file');
  await replicaWriter(replica).applySnapshot({ body: chunks(buildSnapshot({ keys: 3_000, version: 4 })), source: 'test' });
  assert.equal(replica.status().ready, true);
  assert.equal(replica.lookup(hashOf(2_999))?.key.id, 'k_2999');
  await replica.close();
});

test('`keyward import` into a damaged replica fails and leaves its files where they are: only the syncing process moves them', async () => {
  const path = await damagedReplica('imported.sqlite');
  const file = join(dir, 'imported.ndjson');
  writeFileSync(file, Buffer.concat(buildSnapshot({ keys: 3_000, version: 4 })));
  await assert.rejects(importSnapshotFile({ replicaPath: path, file }), /is damaged \(.*(malformed|corrupt).*\): move it and its -wal and -shm files away, then import again/i);
  assert.deepEqual(readdirSync(dir).filter((f) => f.startsWith('imported.sqlite.damaged-')), [], 'nothing moved aside');
  const reader = new ReplicaStore({ path });
  assert.throws(() => { for (let i = 0; i < 3_000; i += 97) reader.lookup(hashOf(i)); }, /malformed|corrupt/i);
  assert.ok(existsSync(path), 'a reader leaves it too');
  assert.deepEqual(readdirSync(dir).filter((f) => f.startsWith('imported.sqlite.damaged-')), []);
  await reader.close();
});

test('a reader meets damage: it tells the owner once, naming its file; the owner moves only that file aside', async () => {
  const path = await damagedReplica('reported.sqlite');
  const told: FileIdentity[] = [];
  const reader = new ReplicaStore({ path, onDamageMet: (file) => told.push(file) });
  let failures = 0;
  for (let i = 0; i < 3_000; i += 97) {
    try {
      reader.lookup(hashOf(i));
    } catch {
      failures++;
    }
  }
  assert.ok(failures > 1, `lookups met the damage (${failures})`);
  assert.equal(told.length, 1, 'once per file');
  const owner = new ReplicaStore({ path, owner: true });
  assert.equal(owner.quarantine({ ifFile: { dev: told[0]!.dev, ino: told[0]!.ino + 1 } }), null, 'a report about another file moves nothing');
  assert.ok(existsSync(path) && sameFile(told[0]!, fileAt(path)));
  assert.match(owner.quarantine({ ifFile: told[0]! }) ?? '', /reported\.sqlite\.damaged-/);
  assert.equal(owner.quarantine({ ifFile: told[0]! }), null, 'a late report about the file moved aside moves nothing');
  assert.equal(owner.status().ready, false);
  await owner.close();
  await reader.close();
});

test('a replica without a snapshot takes no change batch: partial data would read as ready', async () => {
  const replica = new ReplicaStore({ path: join(dir, 'empty.sqlite') });
  const r = await replicaWriter(replica).applyChangeText(JSON.stringify({ version: 9, changes: deletes(0, 3) }), 'test');
  assert.equal(r.applied, false);
  assert.deepEqual([replica.status().ready, replica.status().version], [false, null]);
  await replica.close();
});

test('one syncing process to a replica path: a second is refused at start, and the path is free again once the first closes', async () => {
  const path = join(dir, 'owned.sqlite');
  const first = new ReplicaStore({ path, owner: true });
  assert.throws(() => new ReplicaStore({ path, owner: true }), /is synced by another keyward \(it holds .*owned\.sqlite\.owner locked\): give this one its own replica\.path/);
  const reader = new ReplicaStore({ path });
  assert.equal(reader.status().ready, false, 'a process that only reads it (a worker, `keyward import`) is not refused');
  await reader.close();
  await first.close();
  await new ReplicaStore({ path, owner: true }).close();
});

// A syncing sidecar's snapshot that meets the damage moves the file aside, so the next one fills a new file instead of failing the same way forever.
test('a snapshot that meets damage in the owned replica moves the file aside; the next snapshot fills a new file', async () => {
  const path = await damagedReplica('snap-damaged.sqlite');
  const moved: string[] = [];
  const replica = new ReplicaStore({ path, owner: true, onDamaged: (to) => moved.push(to) });
  const writer = replicaWriter(replica);
  try {
    await assert.rejects(writer.applySnapshot({ body: chunks(buildSnapshot({ keys: 3_000, version: 4 })), source: 'test' }), /malformed|corrupt/i);
    assert.equal(moved.length, 1, 'the damaged file was moved aside');
    assert.ok(readdirSync(dir).some((f) => f.startsWith('snap-damaged.sqlite.damaged-')));
    await writer.applySnapshot({ body: chunks(buildSnapshot({ keys: 3_000, version: 5 })), source: 'test' });
    assert.equal(replica.status().ready, true);
    assert.equal(replica.status().version, 5);
  } finally {
    await replica.close();
  }
});
