/**
 * The replica a syncing sidecar owns, damaged under it: a snapshot that meets the damage
 * moves the file aside, so the next snapshot fills a new file instead of failing the same
 * way forever (src/replica/writer.ts).
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { closeSync, fstatSync, mkdtempSync, openSync, readdirSync, rmSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ReplicaStore } from '../../src/replica/store.js';
import { foldSoon } from '../../src/replica/snapshot-apply.js';
import { replicaWriter } from '../../src/replica/writer.js';
import { parseSnapshotText } from '../../src/protocol/ndjson.js';
import { buildSnapshot } from '../helpers/console-replica.js';

const dir = mkdtempSync(join(tmpdir(), 'kw-replica-damaged-'));
after(() => rmSync(dir, { recursive: true, force: true }));

async function* chunks(bufs: Buffer[]): AsyncGenerator<Uint8Array> {
  yield* bufs;
}

/** A replica of 3,000 keys whose every page past the first 8 is overwritten. */
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
