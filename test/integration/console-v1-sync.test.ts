import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ReplicaStore } from '../../src/replica/store.js';
import { replicaWriter } from '../../src/replica/writer.js';
import { createSyncClient, type SyncClient } from '../../src/sync/client.js';
import { runConsoleCli } from '../helpers/console-cli.js';
import { startConsole } from '../../src/app/console.js';
import { parseSnapshotText } from '../../src/protocol/ndjson.js';
import { startConsoleFixture, syncGet, type ConsoleFixture } from '../helpers/console-fixture.js';
import { lookupSecret, whenReplica } from '../helpers/console-replica.js';

let fx: ConsoleFixture;
let dir: string;
let replica: ReplicaStore;
let client: SyncClient;
let cli: (...argv: string[]) => ReturnType<typeof runConsoleCli>;

before(async () => {
  fx = await startConsoleFixture();
  dir = mkdtempSync(join(tmpdir(), 'kw-v1sync-'));
  replica = new ReplicaStore({ path: join(dir, 'replica.sqlite') });
  client = createSyncClient({ url: fx.url, token: fx.tokens.sync, waitMs: 1000, target: replicaWriter(replica), backoff: { baseMs: 20, maxMs: 100 } });
  await client.start();
  cli = (...argv) => runConsoleCli(argv, { env: { KEYWARD_ADMIN_TOKEN: fx.tokens.admin, KEYWARD_CONSOLE_URL: fx.url } });
});
after(async () => {
  await client.stop();
  await replica.close();
  await fx.close();
  rmSync(dir, { recursive: true, force: true });
});

const keyIn = (text: string) => /\bkw_[0-9A-Za-z]{43}_[0-9A-Za-z]{6}\b/.exec(text)?.[0];

test('the CLI flags round-trip through the sync feed into a sidecar replica\'s lookup', async () => {
  assert.equal((await cli('projects', 'create', 'p_net', '--budget', '50', '--budget-period', 'month')).code, 0);
  const made = await cli('keys', 'create', '--team', 'p_net', '--budget', '5', '--budget-period', 'week', '--ips', '10.0.0.0/8,192.168.0.0/16',
    '--allow-browser', '--model-limit', 'gpt-4o*:rpm=10,tpm=20000', '--model-limit', 'llama3:8b*:tpm=500', '--model-limit', 'o1*:rpm=2');
  assert.equal(made.code, 0, made.stderr);
  const secret = keyIn(made.stdout)!;
  const id = /key (k_[0-9a-f]+)/.exec(made.stdout)![1]!;

  await whenReplica(replica, () => lookupSecret(replica, secret) !== null);
  const f = lookupSecret(replica, secret)!;
  assert.deepEqual(f.key.ips, ['10.0.0.0/8', '192.168.0.0/16']);
  assert.equal(f.key.allowBrowser, true);
  assert.deepEqual(f.key.modelLimits, [
    { models: 'gpt-4o*', rpm: 10, tpm: 20000 }, { models: 'llama3:8b*', rpm: null, tpm: 500 }, { models: 'o1*', rpm: 2, tpm: null },
  ]);
  assert.equal(f.key.period, 'week');
  assert.equal(f.key.epoch, 0);
  assert.deepEqual([f.project!.period, f.project!.epoch], ['month', 0]);

  const shown = await cli('keys', 'show', id);
  assert.match(shown.stdout, /ips\s+10\.0\.0\.0\/8,192\.168\.0\.0\/16/);
  assert.match(shown.stdout, /allow browser\s+yes/);
  assert.match(shown.stdout, /model limits\s+gpt-4o\*:rpm=10,tpm=20000 llama3:8b\*:tpm=500 o1\*:rpm=2/);
  assert.match(shown.stdout, /budget period\s+week \(restarts \d{4}-\d\d-\d\d 00:00:00Z\)/);
  const listed = await cli('keys', 'list', '--project', 'p_net');
  assert.match(listed.stdout, /IPS\s+BROWSER\s+MODEL LIMITS/);
  assert.ok(listed.stdout.includes('10.0.0.0/8,192.168.0.0/16') && listed.stdout.includes('gpt-4o*:rpm=10,tpm=20000'));

  // A rotated key keeps the network policy, per-model limits and period.
  const rot = JSON.parse((await cli('keys', 'rotate', id, '--json')).stdout);
  await whenReplica(replica, () => lookupSecret(replica, rot.secret) !== null);
  const r = lookupSecret(replica, rot.secret)!.key;
  assert.deepEqual([r.ips, r.allowBrowser, r.modelLimits, r.period, r.budget], [f.key.ips, true, f.key.modelLimits, 'week', 5]);

  // A budget change bumps the epoch; clearing flags clears them on the replica too.
  const upd = await cli('keys', 'update', id, '--no-allow-browser', '--ips', 'none', '--model-limit', 'none', '--budget-period', 'none', '--budget', '6');
  assert.equal(upd.code, 0, upd.stderr);
  await whenReplica(replica, () => lookupSecret(replica, secret)!.key.epoch === 1);
  const g = lookupSecret(replica, secret)!.key;
  assert.deepEqual([g.ips, g.allowBrowser, g.modelLimits, g.period, g.budget], [null, false, null, null, 6]);

  const topped = await cli('wallets', 'credit', 'wendy', '3');
  assert.equal(topped.code, 0);
  const personal = keyIn((await cli('keys', 'create', '--personal', 'wendy')).stdout)!;
  await whenReplica(replica, () => lookupSecret(replica, personal)?.walletEpoch === 1);
  assert.equal(lookupSecret(replica, personal)!.walletBalance, 3);

  const bad = await cli('keys', 'update', id, '--ips', '10.0.0.0/33');
  assert.equal(bad.code, 1);
  assert.match(bad.stderr, /400 invalid_request: ips\.0: expected a CIDR/);
  assert.match((await cli('keys', 'update', id, '--model-limit', 'gpt-4o*')).stderr, /--model-limit must look like/);
  assert.match((await cli('keys', 'update', id, '--model-limit', 'x:rpm=fast')).stderr, /--model-limit rpm must be a whole number/);
  assert.match((await cli('keys', 'update', id, '--budget-period', 'year')).stderr, /--budget-period must be day, week, month or none/);
  assert.match((await cli('projects', 'update', 'p_net', '--budget-period', 'day')).stdout, /p_net\s+enabled\s+50\s+day \(restarts/);
});

test("a key's shadow list: set by the CLI, in the snapshot and the change feed, through to the replica; shown, kept on rotation, cleared", async () => {
  const made = await cli('keys', 'create', '--personal', 'sam', '--rpm', '2', '--shadow', 'tpm,rpm', '--json');
  assert.equal(made.code, 0, made.stderr);
  const { key, secret } = JSON.parse(made.stdout) as { key: { id: string; shadow: string[] }; secret: string };
  assert.deepEqual(key.shadow, ['rpm', 'tpm']);

  // The change feed carried it to the replica, and a fresh snapshot has it too.
  await whenReplica(replica, () => lookupSecret(replica, secret) !== null);
  assert.deepEqual(lookupSecret(replica, secret)!.key.shadow, ['rpm', 'tpm']);
  const snap = parseSnapshotText((await syncGet(fx, '/sync/v1/snapshot')).text);
  const inSnapshot = snap.records.map((r) => r.record).find((r) => r.type === 'key' && r.id === key.id);
  assert.deepEqual(inSnapshot && inSnapshot.type === 'key' && inSnapshot.shadow, ['rpm', 'tpm']);
  const fresh = new ReplicaStore({ path: join(dir, 'from-snapshot.sqlite') });
  fresh.applySnapshot({ ...snap, source: 'test' });
  assert.deepEqual(lookupSecret(fresh, secret)!.key.shadow, ['rpm', 'tpm']);
  await fresh.close();

  assert.match((await cli('keys', 'show', key.id)).stdout, /shadow\s+rpm,tpm/);
  assert.match((await cli('keys', 'list', '--user', 'sam')).stdout, /SHADOW[\s\S]*rpm,tpm/);

  const rot = JSON.parse((await cli('keys', 'rotate', key.id, '--json')).stdout) as { secret: string };
  await whenReplica(replica, () => lookupSecret(replica, rot.secret) !== null);
  assert.deepEqual(lookupSecret(replica, rot.secret)!.key.shadow, ['rpm', 'tpm']);

  const upd = await cli('keys', 'update', key.id, '--shadow', 'budget');
  assert.equal(upd.code, 0, upd.stderr);
  await whenReplica(replica, () => lookupSecret(replica, secret)!.key.shadow.join() === 'budget');
  assert.equal((await cli('keys', 'update', key.id, '--shadow', 'none')).code, 0);
  await whenReplica(replica, () => lookupSecret(replica, secret)!.key.shadow.length === 0);
  assert.match((await cli('keys', 'show', key.id)).stdout, /shadow\s+none/);

  const bad = await cli('keys', 'update', key.id, '--shadow', 'rpm,speed');
  assert.equal(bad.code, 1);
  assert.match(bad.stderr, /--shadow takes a comma-separated list of rpm, tpm, concurrency, route, model, budget, or "none"; unknown: speed/);
  const api = await fx.api('PATCH', `/admin/v1/keys/${key.id}`, { body: { shadow: ['speed'] } });
  assert.equal(api.status, 400);
});

test('the console publishes its price table; a changed table reaches replicas as upserts and deletes', async (t) => {
  // The consoles this test starts are not the fixture's: close whichever one is running,
  // even when an assertion fails, or its server keeps the file from ending.
  t.after(async () => {
    await client.stop();
    await fx.console.close();
  });
  // On start: every configured glob, and the non-zero `unpriced` rate as the catch-all.
  const snap = parseSnapshotText((await syncGet(fx, '/sync/v1/snapshot')).text);
  const prices = snap.records.map((r) => r.record).filter((r) => r.type === 'price');
  assert.deepEqual(prices.map((p) => p.model).sort(), ['*', 'gpt-4o*', 'gpt-4o-mini*']);
  await whenReplica(replica, () => replica.priceFor('gpt-4o-mini-2024-07-18') !== null);
  assert.deepEqual(replica.priceFor('gpt-4o-mini-2024-07-18'), { input: 0.15, output: 0.6, per: 1e6 });
  assert.deepEqual(replica.priceFor('gpt-4o'), { input: 2.5, output: 10, per: 1e6 });
  assert.deepEqual(replica.priceFor('llama-3'), { input: 1, output: 1, per: 1e6 });

  // A restart with a new table: gpt-4o-mini* is gone, gpt-4o* costs more, unpriced is free now.
  const before = fx.console.store.feed.version();
  await fx.console.close();
  const config = { ...fx.config, pricing: { models: [{ match: 'gpt-4o*', inputPerMillion: 5, outputPerMillion: 15 }], unpriced: { inputPerMillion: 0, outputPerMillion: 0 } } };
  fx.console = await startConsole({ config, env: fx.env });
  // The first try may land on a pooled keep-alive connection the closed console dropped.
  const changes = `/sync/v1/changes?after=${before}`;
  const feed = JSON.parse((await syncGet(fx, changes).catch(() => syncGet(fx, changes))).text) as { changes: Record<string, unknown>[] };
  assert.deepEqual(
    feed.changes.map((c) => `${c.op} ${c.model}`).sort(),
    ['delete *', 'delete gpt-4o-mini*', 'upsert gpt-4o*'],
  );
  await whenReplica(replica, () => replica.priceFor('gpt-4o')?.input === 5, 10_000);
  assert.deepEqual(replica.priceFor('gpt-4o-mini'), { input: 5, output: 15, per: 1e6 }, 'the deleted glob no longer wins');
  assert.equal(replica.priceFor('llama-3'), null);

  // The same table again adds nothing to the feed.
  const settled = fx.console.store.feed.version();
  await fx.console.close();
  fx.console = await startConsole({ config, env: fx.env });
  assert.equal(fx.console.store.feed.version(), settled);
});
