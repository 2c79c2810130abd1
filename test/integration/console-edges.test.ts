/**
 * Console behaviour at its edges: the snapshot's media type and
 * tombstones, a usage event at the exact UTC boundary, the key's last-use time (never in
 * the future, never moving back), budgets of deleted keys at a boundary, the last page of
 * the key listing, bearer-scheme handling, the usage body limit and the long poll's default.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import http from 'node:http';
import { once } from 'node:events';
import { parseSnapshotText } from '../../src/protocol/ndjson.js';
import { startConsole, type RunningConsole } from '../../src/app/console.js';
import { rollPeriods } from '../../src/console/budgets.js';
import { priceTable } from '../../src/console/pricing.js';
import { makeConsoleConfig, tok } from '../helpers/console-fixture.js';

const dirs: string[] = [];
const consoles: RunningConsole[] = [];
after(async () => {
  for (const c of consoles) await c.close().catch(() => {});
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

/** A real console on port 0 whose clock the test moves; its own period timer is kept out of the way. */
async function clocked(startIso: string, overrides: Parameters<typeof makeConsoleConfig>[0]['overrides'] = {}) {
  const dir = mkdtempSync(join(tmpdir(), 'kw-console-edges-'));
  dirs.push(dir);
  const tokens = { admin: tok('admin'), sync: tok('sync'), alice: tok('alice'), bob: tok('bob') };
  const clock = { now: Date.parse(startIso) };
  const running = await startConsole({
    config: makeConsoleConfig({ dir, tokens, overrides }),
    env: { TEST_MASTER_KEY: randomBytes(32).toString('hex') },
    now: () => clock.now,
    periodCheckMs: 3_600_000,
  });
  consoles.push(running);
  const call = async (method: string, path: string, body?: unknown, headers: Record<string, string> = {}) => {
    const res = await fetch(`${running.url}${path}`, {
      method,
      headers: { authorization: `Bearer ${path.startsWith('/sync/') ? tokens.sync : tokens.admin}`, ...(body !== undefined ? { 'content-type': 'application/json' } : {}), ...headers },
      ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
    });
    return { status: res.status, headers: res.headers, text: await res.text() };
  };
  const json = async (method: string, path: string, body?: unknown) => JSON.parse((await call(method, path, body)).text);
  const usage = (events: object[]) =>
    fetch(`${running.url}/sync/v1/usage`, { method: 'POST', headers: { authorization: `Bearer ${tokens.sync}` }, body: events.map((e) => JSON.stringify(e)).join('\n') })
      .then((r) => r.json() as Promise<Record<string, number>>);
  return { running, clock, call, json, usage, tokens };
}

const ev = (key_id: string, request_id: string, at: string) => ({
  request_id, key_id, model: 'gpt-4o', input_tokens: 100_000, output_tokens: 10_000, status: 200, at,
}); // 0.35 at the fixture's gpt-4o price

test('the snapshot is application/x-ndjson and carries a deleted key as a tombstone', async () => {
  const c = await clocked('2026-11-30T12:00:00Z');
  const key = (await c.json('POST', '/admin/v1/keys', { kind: 'personal', user: 'alice' })).key;
  assert.equal((await c.call('DELETE', `/admin/v1/keys/${key.id}`)).status, 200);
  const snap = await c.call('GET', '/sync/v1/snapshot');
  assert.equal(snap.status, 200);
  assert.equal(snap.headers.get('content-type'), 'application/x-ndjson', 'DESIGN section 7');
  const keys = parseSnapshotText(snap.text).records.map((r) => r.record).filter((r) => r.type === 'key');
  // A sidecar snapshotting after the delete still answers api_key_deleted, not invalid_api_key.
  assert.deepEqual(keys.map((k) => [k.type === 'key' && k.id, k.type === 'key' && k.status]), [[key.id, 'deleted']]);
});

test('usage stamped at the very instant a period begins counts toward the new period', async () => {
  const c = await clocked('2026-11-30T23:59:00Z');
  await c.json('POST', '/admin/v1/projects', { id: 'p_edge', budget: 100, period: 'day' });
  const key = (await c.json('POST', '/admin/v1/keys', { kind: 'team', project: 'p_edge', budget: 5, period: 'day' })).key;
  c.clock.now = Date.parse('2026-12-01T00:00:10Z');
  const out = await c.usage([ev(key.id, 'edge', '2026-12-01T00:00:00.000Z')]);
  assert.equal(out.accepted, 1);
  const k = (await c.json('GET', `/admin/v1/keys/${key.id}`)).key;
  assert.deepEqual([k.spent, k.epoch], [0.35, 1], 'made at 00:00:00.000 is made in the new day');
  assert.equal((await c.json('GET', '/admin/v1/projects/p_edge')).project.spent, 0.35);
});

test('a key\'s last use is never in the future and never moves back', async () => {
  const c = await clocked('2026-11-30T12:00:00Z');
  const key = (await c.json('POST', '/admin/v1/keys', { kind: 'personal', user: 'alice' })).key;
  // A sidecar clock an hour ahead, pushing without a Date header.
  await c.usage([ev(key.id, 'ahead', '2026-11-30T13:00:00Z')]);
  assert.equal((await c.json('GET', `/admin/v1/keys/${key.id}`)).key.lastUsedAt, '2026-11-30T12:00:00.000Z', 'clamped to the console\'s now');
  // An older event delivered late (a retried batch) leaves the last use where it was.
  c.clock.now = Date.parse('2026-11-30T12:30:00Z');
  await c.usage([ev(key.id, 'now', '2026-11-30T12:30:00Z')]);
  await c.usage([ev(key.id, 'older', '2026-11-30T12:10:00Z')]);
  assert.equal((await c.json('GET', `/admin/v1/keys/${key.id}`)).key.lastUsedAt, '2026-11-30T12:30:00.000Z');
});

test('a deleted key\'s budget is not restarted at the boundary: its figures stay, the feed carries only what restarted', async () => {
  const c = await clocked('2026-11-30T12:00:00Z');
  await c.json('POST', '/admin/v1/projects', { id: 'p_gone', budget: 100, period: 'day' });
  const key = (await c.json('POST', '/admin/v1/keys', { kind: 'team', project: 'p_gone', budget: 5, period: 'day' })).key;
  await c.usage([ev(key.id, 'spent', '2026-11-30T12:00:00Z')]);
  await c.call('DELETE', `/admin/v1/keys/${key.id}`);
  const before = c.running.store.feed.version();
  c.clock.now = Date.parse('2026-12-01T00:00:01Z');
  assert.equal(rollPeriods(c.running.store), 1, 'the project, not the deleted key');
  const batch = JSON.parse((await c.call('GET', `/sync/v1/changes?after=${before}`)).text) as { changes: { type: string; id: string }[] };
  assert.deepEqual(batch.changes.map((ch) => `${ch.type}:${ch.id}`), ['project:p_gone']);
  const k = (await c.json('GET', `/admin/v1/keys/${key.id}`)).key;
  assert.deepEqual([k.status, k.spent, k.epoch], ['deleted', 0.35, 0]);
});

test('the key listing: a page that holds exactly the last keys says there is no next page', async () => {
  const c = await clocked('2026-11-30T12:00:00Z');
  for (let i = 0; i < 3; i++) {
    c.clock.now += 1000;
    await c.json('POST', '/admin/v1/keys', { kind: 'personal', user: 'alice' });
  }
  const all = await c.json('GET', '/admin/v1/keys?limit=3');
  assert.equal(all.keys.length, 3);
  assert.equal(all.next, null);
  const first = await c.json('GET', '/admin/v1/keys?limit=2');
  assert.equal(first.keys.length, 2);
  const last = await c.json('GET', `/admin/v1/keys?limit=1&after=${encodeURIComponent(first.next)}`);
  assert.deepEqual([last.keys.length, last.next], [1, null]);
});

test('bearer tokens: the scheme in any case; a 401 names the Bearer scheme', async () => {
  const c = await clocked('2026-11-30T12:00:00Z');
  const lower = await fetch(`${c.running.url}/admin/v1/whoami`, { headers: { authorization: `bearer ${c.tokens.admin}` } });
  assert.equal(lower.status, 200, 'RFC 9110: the auth scheme is case-insensitive');
  const none = await fetch(`${c.running.url}/sync/v1/snapshot`);
  assert.equal(none.status, 401);
  assert.equal(none.headers.get('www-authenticate'), 'Bearer');
});

test('a changes request without waitMs answers at once', async () => {
  const c = await clocked('2026-11-30T12:00:00Z');
  const v = c.running.store.feed.version();
  const req = http.get(`${c.running.url}/sync/v1/changes?after=${v}`, { headers: { authorization: `Bearer ${c.tokens.sync}` } });
  const timer = setTimeout(() => req.destroy(new Error('no answer within 2 s: the default wait is not 0')), 2000);
  const [res] = (await once(req, 'response')) as [http.IncomingMessage];
  clearTimeout(timer);
  let body = '';
  for await (const chunk of res) body += chunk;
  assert.equal(res.statusCode, 200);
  assert.deepEqual(JSON.parse(body).changes, []);
});

test('a price table naming `*` itself publishes that price once, not the unpriced rate over it', () => {
  const table = priceTable({
    models: [{ match: '*', inputPerMillion: 3, outputPerMillion: 4 }],
    unpriced: { inputPerMillion: 1, outputPerMillion: 1 },
  } as never);
  assert.deepEqual(table, [{ model: '*', input: 3, output: 4, per: 1_000_000 }]);
});

test('a deleted key: reset and rotate are 410 key_deleted; its usage pushed late is still billed to the wallet', async () => {
  const c = await clocked('2026-11-30T12:00:00Z');
  await c.json('POST', '/admin/v1/projects', { id: 'p_del', budget: 100 });
  const team = (await c.json('POST', '/admin/v1/keys', { kind: 'team', project: 'p_del', budget: 5 })).key;
  const own = (await c.json('POST', '/admin/v1/keys', { kind: 'personal', user: 'bob' })).key;
  await c.json('PUT', '/admin/v1/wallets/bob', { balance: 10 });
  for (const k of [team, own]) await c.call('DELETE', `/admin/v1/keys/${k.id}`);
  const reset = await c.call('POST', `/admin/v1/keys/${team.id}/reset`);
  assert.equal(reset.status, 410);
  assert.equal(JSON.parse(reset.text).error.code, 'key_deleted');
  const rotate = await c.call('POST', `/admin/v1/keys/${team.id}/rotate`);
  assert.equal(rotate.status, 410);
  assert.equal(JSON.parse(rotate.text).error.code, 'key_deleted');
  assert.equal((await c.json('GET', '/admin/v1/keys?all=1')).keys.length, 2, 'no replacement was made');
  // Made before the delete, delivered after it (the sidecar kept it while the console was away).
  const out = await c.usage([ev(own.id, 'late', '2026-11-30T11:59:00Z')]);
  assert.equal(out.accepted, 1);
  assert.equal((await c.json('GET', '/admin/v1/wallets/bob')).wallet.balance, 9.65);
});
