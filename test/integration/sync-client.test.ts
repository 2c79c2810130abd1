import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, existsSync } from 'node:fs';
import { startConsole } from '../../src/app/console.js';
import { startConsoleFixture, type ConsoleFixture } from '../helpers/console-fixture.js';
import { syncTestBed, type SyncTestBed } from '../helpers/sync-bed.js';
import { lookupSecret, until, whenReplica } from '../helpers/console-replica.js';

let bed: SyncTestBed;
let fx: ConsoleFixture;

before(async () => {
  bed = await syncTestBed('sync', { overrides: { sync: { retainChanges: 10 } } });
  ({ fx } = bed);
});
after(() => bed.close());

const sidecar = (name: string, extra: { fetch?: typeof fetch } = {}) =>
  bed.sidecar(name, { waitMs: 1000, backoff: { baseMs: 20, maxMs: 200 }, ...extra });

test('two sidecars: snapshot, then a key delete reaches both replicas well within a second', async (t) => {
  await fx.api('POST', '/admin/v1/projects', { body: { id: 'p_rev' } });
  const a = sidecar('a');
  const b = sidecar('b');
  await Promise.all([a.client.start(), b.client.start()]);
  assert.equal(a.client.status().connected, true);
  assert.equal(a.replica.status().version, b.replica.status().version);

  const latencies: number[] = [];
  for (let trial = 0; trial < 20; trial++) {
    const created = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'team', project: 'p_rev' } })).body;
    await Promise.all([a, b].map((s) => whenReplica(s.replica, () => lookupSecret(s.replica, created.secret)?.key.status === 'active')));
    const started = performance.now();
    const seen = [a, b].map((s) => whenReplica(s.replica, () => lookupSecret(s.replica, created.secret)?.key.status === 'deleted', 1000).then(() => performance.now() - started));
    assert.equal((await fx.api('DELETE', `/admin/v1/keys/${created.key.id}`)).status, 200);
    latencies.push(...(await Promise.all(seen)));
  }
  latencies.sort((x, y) => x - y);
  const q = (p: number) => latencies[Math.min(latencies.length - 1, Math.floor(p * latencies.length))]!.toFixed(1);
  t.diagnostic(`revocation to replica (ms, ${latencies.length} samples over 2 sidecars): min ${q(0)} p50 ${q(0.5)} p90 ${q(0.9)} max ${q(1)}`);
  assert.ok(latencies.at(-1)! < 1000);
});

test('the replica file never holds a key', async () => {
  const { replica, client } = sidecar('scan');
  await client.start();
  const created = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'personal', user: 'alice' } })).body;
  await whenReplica(replica, () => lookupSecret(replica, created.secret) !== null);
  const path = replica.db.name;
  const bytes = [path, `${path}-wal`].filter(existsSync).map((p) => readFileSync(p).toString('latin1')).join('');
  assert.ok(!bytes.includes(created.secret));
  assert.ok(!bytes.includes(created.secret.slice(3, 40)));
});

test('console away: the replica keeps serving; when it returns the client catches up', async () => {
  const { replica, client } = sidecar('away');
  await client.start();
  const kept = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'personal', user: 'alice' } })).body;
  const doomed = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'personal', user: 'alice' } })).body;
  await whenReplica(replica, () => lookupSecret(replica, doomed.secret) !== null);

  await fx.console.close();
  assert.ok(await until(() => !client.status().connected));
  assert.ok(client.status().lastError);
  assert.equal(lookupSecret(replica, kept.secret)?.key.status, 'active', 'still answers from the last good replica');

  // A change made while this sidecar could not reach the console (another instance on the same store).
  const other = await startConsole({ config: { ...fx.config, listen: { host: '127.0.0.1', port: 0 } }, env: fx.env });
  await fetch(`${other.url}/admin/v1/keys/${doomed.key.id}`, { method: 'DELETE', headers: { authorization: `Bearer ${fx.tokens.admin}` } });
  await other.close();
  assert.equal(lookupSecret(replica, doomed.secret)?.key.status, 'active');

  await fx.restart();
  await whenReplica(replica, () => lookupSecret(replica, doomed.secret)?.key.status === 'deleted', 5000);
  await new Promise((r) => setImmediate(r));
  assert.equal(client.status().connected, true);
});

test('after a 410 the client takes a fresh snapshot and carries on', async () => {
  let blocked = false;
  const gate: typeof fetch = (input, init) => (blocked ? Promise.reject(new Error('network down')) : fetch(input, init));
  const { replica, client } = sidecar('gone', { fetch: gate });
  await client.start();
  const snapshotsBefore = client.status().snapshots;
  blocked = true;
  // Wait for the client to notice, so its cursor is the pre-change version.
  assert.ok(await until(() => !client.status().connected));
  for (let i = 0; i < 15; i++) await fx.api('POST', '/admin/v1/wallets/erin/credit', { body: { amount: 1 } });
  const k = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'personal', user: 'erin' } })).body;
  blocked = false;
  await whenReplica(replica, () => lookupSecret(replica, k.secret) !== null, 5000);
  await new Promise((r) => setImmediate(r)); // the client counts the snapshot right after the replica swaps
  assert.equal(lookupSecret(replica, k.secret)?.walletBalance, 15);
  assert.equal(client.status().snapshots, snapshotsBefore + 1, 'recovered through a snapshot');
});

test('a bad snapshot is rejected whole and the old replica stays', async () => {
  let corrupt = false;
  const tamper: typeof fetch = async (input, init) => {
    const res = await fetch(input, init);
    if (!corrupt || !String(input).includes('/snapshot')) return res;
    const text = await res.text();
    return new Response(text.replace(/"kind":"team"/, '"kind":"robot"'), { status: 200 });
  };
  await fx.api('POST', '/admin/v1/projects', { body: { id: 'p_bad' } });
  const team = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'team', project: 'p_bad' } })).body;
  const { replica, client } = sidecar('bad', { fetch: tamper });
  await client.start();
  const version = replica.status().version;
  assert.ok(lookupSecret(replica, team.secret));
  await client.stop();

  corrupt = true;
  const again = bed.client(replica, { waitMs: 1000, fetch: tamper, backoff: { baseMs: 20, maxMs: 50 } });
  void again.start();
  assert.ok(await until(() => again.status().failures > 0));
  assert.match(again.status().lastError ?? '', /line \d+/);
  assert.equal(replica.status().version, version);
  assert.ok(lookupSecret(replica, team.secret), 'old data still served');
  corrupt = false;
  assert.ok(await until(() => again.status().connected), 'recovers once the console sends a good snapshot');
  await again.stop();
});

test('a wrong sync token is reported without the token and retried', async () => {
  const replica = bed.replica('token');
  const badToken = 'wrong-token-0123456789abcdef';
  const client = bed.client(replica, { token: badToken, waitMs: 1000, backoff: { baseMs: 20, maxMs: 50 } });
  void client.start();
  assert.ok(await until(() => client.status().failures >= 2));
  assert.match(client.status().lastError!, /rejected the sync token/);
  assert.ok(!client.status().lastError!.includes(badToken));
  assert.equal(replica.status().ready, false);
  await client.stop();
});

/**
 * A started sync client into a new replica named `name`, whose change polls all get
 * `answer()` (snapshots come from the real console); `changeCalls` counts the polls.
 */
async function answeredWith(name: string, answer: () => Response, backoff: { baseMs: number; maxMs: number }) {
  const seen = { changeCalls: 0 };
  const stub: typeof fetch = async (input, init) => {
    if (!String(input).includes('/sync/v1/changes')) return fetch(input, init);
    seen.changeCalls++;
    return answer();
  };
  const { replica, client } = bed.sidecar(name, { waitMs: 1000, backoff, fetch: stub });
  await client.start();
  assert.ok(await until(() => seen.changeCalls > 0), 'the client polls after its snapshot');
  return { replica, client, seen };
}

test('a console answering changes with an older version at once is not polled, or asked for snapshots, in a tight loop', async () => {
  const older = () => new Response(JSON.stringify({ version: 0, changes: [] }), { headers: { 'content-type': 'application/json' } });
  const { replica, client, seen } = await answeredWith('stale', older, { baseMs: 200, maxMs: 400 });
  const from = seen.changeCalls;
  await new Promise((r) => setTimeout(r, 1000)); // a rate: calls per second of wall time
  assert.ok(seen.changeCalls - from <= 10, `${seen.changeCalls - from} change polls in a second`);
  // one snapshot for the older answer; the same answer right after it takes none, and is a failure
  assert.equal(client.status().snapshots, 2);
  assert.equal(client.status().connected, false);
  assert.match(client.status().lastError ?? '', /older than its own snapshot/);
  assert.equal(replica.status().ready, true, 'the snapshot still serves');
});

test('a console answering 410 to the version its own snapshot gave is not asked for snapshots back to back', async () => {
  const { replica, client } = await answeredWith('gone', () => new Response('', { status: 410 }), { baseMs: 20, maxMs: 50 });
  const from = client.status().snapshots;
  await new Promise((r) => setTimeout(r, 1000)); // a rate: snapshots per second of wall time
  assert.ok(client.status().snapshots - from <= 1, `${client.status().snapshots - from} snapshots in a second`);
  assert.equal(client.status().connected, false);
  assert.match(client.status().lastError ?? '', /410 to version \d+, which its own snapshot just gave/);
  assert.equal(replica.status().ready, true, 'the snapshot still serves');
});

/** A sync client into a new replica named `name`, counting its change polls; it is stopped and closed after the file. */
async function countingClient(name: string, opts: { waitMs: number; now?: () => number }) {
  let polls = 0;
  const counted: typeof fetch = async (input, init) => {
    if (String(input).includes('/sync/v1/changes')) polls++;
    return fetch(input, init);
  };
  const { replica, client } = bed.sidecar(name, { fetch: counted, ...opts });
  await client.start();
  return { replica, client, polls: () => polls };
}

test('console.waitMs 0 polls twice a second, not in a loop, and a deleted key still applies within a second', async () => {
  const { replica, polls } = await countingClient('short-poll', { waitMs: 0 });
  assert.ok(await until(() => polls() > 0), 'the client polls after its snapshot');
  const from = polls();
  await new Promise((r) => setTimeout(r, 1000)); // a rate: calls per second of wall time
  assert.ok(polls() - from <= 3, `${polls() - from} change polls in a second`);
  const v0 = replica.status().version ?? 0;
  const created = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'personal', user: 'short-poll' } })).body;
  assert.ok(await until(() => (replica.status().version ?? 0) > v0, 2_000), 'the new key applied');
  const v1 = replica.status().version ?? 0;
  await fx.api('DELETE', `/admin/v1/keys/${created.key.id}`);
  assert.ok(await until(() => (replica.status().version ?? 0) > v1, 1_000), 'the deletion applied within a second');
});

test('a long poll held open keeps the replica current: its lag does not climb toward waitMs', async () => {
  let clock = 1_000_000;
  const { client, polls } = await countingClient('held-poll', { waitMs: 20_000, now: () => clock });
  assert.ok(await until(() => polls() > 0), 'a long poll is sent');
  const synced = client.status().lastSyncAt!;
  clock += 15_000; // well into the poll, which the console holds: nothing new
  assert.equal(client.status().currentAsOf, clock);
  assert.equal(client.status().lastSyncAt, synced);
  clock += 11_000; // past waitMs and its margin: the poll no longer vouches for anything
  assert.equal(client.status().currentAsOf, synced);
});

test('backoff: exponential, capped, jittered, never zero', async () => {
  const { backoffDelay } = await import('../../src/sync/backoff.js');
  const lo = (n: number) => backoffDelay(n, { baseMs: 100, maxMs: 1000, random: () => 0 });
  const hi = (n: number) => backoffDelay(n, { baseMs: 100, maxMs: 1000, random: () => 0.999999 });
  assert.deepEqual([1, 2, 3, 4, 5, 50].map(lo), [50, 100, 200, 400, 500, 500]);
  assert.deepEqual([1, 2, 3, 4, 5, 50].map(hi), [100, 200, 400, 800, 1000, 1000]);
});

test('usage pushed by a sidecar moves budgets and balances in every replica; a disabled project follows within a second', async () => {
  const { createUsagePusher } = await import('../../src/sync/client.js');
  const { replica, client } = sidecar('budget');
  await client.start();
  await fx.api('POST', '/admin/v1/projects', { body: { id: 'p_budget', budget: 0.01 } });
  const team = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'team', project: 'p_budget', budget: 0.005 } })).body;
  const personal = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'personal', user: 'gina' } })).body;
  await fx.api('PUT', '/admin/v1/wallets/gina', { body: { balance: 0.004 } });
  await whenReplica(replica, () => lookupSecret(replica, personal.secret)?.walletBalance === 0.004);

  const pusher = createUsagePusher({ url: fx.url, token: fx.tokens.sync, maxBuffer: 100, batchSize: 10, flushMs: 20 });
  const at = new Date().toISOString();
  // gpt-4o: 1000 in + 100 out = 0.0035 each
  for (let i = 0; i < 2; i++) pusher.push({ request_id: `b-${i}`, key_id: team.key.id, model: 'gpt-4o', input_tokens: 1000, output_tokens: 100, status: 200, at });
  pusher.push({ request_id: 'w-1', key_id: personal.key.id, model: 'gpt-4o', input_tokens: 1000, output_tokens: 100, status: 200, at });
  pusher.push({ request_id: 'w-2', key_id: personal.key.id, model: 'gpt-4o', input_tokens: 1000, output_tokens: 100, status: 200, at });
  await pusher.flush();
  await whenReplica(replica, () => {
    const t = lookupSecret(replica, team.secret);
    const p = lookupSecret(replica, personal.secret);
    return t !== null && p !== null && t.key.spent >= 0.007 && p.walletBalance !== null && p.walletBalance <= 0;
  });
  const t = lookupSecret(replica, team.secret)!;
  assert.ok(t.key.spent >= t.key.budget!, 'key budget exhausted in the replica');
  assert.equal(t.project?.spent, 0.007);
  assert.equal(lookupSecret(replica, personal.secret)!.walletBalance, -0.003);
  await pusher.stop();

  const started = performance.now();
  const disabled = whenReplica(replica, () => lookupSecret(replica, team.secret)?.project?.status === 'disabled', 1000);
  await fx.api('PATCH', '/admin/v1/projects/p_budget', { body: { status: 'disabled' } });
  await disabled;
  assert.ok(performance.now() - started < 1000);
});

test('a sidecar that fell behind by hundreds of changes catches up through a worker-applied batch', async () => {
  const big = await startConsoleFixture({ overrides: { sync: { maxBatch: 5000 } } });
  try {
    let blocked = false;
    const gate: typeof fetch = (input, init) => (blocked ? Promise.reject(new Error('network down')) : fetch(input, init));
    const { replica, client } = bed.sidecar('behind', { url: big.url, token: big.tokens.sync, waitMs: 200, fetch: gate, backoff: { baseMs: 20, maxMs: 100 } });
    await client.start();
    blocked = true;
    assert.ok(await until(() => !client.status().connected));
    await big.api('POST', '/admin/v1/projects', { body: { id: 'p_behind' } });
    const made = Array.from({ length: 600 }, () => big.console.store.createKey({ kind: 'team', project: 'p_behind' }));
    blocked = false;
    // 2 to 6 s alone; a generous bound so a loaded machine (a stalled worker thread) is not a failure
    await whenReplica(replica, () => lookupSecret(replica, made.at(-1)!.secret) !== null, 30_000);
    assert.ok(made.every((m) => lookupSecret(replica, m.secret)?.key.id === m.key.id));
    assert.equal(client.status().snapshots, 1, 'caught up from changes, not a snapshot');
    await client.stop();
  } finally {
    await big.close();
  }
});

test('a snapshot asked for between polls is taken at the next turn, not left for a later failure', async () => {
  const replica = bed.replica('between');
  // Short polls: most of the time is spent between them, where there is no poll to cut.
  let polled = 0;
  const counting: typeof fetch = async (url, init) => {
    const res = await fetch(url, init);
    if (String(url).includes('/changes')) polled++;
    return res;
  };
  const client = bed.client(replica, { waitMs: 0, backoff: { baseMs: 20, maxMs: 200 }, fetch: counting });
  await client.start();
  await until(() => polled > 0); // answered: the client waits before its next poll
  const before = client.status().snapshots;
  client.snapshotNow();
  assert.ok(await until(() => client.status().snapshots === before + 1, 3_000), 'the snapshot was taken');
  assert.equal(client.status().failures, 0);
});

test('a replica that lost its data (a damaged file set aside) is snapshotted at once, not after the long poll under way', async () => {
  const replica = bed.replica('lost', { owner: true });
  const client = bed.client(replica, { waitMs: 30_000, backoff: { baseMs: 20, maxMs: 200 } });
  // As the composition root wires it (app/console-clients.ts).
  replica.onChange((s) => {
    if (s.version === null) client.snapshotNow();
  });
  await client.start();
  const version = replica.status().version;
  await until(() => client.status().currentAsOf !== null && client.status().failures === 0);
  replica.quarantine();
  assert.equal(replica.status().ready, false);
  const started = performance.now();
  await whenReplica(replica, () => replica.status().version === version, 5_000);
  assert.ok(performance.now() - started < 5_000, 'well before the 30 s long poll would have ended');
  assert.equal(client.status().failures, 0, 'not counted as a failure');
});
