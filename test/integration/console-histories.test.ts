/**
 * The console's history tag (sync protocol v1 addition, DESIGN section 7): every start of
 * the store begins a history; snapshots and changes answers name the history of their
 * version; `/changes?after=V&tag=T` is 410 unless history T covers V, while a plain
 * restart keeps a sidecar's cursor good and a cursor without a tag is served as before.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import Database from 'better-sqlite3';
import { startConsoleFixture, type ConsoleFixture } from '../helpers/console-fixture.js';
import { adminCall, syncCall } from '../helpers/console-restore.js';

let fx: ConsoleFixture;
before(async () => {
  fx = await startConsoleFixture();
});
after(async () => {
  await fx.close();
});

const credit = (user: string) => adminCall(fx, 'POST', `/admin/v1/wallets/${user}/credit`, { amount: 1 });

/** The snapshot's meta line. */
async function meta(): Promise<{ version: number; tag?: string }> {
  const snap = await syncCall(fx, '/sync/v1/snapshot');
  assert.equal(snap.status, 200);
  return JSON.parse(snap.text.slice(0, snap.text.indexOf('\n'))) as { version: number; tag?: string };
}

async function changes(query: string): Promise<{ status: number; body: any }> {
  const res = await syncCall(fx, `/sync/v1/changes?${query}`);
  return { status: res.status, body: JSON.parse(res.text) };
}

async function restart(): Promise<void> {
  await fx.console.close();
  await fx.restart();
}

test('snapshots and changes answers, empty ones too, name the history of their version', async () => {
  await credit('ann');
  const m = await meta();
  assert.match(m.tag ?? '', /^[0-9a-f]{16}$/);
  const empty = await changes(`after=${m.version}&tag=${m.tag}`);
  assert.deepEqual(empty, { status: 200, body: { version: m.version, tag: m.tag, changes: [] } });
  await credit('ann');
  const next = await changes(`after=${m.version}&tag=${m.tag}`);
  assert.equal(next.status, 200);
  assert.equal(next.body.version, m.version + 1);
  assert.equal(next.body.tag, m.tag);
  assert.equal(next.body.changes.length, 1);
});

test('410 for a tag this store does not have, of any bounded text; an empty or overlong tag is 400', async () => {
  const m = await meta();
  for (const tag of ['0123456789abcdef', 'not-a-console-tag', 'f'.repeat(64)]) {
    const res = await changes(`after=${m.version}&tag=${encodeURIComponent(tag)}`);
    assert.equal(res.status, 410, tag);
    assert.equal(res.body.error.code, 'cursor_gone');
    assert.equal(res.body.version, m.version);
  }
  assert.equal((await changes(`after=${m.version}&tag=`)).status, 400);
  assert.equal((await changes(`after=${m.version}&tag=${'f'.repeat(65)}`)).status, 400);
  // without a tag, as before
  assert.equal((await changes(`after=${m.version}`)).status, 200);
});

test('a plain restart: the old history still covers the version it ended at, so the cursor stays good', async () => {
  await credit('ann');
  const before = await meta();
  await restart();
  const now = await meta();
  assert.equal(now.version, before.version);
  assert.notEqual(now.tag, before.tag, 'each start begins a history');
  const held = await changes(`after=${before.version}&tag=${before.tag}`);
  assert.deepEqual(held, { status: 200, body: { version: before.version, tag: now.tag, changes: [] } });
  await credit('ann');
  const next = await changes(`after=${before.version}&tag=${before.tag}`);
  assert.equal(next.status, 200);
  assert.equal(next.body.version, before.version + 1);
  assert.equal(next.body.tag, now.tag);
});

test("410 for a version past the end of its tag's history, even one this store has reached since", async () => {
  const old = await meta();
  await restart();
  for (let i = 0; i < 3; i++) await credit('ann');
  const now = await meta();
  assert.ok(now.version > old.version);
  // a cursor that history never reached: the versions after old.version belong to the new one
  for (const v of [old.version + 1, now.version]) {
    const res = await changes(`after=${v}&tag=${old.tag}`);
    assert.equal(res.status, 410, `version ${v}`);
    assert.equal(res.body.version, now.version);
  }
  // a version before a history began is not in it either
  assert.equal((await changes(`after=${old.version - 1}&tag=${now.tag}`)).status, 410);
  assert.equal((await changes(`after=${now.version}&tag=${now.tag}`)).status, 200);
  assert.equal((await changes(`after=${old.version - 1}&tag=${old.tag}`)).status, 200);
});

test('a long poll with a good tag waits, and its answer names the history of the new version', async () => {
  const m = await meta();
  assert.match(m.tag ?? '', /^[0-9a-f]{16}$/);
  const poll = changes(`after=${m.version}&tag=${m.tag}&waitMs=10000`);
  while (fx.console.store.feed.waiting() === 0) await new Promise((r) => setImmediate(r));
  await credit('ann');
  const res = await poll;
  assert.equal(res.status, 200);
  assert.equal(res.body.version, m.version + 1);
  assert.equal(res.body.tag, m.tag);
});

test('a store from before histories gains the table, and its first start begins the first history at its version', async () => {
  await credit('ann');
  await fx.console.close();
  const db = new Database(fx.config.store.path);
  db.exec('DROP TABLE histories');
  db.close();
  await fx.restart();
  const m = await meta();
  assert.match(m.tag ?? '', /^[0-9a-f]{16}$/);
  assert.equal((await changes(`after=${m.version}&tag=${m.tag}`)).status, 200);
  assert.equal((await changes(`after=${m.version - 1}&tag=${m.tag}`)).status, 410, 'the history begins at the version the store had');
  assert.equal((await changes(`after=${m.version - 1}`)).status, 200, 'a cursor without a tag is served as before');
});
