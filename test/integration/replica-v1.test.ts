import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Database from 'better-sqlite3';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ReplicaStore } from '../../src/replica/store.js';
import { applyChangeTextOffThread, applySnapshotStream } from '../../src/replica/snapshot-apply.js';
import { replicaWriter } from '../../src/replica/writer.js';
import { parseSnapshotText } from '../../src/protocol/ndjson.js';
import { SCHEMA_VERSION } from '../../src/replica/schema.js';
import { UnusableDataError } from '../../src/protocol/writer.js';
import { buildSnapshot, sha256 } from '../helpers/console-replica.js';

let dir: string;
before(() => {
  dir = mkdtempSync(join(tmpdir(), 'kw-replica-v1-'));
});
after(() => rmSync(dir, { recursive: true, force: true }));

const key = (id: string, extra: Record<string, unknown> = {}) => ({
  type: 'key', id, hash: sha256(id), kind: 'team', user: null, project: 'p_1', status: 'active', budget: 10, spent: 1,
  models: null, routing: null, rpm: null, tpm: null, concurrency: null, ...extra,
});
const lines = (version: number, records: object[]) => [{ type: 'meta', version }, ...records].map((r) => JSON.stringify(r)).join('\n') + '\n';

/** The replica tables as schema 1 wrote them, before the v1 protocol additions. */
const SCHEMA_1 = `
CREATE TABLE meta (id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL, applied_at INTEGER NOT NULL, source TEXT NOT NULL);
CREATE TABLE keys (id TEXT PRIMARY KEY, hash TEXT NOT NULL UNIQUE, kind TEXT NOT NULL, user_id TEXT, project_id TEXT, status TEXT NOT NULL,
  budget REAL, spent REAL NOT NULL, models TEXT, routing TEXT, rpm INTEGER, tpm INTEGER, concurrency INTEGER);
CREATE TABLE projects (id TEXT PRIMARY KEY, status TEXT NOT NULL, budget REAL, spent REAL NOT NULL);
CREATE TABLE wallets (user_id TEXT PRIMARY KEY, balance REAL NOT NULL);
INSERT INTO meta VALUES (1, 7, 0, 'console');
INSERT INTO keys VALUES ('k_old', '${sha256('k_old')}', 'team', NULL, 'p_1', 'active', 3, 1, '["gpt-4o*"]', NULL, 60, NULL, NULL);
INSERT INTO keys VALUES ('k_me', '${sha256('k_me')}', 'personal', 'u_1', NULL, 'active', NULL, 0, NULL, NULL, NULL, NULL, NULL);
INSERT INTO projects VALUES ('p_1', 'enabled', 100, 12.5);
INSERT INTO wallets VALUES ('u_1', 5);
PRAGMA user_version = 1;
`;

test('a replica file from schema 1 is migrated in place: rows kept, ready, v1 fields at their defaults', async () => {
  const path = join(dir, 'old.sqlite');
  const old = new Database(path);
  old.exec(SCHEMA_1);
  old.close();

  const replica = new ReplicaStore({ path });
  assert.equal(replica.db.pragma('user_version', { simple: true }), SCHEMA_VERSION);
  assert.deepEqual(replica.status().version, 7);
  const f = replica.lookup(sha256('k_old'))!;
  assert.deepEqual(f.key, {
    id: 'k_old', kind: 'team', userId: null, projectId: 'p_1', status: 'active', budget: 3, spent: 1, models: ['gpt-4o*'],
    routing: null, rpm: 60, tpm: null, concurrency: null, epoch: 0, ips: null, allowBrowser: false, modelLimits: null, period: null, shadow: [],
  });
  assert.deepEqual(f.project, { id: 'p_1', status: 'enabled', budget: 100, spent: 12.5, epoch: 0, period: null });
  assert.equal(f.walletEpoch, null, 'a team key with no wallet row');
  const me = replica.lookup(sha256('k_me'))!;
  assert.equal(me.walletBalance, 5);
  assert.equal(me.walletEpoch, 0);
  assert.equal(replica.priceFor('gpt-4o'), null);

  // the migrated file takes v1 records, and a second open finds nothing left to do
  replica.applyChanges({ version: 8, changes: [{ op: 'upsert', ...(parseSnapshotText(lines(0, [key('k_old', { epoch: 2, allowBrowser: true })])).records[0]!.record) }] }, 'test');
  assert.equal(replica.lookup(sha256('k_old'))!.key.epoch, 2);
  await replica.close();
  const again = new ReplicaStore({ path });
  assert.equal(again.lookup(sha256('k_old'))!.key.allowBrowser, true);
  await again.close();
});

test("a replica file from schema 2 gains the keys' shadow column in place: rows kept, no key shadowed, shadow lists then stored", async () => {
  const path = join(dir, 'schema2.sqlite');
  const made = new ReplicaStore({ path });
  made.applySnapshot({ ...parseSnapshotText(lines(4, [key('k_two')])), source: 'test' });
  await made.close();
  const older = new Database(path);
  older.exec('ALTER TABLE keys DROP COLUMN shadow; PRAGMA user_version = 2;');
  older.close();

  const replica = new ReplicaStore({ path });
  assert.equal(replica.db.pragma('user_version', { simple: true }), SCHEMA_VERSION);
  assert.deepEqual(replica.lookup(sha256('k_two'))!.key.shadow, []);
  replica.applyChanges({ version: 5, changes: [{ op: 'upsert', ...(parseSnapshotText(lines(0, [key('k_two', { shadow: ['concurrency'] })])).records[0]!.record) }] }, 'test');
  assert.deepEqual(replica.lookup(sha256('k_two'))!.key.shadow, ['concurrency']);
  await replica.close();
});

test('a v1 snapshot: every new field reaches lookup; old-style records load with defaults; prices served by priceFor', async () => {
  const replica = new ReplicaStore({ path: join(dir, 'v1.sqlite') });
  const snap = parseSnapshotText(lines(3, [
    { type: 'project', id: 'p_1', status: 'enabled', budget: 50, spent: 2, epoch: 4, period: 'week' },
    { type: 'wallet', user: 'u_1', balance: 9, epoch: 6 },
    { type: 'wallet', user: 'u_2', balance: 1 },
    key('k_new', { epoch: 5, ips: ['10.0.0.0/8', '2001:db8::/32'], allowBrowser: true, period: 'month', modelLimits: [{ models: 'gpt-4o*', rpm: 10, tpm: 20000 }], shadow: ['tpm', 'rpm'], unknownField: true }),
    key('k_plain'),
    { type: 'key', id: 'k_u2', hash: sha256('k_u2'), kind: 'personal', user: 'u_2', project: null, status: 'active', budget: null, spent: 0, models: null, routing: null, rpm: null, tpm: null, concurrency: null },
    { type: 'price', model: 'gpt-4o*', input: 2.5, output: 10, per: 1000000 },
    { type: 'price', model: 'gpt-4o-mini*', input: 0.15, output: 0.6, per: 1000000 },
    { type: 'price', model: 'gpt-4o-mini', input: 0.1, output: 0.5, per: 1000 },
  ]));
  assert.deepEqual(replica.applySnapshot({ ...snap, source: 'test' }), { keys: 3, projects: 1, wallets: 2, prices: 3 });
  const f = replica.lookup(sha256('k_new'))!;
  assert.equal(f.key.epoch, 5);
  assert.deepEqual(f.key.ips, ['10.0.0.0/8', '2001:db8::/32']);
  assert.equal(f.key.allowBrowser, true);
  assert.deepEqual(f.key.modelLimits, [{ models: 'gpt-4o*', rpm: 10, tpm: 20000 }]);
  assert.equal(f.key.period, 'month');
  assert.deepEqual(f.key.shadow, ['rpm', 'tpm']);
  assert.equal(f.project!.epoch, 4);
  assert.equal(f.project!.period, 'week');
  const plain = replica.lookup(sha256('k_plain'))!.key;
  assert.deepEqual([plain.epoch, plain.ips, plain.allowBrowser, plain.modelLimits, plain.period, plain.shadow], [0, null, false, null, null, []]);
  const u2 = replica.lookup(sha256('k_u2'))!;
  assert.deepEqual([u2.walletBalance, u2.walletEpoch], [1, 0]);

  assert.deepEqual(replica.priceFor('gpt-4o-mini'), { input: 0.1, output: 0.5, per: 1000 });
  assert.deepEqual(replica.priceFor('gpt-4o-mini-2024-07-18'), { input: 0.15, output: 0.6, per: 1e6 });
  assert.deepEqual(replica.priceFor('gpt-4o'), { input: 2.5, output: 10, per: 1e6 });
  assert.equal(replica.priceFor('claude-3'), null);
  await replica.close();
});

test('change batches: a price upsert changes priceFor at once, a price delete removes it, other prices stay', async () => {
  const replica = new ReplicaStore({ path: join(dir, 'changes.sqlite') });
  replica.applySnapshot({ ...parseSnapshotText(lines(1, [{ type: 'price', model: 'gpt-4o*', input: 2.5, output: 10, per: 1e6 }, { type: 'price', model: '*', input: 1, output: 1, per: 1e6 }])), source: 'test' });
  assert.equal(replica.priceFor('gpt-4o')!.input, 2.5, 'cached now');
  const writer = replicaWriter(replica);
  await writer.applyChangeText(JSON.stringify({ version: 2, changes: [{ op: 'upsert', type: 'price', model: 'gpt-4o*', input: 5, output: 20, per: 1e6 }] }), 'test');
  assert.deepEqual(replica.priceFor('gpt-4o'), { input: 5, output: 20, per: 1e6 });
  await writer.applyChangeText(JSON.stringify({ version: 3, changes: [{ op: 'delete', type: 'price', model: 'gpt-4o*' }] }), 'test');
  assert.deepEqual(replica.priceFor('gpt-4o'), { input: 1, output: 1, per: 1e6 }, 'falls back to the catch-all');
  await writer.applyChangeText(JSON.stringify({ version: 4, changes: [{ op: 'delete', type: 'price', model: '*' }, { op: 'delete', type: 'price', model: 'never-there' }] }), 'test');
  assert.equal(replica.priceFor('gpt-4o'), null);
  assert.equal(replica.db.prepare('SELECT COUNT(*) FROM prices').pluck().get(), 0);

  // epochs move with upserts of the holder; a wallet delete takes its epoch with it
  await writer.applyChangeText(JSON.stringify({ version: 5, changes: [{ op: 'upsert', type: 'wallet', user: 'u', balance: 3, epoch: 2 }, { op: 'upsert', ...key('k_w', { kind: 'personal', user: 'u', project: null, budget: null }) }] }), 'test');
  assert.equal(replica.lookup(sha256('k_w'))!.walletEpoch, 2);
  await writer.applyChangeText(JSON.stringify({ version: 6, changes: [{ op: 'delete', type: 'wallet', id: 'u' }] }), 'test');
  assert.deepEqual([replica.lookup(sha256('k_w'))!.walletBalance, replica.lookup(sha256('k_w'))!.walletEpoch], [null, null]);
  await replica.close();
});

test('the snapshot worker and the change worker apply prices and v1 fields too', async () => {
  const replica = new ReplicaStore({ path: join(dir, 'worker.sqlite') });
  const chunks = buildSnapshot({ keys: 5000, version: 2 });
  chunks.push(Buffer.from(
    JSON.stringify(key('k_v1', { project: 'p_big', ips: ['192.168.0.0/16'], modelLimits: [{ models: 'o1*', rpm: 1, tpm: null }], epoch: 9, shadow: ['budget'] })) + '\n' +
    JSON.stringify({ type: 'price', model: 'o1*', input: 15, output: 60, per: 1e6 }) + '\n',
  ));
  assert.ok(chunks.reduce((n, c) => n + c.length, 0) > 256 * 1024, 'large enough to go to the worker');
  async function* body() {
    for (const c of chunks) yield new Uint8Array(c);
  }
  const applied = await applySnapshotStream({ replica, body: body(), source: 'test' });
  assert.equal(applied.prices, 1);
  assert.equal(applied.keys, 5001);
  assert.deepEqual(replica.priceFor('o1-preview'), { input: 15, output: 60, per: 1e6 });
  const f = replica.lookup(sha256('k_v1'))!;
  assert.deepEqual([f.key.epoch, f.key.ips, f.key.modelLimits, f.key.shadow], [9, ['192.168.0.0/16'], [{ models: 'o1*', rpm: 1, tpm: null }], ['budget']]);

  const text = JSON.stringify({ version: 3, changes: [{ op: 'delete', type: 'price', model: 'o1*' }, { op: 'upsert', type: 'price', model: 'o3', input: 2, output: 8, per: 1e6 }] });
  assert.deepEqual(await applyChangeTextOffThread({ replica, text, source: 'test' }), { version: 3, changes: 2, applied: true });
  assert.equal(replica.priceFor('o1-preview'), null);
  assert.deepEqual(replica.priceFor('o3'), { input: 2, output: 8, per: 1e6 });
  await replica.close();
});

test('a bad CIDR in a snapshot rejects it whole and the old replica stays', async () => {
  const replica = new ReplicaStore({ path: join(dir, 'bad.sqlite') });
  replica.applySnapshot({ ...parseSnapshotText(lines(1, [key('k_a')])), source: 'test' });
  const text = lines(2, [key('k_b'), key('k_c', { ips: ['10.0.0.0/40'] })]);
  await assert.rejects(applySnapshotStream({ replica, body: (async function* () { yield Buffer.from(text); })(), source: 'test' }), /line 3: ips\.0: expected a CIDR/);
  assert.equal(replica.status().version, 1);
  assert.equal(replica.lookup(sha256('k_b')), null);
  await replica.close();
});

test('a small snapshot that is not UTF-8 is bad data (not fetched again at once), and the old replica stays', async () => {
  const replica = new ReplicaStore({ path: join(dir, 'utf8.sqlite') });
  replica.applySnapshot({ ...parseSnapshotText(lines(1, [key('k_a')])), source: 'test' });
  const body = Buffer.concat([Buffer.from(lines(2, [key('k_b')])), Buffer.from([0x1f, 0x8b, 0xff, 0xfe, 0x0a])]);
  const err = await applySnapshotStream({ replica, body: (async function* () { yield body; })(), source: 'test' }).then(() => assert.fail('applied'), (e: unknown) => e);
  assert.ok(err instanceof UnusableDataError, String(err));
  assert.match((err as Error).message, /not UTF-8 text/);
  assert.equal(replica.status().version, 1);
  await replica.close();
});

test('a snapshot body with no meta record (empty, or only blank lines: a proxy answering 200 with nothing) is refused, and the replica keeps every key', async () => {
  const replica = new ReplicaStore({ path: join(dir, 'no-meta.sqlite') });
  replica.applySnapshot({ ...parseSnapshotText(lines(4, [key('k_stays')])), source: 'test' });
  for (const text of ['', '\n\n', '  \n']) {
    const body = (async function* () { if (text) yield Buffer.from(text); })();
    await assert.rejects(replicaWriter(replica).applySnapshot({ body, source: 'test' }), /no meta record/, JSON.stringify(text));
    assert.equal(replica.status().version, 4, JSON.stringify(text));
    assert.equal(replica.lookup(sha256('k_stays'))?.key.status, 'active', JSON.stringify(text));
  }
  assert.throws(() => parseSnapshotText(''), /no meta record/);
  await replica.close();
});

test('a wallet upsert over an existing wallet moves its epoch with its balance (a period restart), on this thread and on the worker', async () => {
  for (const where of ['here', 'worker'] as const) {
    const replica = new ReplicaStore({ path: join(dir, `wallet-epoch-${where}.sqlite`) });
    const mine = key('k_e', { kind: 'personal', user: 'u_e', project: null, budget: null });
    replica.applySnapshot({ ...parseSnapshotText(lines(1, [{ type: 'wallet', user: 'u_e', balance: 2, epoch: 1 }, mine])), source: 'test' });
    assert.deepEqual([replica.lookup(sha256('k_e'))!.walletBalance, replica.lookup(sha256('k_e'))!.walletEpoch], [2, 1]);
    const text = JSON.stringify({ version: 2, changes: [{ op: 'upsert', type: 'wallet', user: 'u_e', balance: 10, epoch: 2 }] });
    if (where === 'here') await replicaWriter(replica).applyChangeText(text, 'test');
    else await applyChangeTextOffThread({ replica, text, source: 'test' });
    const f = replica.lookup(sha256('k_e'))!;
    // an epoch left behind would read the new balance as the old period's
    assert.deepEqual([f.walletBalance, f.walletEpoch], [10, 2], where);
    await replica.close();
  }
});

test('lookup cache: a key in use stays cached, a cold one is read again, at most cacheSize entries', async () => {
  const path = join(dir, 'cache.sqlite');
  // watchMs: the change of another connection below is not noticed, so a cached answer shows itself as stale
  const replica = new ReplicaStore({ path, cacheSize: 4, watchMs: 3_600_000 });
  const ids = ['k_hot', 'k_a', 'k_b', 'k_c', 'k_d', 'k_e'];
  replica.applySnapshot({ ...parseSnapshotText(lines(1, ids.map((id) => key(id, { rpm: 1 })))), source: 'test' });
  const rpm = (id: string) => replica.lookup(sha256(id))!.key.rpm;
  for (const id of [...ids, 'k_hot']) assert.equal(rpm(id), 1);
  const other = new Database(path);
  other.prepare('UPDATE keys SET rpm = 2').run();
  other.close();
  // k_hot is asked for between every other key: it stays cached (still rpm 1) while the
  // others pass through a cache of four; k_a, last asked for five lookups ago, is read again.
  for (const id of ['k_b', 'k_hot', 'k_c', 'k_hot', 'k_d', 'k_hot', 'k_e', 'k_hot']) rpm(id);
  assert.equal(rpm('k_hot'), 1, 'a key in use is answered from the cache');
  assert.equal(rpm('k_a'), 2, 'a key that went cold is read from the replica again');
  await replica.close();
});

test('a file that cannot be the replica is refused with its path and what to do', () => {
  const garbage = join(dir, 'garbage.sqlite');
  writeFileSync(garbage, 'not a database, just text '.repeat(200));
  const other = join(dir, 'other.sqlite');
  // another program's database with tables of the same names
  const db = new Database(other);
  db.exec('CREATE TABLE keys (id TEXT); CREATE TABLE meta (id INTEGER)');
  db.close();
  for (const path of [garbage, other]) {
    assert.throws(() => new ReplicaStore({ path }), (err: Error) => err.message.startsWith(`replica.path ${path} cannot be used as the replica (`) && /move it away/.test(err.message));
  }
});

test('a replica file another process holds locked is named as in use, not as one to move away', async () => {
  const path = join(dir, 'locked.sqlite');
  await new ReplicaStore({ path }).close();
  const holder = new Database(path);
  holder.pragma('locking_mode = EXCLUSIVE');
  holder.exec('BEGIN EXCLUSIVE');
  try {
    assert.throws(() => new ReplicaStore({ path }), (err: Error) => /locked/.test(err.message) && /another process holds it locked/.test(err.message) && !/move it away/.test(err.message));
  } finally {
    holder.exec('ROLLBACK');
    holder.close();
  }
});
