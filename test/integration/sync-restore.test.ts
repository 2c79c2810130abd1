/**
 * A console restored from a backup while a sidecar keeps running (DESIGN section 7, the
 * history tag): once the restored console has taken more writes than it lost, the
 * sidecar's version is a valid number again, but of a history the console no longer has.
 * The tag makes the console answer 410, so the sidecar takes a snapshot instead of
 * applying only what comes after that number.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ReplicaStore } from '../../src/replica/store.js';
import { createSyncClient, type SyncClient } from '../../src/sync/client.js';
import { replicaWriter } from '../../src/replica/writer.js';
import { startConsoleFixture, type ConsoleFixture } from '../helpers/console-fixture.js';
import { lookupSecret, whenReplica } from '../helpers/console-replica.js';
import { adminCall, copyStore, gatedFetch } from '../helpers/console-restore.js';

let fx: ConsoleFixture;
let dir: string;
let client: SyncClient | null = null;
let replica: ReplicaStore | null = null;

before(async () => {
  fx = await startConsoleFixture();
  dir = mkdtempSync(join(tmpdir(), 'kw-sync-restore-'));
});
after(async () => {
  await client?.stop();
  await replica?.close();
  await fx.close();
  rmSync(dir, { recursive: true, force: true });
});

const credit = (user: string) => adminCall(fx, 'POST', `/admin/v1/wallets/${user}/credit`, { amount: 1 });
const newKey = async (user: string) => (await adminCall(fx, 'POST', '/admin/v1/keys', { kind: 'personal', user })).body as { key: { id: string }; secret: string };

/** Starts the console again on its store; returns the store's version. */
async function restartAndVersion(): Promise<number> {
  await fx.restart();
  return fx.console.store.feed.version();
}

test('a console restored from a backup: the sidecar takes a snapshot, so what the restore lost and what it changed since both reach it', async () => {
  const store = fx.config.store.path;
  const backup = join(dir, 'backup.sqlite');
  const k1 = await newKey('ann');
  await credit('ann');
  await fx.console.close();
  copyStore(store, backup);
  const backupVersion = await restartAndVersion();

  // A sidecar follows the console through writes the backup does not have.
  const gate = gatedFetch();
  replica = new ReplicaStore({ path: join(dir, 'replica.sqlite') });
  client = createSyncClient({ url: fx.url, token: fx.tokens.sync, waitMs: 500, target: replicaWriter(replica), backoff: { baseMs: 20, maxMs: 100 }, fetch: gate.through });
  await client.start();
  const k2 = await newKey('bob');
  for (let i = 0; i < 3; i++) await credit('bob');
  const lost = fx.console.store.feed.version();
  await whenReplica(replica, () => replica!.status().version === lost);
  assert.ok(lookupSecret(replica, k2.secret), 'the sidecar has K2, which the backup lacks');
  const snapshots = client.status().snapshots;

  // Restored while the sidecar waits between attempts; the restored console then takes more writes than it lost.
  gate.shut();
  await fx.console.close();
  copyStore(backup, store);
  assert.equal(await restartAndVersion(), backupVersion);
  assert.equal((await adminCall(fx, 'DELETE', `/admin/v1/keys/${k1.key.id}`)).status, 200);
  while (fx.console.store.feed.version() <= lost) assert.equal((await credit('ann')).status, 200);
  gate.open();

  await whenReplica(replica, () => lookupSecret(replica!, k1.secret)?.key.status === 'deleted' && lookupSecret(replica!, k2.secret) === null);
  assert.equal(replica.status().version, fx.console.store.feed.version());
  await new Promise((r) => setImmediate(r)); // the client counts the snapshot right after the replica swaps
  assert.equal(client.status().snapshots, snapshots + 1, 'through a snapshot');
});
