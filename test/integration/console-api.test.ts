import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, existsSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { makeKeyHasher } from '../../src/auth/hash.js';
import { isWellFormedKey } from '../../src/auth/keyformat.js';
import { startConsole } from '../../src/app/console.js';
import { KeyHashingError, MasterKeyError } from '../../src/console/crypto.js';
import { parseSnapshotText } from '../../src/protocol/ndjson.js';
import { startConsoleFixture, syncGet, type ConsoleFixture } from '../helpers/console-fixture.js';

let fx: ConsoleFixture;
before(async () => {
  fx = await startConsoleFixture();
});
after(async () => {
  await fx.close();
});

function storeBytes(): Buffer {
  const path = fx.config.store.path;
  return Buffer.concat([path, `${path}-wal`].filter(existsSync).map((p) => readFileSync(p)));
}

test('create → hash as the sidecar computes it, reveal returns the same key, no plain key in the store or the feed', async () => {
  const created = await fx.api('POST', '/admin/v1/keys', { body: { kind: 'personal', user: 'alice', models: ['gpt-4o*'], rpm: 60 } });
  assert.equal(created.status, 201);
  const secret: string = created.body.secret;
  assert.ok(isWellFormedKey(secret));
  assert.equal(created.body.key.user, 'alice');
  assert.equal(created.body.key.hash, undefined, 'the admin API does not show hashes');

  const revealed = await fx.api('POST', `/admin/v1/keys/${created.body.key.id}/reveal`);
  assert.equal(revealed.status, 200);
  assert.equal(revealed.body.secret, secret);

  const snap = await syncGet(fx, '/sync/v1/snapshot');
  assert.equal(snap.status, 200);
  const parsed = parseSnapshotText(snap.text);
  const rec = parsed.records.map((r) => r.record).find((r) => r.type === 'key' && r.id === created.body.key.id);
  assert.ok(rec && rec.type === 'key');
  assert.equal(rec.hash, makeKeyHasher({ hash: 'sha256' })(secret));
  assert.deepEqual(rec.models, ['gpt-4o*']);
  const changes = await syncGet(fx, '/sync/v1/changes?after=0');
  assert.equal(changes.status, 200);

  const body = secret.slice(3, 46); // the random part: no fragment of it may be stored
  for (const [what, text] of [['snapshot', snap.text], ['changes', changes.text], ['store file', storeBytes().toString('latin1')]] as const) {
    assert.ok(!text.includes(secret), `${what} contains the key`);
    assert.ok(!text.includes(body), `${what} contains the key body`);
  }
});

test('keys delete: the sealed secret is gone from the store and its write-ahead log, and reveal says so', async () => {
  const made = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'personal', user: 'dora' } })).body;
  const row = fx.console.store.db.prepare('SELECT secret_ct FROM keys WHERE id = ?').get(made.key.id) as { secret_ct: Buffer };
  assert.ok(row.secret_ct.length >= 16);
  assert.ok(storeBytes().includes(row.secret_ct), 'the sealed secret is stored while the key lives');
  assert.equal((await fx.api('DELETE', `/admin/v1/keys/${made.key.id}`)).status, 200);
  assert.ok(!storeBytes().includes(row.secret_ct), 'no copy of the sealed secret is left in the store files');
  assert.equal((await fx.api('POST', `/admin/v1/keys/${made.key.id}/reveal`)).status, 410);
});

test('tokens: 401 without, 403 for someone else\'s key, own and project keys visible to users', async () => {
  await fx.api('POST', '/admin/v1/projects', { body: { id: 'p_perm', members: ['bob'] } });
  const aliceKey = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'personal', user: 'alice' } })).body;
  const teamKey = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'team', project: 'p_perm', budget: 5 } })).body;
  const { alice, bob, sync } = fx.tokens;

  assert.equal((await fx.api('GET', '/admin/v1/keys', { token: null })).status, 401);
  assert.equal((await fx.api('GET', '/admin/v1/keys', { token: 'not-a-real-token-000000' })).status, 401);
  assert.equal((await fx.api('POST', `/admin/v1/keys/${aliceKey.key.id}/reveal`, { token: null })).status, 401);
  assert.equal((await fx.api('GET', '/admin/v1/keys', { token: sync })).status, 403);

  const own = await fx.api('POST', `/admin/v1/keys/${aliceKey.key.id}/reveal`, { token: alice });
  assert.equal(own.status, 200);
  assert.equal(own.body.secret, aliceKey.secret);
  const other = await fx.api('POST', `/admin/v1/keys/${aliceKey.key.id}/reveal`, { token: bob });
  assert.equal(other.status, 403);
  assert.ok(!JSON.stringify(other.body).includes(aliceKey.secret));
  assert.equal((await fx.api('GET', `/admin/v1/keys/${aliceKey.key.id}`, { token: bob })).status, 403);

  const member = await fx.api('POST', `/admin/v1/keys/${teamKey.key.id}/reveal`, { token: bob });
  assert.equal(member.status, 200);
  assert.equal(member.body.secret, teamKey.secret);
  assert.equal((await fx.api('POST', `/admin/v1/keys/${teamKey.key.id}/reveal`, { token: alice })).status, 403);

  const bobList = (await fx.api('GET', '/admin/v1/keys', { token: bob })).body.keys.map((k: { id: string }) => k.id);
  assert.ok(bobList.includes(teamKey.key.id));
  assert.ok(!bobList.includes(aliceKey.key.id));
  const aliceList = (await fx.api('GET', '/admin/v1/keys', { token: alice })).body.keys.map((k: { id: string }) => k.id);
  assert.ok(aliceList.includes(aliceKey.key.id) && !aliceList.includes(teamKey.key.id));

  // users only read: creating, deleting and crediting need an admin token
  assert.equal((await fx.api('POST', '/admin/v1/keys', { token: alice, body: { kind: 'personal', user: 'alice' } })).status, 403);
  assert.equal((await fx.api('DELETE', `/admin/v1/keys/${aliceKey.key.id}`, { token: alice })).status, 403);
  assert.equal((await fx.api('POST', '/admin/v1/wallets/alice/credit', { token: alice, body: { amount: 5 } })).status, 403);
  assert.equal((await fx.api('GET', '/admin/v1/wallets/alice', { token: alice })).status, 200);
  assert.equal((await fx.api('GET', '/admin/v1/wallets/alice', { token: bob })).status, 403);

  // sync endpoints: only the sync token
  assert.equal((await syncGet(fx, '/sync/v1/snapshot', null)).status, 401);
  assert.equal((await syncGet(fx, '/sync/v1/snapshot', fx.tokens.admin)).status, 403);
});

test('keys: update, delete tombstones and wipes the secret, rotate copies settings and what the key spent; errors are JSON', async () => {
  await fx.api('POST', '/admin/v1/projects', { body: { id: 'p_rot', budget: 100 } });
  const k = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'team', project: 'p_rot', models: ['a*'], routing: 'batch', rpm: 10, tpm: 1000, concurrency: 2, budget: 3 } })).body;
  const upd = await fx.api('PATCH', `/admin/v1/keys/${k.key.id}`, { body: { rpm: 20, models: null } });
  assert.equal(upd.status, 200);
  assert.equal(upd.body.key.rpm, 20);
  assert.equal(upd.body.key.models, null);

  const event = { request_id: 'rot-1', key_id: k.key.id, model: 'gpt-4o', input_tokens: 400_000, output_tokens: 0, status: 200, at: new Date().toISOString() };
  await fetch(`${fx.url}/sync/v1/usage`, { method: 'POST', headers: { authorization: `Bearer ${fx.tokens.sync}`, 'content-type': 'application/x-ndjson' }, body: JSON.stringify(event) });
  const spent = (await fx.api('GET', `/admin/v1/keys/${k.key.id}`)).body.key.spent as number;
  assert.ok(spent > 0);

  const rot = await fx.api('POST', `/admin/v1/keys/${k.key.id}/rotate`);
  assert.equal(rot.status, 201);
  // a new credential, not a new budget
  assert.equal(rot.body.key.spent, spent);
  assert.notEqual(rot.body.key.id, k.key.id);
  assert.notEqual(rot.body.secret, k.secret);
  for (const f of ['kind', 'project', 'models', 'routing', 'rpm', 'tpm', 'concurrency', 'budget']) assert.deepEqual(rot.body.key[f], upd.body.key[f], f);
  assert.equal(rot.body.replaces.id, k.key.id);
  assert.equal(rot.body.replaces.status, 'active');

  const del = await fx.api('DELETE', `/admin/v1/keys/${k.key.id}`);
  assert.equal(del.body.key.status, 'deleted');
  const gone = await fx.api('POST', `/admin/v1/keys/${k.key.id}/reveal`);
  assert.equal(gone.status, 410);
  assert.equal(gone.body.error.code, 'key_deleted');

  const bad = await fx.api('POST', '/admin/v1/keys', { body: { kind: 'personal', user: 'alice', budget: 5 } });
  assert.equal(bad.status, 400);
  assert.equal(bad.body.error.code, 'invalid_request');
  assert.equal((await fx.api('POST', '/admin/v1/keys', { body: { kind: 'team', project: 'nope' } })).status, 404);
  assert.equal((await fx.api('POST', '/admin/v1/keys', { body: { kind: 'team', project: 'p_rot', extra: 1 } })).status, 400);
  assert.equal((await fx.api('GET', '/admin/v1/keys/k_missing')).status, 404);
  // A glob the sidecar could never be asked about (it refuses such model names) is refused here too.
  for (const models of [['gpt 4o'], ['a,b'], ['\u0001x']]) {
    assert.equal((await fx.api('POST', '/admin/v1/keys', { body: { kind: 'team', project: 'p_rot', models } })).status, 400, JSON.stringify(models));
  }
  assert.equal((await fx.api('POST', '/admin/v1/keys', { body: { kind: 'team', project: 'p_rot', modelLimits: [{ models: 'a b*', rpm: 1 }] } })).status, 400);
  // Number() would take these; the query's integers are plain digits, as the sync API's are
  for (const limit of ['1e2', '0x10', '%205']) assert.equal((await fx.api('GET', `/admin/v1/keys/${rot.body.key.id}/usage?limit=${limit}`)).status, 400, limit);
  // 405 names what the path answers (RFC 9110)
  const wrong = await fetch(`${fx.url}/admin/v1/keys`, { method: 'PUT', headers: { authorization: `Bearer ${fx.tokens.admin}` } });
  assert.equal(wrong.status, 405);
  assert.equal(wrong.headers.get('allow'), 'GET, POST');
  const wrongSync = await fetch(`${fx.url}/sync/v1/usage`, { method: 'PUT', headers: { authorization: `Bearer ${fx.tokens.sync}` } });
  assert.equal(wrongSync.status, 405);
  assert.equal(wrongSync.headers.get('allow'), 'POST');
  // An amount the store would round to Infinity would reach every sidecar as null (a feed they refuse).
  assert.equal((await fx.api('PUT', '/admin/v1/wallets/rot', { body: { balance: 1e300 } })).status, 400);
  assert.equal((await fx.api('POST', '/admin/v1/wallets/rot/credit', { body: { amount: 1e300 } })).status, 400);
  assert.equal((await fx.api('POST', '/admin/v1/keys', { body: { kind: 'team', project: 'p_rot', budget: 1e300 } })).status, 400);
  assert.equal((await fx.api('PUT', '/admin/v1/wallets/rot', { body: { balance: 1e12 } })).status, 200);
  assert.equal((await fx.api('POST', '/admin/v1/projects', { body: { id: 'p_rot' } })).status, 409);
});

test('usage ingestion prices events, moves spent and balance, records last use, ignores repeats', async () => {
  await fx.api('POST', '/admin/v1/projects', { body: { id: 'p_use', budget: 10 } });
  const team = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'team', project: 'p_use', budget: 1 } })).body.key;
  const personal = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'personal', user: 'carol' } })).body.key;
  await fx.api('PUT', '/admin/v1/wallets/carol', { body: { balance: 2 } });
  const at = new Date(Date.now() - 60_000).toISOString();
  const ev = (request_id: string, key_id: string, model: string | null, input_tokens: number, output_tokens: number) =>
    JSON.stringify({ request_id, key_id, model, input_tokens, output_tokens, status: 200, at });
  const lines = [
    ev('r1', team.id, 'gpt-4o', 100_000, 10_000), // 0.25 + 0.1
    ev('r2', personal.id, 'gpt-4o-mini', 1_000_000, 0), // 0.15
    ev('r3', personal.id, 'llama-3', 500_000, 500_000), // unpriced 1/1: 1
    ev('r1', team.id, 'gpt-4o', 100_000, 10_000), // the same event again (a retried batch)
    JSON.stringify({ request_id: 'r1', key_id: team.id, model: 'gpt-4o', input_tokens: 100_000, output_tokens: 10_000, status: 200, at: new Date(Date.parse(at) + 1).toISOString() }), // another request reusing a client's request id
    ev('r4', 'k_unknown', 'gpt-4o', 1, 1),
    '{"request_id":"bad"}',
  ].join('\n');
  const res = await fetch(`${fx.url}/sync/v1/usage`, { method: 'POST', headers: { authorization: `Bearer ${fx.tokens.sync}`, 'content-type': 'application/x-ndjson' }, body: lines });
  assert.equal(res.status, 200);
  const out = (await res.json()) as Record<string, number>;
  assert.deepEqual({ accepted: out.accepted, duplicates: out.duplicates, unknownKeys: out.unknownKeys, invalid: out.invalid }, { accepted: 4, duplicates: 1, unknownKeys: 1, invalid: 1 });
  assert.equal(out.cost, 1.85);

  const t = (await fx.api('GET', `/admin/v1/keys/${team.id}`)).body.key;
  assert.equal(t.spent, 0.7);
  assert.equal(t.lastUsedAt, new Date(Date.parse(at) + 1).toISOString());
  assert.equal((await fx.api('GET', '/admin/v1/projects/p_use')).body.project.spent, 0.7);
  assert.equal((await fx.api('GET', `/admin/v1/keys/${personal.id}`)).body.key.spent, 1.15);
  assert.equal((await fx.api('GET', '/admin/v1/wallets/carol')).body.wallet.balance, 0.85);

  // The new figures reach sidecars as changes.
  const feed = await syncGet(fx, '/sync/v1/changes?after=0');
  const last = (JSON.parse(feed.text) as { changes: { type: string; id?: string; user?: string; spent?: number; balance?: number }[] }).changes;
  assert.ok(last.some((c) => c.type === 'wallet' && c.user === 'carol' && c.balance === 0.85));
  assert.ok(last.some((c) => c.type === 'project' && c.id === 'p_use' && c.spent === 0.7));
});

test('usage events with an event_id: equal fields are two events, the same event_id again is a repeat', async () => {
  const key = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'personal', user: 'eve' } })).body.key;
  const at = new Date(Date.now() - 1000).toISOString();
  const ev = (event_id: string) => JSON.stringify({ event_id, request_id: 'same', key_id: key.id, model: 'gpt-4o', input_tokens: 1_000_000, output_tokens: 0, status: 200, at });
  const post = async (lines: string[]) => {
    const res = await fetch(`${fx.url}/sync/v1/usage`, { method: 'POST', headers: { authorization: `Bearer ${fx.tokens.sync}`, 'content-type': 'application/x-ndjson' }, body: lines.join('\n') });
    const out = (await res.json()) as Record<string, number>;
    return { accepted: out.accepted, duplicates: out.duplicates };
  };
  assert.deepEqual(await post([ev('e1'), ev('e2')]), { accepted: 2, duplicates: 0 });
  assert.deepEqual(await post([ev('e2'), ev('e3')]), { accepted: 1, duplicates: 1 }, 'a retried batch applies its events once');
  assert.equal((await fx.api('GET', `/admin/v1/keys/${key.id}`)).body.key.spent, 7.5); // 2.5 per million input tokens, three events
});

test('start-up fails clearly on a missing, malformed or wrong master key, without printing it', async () => {
  const config = { ...fx.config, listen: { host: '127.0.0.1', port: 0 } };
  await assert.rejects(startConsole({ config, env: {} }), (e: Error) => e instanceof MasterKeyError && /TEST_MASTER_KEY is not set/.test(e.message));
  await assert.rejects(startConsole({ config, env: { TEST_MASTER_KEY: 'nothex' } }), /TEST_MASTER_KEY is malformed/);
  const wrong = randomBytes(32).toString('hex');
  await assert.rejects(startConsole({ config, env: { TEST_MASTER_KEY: wrong } }), (e: Error) => {
    return e instanceof MasterKeyError && /does not match/.test(e.message) && !e.message.includes(wrong);
  });
});

test('start-up fails clearly when keys.hash or keys.pepper differs from what the store\'s keys were hashed with', async () => {
  assert.equal((await fx.api('POST', '/admin/v1/keys', { body: { kind: 'personal', user: 'alice' } })).status, 201);
  const config = (keys: object) => ({ ...fx.config, listen: { host: '127.0.0.1', port: 0 }, keys: { ...fx.config.keys, ...keys } });
  const pepper = 'pepper-0123456789abcdef';
  // A console that starts anyway is closed again, so the failure is reported, not a hang.
  const err = await startConsole({ config: config({ hash: 'hmac-sha256', pepper }), env: fx.env }).then((c) => c.close().then(() => null), (e: Error) => e);
  assert.ok(err instanceof KeyHashingError && /keys\.hash or keys\.pepper/.test(err.message) && !err.message.includes(pepper), String(err));
  const same = await startConsole({ config: config({}), env: fx.env });
  await same.close();
});

test('the key listing pages in creation order: limit, next and after; a user\'s pages hold only what they may see', async () => {
  await fx.api('POST', '/admin/v1/projects', { body: { id: 'p_page', members: ['bob'] } });
  const made: string[] = [];
  for (let i = 0; i < 5; i++) made.push((await fx.api('POST', '/admin/v1/keys', { body: { kind: 'team', project: 'p_page' } })).body.key.id);
  await fx.api('POST', '/admin/v1/keys', { body: { kind: 'personal', user: 'someone-else' } });
  const whole = (await fx.api('GET', '/admin/v1/keys?project=p_page')).body;
  assert.deepEqual([whole.keys.map((k: { id: string }) => k.id), whole.next], [made, null], 'one page by default');
  const seen: string[] = [];
  const sizes: number[] = [];
  for (let after: string | null = null, turns = 0; turns < 10; turns++) {
    const q: URLSearchParams = new URLSearchParams({ project: 'p_page', limit: '2', ...(after ? { after } : {}) });
    const page: { keys: { id: string }[]; next: string | null } = (await fx.api('GET', `/admin/v1/keys?${q}`)).body;
    seen.push(...page.keys.map((k: { id: string }) => k.id));
    sizes.push(page.keys.length);
    after = page.next;
    if (after === null) break;
  }
  assert.deepEqual([seen, sizes], [made, [2, 2, 1]]);
  const other = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'personal', user: 'alice' } })).body.key.id;
  const bobSees: string[] = [];
  for (let after: string | null = null, turns = 0; turns < 50; turns++) {
    const page: { keys: { id: string }[]; next: string | null } = (await fx.api('GET', `/admin/v1/keys?limit=1${after ? `&after=${encodeURIComponent(after)}` : ''}`, { token: fx.tokens.bob })).body;
    bobSees.push(...page.keys.map((k: { id: string }) => k.id));
    after = page.next;
    if (after === null) break;
  }
  assert.ok(made.every((id) => bobSees.includes(id)) && !bobSees.includes(other), 'a member\'s pages: the project\'s keys, not alice\'s');
  assert.equal((await fx.api('GET', '/admin/v1/keys?limit=0')).status, 400);
  assert.equal((await fx.api('GET', '/admin/v1/keys?limit=1001')).status, 400);
  assert.equal((await fx.api('GET', '/admin/v1/keys?after=nonsense')).status, 400);
});
