/**
 * `keyward serve --workers 2` as an operator runs it: a real primary and two real worker
 * processes on one proxy port, the real Redis, one replica file fed by `keyward import`.
 * Which worker served a request is read from the `worker` field of its access line.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { makeKeyHasher } from '../../src/auth/hash.js';
import { spawnSidecar, type SidecarProcess } from '../helpers/process.js';
import { accessLines, importReplica, untilLogged } from '../helpers/instance.js';
import { bearer, send, type RawResponse } from '../helpers/http.js';
import { echoJson, startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
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

function importSnapshot(version: number, del: boolean): Promise<void> {
  const file = join(dir, `snap-${version}.ndjson`);
  writeFileSync(file, snapshot(version, del));
  return importReplica(file, replicaPath);
}

const access = () => accessLines(kw);
const until = (cond: () => boolean, what: string) => untilLogged(kw, cond, what);

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
  await importSnapshot(1, false);
  const yaml =
    `server: { port: 0, shutdownGraceMs: 20000 }\nadmin: { port: 0 }\nupstreams: { default: { url: ${up.url} } }\n` +
    `replica: { path: ${replicaPath} }\nredis: { url: ${REDIS}, prefix: ${prefix}, timeoutMs: 1000 }\nlogging: { level: info }\n`;
  kw = await spawnSidecar({ dir, name: 'workers', yaml, args: ['--workers', '2'] });
});

after(async () => {
  await kw?.stop('SIGKILL');
  await up?.close();
  const redis = new Redis(REDIS);
  const keys = await redis.keys(`{${prefix}:*`);
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
    await importSnapshot(2, true);
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
