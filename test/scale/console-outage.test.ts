/**
 * The console away while traffic goes on. A real sidecar keeps serving from its replica and
 * buffers usage; when the console returns, the sync client sees it first and nudges the
 * usage pusher, so the backlog arrives within seconds, each event once. A long outage runs
 * on an injected clock; a fleet's return is spread by jitter instead of one burst.
 */
import assert from 'node:assert/strict';
import http from 'node:http';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { after, before, test } from 'node:test';
import { configSchema } from '../../src/config/schema.js';
import { createLogger } from '../../src/obs/logger.js';
import { type Sidecar, startSidecar } from '../../src/app/sidecar.js';
import { ReplicaStore } from '../../src/replica/store.js';
import { createUsagePusher } from '../../src/sync/client.js';
import type { UsageEvent } from '../../src/protocol/usage.js';
import { type ConsoleFixture, startConsoleFixture } from '../helpers/console-fixture.js';
import { type ConsoleFront, startConsoleFront } from '../helpers/console-front.js';
import { lookupSecret, whenReplica } from '../helpers/console-replica.js';
import { chatRequest, printFigures } from '../helpers/load.js';
import { waitFor } from '../helpers/redis-server.js';
import { type FakeUpstream, startFakeUpstream } from '../helpers/upstream.js';

const OUTAGE_MS = 30_000;

let fx: ConsoleFixture;
let front: ConsoleFront;
let up: FakeUpstream;
let dir: string;
let keyId: string;
let secret: string;
const agent = new http.Agent({ keepAlive: true });

before(async () => {
  fx = await startConsoleFixture();
  front = await startConsoleFront(fx.url);
  up = await startFakeUpstream((_q, res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ id: 'c', choices: [], usage: { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 } }));
  });
  dir = mkdtempSync(join(tmpdir(), 'kw-outage-'));
  await fx.api('POST', '/admin/v1/projects', { body: { id: 'p_outage' } });
  const made = await fx.api('POST', '/admin/v1/keys', { body: { kind: 'team', project: 'p_outage' } });
  keyId = made.body.key.id;
  secret = made.body.secret;
});
after(async () => {
  agent.destroy();
  await front?.close();
  await up?.close();
  await fx?.close();
  rmSync(dir, { recursive: true, force: true });
});

const counts = (ids: string[]): Map<string, number> => {
  const m = new Map<string, number>();
  for (const id of ids) m.set(id, (m.get(id) ?? 0) + 1);
  return m;
};

test(`after a ${OUTAGE_MS / 1000} s outage under traffic, every buffered event arrives within 5 s of the return, once`, { timeout: 90_000 }, async (t) => {
  const config = configSchema.parse({
    server: { port: 0 }, admin: { port: 0 },
    upstreams: { default: { url: up.url } },
    replica: { path: join(dir, 'replica.sqlite') },
    console: { url: front.url, token: fx.tokens.sync, waitMs: 2_000 },
  });
  const replica = new ReplicaStore({ path: config.replica.path });
  const logger = createLogger({ level: 'error', destination: new Writable({ write: (_c, _e, cb) => cb() }) });
  const sidecar: Sidecar = await startSidecar({ config, logger, replica });
  try {
    await whenReplica(replica, () => lookupSecret(replica, secret) !== null, 10_000);
    const send = async (): Promise<string> => {
      const r = await chatRequest(sidecar.url, secret, agent);
      assert.equal(r.status, 200);
      return String(r.headers['x-request-id']);
    };
    const warm = await Promise.all(Array.from({ length: 10 }, send));
    await waitFor(() => warm.every((id) => front.deliveries.some((d) => d.requestId === id)), 10_000, 'usage before the outage');

    await front.down();
    const downAt = performance.now();
    const during: string[] = [];
    while (performance.now() - downAt < OUTAGE_MS) {
      during.push(await send()); // the sidecar serves from its replica meanwhile
      await new Promise((r) => setTimeout(r, 40));
    }
    assert.equal(sidecar.usage!.stats().buffered, during.length, 'everything is buffered, nothing delivered or dropped');

    await front.up();
    const upAt = performance.now();
    const wanted = new Set(during);
    await waitFor(() => front.deliveries.filter((d) => wanted.has(d.requestId)).length >= wanted.size, 15_000, 'the backlog', 20);
    const lastAt = Math.max(...front.deliveries.filter((d) => wanted.has(d.requestId)).map((d) => d.at));
    await sidecar.usage!.flush();
    const seen = counts(front.deliveries.map((d) => d.requestId));
    const twice = [...seen.values()].filter((n) => n > 1).length;
    const figures = { events: wanted.size, deliveredAfterReturnMs: Math.round(lastAt - upAt), duplicates: twice, dropped: sidecar.usage!.stats().dropped };
    printFigures(t, `console outage ${OUTAGE_MS / 1000} s`, figures);
    assert.ok(lastAt - upAt < 5_000, `backlog delivered ${Math.round(lastAt - upAt)} ms after the console returned`);
    assert.equal(twice, 0, 'no event delivered twice');
    assert.equal(figures.dropped, 0);
    const usage = await fx.api('GET', `/admin/v1/keys/${keyId}`);
    assert.equal(usage.status, 200);
  } finally {
    await sidecar.close({ graceMs: 200 });
    await replica.close();
  }
});

let seq = 0;
const ev = (): UsageEvent => ({
  request_id: `long-${++seq}`, key_id: keyId, model: 'gpt-4o', input_tokens: 10, output_tokens: 5, status: 200, at: new Date().toISOString(),
});

test('a 10 minute outage on an injected clock: the buffer stays bounded, drops are counted, retries stay sparse', { timeout: 60_000 }, async (t) => {
  let clock = 0;
  const p = createUsagePusher({ url: front.url, token: fx.tokens.sync, maxBuffer: 2_000, batchSize: 500, flushMs: 5, now: () => clock });
  try {
    await front.down();
    const pushed: string[] = [];
    for (let t = 0; t < 600_000; t += 5_000) {
      clock = t;
      for (let i = 0; i < 50; i++) {
        const e = ev();
        pushed.push(e.request_id);
        p.push(e);
      }
      await new Promise((r) => setTimeout(r, 15)); // real time for the pusher's timer to act on the new clock
    }
    const s = p.stats();
    const figures = { simulatedMinutes: 10, pushed: pushed.length, buffered: s.buffered, dropped: s.dropped, attempts: s.failures };
    printFigures(t, 'long outage', figures);
    assert.equal(s.buffered, 2_000, 'bounded');
    assert.equal(s.dropped, pushed.length - 2_000, 'every event past the bound is counted');
    // Exponential backoff to 30 s: about 8 quick attempts, then one per 15-30 s.
    assert.ok(s.failures >= 15 && s.failures <= 50, `${s.failures} attempts in 10 minutes`);

    await front.up();
    const before = front.deliveries.length;
    p.nudge();
    await waitFor(() => p.stats().buffered === 0, 5_000, 'the kept events', 10);
    const got = front.deliveries.slice(before).map((d) => d.requestId);
    assert.deepEqual(got, pushed.slice(0, 2_000), 'the kept events, in order, each once');
  } finally {
    await front.up().catch(() => undefined);
    await p.stop();
  }
});

test('a fleet of 20 pushers nudged together reaches the console spread over the jitter window', { timeout: 30_000 }, async (t) => {
  const fleet = Array.from({ length: 20 }, () =>
    createUsagePusher({ url: front.url, token: fx.tokens.sync, maxBuffer: 1_000, batchSize: 500, flushMs: 50, backoff: { baseMs: 60_000, maxMs: 60_000 } }),
  );
  try {
    await front.down();
    const ids: string[] = [];
    for (const p of fleet) {
      for (let i = 0; i < 50; i++) {
        const e = ev();
        ids.push(e.request_id);
        p.push(e);
      }
      await p.flush(); // fails: each now waits out a 30-60 s backoff
    }
    assert.ok(fleet.every((p) => p.stats().failures === 1));
    await front.up();
    const postsBefore = front.posts.length;
    const nudgedAt = performance.now();
    for (const p of fleet) p.nudge();
    await waitFor(() => fleet.every((p) => p.stats().buffered === 0), 5_000, 'the fleet backlog', 10);
    const arrivals = front.posts.slice(postsBefore).map((t) => t - nudgedAt);
    const windows = counts(arrivals.map((t) => String(Math.floor(t / 100))));
    const figures = {
      pushers: fleet.length,
      posts: arrivals.length,
      firstMs: Math.round(Math.min(...arrivals)),
      lastMs: Math.round(Math.max(...arrivals)),
      peakPer100Ms: Math.max(...windows.values()),
    };
    printFigures(t, 'fleet return', figures);
    assert.equal(arrivals.length, fleet.length, 'one batch each');
    assert.ok(figures.lastMs - figures.firstMs >= 300, 'spread, not all at once');
    assert.ok(figures.lastMs < 2_000, 'all within the jitter window');
    const seen = counts(front.deliveries.map((d) => d.requestId));
    assert.ok(ids.every((id) => seen.get(id) === 1), 'each event once');
  } finally {
    await Promise.all(fleet.map((p) => p.stop()));
  }
});
