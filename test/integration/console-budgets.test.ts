import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import Database from 'better-sqlite3';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import http from 'node:http';
import { once } from 'node:events';
import { text } from 'node:stream/consumers';
import { parseChangeBatch, type Change } from '../../src/protocol/records.js';
import { startConsole, type RunningConsole } from '../../src/app/console.js';
import { rollPeriods } from '../../src/console/budgets.js';
import { openConsoleDb } from '../../src/console/db.js';
import { makeConsoleConfig, tok } from '../helpers/console-fixture.js';

const dirs: string[] = [];
const consoles: RunningConsole[] = [];
after(async () => {
  for (const c of consoles) await c.close().catch(() => {});
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

/** A real console on port 0 whose clock the test moves. */
async function clocked(startIso: string, opts: { periodCheckMs?: number } = {}) {
  const dir = mkdtempSync(join(tmpdir(), 'kw-budgets-'));
  dirs.push(dir);
  const tokens = { admin: tok('admin'), sync: tok('sync'), alice: tok('alice'), bob: tok('bob') };
  const clock = { now: Date.parse(startIso), reads: 0 };
  const running = await startConsole({
    config: makeConsoleConfig({ dir, tokens }),
    env: { TEST_MASTER_KEY: randomBytes(32).toString('hex') },
    now: () => (clock.reads++, clock.now),
    periodCheckMs: opts.periodCheckMs ?? 60_000,
  });
  consoles.push(running);
  const call = async (method: string, path: string, body?: unknown) => {
    const res = await fetch(`${running.url}${path}`, {
      method,
      headers: { authorization: `Bearer ${path.startsWith('/sync/') ? tokens.sync : tokens.admin}`, ...(body !== undefined ? { 'content-type': 'application/json' } : {}) },
      ...(body !== undefined ? { body: typeof body === 'string' ? body : JSON.stringify(body) } : {}),
    });
    const text = await res.text();
    return { status: res.status, body: text && res.headers.get('content-type')?.includes('json') ? JSON.parse(text) : text };
  };
  // An event made now on the console's clock, unless it says when it was made.
  const usage = (events: object[], headers: Record<string, string> = {}) =>
    fetch(`${running.url}/sync/v1/usage`, {
      method: 'POST', headers: { authorization: `Bearer ${tokens.sync}`, ...headers }, body: events.map((e) => JSON.stringify({ at: new Date(clock.now).toISOString(), ...e })).join('\n'),
    }).then((r) => r.json() as Promise<Record<string, number>>);
  /** the feed's changes after `after`, parsed as a sidecar would */
  const changes = async (after: number, waitMs = 0): Promise<{ version: number; changes: Change[] }> => {
    const r = await call('GET', `/sync/v1/changes?after=${after}&waitMs=${waitMs}`);
    const parsed = parseChangeBatch(r.body);
    assert.ok(parsed.ok);
    return parsed.value;
  };
  return { running, clock, call, usage, changes, version: () => running.store.feed.version(), tokens };
}

const ev = (key_id: string, request_id: string, extra: object = {}) => ({
  request_id, key_id, model: 'gpt-4o', input_tokens: 100_000, output_tokens: 10_000, status: 200, ...extra,
}); // 0.25 + 0.1 = 0.35 at the fixture's gpt-4o price

test('many budgets at one boundary restart a batch a write; usage restarts only what it charges first', async () => {
  const c = await clocked('2026-11-30T12:00:00Z');
  await c.call('POST', '/admin/v1/projects', { id: 'p_many', budget: 100, period: 'day' });
  await c.call('POST', '/admin/v1/projects', { id: 'p_other', budget: 100, period: 'day' });
  const keys: string[] = [];
  for (let i = 0; i < 5; i++) keys.push((await c.call('POST', '/admin/v1/keys', { kind: 'team', project: 'p_many', budget: 5, period: 'day' })).body.key.id);
  const lone = (await c.call('POST', '/admin/v1/keys', { kind: 'team', project: 'p_other', budget: 5, period: 'day' })).body.key.id;
  c.clock.now = Date.parse('2026-12-01T00:00:01Z');
  // Usage first: its key and that key's project restart, nothing else.
  await c.usage([ev(lone, 'u1')]);
  const epoch = async (path: string) => (await c.call('GET', path)).body;
  assert.deepEqual([(await epoch(`/admin/v1/keys/${lone}`)).key.epoch, (await epoch('/admin/v1/projects/p_other')).project.epoch], [1, 1]);
  assert.equal((await epoch(`/admin/v1/keys/${keys[0]}`)).key.epoch, 0, 'a key the usage did not charge waits for the background restart');
  assert.equal((await epoch('/admin/v1/projects/p_many')).project.epoch, 0);
  // The background restart: at most 2 of each table a write, until none is due.
  assert.equal(rollPeriods(c.running.store, 2), 3, '2 keys and the 1 project due');
  assert.equal(rollPeriods(c.running.store, 2), 2);
  assert.equal(rollPeriods(c.running.store, 2), 1);
  assert.equal(rollPeriods(c.running.store, 2), 0);
  for (const id of keys) assert.equal((await epoch(`/admin/v1/keys/${id}`)).key.epoch, 1);
  assert.equal((await epoch(`/admin/v1/keys/${lone}`)).key.spent, 0.35, 'restarted once, then charged');
});

test('usage made before a UTC boundary and pushed after it is recorded, not counted toward the new period', async () => {
  const c = await clocked('2026-11-30T23:59:50Z');
  await c.call('POST', '/admin/v1/projects', { id: 'p_late', budget: 100, period: 'day' });
  const key = (await c.call('POST', '/admin/v1/keys', { kind: 'team', project: 'p_late', budget: 5, period: 'day' })).body.key;
  c.clock.now = Date.parse('2026-12-01T00:00:05Z');
  const out = await c.usage([ev(key.id, 'before', { at: '2026-11-30T23:59:55Z' }), ev(key.id, 'after', { at: '2026-12-01T00:00:01Z' })]);
  assert.equal(out.accepted, 2, 'both are recorded');
  const k = (await c.call('GET', `/admin/v1/keys/${key.id}`)).body.key;
  assert.deepEqual([k.spent, k.epoch], [0.35, 1], 'the new day counts only what was made in it');
  assert.equal((await c.call('GET', '/admin/v1/projects/p_late')).body.project.spent, 0.35);
  const recent = (await c.call('GET', `/admin/v1/keys/${key.id}/usage`)).body.usage as { requestId: string }[];
  assert.deepEqual(recent.map((u) => u.requestId).sort(), ['after', 'before'], 'the late one is in the key\'s usage');
});

test('a sidecar whose clock is behind: its usage after the boundary by the console\'s clock counts toward the new period', async () => {
  const c = await clocked('2026-11-30T23:50:00Z');
  await c.call('POST', '/admin/v1/projects', { id: 'p_skew', budget: 100, period: 'day' });
  const key = (await c.call('POST', '/admin/v1/keys', { kind: 'team', project: 'p_skew', budget: 5, period: 'day' })).body.key;
  c.clock.now = Date.parse('2026-12-01T00:01:00Z');
  // Five minutes behind: made at 00:00:30 by the console's clock, stamped 23:55:30 the day before, sent at 23:56:00.
  const behind = { date: new Date(Date.parse('2026-11-30T23:56:00Z')).toUTCString() };
  const out = await c.usage([ev(key.id, 'skewed', { at: '2026-11-30T23:55:30Z' })], behind);
  assert.equal(out.accepted, 1);
  const k = (await c.call('GET', `/admin/v1/keys/${key.id}`)).body.key;
  assert.deepEqual([k.spent, k.epoch], [0.35, 1], 'counted in the new day');
  // A sidecar in step (or one that sends no Date): its `at` as it says.
  const late = await c.usage([ev(key.id, 'late', { at: '2026-11-30T23:59:30Z' })], { date: new Date(c.clock.now).toUTCString() });
  assert.equal(late.accepted, 1);
  assert.equal((await c.call('GET', `/admin/v1/keys/${key.id}`)).body.key.spent, 0.35, 'made the day before: recorded, not counted');
});

test('a push whose body is slow to arrive, from a sidecar in step: the time it took is not taken for clock skew', async () => {
  const c = await clocked('2026-11-30T23:50:00Z');
  await c.call('POST', '/admin/v1/projects', { id: 'p_slow', budget: 100, period: 'day' });
  const key = (await c.call('POST', '/admin/v1/keys', { kind: 'team', project: 'p_slow', budget: 5, period: 'day' })).body.key;
  c.clock.now = Date.parse('2026-11-30T23:59:58.000Z');
  const req = http.request(`${c.running.url}/sync/v1/usage`, { method: 'POST', headers: { authorization: `Bearer ${c.tokens.sync}`, date: new Date(c.clock.now).toUTCString(), 'transfer-encoding': 'chunked' } });
  const answered = once(req, 'response') as Promise<[http.IncomingMessage]>;
  const reads = c.clock.reads;
  req.flushHeaders();
  // the console has the head (it read its clock): the body takes three seconds more
  while (c.clock.reads === reads) await new Promise((r) => setImmediate(r));
  c.clock.now = Date.parse('2026-12-01T00:00:01.000Z');
  req.end(JSON.stringify({ ...ev(key.id, 'slow'), at: '2026-11-30T23:59:58.500Z' }));
  const [res] = await answered;
  assert.equal((JSON.parse(await text(res)) as { accepted: number }).accepted, 1);
  const k = (await c.call('GET', `/admin/v1/keys/${key.id}`)).body.key;
  assert.deepEqual([k.spent, k.epoch], [0, 1], 'made the day before (a new day began): recorded, not counted');
});

test('epochs: bumped by top-ups, resets and budget changes, never by usage; the feed carries them', async () => {
  const c = await clocked('2026-11-25T12:00:00Z');
  await c.call('POST', '/admin/v1/projects', { id: 'p_e', budget: 10 });
  const key = (await c.call('POST', '/admin/v1/keys', { kind: 'team', project: 'p_e', budget: 5 })).body.key;
  const me = (await c.call('POST', '/admin/v1/keys', { kind: 'personal', user: 'erin' })).body.key;
  assert.equal(key.epoch, 0);
  const epochs = async () => ({
    key: (await c.call('GET', `/admin/v1/keys/${key.id}`)).body.key.epoch,
    project: (await c.call('GET', '/admin/v1/projects/p_e')).body.project.epoch,
    wallet: (await c.call('GET', '/admin/v1/wallets/erin')).body.wallet.epoch,
  });
  assert.deepEqual(await epochs(), { key: 0, project: 0, wallet: 0 });

  await c.call('POST', '/admin/v1/wallets/erin/credit', { amount: 5 });
  await c.call('PUT', '/admin/v1/wallets/erin', { balance: 7 });
  assert.deepEqual(await epochs(), { key: 0, project: 0, wallet: 2 }, 'a credit and a set');

  const v = c.version();
  const out = await c.usage([ev(key.id, 'r1'), ev(me.id, 'r2')]);
  assert.equal(out.accepted, 2);
  assert.deepEqual(await epochs(), { key: 0, project: 0, wallet: 2 }, 'usage moves figures, not epochs');
  const usageChanges = await c.changes(v);
  assert.ok(usageChanges.changes.some((ch) => ch.op === 'upsert' && ch.type === 'key' && ch.id === key.id && ch.spent === 0.35 && ch.epoch === 0));

  await c.call('PATCH', `/admin/v1/keys/${key.id}`, { budget: 6 });
  await c.call('PATCH', '/admin/v1/projects/p_e', { budget: 20 });
  assert.deepEqual(await epochs(), { key: 1, project: 1, wallet: 2 }, 'new limits');
  await c.call('PATCH', `/admin/v1/keys/${key.id}`, { budget: 6, rpm: 5 });
  await c.call('PATCH', '/admin/v1/projects/p_e', { budget: 20, status: 'disabled' });
  assert.deepEqual(await epochs(), { key: 1, project: 1, wallet: 2 }, 'the same limit again, or other settings, bump nothing');

  const v2 = c.version();
  const reset = await c.call('POST', `/admin/v1/keys/${key.id}/reset`);
  assert.equal(reset.status, 200);
  assert.deepEqual([reset.body.key.spent, reset.body.key.epoch], [0, 2]);
  const pr = await c.call('POST', '/admin/v1/projects/p_e/reset');
  assert.deepEqual([pr.body.project.spent, pr.body.project.epoch], [0, 2]);
  const fed = await c.changes(v2);
  const summary = fed.changes.map((ch) => (ch.op === 'upsert' && (ch.type === 'key' || ch.type === 'project') ? [ch.type, ch.spent, ch.epoch] : ch));
  assert.deepEqual(summary, [['key', 0, 2], ['project', 0, 2]]);
  assert.equal((await c.call('POST', `/admin/v1/keys/${me.id}/reset`)).status, 400, 'a personal key has no budget to reset');
  assert.equal((await c.call('POST', '/admin/v1/projects/p_none/reset')).status, 404);
});

test('budget periods restart at the UTC boundary (injected clock): spent 0, epoch bumped, usage counts toward the new period', async () => {
  const c = await clocked('2026-11-30T23:58:00Z', { periodCheckMs: 10 });
  await c.call('POST', '/admin/v1/projects', { id: 'p_m', budget: 100, period: 'month' });
  await c.call('POST', '/admin/v1/projects', { id: 'p_w', budget: 100, period: 'week' });
  const daily = (await c.call('POST', '/admin/v1/keys', { kind: 'team', project: 'p_m', budget: 5, period: 'day' })).body.key;
  const weekly = (await c.call('POST', '/admin/v1/keys', { kind: 'team', project: 'p_w', budget: 5, period: 'week' })).body.key;
  assert.equal(daily.resetsAt, '2026-12-01T00:00:00.000Z');
  assert.equal(weekly.resetsAt, '2026-12-07T00:00:00.000Z', 'ISO weeks start on Monday');
  assert.equal((await c.call('POST', '/admin/v1/keys', { kind: 'personal', user: 'x', period: 'day' })).status, 400);
  await c.usage([ev(daily.id, 'a'), ev(weekly.id, 'b')]);

  c.clock.now = Date.parse('2026-11-30T23:59:59.999Z');
  assert.equal(rollPeriods(c.running.store), 0, 'not before the boundary');
  const before = c.version();
  // The console's own timer notices the boundary: wait for its change on the feed.
  c.clock.now = Date.parse('2026-12-01T00:00:00Z');
  const batch = await c.changes(before, 5000);
  const byId = new Map(batch.changes.map((ch) => [ch.op === 'upsert' && ch.type !== 'price' && ch.type !== 'wallet' ? ch.id : '', ch]));
  assert.deepEqual([...byId.keys()].sort(), [daily.id, 'p_m'].sort(), 'the day and the month ended; the week did not');
  const d = byId.get(daily.id)!;
  assert.ok(d.op === 'upsert' && d.type === 'key' && d.spent === 0 && d.epoch === 1 && d.period === 'day');
  const p = byId.get('p_m')!;
  assert.ok(p.op === 'upsert' && p.type === 'project' && p.spent === 0 && p.epoch === 1);
  const shown = (await c.call('GET', `/admin/v1/keys/${daily.id}`)).body.key;
  assert.deepEqual([shown.spent, shown.epoch, shown.resetsAt], [0, 1, '2026-12-02T00:00:00.000Z']);
  assert.equal((await c.call('GET', `/admin/v1/keys/${weekly.id}`)).body.key.spent, 0.35, 'the week goes on');
  assert.equal(rollPeriods(c.running.store), 0, 'once per boundary');

  // Usage arriving after the next boundary restarts the period first, then counts.
  c.clock.now = Date.parse('2026-12-07T00:00:01Z');
  const out = await c.usage([ev(weekly.id, 'c')]);
  assert.equal(out.accepted, 1);
  const w = (await c.call('GET', `/admin/v1/keys/${weekly.id}`)).body.key;
  assert.deepEqual([w.spent, w.epoch], [0.35, 1]);
  assert.equal((await c.call('GET', '/admin/v1/projects/p_w')).body.project.spent, 0.35);

  // Changing the period counts from the start of the current one: `spent` is the usage
  // recorded since then (the month's 'c', not November's 'b'), and the epoch moves.
  const changed = (await c.call('PATCH', `/admin/v1/keys/${weekly.id}`, { period: 'month' })).body.key;
  assert.deepEqual([changed.spent, changed.epoch, changed.period, changed.resetsAt], [0.35, 2, 'month', '2027-01-01T00:00:00.000Z']);
  const project = (await c.call('PATCH', '/admin/v1/projects/p_w', { period: 'day' })).body.project;
  assert.deepEqual([project.spent, project.epoch], [0.35, 2], 'today\'s usage of its keys');
  // A key without a period that spent in November: a daily budget set today starts at 0.
  c.clock.now = Date.parse('2026-12-07T12:00:00Z');
  const lifetime = (await c.call('POST', '/admin/v1/keys', { kind: 'team', project: 'p_m', budget: 5 })).body.key;
  await c.usage([ev(lifetime.id, 'd', { at: '2026-11-20T10:00:00Z' })]);
  assert.equal((await c.call('GET', `/admin/v1/keys/${lifetime.id}`)).body.key.spent, 0.35);
  const daily2 = (await c.call('PATCH', `/admin/v1/keys/${lifetime.id}`, { period: 'day' })).body.key;
  assert.deepEqual([daily2.spent, daily2.epoch], [0, 1], 'November\'s spend is not today\'s');
  const none = (await c.call('PATCH', `/admin/v1/keys/${weekly.id}`, { period: null })).body.key;
  assert.deepEqual([none.period, none.resetsAt], [null, null]);
});

test('estimated usage is priced like any other and ingested once', async () => {
  const c = await clocked('2026-11-25T12:00:00Z');
  await c.call('POST', '/admin/v1/projects', { id: 'p_est' });
  const key = (await c.call('POST', '/admin/v1/keys', { kind: 'team', project: 'p_est' })).body.key;
  const estimated = ev(key.id, 'r_est', { status: 499, estimated: true });
  assert.deepEqual(await c.usage([estimated]).then((o) => [o.accepted, o.duplicates, o.cost]), [1, 0, 0.35]);
  assert.deepEqual(await c.usage([estimated]).then((o) => [o.accepted, o.duplicates]), [0, 1], 'a retried batch is not charged twice');
  assert.equal((await c.call('GET', `/admin/v1/keys/${key.id}`)).body.key.spent, 0.35);
  const row = c.running.store.db.prepare('SELECT estimated, cost FROM usage WHERE request_id = ?').get('r_est') as { estimated: number; cost: number };
  assert.deepEqual(row, { estimated: 1, cost: 0.35 });
});

test('a console store from before the v1 fields opens with its data and the defaults', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'kw-oldstore-'));
  dirs.push(dir);
  const path = join(dir, 'console.sqlite');
  // Build today's store, then take the v1 additions away again: what an older version left on disk.
  const db = openConsoleDb(path);
  db.exec(`DROP INDEX keys_period; DROP INDEX projects_period; DROP TABLE prices;
    ALTER TABLE keys DROP COLUMN epoch; ALTER TABLE keys DROP COLUMN ips; ALTER TABLE keys DROP COLUMN allow_browser;
    ALTER TABLE keys DROP COLUMN model_limits; ALTER TABLE keys DROP COLUMN period; ALTER TABLE keys DROP COLUMN period_start;
    ALTER TABLE projects DROP COLUMN epoch; ALTER TABLE projects DROP COLUMN period; ALTER TABLE projects DROP COLUMN period_start;
    ALTER TABLE wallets DROP COLUMN epoch; ALTER TABLE usage DROP COLUMN estimated;
    INSERT INTO projects (id, status, budget, spent, created_at) VALUES ('p_old', 'enabled', 9, 1.5, 0);`);
  db.close();
  const old = new Database(path, { readonly: true });
  assert.equal((old.prepare('PRAGMA table_info(keys)').all() as { name: string }[]).some((c) => c.name === 'epoch'), false);
  old.close();

  const tokens = { admin: tok('admin'), sync: tok('sync'), alice: tok('alice'), bob: tok('bob') };
  const running = await startConsole({ config: makeConsoleConfig({ dir, tokens }), env: { TEST_MASTER_KEY: randomBytes(32).toString('hex') } });
  consoles.push(running);
  const p = running.store.getProject('p_old');
  assert.deepEqual([p.spent, p.epoch, p.period, p.resetsAt], [1.5, 0, null, null]);
  const snap = await (await fetch(`${running.url}/sync/v1/snapshot`, { headers: { authorization: `Bearer ${tokens.sync}` } })).text();
  assert.ok(snap.includes('{"type":"project","id":"p_old","status":"enabled","budget":9,"spent":1.5,"epoch":0,"period":null}'));
  assert.ok(snap.includes('"type":"price"'), 'the price table is published into the migrated store');
});
