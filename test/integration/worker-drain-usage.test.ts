/**
 * `keyward serve --workers 2` at two edges of a worker's life, with real processes, the
 * real Redis and a real console: the usage events a worker still holds when it is told to
 * drain, and when the primary's /readyz starts counting a worker that replaced a dead one.
 */
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { spawnSidecar, type SidecarProcess } from '../helpers/process.js';
import { accessOf, importReplica, untilLogged, untilScraped } from '../helpers/instance.js';
import { bearer, send, type RawResponse } from '../helpers/http.js';
import { answerJson, startFakeUpstream } from '../helpers/upstream.js';
import { startConsoleFixture } from '../helpers/console-fixture.js';
import { deleteByPrefix, deleteByPrefixAndDisconnect } from '../helpers/redis-harness.js';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';

const prefix = `kwwd${randomBytes(4).toString('hex')}`;
const dirs: string[] = [];

function tempDir(name: string): string {
  const dir = mkdtempSync(join(tmpdir(), `kw-${name}-`));
  dirs.push(dir);
  return dir;
}

after(async () => {
  const redis = new Redis(TEST_REDIS_URL);
  await deleteByPrefix(redis, `${prefix}u`);
  await deleteByPrefixAndDisconnect(redis, `${prefix}r`);
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

const readyz = async (p: SidecarProcess): Promise<RawResponse> => send(`http://127.0.0.1:${p.adminPort}`, { path: '/readyz' });

/** Asks /readyz until it answers 200; fails after `timeoutMs`. */
async function untilReady(p: SidecarProcess, what: string, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while ((await readyz(p)).status !== 200) assert.ok(Date.now() < deadline, `not ready within ${timeoutMs} ms: ${what}`);
}

/** Resolves once the proxy port refuses connections: every worker has stopped accepting, so each is draining. */
async function untilRefused(url: string, timeoutMs = 10_000): Promise<void> {
  const port = Number(new URL(url).port);
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const refused = await new Promise<boolean>((resolve) => {
      const s = net.connect(port, '127.0.0.1');
      s.once('connect', () => (s.destroy(), resolve(false)));
      s.once('error', () => resolve(true));
    });
    if (refused) return;
    assert.ok(Date.now() < deadline, `the proxy port still accepted connections after ${timeoutMs} ms`);
    await new Promise((r) => setImmediate(r));
  }
}

describe('serve --workers 2: a worker told to drain', () => {
  test('hands over the usage events it still holds: every request that ends during the drain reaches the console', async () => {
    // Each answer waits until the workers are draining: its usage event is made then, and
    // the worker's drain ends some 20-40 ms later, before the 100 ms its batch of events
    // would wait for. Only the drain's own hand-over brings them to the primary. Two
    // requests per worker: more would end further apart, and eat into that margin.
    const n = 4;
    let release!: () => void;
    const released = new Promise<void>((r) => (release = r));
    let arrived = 0;
    let allArrived!: () => void;
    const arrivedAll = new Promise<void>((r) => (allArrived = r));
    const up = await startFakeUpstream(async (_req, res) => {
      if (++arrived === n) allArrived();
      await released;
      answerJson(res, { id: 'x', usage: { prompt_tokens: 1000, completion_tokens: 100, total_tokens: 1100 } });
    });
    const fx = await startConsoleFixture();
    let proc: SidecarProcess | null = null;
    try {
      await fx.api('POST', '/admin/v1/projects', { body: { id: 'p_drain', budget: 100 } });
      const created = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'team', project: 'p_drain' } })).body as { key: { id: string }; secret: string };
      const sub = tempDir('drain-usage');
      const yaml =
        `server: { port: 0, shutdownGraceMs: 20000 }\nadmin: { port: 0 }\nupstreams: { default: { url: ${up.url} } }\nreplica: { path: ${join(sub, 'replica.sqlite')} }\n` +
        `console: { url: ${fx.url}, token: ${fx.tokens.sync}, waitMs: 1000 }\nredis: { url: ${TEST_REDIS_URL}, prefix: ${prefix}u, timeoutMs: 1000 }\nlogging: { level: info }\n`;
      proc = await spawnSidecar({ dir: sub, name: 'drain-usage', yaml, args: ['--workers', '2'] });
      const p = proc;
      // ready once the primary's first sync has written the replica file
      await untilReady(p, 'the first sync');
      const ids = Array.from({ length: n }, (_, i) => `usage-${prefix}-${i}`);
      // send() opens a connection per request, and the cluster hands connections out in turn
      const answers = ids.map((id) =>
        send(p.url, { method: 'POST', path: '/v1/chat/completions', headers: { ...bearer(created.secret), 'content-type': 'application/json', 'x-request-id': id }, body: JSON.stringify({ model: 'gpt-4o', messages: [] }) }),
      );
      await arrivedAll;
      p.child.kill('SIGTERM');
      await untilRefused(p.url);
      release();
      assert.deepEqual((await Promise.all(answers)).map((r) => r.status), Array(n).fill(200));
      assert.equal(await p.closed, 0);
      const served = await accessOf(p, ids);
      assert.equal(new Set(served.map((l) => l.worker)).size, 2, 'both workers served');
      const usage = (await fx.api('GET', `/admin/v1/keys/${created.key.id}/usage?limit=500`)).body.usage as { requestId: string }[];
      assert.deepEqual(usage.map((u) => u.requestId).sort(), [...ids].sort(), 'one usage event per request, each pushed once');
      // 1000 input tokens at 2.5/M and 100 output at 10/M per request
      const spent = (await fx.api('GET', `/admin/v1/keys/${created.key.id}`)).body.key.spent as number;
      assert.equal(+spent.toFixed(9), +(n * 0.0035).toFixed(9));
    } finally {
      release();
      await proc?.stop('SIGKILL');
      await up.close();
      await fx.close();
    }
  });
});

describe('serve --workers 2: /readyz of the primary', () => {
  test('a worker that replaces a dead one counts only once its replica is loaded', async () => {
    const sub = tempDir('ready-replacement');
    const replica = join(sub, 'replica.sqlite');
    const snapshot = join(sub, 'snap.ndjson');
    writeFileSync(snapshot, [{ type: 'meta', version: 1 }, { type: 'wallet', user: 'u1', balance: 1 }].map((r) => JSON.stringify(r)).join('\n') + '\n');
    await importReplica(snapshot, replica);
    const yaml =
      `server: { port: 0 }\nadmin: { port: 0 }\nupstreams: { default: { url: http://127.0.0.1:9 } }\nreplica: { path: ${replica} }\n` +
      `redis: { url: ${TEST_REDIS_URL}, prefix: ${prefix}r, timeoutMs: 1000 }\nlogging: { level: info }\n`;
    let proc: SidecarProcess | null = null;
    try {
      proc = await spawnSidecar({ dir: sub, name: 'ready-replacement', yaml, args: ['--workers', '2'] });
      const p = proc;
      await untilReady(p, 'both workers on the imported replica');
      // The file moves away: the primary and the live worker keep serving the one they
      // opened, loaded; the next worker to start opens an empty one at the path.
      for (const ext of ['', '-wal', '-shm']) if (existsSync(replica + ext)) renameSync(replica + ext, `${replica}.old${ext}`);
      const listening = p.lines.map((l) => JSON.parse(l) as { msg?: string; pids?: number[] }).find((l) => l.msg === 'keyward listening')!;
      process.kill(listening.pids![0]!, 'SIGKILL');
      await untilScraped(p, (m) => m.get('keyward_worker_restarts_total') === 1 && m.get('keyward_workers') === 2, 'a replacement worker listening', 15_000);
      const deadLine = () => p.lines.map((l) => JSON.parse(l) as { msg?: string; worker_id?: number }).find((l) => l.msg === 'worker exited unexpectedly; starting another');
      await untilLogged(p, () => deadLine() !== undefined, 'the death logged');
      const dead = deadLine()!;
      // Listening, but its replica holds nothing yet: it does not count as ready.
      const notYet = await readyz(p);
      assert.equal(notYet.status, 503);
      const reason = notYet.json<{ reason: string }>().reason;
      const named = /^worker (\d+) has not loaded the replica yet$/.exec(reason);
      assert.ok(named, reason);
      assert.notEqual(Number(named[1]), dead.worker_id, 'the replacement is the one waited for, not the dead one');
      // A snapshot in the file at the path: the replacement reports its replica and counts.
      await importReplica(snapshot, replica);
      await untilReady(p, 'the replacement worker reporting the imported replica', 10_000);
    } finally {
      await proc?.stop('SIGKILL');
    }
  });
});
