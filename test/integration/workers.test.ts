/**
 * `keyward serve --workers 2` as an operator runs it: a real primary and two real worker
 * processes on one proxy port, the real Redis, one replica file fed by `keyward import`.
 * Which worker served a request is read from the `worker` field of its access line.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { randomBytes } from 'node:crypto';
import { closeSync, fstatSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync, writeSync } from 'node:fs';
import Database from 'better-sqlite3';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { makeKeyHasher } from '../../src/auth/hash.js';
import { KEYWARD_ARGS, spawnSidecar, type SidecarProcess } from '../helpers/process.js';
import { untilLogged } from '../helpers/instance.js';
import { bearer, send, type RawResponse } from '../helpers/http.js';
import { echoJson, startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { startConsoleFixture } from '../helpers/console-fixture.js';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';

const REDIS = TEST_REDIS_URL;
const prefix = `kwtw${randomBytes(4).toString('hex')}`;
const hash = makeKeyHasher({ hash: 'sha256' });
const secrets = { k_open: `sk-open-${randomBytes(8).toString('hex')}`, k_rpm: `sk-rpm-${randomBytes(8).toString('hex')}`, k_del: `sk-del-${randomBytes(8).toString('hex')}` };

const keyLine = (id: keyof typeof secrets, extra: Record<string, unknown> = {}) =>
  JSON.stringify({
    type: 'key', id, hash: hash(secrets[id]), kind: 'personal', user: 'u1', project: null, status: 'active', budget: null, spent: 0,
    models: null, routing: null, rpm: null, tpm: null, concurrency: null, ...extra,
  });
const snapshot = (version: number, del: boolean) =>
  [
    JSON.stringify({ type: 'meta', version }),
    JSON.stringify({ type: 'wallet', user: 'u1', balance: 100 }),
    keyLine('k_open'),
    keyLine('k_rpm', { rpm: 5 }),
    keyLine('k_del', del ? { status: 'deleted' } : {}),
  ].join('\n') + '\n';

let dir: string;
let up: FakeUpstream;
let kw: SidecarProcess;
let replicaPath: string;

function importSnapshot(version: number, del: boolean): void {
  const file = join(dir, `snap-${version}.ndjson`);
  writeFileSync(file, snapshot(version, del));
  const r = spawnSync(process.execPath, [...KEYWARD_ARGS, 'import', file, '--replica', replicaPath], { encoding: 'utf8', timeout: 30_000 });
  assert.equal(r.status, 0, r.stderr);
}

/** Access lines written so far (the primary's and workers' stdout is one stream). */
function access(): { worker: number; req_id: string; key_id: string | null; status: number; code: string | null }[] {
  return kw.lines.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.msg === 'request') as never;
}

/** Resolves once `cond` holds, checked after every chunk the sidecar (`proc`) writes to stdout. */
function until(cond: () => boolean, what: string, timeoutMs = 10_000, proc: SidecarProcess = kw): Promise<void> {
  if (cond()) return Promise.resolve();
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      proc.child.stdout!.off('data', check);
      reject(new Error(`timed out waiting for ${what}`));
    }, timeoutMs);
    const check = () => {
      // readline's listener was added first, so the lines of this chunk are already in its lines
      if (!cond()) return;
      clearTimeout(timer);
      proc.child.stdout!.off('data', check);
      resolve();
    };
    proc.child.stdout!.on('data', check);
  });
}

const chat = (key: string, headers: Record<string, string> = {}): Promise<RawResponse> =>
  send(kw.url, { method: 'POST', path: '/v1/chat/completions', headers: { ...bearer(key), 'content-type': 'application/json', ...headers }, body: JSON.stringify({ model: 'gpt-4o-mini', messages: [] }) });

async function metric(name: string): Promise<number> {
  const res = await send(`http://127.0.0.1:${kw.adminPort}`, { path: '/metrics' });
  assert.equal(res.status, 200);
  const line = res.body.toString('utf8').split('\n').find((l) => l.startsWith(`${name} `));
  return line ? Number(line.slice(name.length + 1)) : 0;
}
const served200 = 'keyward_requests_total{route="chat.completions",status="200",code=""}';
const allowed = 'keyward_decision_seconds_count{outcome="allow"}';

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'kw-workers-'));
  replicaPath = join(dir, 'replica.sqlite');
  up = await startFakeUpstream(echoJson);
  importSnapshot(1, false);
  const yaml =
    `server: { port: 0, shutdownGraceMs: 20000 }\nadmin: { port: 0 }\nupstreams: { default: { url: ${up.url} } }\n` +
    `replica: { path: ${replicaPath} }\nredis: { url: ${REDIS}, prefix: ${prefix}, timeoutMs: 1000 }\nlogging: { level: info }\n`;
  kw = await spawnSidecar({ dir, name: 'workers', yaml, args: ['--workers', '2'] });
});

after(async () => {
  await kw?.stop('SIGKILL');
  await up?.close();
  const redis = new Redis(REDIS);
  const keys = [...(await redis.keys(`{${prefix}:*`)), ...(await redis.keys(`{${prefix}c:*`))];
  if (keys.length > 0) await redis.del(...keys);
  redis.disconnect();
  rmSync(dir, { recursive: true, force: true });
});

describe('serve --workers 2', () => {
  test('two workers answer on one port, and /metrics on the admin port counts the requests of both', async () => {
    const before200 = await metric(served200);
    const beforeAllowed = await metric(allowed);
    assert.equal(await metric('keyward_workers'), 2);
    // send() opens a new connection per request, and the cluster hands connections out in turn
    const rs = await Promise.all(Array.from({ length: 8 }, () => chat(secrets.k_open)));
    assert.deepEqual(rs.map((r) => r.status), Array(8).fill(200));
    await until(() => access().filter((l) => l.key_id === 'k_open').length === 8, '8 access lines');
    const workers = new Set(access().filter((l) => l.key_id === 'k_open').map((l) => l.worker));
    assert.equal(workers.size, 2, `requests were served by workers ${[...workers].join(', ')}`);
    assert.equal((await metric(served200)) - before200, 8);
    // each worker keeps its own decision histogram; the primary adds them up
    assert.equal((await metric(allowed)) - beforeAllowed, 8);
    // a per-process limit is each process's, not their sum
    const fds = Number(/^Max open files\s+(\d+)/m.exec(readFileSync(`/proc/${kw.child.pid}/limits`, 'utf8'))?.[1]);
    assert.equal(await metric('keyward_process_max_fds'), fds);
  });

  test('one RPM limit in Redis holds across both workers: 8 at once with rpm 5 admit exactly 5', async () => {
    const rs = await Promise.all(Array.from({ length: 8 }, () => chat(secrets.k_rpm)));
    assert.equal(rs.filter((r) => r.status === 200).length, 5);
    const denied = rs.filter((r) => r.status === 429);
    assert.equal(denied.length, 3);
    for (const r of denied) assert.equal(r.headers['x-keyward-error'], 'rpm_exceeded');
    await until(() => access().filter((l) => l.key_id === 'k_rpm').length === 8, '8 access lines');
    const workers = new Set(access().filter((l) => l.key_id === 'k_rpm').map((l) => l.worker));
    assert.equal(workers.size, 2, 'both workers took part');
  });

  test('a key deleted through `keyward import` is refused by both workers', async () => {
    assert.equal((await chat(secrets.k_del)).status, 200);
    importSnapshot(2, true);
    // Each worker notices the import on its own (data_version); ask until both have answered 401.
    const deadline = Date.now() + 10_000;
    const deniedBy = () => new Set(access().filter((l) => l.key_id === 'k_del' && l.code === 'api_key_deleted').map((l) => l.worker));
    let deniedCount = 0;
    while (deniedBy().size < 2) {
      assert.ok(Date.now() < deadline, 'not every worker refused the deleted key within 10 s');
      const r = await chat(secrets.k_del);
      if (r.status === 401) {
        deniedCount++;
        await until(() => access().filter((l) => l.key_id === 'k_del' && l.code === 'api_key_deleted').length === deniedCount, 'the 401 access line');
      }
    }
    const rs = await Promise.all(Array.from({ length: 4 }, () => chat(secrets.k_del)));
    for (const r of rs) {
      assert.equal(r.status, 401);
      assert.equal(r.headers['x-keyward-error'], 'api_key_deleted');
    }
    // the primary's own view of the file (it answers /readyz and the replica metrics) follows too
    while ((await metric('keyward_replica_version')) !== 2) assert.ok(Date.now() < deadline + 5_000, 'the primary did not see the import');
  });

  test('a worker that dies is replaced, the other one serves meanwhile, and the totals keep what it counted', async () => {
    const listening = kw.lines.map((l) => JSON.parse(l) as { msg?: string; pids?: number[] }).find((l) => l.msg === 'keyward listening')!;
    assert.equal(listening.pids?.length, 2);
    // both workers have served requests by now (the first test saw both); this scrape is the dead one's last
    const before200 = await metric(served200);
    process.kill(listening.pids![0]!, 'SIGKILL');
    const deadline = Date.now() + 15_000;
    while ((await metric('keyward_worker_restarts_total')) < 1) assert.ok(Date.now() < deadline, 'the death was not noticed');
    // one worker left: every request still answered
    const rs = await Promise.all(Array.from({ length: 4 }, () => chat(secrets.k_open)));
    assert.deepEqual(rs.map((r) => r.status), Array(4).fill(200));
    while ((await metric('keyward_workers')) < 2) assert.ok(Date.now() < deadline, 'no replacement worker within 15 s');
    while ((await send(`http://127.0.0.1:${kw.adminPort}`, { path: '/readyz' })).status !== 200) assert.ok(Date.now() < deadline, 'not ready again');
    assert.equal(await metric('keyward_worker_restarts_total'), 1);
    // the primary's line about it is the primary's (worker 0), naming the dead one apart
    const exitLine = kw.lines.find((l) => l.includes('worker exited unexpectedly'))!;
    assert.equal((exitLine.match(/"worker":/g) ?? []).length, 1, exitLine);
    const exited = JSON.parse(exitLine) as Record<string, unknown>;
    assert.equal(exited.worker, 0);
    assert.equal(exited.signal, 'SIGKILL');
    assert.equal(typeof exited.worker_id, 'number');
    assert.equal(exited.restart_in_ms, 1_000, 'the first restart of a worker waits a second');
    // a total that fell would read as a counter reset, and rate() would count requests twice
    assert.equal(await metric(served200), before200 + 4);
  });

  test('a worker an operator stops alone drains, keeps what it counted in the totals, and is replaced without a failure', async () => {
    const listening = kw.lines.map((l) => JSON.parse(l) as { msg?: string; pids?: number[] }).find((l) => l.msg === 'keyward listening')!;
    const before200 = await metric(served200);
    const restarts = await metric('keyward_worker_restarts_total');
    // counted after the last scrape: only the worker's final figures carry these
    const rs = await Promise.all(Array.from({ length: 6 }, () => chat(secrets.k_open)));
    assert.deepEqual(rs.map((r) => r.status), Array(6).fill(200));
    const from = kw.lines.length; // an earlier test's worker exited unexpectedly: only this exit's lines count
    process.kill(listening.pids![1]!, 'SIGTERM');
    const deadline = Date.now() + 15_000;
    while ((await metric('keyward_worker_restarts_total')) < restarts + 1) assert.ok(Date.now() < deadline, 'the exit was not noticed');
    assert.equal(await metric(served200), before200 + 6, 'the stopped worker\'s last requests stay counted');
    const exitLines = () => kw.lines.slice(from).map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => /exited/.test(String(l.msg)));
    // The line goes out through the log stream, which can reach this process after the scrape did.
    await untilLogged(kw, () => exitLines().length > 0, 'the exit logged');
    const line = exitLines().find((l) => l.msg === 'worker drained and exited; starting another');
    assert.ok(line, 'an info line, not "exited unexpectedly"');
    assert.deepEqual([line.level, line.code, line.restart_in_ms], ['info', 0, 1_000]);
    while ((await metric('keyward_workers')) < 2) assert.ok(Date.now() < deadline, 'no replacement worker within 15 s');
  });

  test('SIGTERM to the primary drains both workers: streams in flight finish, then exit 0', async () => {
    let release!: () => void;
    const released = new Promise<void>((r) => (release = r));
    up.setHandler(async (_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: {"choices":[{"delta":{"content":"hel"}}]}\n\n');
      await released;
      res.end('data: {"choices":[{"delta":{"content":"lo"}}]}\n\ndata: [DONE]\n\n');
    });
    const arrived = [up.nextRequest(), up.nextRequest()];
    // named, so their access lines are found whatever else was logged around them
    const ids = [`drain-${prefix}-1`, `drain-${prefix}-2`];
    const streams = ids.map((id) => chat(secrets.k_open, { 'x-request-id': id }));
    await Promise.all(arrived);
    // 'close': exited, and stdout read to its end (the workers' last access lines included)
    const exited = once(kw.child, 'close') as Promise<[number | null, string | null]>;
    kw.child.kill('SIGTERM');
    // Draining: /readyz turns 503 ...
    for (;;) {
      const r = await send(`http://127.0.0.1:${kw.adminPort}`, { path: '/readyz' });
      if (r.status === 503) break;
    }
    // ... and the port refuses new connections once both workers have stopped accepting.
    for (;;) {
      const refused = await new Promise<boolean>((resolve) => {
        const s = net.connect(Number(new URL(kw.url).port), '127.0.0.1');
        s.once('connect', () => (s.destroy(), resolve(false)));
        s.once('error', () => resolve(true));
      });
      if (refused) break;
      await new Promise((r) => setImmediate(r));
    }
    release();
    const done = await Promise.all(streams);
    for (const r of done) {
      assert.equal(r.status, 200);
      assert.match(r.body.toString('utf8'), /data: \[DONE\]\n\n$/);
    }
    const [code, signal] = await exited;
    assert.equal(signal, null);
    assert.equal(code, 0);
    const finished = access().filter((l) => ids.includes(l.req_id));
    assert.deepEqual(finished.map((l) => l.status), [200, 200]);
    assert.equal(new Set(finished.map((l) => l.worker)).size, 2, 'one stream per worker');
    up.setHandler(echoJson);
  });
});

describe('serve --workers 2 with a console', () => {
  test('usage from both workers reaches the console once each, the last of it on SIGTERM', async () => {
    const fx = await startConsoleFixture();
    const upUsage = await startFakeUpstream((_req, res) => {
      const text = JSON.stringify({ id: 'x', usage: { prompt_tokens: 1000, completion_tokens: 100, total_tokens: 1100 } });
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
      res.end(text);
    });
    const sub = mkdtempSync(join(tmpdir(), 'kw-workers-console-'));
    let proc: SidecarProcess | null = null;
    try {
      await fx.api('POST', '/admin/v1/projects', { body: { id: 'p_w', budget: 100 } });
      const created = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'team', project: 'p_w' } })).body as { key: { id: string }; secret: string };
      const yaml =
        `server: { port: 0 }\nadmin: { port: 0 }\nupstreams: { default: { url: ${upUsage.url} } }\nreplica: { path: ${join(sub, 'replica.sqlite')} }\n` +
        `console: { url: ${fx.url}, token: ${fx.tokens.sync}, waitMs: 1000 }\nredis: { url: ${REDIS}, prefix: ${prefix}c, timeoutMs: 1000 }\nlogging: { level: info }\n`;
      proc = await spawnSidecar({ dir: sub, name: 'workers-console', yaml, args: ['--workers', '2'] });
      const admin = `http://127.0.0.1:${proc.adminPort}`;
      // ready once the primary's first sync has written the replica file
      while ((await send(admin, { path: '/readyz' })).status !== 200);
      const p = proc;
      const rs = await Promise.all(
        Array.from({ length: 6 }, () =>
          send(p.url, { method: 'POST', path: '/v1/chat/completions', headers: { ...bearer(created.secret), 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', messages: [] }) }),
        ),
      );
      assert.deepEqual(rs.map((r) => r.status), Array(6).fill(200));
      assert.equal(await proc.stop('SIGTERM'), 0);
      const workers = new Set(proc.lines.map((l) => JSON.parse(l) as { msg?: string; worker?: number }).filter((l) => l.msg === 'request').map((l) => l.worker));
      assert.equal(workers.size, 2, 'both workers served');
      // 1000 input tokens at 2.5/M and 100 output at 10/M per request: each event charged once
      const spent = (await fx.api('GET', `/admin/v1/keys/${created.key.id}`)).body.key.spent as number;
      assert.equal(+spent.toFixed(9), +(6 * 0.0035).toFixed(9));
    } finally {
      await proc?.stop('SIGKILL');
      await upUsage.close();
      await fx.close();
      rmSync(sub, { recursive: true, force: true });
    }
  });

  test('damage a worker meets in the replica file: the primary moves the file aside and fills a new one from the console', { timeout: 60_000 }, async () => {
    const fx = await startConsoleFixture();
    const sub = mkdtempSync(join(tmpdir(), 'kw-workers-damage-'));
    const path = join(sub, 'replica.sqlite');
    let proc: SidecarProcess | null = null;
    try {
      await fx.api('POST', '/admin/v1/wallets/u_d/credit', { body: { amount: 100 } });
      const secrets: string[] = [];
      for (let i = 0; i < 300; i++) secrets.push(((await fx.api('POST', '/admin/v1/keys', { body: { kind: 'personal', user: 'u_d' } })).body as { secret: string }).secret);
      const yaml =
        `server: { port: 0 }\nadmin: { port: 0 }\nupstreams: { default: { url: ${up.url} } }\nreplica: { path: ${path} }\n` +
        `console: { url: ${fx.url}, token: ${fx.tokens.sync}, waitMs: 1000 }\nredis: { url: ${REDIS}, prefix: ${prefix}d, timeoutMs: 1000 }\nlogging: { level: info }\n`;
      const ready = async (p: SidecarProcess) => {
        while ((await send(`http://127.0.0.1:${p.adminPort}`, { path: '/readyz' })).status !== 200);
      };
      proc = await spawnSidecar({ dir: sub, name: 'damage', yaml, args: ['--workers', '2'] });
      const p = proc;
      await ready(p);
      // While it runs: the snapshot folded into the main file, then the pages of the keys past the tables' roots overwritten.
      const db = new Database(path);
      db.pragma('wal_checkpoint(TRUNCATE)');
      const firstData = 1 + Math.max(...db.prepare('SELECT rootpage FROM sqlite_schema').pluck().all() as number[]);
      db.close();
      const fd = openSync(path, 'r+');
      for (let at = firstData * 4096; at < fstatSync(fd).size; at += 4096) writeSync(fd, Buffer.alloc(4096, 0x5a), 0, 4096, at);
      closeSync(fd);
      const chatAs = (secret: string) => send(p.url, { method: 'POST', path: '/v1/chat/completions', headers: { ...bearer(secret), 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o-mini', messages: [] }) });
      let damaged: string | null = null;
      for (const secret of secrets) {
        if ((await chatAs(secret)).status === 500) {
          damaged = secret;
          break;
        }
      }
      assert.ok(damaged, 'a worker met the damage');
      const moved = () => p.lines.some((l) => (JSON.parse(l) as { msg?: string }).msg === 'the replica file is damaged: moved aside; not ready until a snapshot fills a new one');
      await until(moved, 'the primary moved the file aside', 10_000, p);
      assert.ok(readdirSync(sub).some((f) => f.startsWith('replica.sqlite.damaged-')));
      let status = 0;
      while (status !== 200) status = (await chatAs(damaged)).status;
      const all = await Promise.all(secrets.slice(0, 40).map(chatAs));
      assert.deepEqual(all.map((r) => r.status), Array(40).fill(200), 'both workers serve the new file');
    } finally {
      await proc?.stop('SIGKILL');
      await fx.close();
      rmSync(sub, { recursive: true, force: true });
    }
  });

  test('a worker that cannot start again is restarted less and less often, and says why in the JSON log', async () => {
    const sub = mkdtempSync(join(tmpdir(), 'kw-workers-crashloop-'));
    let proc: SidecarProcess | null = null;
    try {
      const replica = join(sub, 'replica.sqlite');
      const file = join(sub, 'snap.ndjson');
      writeFileSync(file, snapshot(1, false));
      assert.equal(spawnSync(process.execPath, [...KEYWARD_ARGS, 'import', file, '--replica', replica], { encoding: 'utf8', timeout: 30_000 }).status, 0);
      const yaml = `server: { port: 0 }\nadmin: { port: 0 }\nupstreams: { default: { url: ${up.url} } }\nreplica: { path: ${replica} }\nredis: { url: ${REDIS}, prefix: ${prefix}l, timeoutMs: 1000 }\n`;
      proc = await spawnSidecar({ dir: sub, name: 'workers-crashloop', yaml, args: ['--workers', '2'] });
      // the running workers keep their open file; a new one finds a directory where it was
      renameSync(replica, `${replica}.moved`);
      mkdirSync(replica);
      const listening = proc.lines.map((l) => JSON.parse(l) as { msg?: string; pids?: number[] }).find((l) => l.msg === 'keyward listening')!;
      process.kill(listening.pids![0]!, 'SIGKILL');
      const p = proc;
      const waits = () => p.lines.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.msg === 'worker exited unexpectedly; starting another').map((l) => l.restart_in_ms);
      await until(() => waits().length >= 3, 'three restarts', 15_000, p);
      assert.deepEqual(waits().slice(0, 3), [1_000, 2_000, 4_000]);
      const failed = p.lines.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.msg === 'keyward start failed');
      assert.ok(failed && typeof failed.worker === 'number' && failed.level === 'fatal', 'the worker\'s reason, as a JSON line');
      assert.match(String(failed.err), /replica/);
    } finally {
      await proc?.stop('SIGKILL');
      rmSync(sub, { recursive: true, force: true });
    }
  });

  test('--workers 2 without Redis is refused: each worker would enforce every limit on its own', () => {
    const sub = mkdtempSync(join(tmpdir(), 'kw-workers-noredis-'));
    try {
      const cfg = join(sub, 'kw.yaml');
      writeFileSync(cfg, `server: { port: 0 }\nadmin: { port: 0 }\nupstreams: { default: { url: http://127.0.0.1:9 } }\nreplica: { path: ${join(sub, 'r.sqlite')} }\n`);
      const r = spawnSync(process.execPath, [...KEYWARD_ARGS, 'serve', '--config', cfg, '--workers', '2'], { encoding: 'utf8', timeout: 30_000 });
      assert.equal(r.status, 1);
      assert.match(r.stderr, /--workers 2 needs redis\.url/);
      const bad = spawnSync(process.execPath, [...KEYWARD_ARGS, 'serve', '--config', cfg, '--workers', 'two'], { encoding: 'utf8', timeout: 30_000 });
      assert.equal(bad.status, 1);
      assert.match(bad.stderr, /--workers expects a positive integer or "auto"/);
    } finally {
      rmSync(sub, { recursive: true, force: true });
    }
  });
});
