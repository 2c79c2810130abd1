/**
 * A fleet of `keyward serve --workers 2`: two instances (a primary and two workers each),
 * each with its own replica file filled by `keyward import` from the same snapshot, on one
 * Redis. Shown: an RPM and a concurrency limit hold across the four workers of the fleet,
 * not per worker or per instance; each instance's /metrics adds up its workers; SIGTERM to
 * one instance's primary lets its streams finish, turns its /readyz 503, releases its slots
 * in Redis and exits 0, while the other instance keeps serving. Which worker served a
 * request is read from the `worker` field of its access line.
 */
import assert from 'node:assert/strict';
import http, { type ServerResponse } from 'node:http';
import { EventEmitter, once } from 'node:events';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { after, before, test } from 'node:test';
import { Redis } from 'ioredis';
import { generateKey } from '../../src/auth/keyformat.js';
import { makeKeyHasher } from '../../src/auth/hash.js';
import { bearer, send, type RawResponse } from '../helpers/http.js';
import { accessOf, fleetYaml, importReplica, metricSum, readyz, scrape } from '../helpers/instance.js';
import { printFigures } from '../helpers/load.js';
import { type SidecarProcess, spawnSidecar } from '../helpers/process.js';
import { waitFor } from '../helpers/redis-server.js';
import { deleteByPrefixAndDisconnect } from '../helpers/redis-harness.js';
import { type KeySpec, keyRecord } from '../helpers/sidecar.js';
import { type FakeUpstream, startFakeUpstream } from '../helpers/upstream.js';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';

const REDIS = TEST_REDIS_URL;
/** A token comes back after 5 s: far longer than a burst takes, even on a busy machine. */
const RPM = 12;
const CONC = 6;
const prefix = `kwwf${randomBytes(3).toString('hex')}`;

const specs: Record<string, KeySpec> = {
  open: {},
  rpm: { rpm: RPM },
  conc: { concurrency: CONC },
  // Under 16, so every stream holds a slot lease of its own (no block of slots, see README
  // `redis.lease`): the drain test counts them one by one.
  drain: { concurrency: 12 },
};
const secrets: Record<string, string> = {};

let dir: string;
let up: FakeUpstream;
let redis: Redis;
/** [A, B]: SIGTERM goes to A in the last test */
let fleet: SidecarProcess[] = [];

/** Streams the upstream holds open after their first event, until the test ends them. */
const held: { id: string; res: ServerResponse }[] = [];
const heldEvents = new EventEmitter();
const sse = (text: string) => `data: ${JSON.stringify({ id: 's', choices: [{ index: 0, delta: { content: text } }] })}\n\n`;

function untilHeld(match: (id: string) => boolean, n: number, what: string): Promise<void> {
  const count = () => held.filter((h) => match(h.id)).length;
  if (count() >= n) return Promise.resolve();
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`timed out waiting for ${what} at the upstream (${count()} of ${n})`)), 10_000);
    const check = () => {
      if (count() < n) return;
      clearTimeout(timer);
      heldEvents.off('held', check);
      resolve();
    };
    heldEvents.on('held', check);
  });
}

/** Ends the held streams whose request id matches, as a model that has finished. */
function release(match: (id: string) => boolean): void {
  for (let i = held.length - 1; i >= 0; i--) {
    if (!match(held[i]!.id)) continue;
    held[i]!.res.end(sse('lo') + 'data: [DONE]\n\n');
    held.splice(i, 1);
  }
}

/** Requests the upstream received whose request id starts with `tag`. */
const atUpstream = (tag: string) => up.received.filter((r) => String(r.headers['x-request-id'] ?? '').startsWith(tag)).length;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'kw-workers-fleet-'));
  redis = new Redis(REDIS);
  up = await startFakeUpstream((_req, res, rec) => {
    if (!rec.body.includes('"stream":true')) {
      const text = JSON.stringify({ id: 'x', usage: { prompt_tokens: 5, completion_tokens: 5, total_tokens: 10 } });
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
      res.end(text);
      return;
    }
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
    res.write(sse('hel'));
    held.push({ id: String(rec.headers['x-request-id'] ?? ''), res });
    heldEvents.emit('held');
  });
  // One snapshot, imported into each instance's own replica file, as an operator seeds a fleet.
  const hash = makeKeyHasher({ hash: 'sha256' });
  const lines: object[] = [{ type: 'meta', version: 1 }, { type: 'wallet', user: 'u_default', balance: 100 }];
  for (const [id, spec] of Object.entries(specs)) {
    secrets[id] = generateKey();
    lines.push(keyRecord(id, spec, hash(secrets[id])));
  }
  const snapshot = join(dir, 'snapshot.ndjson');
  writeFileSync(snapshot, lines.map((l) => JSON.stringify(l)).join('\n') + '\n');
  const names = ['a', 'b'];
  await Promise.all(names.map((n) => importReplica(snapshot, join(dir, `replica-${n}.sqlite`))));
  fleet = await Promise.all(
    names.map((n) => {
      const yaml = fleetYaml({ upstream: up.url, replica: join(dir, `replica-${n}.sqlite`), redis: REDIS, prefix, server: 'shutdownGraceMs: 20000' });
      return spawnSidecar({ dir, name: `instance-${n}`, yaml, args: ['--workers', '2'] });
    }),
  );
});

after(async () => {
  release(() => true);
  await Promise.all(fleet.map((s) => s.stop('SIGKILL')));
  await up?.close();
  if (redis) await deleteByPrefixAndDisconnect(redis, prefix);
  rmSync(dir, { recursive: true, force: true });
});

/** A small chat request on a connection of its own: the cluster hands each new connection to the next worker. */
const chat = (p: SidecarProcess, key: string, id: string): Promise<RawResponse> =>
  send(p.url, {
    method: 'POST', path: '/v1/chat/completions',
    headers: { ...bearer(key), 'content-type': 'application/json', 'x-request-id': id },
    body: JSON.stringify({ model: 'gpt-4o', messages: [], max_tokens: 16 }),
  });

interface Stream {
  id: string;
  status: number;
  code: string;
  ended: boolean;
  /** the whole answer, once it has ended */
  body: Promise<string>;
}

/** Opens a streaming chat request on a connection of its own; resolves with the answer's head. */
async function openStream(p: SidecarProcess, key: string, id: string): Promise<Stream> {
  const u = new URL(p.url);
  const req = http.request({
    host: u.hostname, port: u.port, method: 'POST', path: '/v1/chat/completions', agent: false,
    headers: { ...bearer(key), 'content-type': 'application/json', 'x-request-id': id },
  });
  req.end(JSON.stringify({ model: 'gpt-4o', stream: true, messages: [{ role: 'user', content: 'hi' }], max_tokens: 64 }));
  const [res] = (await once(req, 'response')) as [http.IncomingMessage];
  const chunks: Buffer[] = [];
  const s: Stream = { id, status: res.statusCode ?? 0, code: String(res.headers['x-keyward-error'] ?? ''), ended: false, body: Promise.resolve('') };
  s.body = new Promise((resolve, reject) => {
    res.on('data', (c: Buffer) => chunks.push(c));
    res.once('end', () => {
      s.ended = true;
      resolve(Buffer.concat(chunks).toString('utf8'));
    });
    res.once('error', (err) => reject(new Error(`stream ${id} cut before its end: ${err.message}`)));
    res.once('close', () => reject(new Error(`stream ${id} cut before its end`)));
  });
  s.body.catch(() => undefined); // asserted where awaited
  return s;
}

const ids = (tag: string, n: number) => Array.from({ length: n }, (_, i) => `${tag}-${i}`);
const countBy = <T>(xs: T[], key: (x: T) => string) => xs.reduce<Record<string, number>>((m, x) => ((m[key(x)] = (m[key(x)] ?? 0) + 1), m), {});
const slotsOf = (keyId: string) => redis.zcard(`{${prefix}:k:${keyId}}:conc`);

test("each instance's /metrics adds up the requests of both its workers", { timeout: 30_000 }, async (t) => {
  const sent = [10, 6];
  const before = await Promise.all(fleet.map(scrape));
  const tags = fleet.map((_, i) => ids(`${prefix}-metrics-${i}`, sent[i]!));
  const rs = await Promise.all(fleet.flatMap((p, i) => tags[i]!.map((id) => chat(p, secrets.open!, id))));
  assert.deepEqual(rs.map((r) => r.status), Array(rs.length).fill(200));
  const lines = await Promise.all(fleet.map((p, i) => accessOf(p, tags[i]!)));
  const afterScrape = await Promise.all(fleet.map(scrape));
  const counted = fleet.map((_, i) => metricSum(afterScrape[i]!, 'keyward_requests_total') - metricSum(before[i]!, 'keyward_requests_total'));
  const perWorker = lines.map((ls) => countBy(ls, (l) => String(l.worker)));
  printFigures(t, 'workers fleet metrics', { sentPerInstance: sent, countedInMetrics: counted, requestsPerWorker: perWorker });
  for (let i = 0; i < fleet.length; i++) {
    assert.equal(metricSum(afterScrape[i]!, 'keyward_workers'), 2);
    assert.deepEqual(Object.keys(perWorker[i]!).sort(), ['1', '2'], `instance ${i}: both workers served (the primary none)`);
    assert.equal(counted[i], sent[i], `instance ${i}: /metrics counts the requests of every worker`);
  }
});

test('N+1 requests at once across four workers of two instances admit exactly N', { timeout: 30_000 }, async (t) => {
  const tag = `${prefix}-rpm`;
  const burst = ids(tag, RPM + 1);
  const started = performance.now();
  const rs = await Promise.all(burst.map((id, i) => chat(fleet[i % 2]!, secrets.rpm!, id)));
  const burstMs = performance.now() - started;
  const lines = await Promise.all(fleet.map((p, i) => accessOf(p, burst.filter((_, j) => j % 2 === i))));
  const admittedBy = countBy(lines.flatMap((ls, i) => ls.filter((l) => l.status === 200).map((l) => `${'ab'[i]}${l.worker}`)), (w) => w);
  const servedBy = new Set(lines.flatMap((ls, i) => ls.map((l) => `${'ab'[i]}${l.worker}`)));
  printFigures(t, 'workers fleet rpm', {
    rpm: RPM, sent: burst.length, admitted: rs.filter((r) => r.status === 200).length, admittedPerWorker: admittedBy,
    atUpstream: atUpstream(tag), burstMs: Math.round(burstMs),
  });
  assert.equal(servedBy.size, 4, `the burst reached all four workers (${[...servedBy].join(', ')})`);
  assert.equal(rs.filter((r) => r.status === 200).length, RPM, `rpm ${RPM} across four workers`);
  assert.deepEqual(rs.filter((r) => r.status !== 200).map((r) => [r.status, r.headers['x-keyward-error']]), [[429, 'rpm_exceeded']]);
  assert.equal(atUpstream(tag), RPM, 'only the admitted reached the upstream');
});

test('a concurrency-C key admits exactly C across the fleet while streams are open, and C again after they end', { timeout: 30_000 }, async (t) => {
  const round = async (tag: string) => {
    const streams = await Promise.all(ids(tag, CONC + 4).map((id, i) => openStream(fleet[i % 2]!, secrets.conc!, id)));
    await untilHeld((id) => id.startsWith(tag), streams.filter((s) => s.status === 200).length, 'the admitted streams');
    const metrics = await Promise.all(fleet.map(scrape));
    return {
      streams,
      open: streams.filter((s) => s.status === 200),
      refused: [...new Set(streams.filter((s) => s.status !== 200).map((s) => `${s.status} ${s.code}`))],
      slotsInRedis: await slotsOf('conc'),
      slotsHeldInMetrics: metrics.map((m) => metricSum(m, 'keyward_slots_held')),
      atUpstream: atUpstream(tag),
    };
  };
  const first = await round(`${prefix}-conc1`);
  const perInstance = [0, 1].map((i) => first.open.filter((s) => first.streams.indexOf(s) % 2 === i).length);
  // The streams end as a model finishing its answer: every slot must come back.
  release((id) => id.startsWith(`${prefix}-conc1`));
  const bodies = await Promise.all(first.open.map((s) => s.body));
  const endedAt = performance.now();
  await waitFor(async () => (await slotsOf('conc')) === 0, 10_000, 'the slots of the ended streams', 10);
  const slotsFreeAfterMs = performance.now() - endedAt;
  const second = await round(`${prefix}-conc2`);
  release((id) => id.startsWith(`${prefix}-conc2`));
  await Promise.all(second.open.map((s) => s.body));
  await waitFor(async () => (await slotsOf('conc')) === 0, 10_000, 'the slots of the second round', 10);
  printFigures(t, 'workers fleet concurrency', {
    concurrency: CONC, opened: first.streams.length, inFlight: first.open.length, inFlightPerInstance: perInstance,
    slotsInRedis: first.slotsInRedis, slotsHeldPerInstanceMetrics: first.slotsHeldInMetrics, slotsFreeAfterEndMs: Math.round(slotsFreeAfterMs),
    secondRoundInFlight: second.open.length,
  });
  for (const r of [first, second]) {
    assert.equal(r.open.length, CONC, `concurrency ${CONC} across the fleet`);
    assert.deepEqual(r.refused, ['429 concurrency_exceeded']);
    assert.equal(r.slotsInRedis, CONC, 'one slot lease per stream in flight');
    assert.equal(r.atUpstream, CONC, 'only the admitted reached the upstream');
    assert.equal(r.slotsHeldInMetrics[0]! + r.slotsHeldInMetrics[1]!, CONC, "the instances' /metrics count the slots their workers hold");
  }
  for (const b of bodies) assert.match(b, /data: \[DONE\]\n\n$/);
});

test('SIGTERM to one primary: its streams finish, /readyz 503, exit 0, slots released; the other serves on', { timeout: 40_000 }, async (t) => {
  const [a, b] = fleet as [SidecarProcess, SidecarProcess];
  const tagA = `${prefix}-drain-a`;
  const tagB = `${prefix}-drain-b`;
  const idsA = ids(tagA, 4);
  const idsB = ids(tagB, 2);
  // A's streams one after another: the cluster then hands their connections to its two workers in turn.
  const streams: Stream[] = [];
  for (const id of idsA) streams.push(await openStream(a, secrets.drain!, id));
  streams.push(...(await Promise.all(idsB.map((id) => openStream(b, secrets.drain!, id)))));
  assert.deepEqual(streams.map((s) => s.status), Array(6).fill(200));
  await untilHeld((id) => id.startsWith(tagA) || id.startsWith(tagB), 6, 'the six streams');
  const streamsA = streams.slice(0, 4);
  const streamsB = streams.slice(4);
  assert.equal(await slotsOf('drain'), 6);

  const signalled = performance.now();
  a.child.kill('SIGTERM');
  await waitFor(async () => (await readyz(a)) === 503, 10_000, "A's /readyz to turn 503", 10);
  const notReadyAfterMs = performance.now() - signalled;
  // While A drains, B answers as before.
  const duringIds = ids(`${prefix}-during`, 6);
  const during = await Promise.all(duringIds.map((id) => chat(b, secrets.open!, id)));
  const bReady = await readyz(b);
  const cutEarly = streamsA.filter((s) => s.ended).length;

  const released = performance.now();
  release((id) => id.startsWith(tagA));
  const bodiesA = await Promise.all(streamsA.map((s) => s.body));
  const code = await a.closed;
  const exitedAfterReleaseMs = performance.now() - released;
  // Read at once: a drained instance has released what it held before it exits.
  const slotsAfterExit = await slotsOf('drain');
  const linesA = await accessOf(a, idsA, 1_000);

  // B's own streams and requests after A has gone.
  const afterExit = await chat(b, secrets.open!, `${prefix}-after-exit`);
  release((id) => id.startsWith(tagB));
  const bodiesB = await Promise.all(streamsB.map((s) => s.body));
  await waitFor(async () => (await slotsOf('drain')) === slotsAfterExit - 2, 10_000, "B's two slots released", 10);

  printFigures(t, 'workers fleet drain', {
    streamsPerWorkerOfA: countBy(linesA, (l) => String(l.worker)),
    readyz503AfterMs: Math.round(notReadyAfterMs),
    exitAfterStreamsEndedMs: Math.round(exitedAfterReleaseMs),
    sigtermToExitMs: Math.round(performance.now() - signalled),
    slotsInRedis: `6 before, ${slotsAfterExit} after A exited`,
  });
  assert.equal(cutEarly, 0, "the drain waited for A's streams");
  for (const body of [...bodiesA, ...bodiesB]) assert.match(body, /data: \[DONE\]\n\n$/);
  assert.equal(code, 0, 'A exited 0');
  assert.deepEqual(linesA.map((l) => l.status), [200, 200, 200, 200]);
  assert.equal(new Set(linesA.map((l) => l.worker)).size, 2, "both of A's workers drained streams");
  assert.equal(slotsAfterExit, 2, "A's four slots released by the time it exited; B's two still held");
  assert.deepEqual(during.map((r) => r.status), Array(6).fill(200), 'B served while A drained');
  assert.equal(bReady, 200);
  assert.equal(afterExit.status, 200, 'B serves after A has gone');
});
