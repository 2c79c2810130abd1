import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { parseChangeBatch } from '../../src/protocol/records.js';
import { parseSnapshotText } from '../../src/protocol/ndjson.js';
import { startConsoleFixture, syncGet, type ConsoleFixture } from '../helpers/console-fixture.js';

let fx: ConsoleFixture;
before(async () => {
  fx = await startConsoleFixture({ overrides: { sync: { retainChanges: 5 } } });
});
after(async () => {
  await fx.close();
});

async function version(): Promise<number> {
  return (await head()).version;
}

/** The snapshot's version and the tag of the history it belongs to. */
async function head(): Promise<{ version: number; tag: string | null }> {
  const snap = await syncGet(fx, '/sync/v1/snapshot');
  return parseSnapshotText(snap.text);
}

test('a long poll answers as soon as a change is committed, well before waitMs', async (t) => {
  const v = await version();
  const started = performance.now();
  const poll = syncGet(fx, `/sync/v1/changes?after=${v}&waitMs=10000`);
  // Make the change only once the poll is actually waiting on the console.
  while (fx.console.store.feed.waiting() === 0) await new Promise((r) => setImmediate(r));
  const changedAt = performance.now();
  const created = await fx.api('POST', '/admin/v1/projects', { body: { id: 'p_wake' } });
  assert.equal(created.status, 201);
  const res = await poll;
  const latency = performance.now() - changedAt;
  assert.equal(res.status, 200);
  const batch = parseChangeBatch(JSON.parse(res.text));
  assert.ok(batch.ok);
  assert.ok(batch.value.version > v);
  assert.deepEqual(batch.value.changes, [{ op: 'upsert', type: 'project', id: 'p_wake', status: 'enabled', budget: null, spent: 0, epoch: 0, period: null }]);
  // DESIGN section 8's second for a deletion to reach every sidecar: the wake-up is part of it.
  assert.ok(latency < 1_000, `answered ${latency.toFixed(1)} ms after the change`);
  assert.ok(performance.now() - started < 5000);
  t.diagnostic(`long-poll wake-up: ${latency.toFixed(1)} ms from the start of the admin write to the answer`);
});

test('with no change, a long poll answers after waitMs with the same version and no changes', async () => {
  const { version: v, tag } = await head();
  const started = performance.now();
  const res = await syncGet(fx, `/sync/v1/changes?after=${v}&waitMs=300`);
  const took = performance.now() - started;
  assert.equal(res.status, 200);
  assert.deepEqual(JSON.parse(res.text), { version: v, tag, changes: [] });
  assert.ok(took >= 290 && took < 2000, `took ${took.toFixed(0)} ms`);
  assert.equal(fx.console.store.feed.waiting(), 0);
});

test('410 for a cursor older than the retained history, or ahead of it; bad parameters are 400', async () => {
  for (let i = 0; i < 12; i++) await fx.api('POST', '/admin/v1/wallets/dave/credit', { body: { amount: 1 } });
  const { version: v, tag } = await head();
  const old = await syncGet(fx, '/sync/v1/changes?after=0');
  assert.equal(old.status, 410);
  assert.equal(JSON.parse(old.text).error.code, 'cursor_gone');
  assert.equal((await syncGet(fx, `/sync/v1/changes?after=${v + 1}`)).status, 410);
  const recent = await syncGet(fx, `/sync/v1/changes?after=${v - 3}`);
  assert.equal(recent.status, 200);
  // three credits to one wallet: only the newest record is sent
  assert.deepEqual(JSON.parse(recent.text), { version: v, tag, changes: [{ op: 'upsert', type: 'wallet', user: 'dave', balance: 12, epoch: 12 }] });
  // a history that holds the cursor does not bring back what the retained history has let go
  assert.equal((await syncGet(fx, `/sync/v1/changes?after=0&tag=${tag}`)).status, 410);
  assert.equal((await syncGet(fx, '/sync/v1/changes?after=abc')).status, 400);
  assert.equal((await syncGet(fx, `/sync/v1/changes?after=${v}&waitMs=60001`)).status, 400);
});

test('a poll whose client goes away leaves no waiter behind', async () => {
  const v = await version();
  const ac = new AbortController();
  const p = fetch(`${fx.url}/sync/v1/changes?after=${v}&waitMs=20000`, { headers: { authorization: `Bearer ${fx.tokens.sync}` }, signal: ac.signal });
  while (fx.console.store.feed.waiting() === 0) await new Promise((r) => setImmediate(r));
  ac.abort();
  await assert.rejects(p);
  const deadline = Date.now() + 2000;
  while (fx.console.store.feed.waiting() > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 5));
  assert.equal(fx.console.store.feed.waiting(), 0);
});
