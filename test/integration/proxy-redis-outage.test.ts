/**
 * Redis failing under the whole request path: a private redis-server on a unix socket is
 * paused (SIGSTOP), killed and restarted while requests flow. With `onError: open` no
 * request fails or waits much longer than `redis.timeoutMs`, and Redis takes over again
 * by itself when it returns; with `closed` the answer is a clean 503 limits_unavailable.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { makeTmpDir, spawnRedis, waitFor, type RedisProcess } from '../helpers/redis-server.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { startHarness, type Harness } from '../helpers/sidecar.js';
import { bearer, send } from '../helpers/http.js';

const TIMEOUT_MS = 100;
/** what "a little" over the timeout may be on a loaded 2-core machine */
const SLACK_MS = 250;

let tmp: Awaited<ReturnType<typeof makeTmpDir>>;
let socket: string;
let redis: RedisProcess;
let up: FakeUpstream;
// A rejection nobody handled fails this file (the runner reports only its message): its
// stack says which call made it, for the rare run where one escapes.
process.on('unhandledRejection', (err) => {
  process.stderr.write(`unhandled rejection: ${err instanceof Error ? err.stack : String(err)}\n`);
});
const startRedis = () => spawnRedis(['--port', '0', '--unixsocket', socket, '--save', '', '--appendonly', 'no', '--dir', tmp.dir]);

before(async () => {
  tmp = await makeTmpDir('outage');
  socket = join(tmp.dir, 'redis.sock');
  redis = await startRedis();
  up = await startFakeUpstream();
});
after(async () => {
  await redis.stop();
  await up.close();
  await tmp.remove();
});

const harness = (onError: 'open' | 'closed') =>
  startHarness({
    upstream: up.url,
    config: { redis: { url: `unix://${socket}`, prefix: `kwo${onError}`, timeoutMs: TIMEOUT_MS, onError } },
    keys: { k: { rpm: 100_000, concurrency: 1000 }, fresh: { rpm: 100_000, concurrency: 1000 } },
  });

/** Sends `n` requests, 10 at a time; returns each one's status and duration. */
async function load(h: Harness, n: number) {
  const out: { status: number; ms: number }[] = [];
  for (let i = 0; i < n; i += 10) {
    await Promise.all(
      Array.from({ length: 10 }, async () => {
        const t = performance.now();
        const r = await send(h.url, { method: 'POST', path: '/v1/chat/completions', headers: { ...bearer(h.keys.k!), 'content-type': 'application/json' }, body: '{"model":"m"}' });
        out.push({ status: r.status, ms: performance.now() - t });
      }),
    );
  }
  return out;
}

describe('Redis outage through the proxy', () => {
  test('onError open: paused, killed and restarted Redis never fails or stalls a request; Redis takes over again', async () => {
    const h = await harness('open');
    try {
      assert.ok((await load(h, 20)).every((r) => r.status === 200));
      assert.equal(h.sidecar.limiter.stats().failOpenAdmissions, 0);

      redis.proc.kill('SIGSTOP');
      const paused = await load(h, 60);
      assert.ok(paused.every((r) => r.status === 200), 'a request failed while Redis was paused');
      const slowest = Math.max(...paused.map((r) => r.ms));
      assert.ok(slowest < TIMEOUT_MS + SLACK_MS, `a request waited ${slowest.toFixed(0)} ms`);
      assert.ok(h.sidecar.limiter.stats().failOpenAdmissions > 0);
      // GET /v1/key shows the in-process figures, the ones admissions are held to meanwhile
      const view = await send(h.url, { method: 'GET', path: '/v1/key', headers: bearer(h.keys.fresh!) });
      assert.equal(view.status, 200);
      assert.equal(view.json<{ limits: { rpm: number } }>().limits.rpm, 100_000);

      redis.proc.kill('SIGCONT');
      await waitFor(async () => {
        const before = h.sidecar.limiter.stats().failOpenAdmissions;
        await load(h, 10);
        return h.sidecar.limiter.stats().failOpenAdmissions === before;
      }, 5000, 'admissions through Redis again after SIGCONT');

      redis.proc.kill('SIGKILL');
      await redis.exited;
      const dead = await load(h, 40);
      assert.ok(dead.every((r) => r.status === 200 && r.ms < TIMEOUT_MS + SLACK_MS), 'a request failed or stalled with Redis dead');

      redis = await startRedis();
      await waitFor(async () => {
        const before = h.sidecar.limiter.stats().failOpenAdmissions;
        await load(h, 10);
        return h.sidecar.limiter.stats().failOpenAdmissions === before;
      }, 10_000, 'admissions through Redis again after a restart');
    } finally {
      redis.proc.kill('SIGCONT');
      await h.close();
    }
  });

  test('onError closed: a paused Redis gives clean, quick 503 limits_unavailable answers', async () => {
    const h = await harness('closed');
    try {
      assert.equal((await load(h, 10)).filter((r) => r.status !== 200).length, 0);
      redis.proc.kill('SIGSTOP');
      const forwarded = up.received.length;
      const t = performance.now();
      // A key this instance has leased nothing for: its admission needs Redis. (The busy
      // key `k` may be served from the slices of its limits and wallet it holds, which
      // Redis granted before the pause.)
      const res = await send(h.url, { method: 'POST', path: '/v1/chat/completions', headers: { ...bearer(h.keys.fresh!), 'content-type': 'application/json' }, body: '{"model":"m"}' });
      assert.ok(performance.now() - t < TIMEOUT_MS + SLACK_MS);
      assert.equal(res.status, 503);
      assert.equal(res.headers['x-keyward-error'], 'limits_unavailable');
      assert.ok(Number(res.headers['retry-after']) >= 1);
      assert.equal(up.received.length, forwarded, 'the refused request reached the upstream');
      // no figure of this process alone stands for the shared one: GET /v1/key is 503 too
      const view = await send(h.url, { method: 'GET', path: '/v1/key', headers: bearer(h.keys.fresh!) });
      assert.equal(view.status, 503);
      assert.equal(view.headers['x-keyward-error'], 'limits_unavailable');
      assert.ok(Number(view.headers['retry-after']) >= 1);
    } finally {
      redis.proc.kill('SIGCONT');
      await h.close();
    }
  });
});

describe('a healthy Redis decides every request', () => {
  test("a client's x-request-id sent again after the timeout is still decided by Redis", async () => {
    const h = await startHarness({
      upstream: up.url,
      config: { redis: { url: `unix://${socket}`, prefix: 'kwreqid', timeoutMs: TIMEOUT_MS, onError: 'closed' } },
      keys: { two: { rpm: 2 } },
    });
    const chat = (id?: string) =>
      send(h.url, { method: 'POST', path: '/v1/chat/completions', headers: { ...bearer(h.keys.two!), 'content-type': 'application/json', ...(id ? { 'x-request-id': id } : {}) }, body: '{"model":"m"}' });
    try {
      assert.deepEqual([(await chat()).status, (await chat()).status], [200, 200]);
      // A client retrying its refused request with the same id, as retry helpers do.
      const refused = await chat('retry-me-1');
      assert.equal(refused.headers['x-keyward-error'], 'rpm_exceeded');
      // The id's first request is past its wait on Redis now (time itself is what matters here).
      await new Promise((resolve) => setTimeout(resolve, TIMEOUT_MS * 2));
      const again = await chat('retry-me-1');
      assert.equal(again.status, 429, `the retry was answered ${again.status} ${again.headers['x-keyward-error']}`);
      assert.equal(again.headers['x-keyward-error'], 'rpm_exceeded');
    } finally {
      await h.close();
    }
  });
});
