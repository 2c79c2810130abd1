/**
 * The console and two real sidecars wired together: each sidecar keeps its replica in
 * step through the sync client and pushes its usage back. Shows revocation, budgets,
 * wallets, project disabling and a console outage from the client's point of view.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { configSchema } from '../../src/config/schema.js';
import { runConsoleCli } from '../helpers/console-cli.js';
import { createLogger } from '../../src/obs/logger.js';
import { startSidecar, type Sidecar } from '../../src/app/sidecar.js';
import { ReplicaStore } from '../../src/replica/store.js';
import { createSyncClient, createUsagePusher, type SyncClient, type UsagePusher } from '../../src/sync/client.js';
import { replicaWriter } from '../../src/replica/writer.js';
import { startConsoleFixture, type ConsoleFixture } from '../helpers/console-fixture.js';
import { lookupSecret, until, whenReplica } from '../helpers/console-replica.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';

interface Node { sidecar: Sidecar; replica: ReplicaStore; client: SyncClient; pusher: UsagePusher }

let fx: ConsoleFixture;
let upstream: FakeUpstream;
let dir: string;
let nodes: Node[] = [];

before(async () => {
  fx = await startConsoleFixture();
  dir = mkdtempSync(join(tmpdir(), 'kw-e2e-sync-'));
  // gpt-4o at 2.5/10 per million: 1000 prompt + 100 completion tokens cost 0.0035
  upstream = await startFakeUpstream((_req, res) => {
    const text = JSON.stringify({ id: 'c', object: 'chat.completion', choices: [], usage: { prompt_tokens: 1000, completion_tokens: 100, total_tokens: 1100 } });
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
    res.end(text);
  });
  for (const name of ['a', 'b']) {
    const config = configSchema.parse({
      server: { port: 0 }, admin: { port: 0 },
      upstreams: { default: { url: upstream.url } },
      replica: { path: join(dir, `${name}.sqlite`) },
      console: { url: fx.url, token: fx.tokens.sync, waitMs: 2000 },
    });
    const replica = new ReplicaStore({ path: config.replica.path });
    const pusher = createUsagePusher({ url: fx.url, token: fx.tokens.sync, maxBuffer: 10_000, batchSize: 100, flushMs: 20, backoff: { baseMs: 20, maxMs: 200 } });
    const logger = createLogger({ level: 'warn', destination: new Writable({ write: (_c, _e, cb) => cb() }) });
    const sidecar = await startSidecar({ config, logger, replica, usageSink: (e) => pusher.push(e) });
    const client = createSyncClient({ url: fx.url, token: fx.tokens.sync, waitMs: 2000, target: replicaWriter(replica), backoff: { baseMs: 20, maxMs: 200 } });
    nodes.push({ sidecar, replica, client, pusher });
  }
  await Promise.all(nodes.map((n) => n.client.start()));
});

after(async () => {
  for (const n of nodes) {
    await n.client.stop();
    await n.pusher.stop();
    await n.sidecar.close({ graceMs: 100 });
    await n.replica.close();
  }
  nodes = [];
  await upstream.close();
  await fx.close();
  rmSync(dir, { recursive: true, force: true });
});

async function chat(node: Node, key: string): Promise<{ status: number; code: string | null }> {
  const res = await fetch(`${node.sidecar.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    // A named output cap: the spend hold (about 0.001 here) must fit the small budgets below.
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], max_tokens: 100 }),
  });
  await res.arrayBuffer();
  return { status: res.status, code: res.headers.get('x-keyward-error') };
}

async function files(node: Node, key: string): Promise<{ status: number; code: string | null }> {
  const res = await fetch(`${node.sidecar.url}/v1/files`, { headers: { authorization: `Bearer ${key}` } });
  await res.arrayBuffer();
  return { status: res.status, code: res.headers.get('x-keyward-error') };
}

const synced = (pred: (n: Node) => boolean) => Promise.all(nodes.map((n) => whenReplica(n.replica, () => pred(n), 3000)));
const cli = (...argv: string[]) => runConsoleCli(argv, { env: { KEYWARD_ADMIN_TOKEN: fx.tokens.admin, KEYWARD_CONSOLE_URL: fx.url } });

test('keys delete: both sidecars answer 401 api_key_deleted within a second', async (t) => {
  await fx.api('POST', '/admin/v1/projects', { body: { id: 'p_e2e' } });
  const samples: number[] = [];
  for (let trial = 0; trial < 10; trial++) {
    const made = JSON.parse((await cli('keys', 'create', '--team', 'p_e2e', '--json')).stdout);
    await synced((n) => lookupSecret(n.replica, made.secret) !== null);
    for (const n of nodes) assert.equal((await chat(n, made.secret)).status, 200);
    const started = performance.now();
    const refused = nodes.map(async (n) => {
      await whenReplica(n.replica, () => lookupSecret(n.replica, made.secret)?.key.status === 'deleted', 1000);
      const r = await chat(n, made.secret);
      assert.deepEqual(r, { status: 401, code: 'api_key_deleted' });
      return performance.now() - started;
    });
    const del = await cli('keys', 'delete', made.key.id);
    assert.equal(del.code, 0, del.stderr);
    samples.push(...(await Promise.all(refused)));
  }
  samples.sort((x, y) => x - y);
  const q = (p: number) => samples[Math.min(samples.length - 1, Math.floor(p * samples.length))]!.toFixed(1);
  t.diagnostic(`keys delete -> 401 api_key_deleted (ms, CLI start to the 401 answer, ${samples.length} samples over 2 sidecars): min ${q(0)} p50 ${q(0.5)} p90 ${q(0.9)} max ${q(1)}`);
  assert.ok(samples.at(-1)! < 1000);
});

test('priced usage reaching a key budget, a project budget or an empty wallet makes the next request 402', async () => {
  await fx.api('POST', '/admin/v1/projects', { body: { id: 'p_kb' } });
  await fx.api('POST', '/admin/v1/projects', { body: { id: 'p_pb', budget: 0.005 } });
  const keyBudget = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'team', project: 'p_kb', budget: 0.005 } })).body;
  const projBudget = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'team', project: 'p_pb' } })).body;
  const personal = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'personal', user: 'hana' } })).body;
  await fx.api('PUT', '/admin/v1/wallets/hana', { body: { balance: 0.005 } });
  await synced((n) => lookupSecret(n.replica, personal.secret)?.walletBalance === 0.005 && lookupSecret(n.replica, projBudget.secret) !== null && lookupSecret(n.replica, keyBudget.secret) !== null);

  const cases = [
    { key: keyBudget.secret, code: 'key_budget_exhausted' },
    { key: projBudget.secret, code: 'project_budget_exhausted' },
    { key: personal.secret, code: 'insufficient_balance' },
  ];
  for (const c of cases) {
    // 0.0035 per request: the first leaves room, the second reaches the limit (spent 0.007 >= 0.005).
    assert.equal((await chat(nodes[0]!, c.key)).status, 200);
    assert.equal((await chat(nodes[1]!, c.key)).status, 200);
    await synced((n) => {
      const f = lookupSecret(n.replica, c.key)!;
      return f.key.kind === 'personal' ? (f.walletBalance ?? 1) <= 0 : f.key.spent >= 0.007 || (f.project?.spent ?? 0) >= 0.007;
    });
    for (const n of nodes) assert.deepEqual(await chat(n, c.key), { status: 402, code: c.code });
  }
  const k = (await fx.api('GET', `/admin/v1/keys/${keyBudget.key.id}`)).body.key;
  assert.equal(k.spent, 0.007);
  assert.ok(k.lastUsedAt);
});

test('one x-request-id on many concurrent requests: the console bills every one of them once', async () => {
  await fx.api('POST', '/admin/v1/projects', { body: { id: 'p_rid' } });
  const key = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'team', project: 'p_rid' } })).body;
  await synced((n) => lookupSecret(n.replica, key.secret) !== null);
  const sentBefore = nodes.map((n) => n.pusher.stats().sent);
  const perNode = 20;
  const statuses = await Promise.all(
    nodes.flatMap((n) =>
      Array.from({ length: perNode }, async () => {
        const res = await fetch(`${n.sidecar.url}/v1/chat/completions`, {
          method: 'POST',
          headers: { authorization: `Bearer ${key.secret}`, 'content-type': 'application/json', 'x-request-id': 'client-reuses-this-id' },
          body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], max_tokens: 100 }),
        });
        await res.arrayBuffer();
        return res.status;
      }),
    ),
  );
  assert.deepEqual(new Set(statuses), new Set([200]));
  assert.ok(await until(() => nodes.every((n, i) => n.pusher.stats().sent - sentBefore[i]! >= perNode)), 'every event was delivered');
  const body = (await fx.api('GET', `/admin/v1/keys/${key.key.id}`)).body.key;
  // 0.0035 a request (1000 prompt and 100 completion tokens of gpt-4o)
  assert.equal(body.spent, Math.round(nodes.length * perNode * 0.0035 * 1e9) / 1e9);
});

test('disabling a project: model requests 402 and file requests 403 within a second', async () => {
  await fx.api('POST', '/admin/v1/projects', { body: { id: 'p_off' } });
  const key = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'team', project: 'p_off' } })).body;
  await synced((n) => lookupSecret(n.replica, key.secret) !== null);
  assert.equal((await files(nodes[0]!, key.secret)).status, 200);
  const started = performance.now();
  const seen = synced((n) => lookupSecret(n.replica, key.secret)?.project?.status === 'disabled');
  assert.equal((await cli('projects', 'disable', 'p_off')).code, 0);
  await seen;
  for (const n of nodes) {
    assert.deepEqual(await chat(n, key.secret), { status: 402, code: 'project_disabled' });
    assert.deepEqual(await files(n, key.secret), { status: 403, code: 'project_disabled' });
  }
  assert.ok(performance.now() - started < 1000);
});

test('console away: sidecars keep serving from their replicas and catch up when it returns', async () => {
  await fx.api('POST', '/admin/v1/projects', { body: { id: 'p_away' } });
  const keep = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'team', project: 'p_away' } })).body;
  await synced((n) => lookupSecret(n.replica, keep.secret) !== null);
  await fx.console.close();
  assert.ok(await until(() => nodes.every((n) => !n.client.status().connected)));
  for (const n of nodes) assert.equal((await chat(n, keep.secret)).status, 200, 'served from the last good replica');
  assert.ok(await until(() => nodes.every((n) => n.pusher.stats().failures > 0 && n.pusher.stats().buffered > 0)), 'usage waits for the console');

  await fx.restart();
  await Promise.all(nodes.map((n) => until(() => n.client.status().connected && n.pusher.stats().buffered === 0)));
  const seen = synced((n) => lookupSecret(n.replica, keep.secret)?.key.status === 'deleted');
  await cli('keys', 'delete', keep.key.id);
  await seen;
  for (const n of nodes) assert.deepEqual(await chat(n, keep.secret), { status: 401, code: 'api_key_deleted' });
  const spent = (await fx.api('GET', `/admin/v1/keys/${keep.key.id}`)).body.key.spent;
  assert.equal(spent, 0.007, 'usage buffered during the outage was delivered and charged once');
});
