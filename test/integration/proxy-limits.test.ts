/**
 * Limits through the whole request path against the real Redis at 127.0.0.1:6379:
 * exactness under bursts, concurrency at the upstream, TPM settlement from the usage
 * tap, slots freed by aborts, one limit across two sidecar processes, and slots of a
 * killed process coming back after the lease.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { once } from 'node:events';
import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import { startFakeUpstream, type FakeUpstream, type Handler } from '../helpers/upstream.js';
import { startHarness, waitForLine, type Harness } from '../helpers/sidecar.js';
import { bearer, send, type RawResponse } from '../helpers/http.js';
import { spawnSidecar } from '../helpers/process.js';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';

const REDIS = TEST_REDIS_URL;
const prefix = `kwt${randomBytes(4).toString('hex')}`;
const many = new http.Agent({ keepAlive: true, maxSockets: Infinity });

let up: FakeUpstream;
let h: Harness;
let redis: Redis;

const okJson: Handler = (_q, res) => {
  res.writeHead(200, { 'content-type': 'application/json' });
  res.end(JSON.stringify({ id: 'x', usage: { prompt_tokens: 5, completion_tokens: 5, total_tokens: 10 } }));
};

before(async () => {
  redis = new Redis(REDIS);
  up = await startFakeUpstream(okJson);
  h = await startHarness({
    upstream: up.url,
    config: { redis: { url: REDIS, prefix, timeoutMs: 500 }, limits: { leaseMs: 1000 } },
    keys: {
      k_rpm: { rpm: 10 },
      k_conc: { concurrency: 20 },
      k_tpm: { tpm: 1000 },
      k_tpm_stream: { tpm: 1000 },
      k_abort: { concurrency: 200 },
      k_shared: { rpm: 10 },
      k_crash: { concurrency: 1 },
    },
  });
});
after(async () => {
  await h.close();
  await up.close();
  const keys = await redis.keys(`{${prefix}:*`);
  if (keys.length) await redis.del(...keys);
  redis.disconnect();
  many.destroy();
});

const chat = (url: string, key: string, body: Record<string, unknown> = {}) =>
  send(url, {
    method: 'POST', path: '/v1/chat/completions', agent: many,
    headers: { ...bearer(key), 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o', messages: [], ...body }),
  });

const statuses = (rs: RawResponse[]) => rs.map((r) => r.status).sort();

/** Opens a streaming request and resolves once its first event has arrived. */
async function openStream(url: string, key: string) {
  const u = new URL(url);
  const req = http.request({ host: u.hostname, port: u.port, method: 'POST', path: '/v1/chat/completions', agent: many, headers: { ...bearer(key), 'content-type': 'application/json' } });
  req.on('error', () => {});
  req.end('{"model":"gpt-4o","stream":true}');
  const [res] = (await once(req, 'response')) as [http.IncomingMessage];
  res.on('error', () => {}); // 'aborted' once the test destroys the request
  if (res.statusCode === 200) await once(res, 'data');
  return { req, res, status: res.statusCode };
}

const holdOpen: Handler = (_q, res) => {
  res.writeHead(200, { 'content-type': 'text/event-stream' });
  res.write('data: {"choices":[]}\n\n');
};

describe('limits through the proxy (Redis)', () => {
  test('N+1 requests at once admit exactly N; the 429 carries Retry-After and retry-after-ms', async () => {
    const rs = await Promise.all(Array.from({ length: 11 }, () => chat(h.url, h.keys.k_rpm!)));
    assert.deepEqual(statuses(rs), [...Array(10).fill(200), 429]);
    const denied = rs.find((r) => r.status === 429)!;
    assert.equal(denied.headers['x-keyward-error'], 'rpm_exceeded');
    assert.ok(Number(denied.headers['retry-after']) >= 1);
    const ms = Number(denied.headers['retry-after-ms']);
    assert.ok(ms > 0 && ms <= 6000, `retry-after-ms ${ms} should be about one token's refill (6 s)`);
  });

  test('500 concurrent requests on a key with concurrency 20 never put more than 20 in flight upstream', async () => {
    let inFlight = 0;
    let maxInFlight = 0;
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    up.setHandler(async (q, res, rec) => {
      inFlight++;
      maxInFlight = Math.max(maxInFlight, inFlight);
      await gate;
      inFlight--;
      void okJson(q, res, rec);
    });
    let denied = 0;
    let allDenied!: () => void;
    const deniedAll = new Promise<void>((r) => (allDenied = r));
    const all = Array.from({ length: 500 }, () =>
      chat(h.url, h.keys.k_conc!).then((r) => {
        if (r.status === 429 && ++denied === 480) allDenied();
        return r;
      }),
    );
    await deniedAll; // 480 answered 429 while 20 are held at the upstream
    assert.equal(inFlight, 20);
    release();
    const rs = await Promise.all(all);
    up.setHandler(okJson);
    assert.equal(maxInFlight, 20);
    assert.equal(rs.filter((r) => r.status === 200).length, 20);
    assert.ok(rs.filter((r) => r.status === 429).every((r) => r.headers['x-keyward-error'] === 'concurrency_exceeded'));
  });

  test('TPM: a response reporting fewer tokens than reserved gives the difference back', async () => {
    // Reserves ~ body/4 + 900; the upstream reports 10 tokens, so 890+ come back.
    assert.equal((await chat(h.url, h.keys.k_tpm!, { max_tokens: 900 })).status, 200);
    await waitForLine(h, (l) => l.key_id === 'k_tpm' && l.input_tokens === 5);
    assert.equal((await chat(h.url, h.keys.k_tpm!, { max_tokens: 900 })).status, 200, 'without the refund this would be tpm_exceeded');
  });

  test('TPM: a stream cut short is settled at the estimate of what it generated, flagged estimated', async () => {
    up.setHandler((_q, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: {"choices":[{"delta":{"content":"four"}}]}\n\n');
      setImmediate(() => res.destroy()); // the upstream dies before the usage event
    });
    const r = await chat(h.url, h.keys.k_tpm_stream!, { stream: true, max_tokens: 900 }).catch(() => null);
    assert.ok(r === null || r.status === 200);
    const line = await waitForLine(h, (l) => l.key_id === 'k_tpm_stream');
    // the upstream stopped, not the client: the status its head gave, and a warning
    assert.equal(line.status, 200);
    assert.ok(h.logs.some((l) => l.includes('"upstream failure"') && l.includes(String(line.req_id))), 'an upstream failure line for the request');
    assert.equal(line.usage_estimated, true);
    assert.equal(line.output_tokens, 1, 'ceil(4 characters seen / 4)');
    assert.ok(typeof line.input_tokens === 'number' && line.input_tokens > 0, 'the prompt estimate');
    up.setHandler(okJson);
    // The 900 reserved for output were given back: another 900 fits the 1000 TPM.
    const next = await chat(h.url, h.keys.k_tpm_stream!, { max_tokens: 900 });
    assert.equal(next.status, 200);
  });

  test('200 streaming requests aborted by their clients leave zero slots held', async () => {
    up.setHandler(holdOpen);
    const first = await Promise.all(Array.from({ length: 200 }, () => openStream(h.url, h.keys.k_abort!)));
    assert.ok(first.every((s) => s.status === 200));
    const closed = first.map((s) => new Promise((r) => s.res.once('close', r)));
    for (const s of first) s.req.destroy();
    await Promise.all(closed);
    await waitForLine(h, () => accessCount('k_abort', 499) === 200);
    assert.equal(h.sidecar.limiter.stats().slotsHeld, 0);
    // and Redis agrees: a second wave of 200 fits again
    const second = await Promise.all(Array.from({ length: 200 }, () => openStream(h.url, h.keys.k_abort!)));
    assert.ok(second.every((s) => s.status === 200), 'slots of aborted requests were not freed');
    for (const s of second) s.req.destroy();
    up.setHandler(okJson);
  });

  test('two sidecar processes sharing one Redis enforce one limit', async () => {
    const yaml = `server: { port: 0 }\nadmin: { port: 0 }\nupstreams: { default: { url: ${up.url} } }\nreplica: { path: ${h.config.replica.path} }\nredis: { url: ${REDIS}, prefix: ${prefix}, timeoutMs: 500 }\nlogging: { level: info }\n`;
    const a = await spawnSidecar({ dir: h.dir, name: 'a', yaml });
    const b = await spawnSidecar({ dir: h.dir, name: 'b', yaml });
    try {
      const rs = await Promise.all(Array.from({ length: 12 }, (_, i) => chat(i % 2 ? a.url : b.url, h.keys.k_shared!)));
      assert.equal(rs.filter((r) => r.status === 200).length, 10);
      assert.equal(rs.filter((r) => r.status === 429).length, 2);
    } finally {
      await Promise.all([a.stop(), b.stop()]);
    }
  });

  test("a sidecar killed mid-stream has its slots back after the lease expiry", async () => {
    up.setHandler(holdOpen);
    const yaml = `server: { port: 0 }\nadmin: { port: 0 }\nupstreams: { default: { url: ${up.url} } }\nreplica: { path: ${h.config.replica.path} }\nredis: { url: ${REDIS}, prefix: ${prefix}, timeoutMs: 500 }\nlimits: { leaseMs: 1000 }\nlogging: { level: info }\n`;
    const doomed = await spawnSidecar({ dir: h.dir, name: 'doomed', yaml });
    const stream = await openStream(doomed.url, h.keys.k_crash!);
    assert.equal(stream.status, 200);
    const killedAt = Date.now();
    await doomed.stop('SIGKILL');
    up.setHandler(okJson);
    const blocked = await chat(h.url, h.keys.k_crash!);
    assert.equal(blocked.status, 429, 'the dead process still holds the slot until its lease expires');
    assert.equal(blocked.headers['x-keyward-error'], 'concurrency_exceeded');
    let status = 429;
    while (status === 429 && Date.now() - killedAt < 5000) {
      await new Promise((r) => setTimeout(r, Number(blockedRetry(blocked))));
      status = (await chat(h.url, h.keys.k_crash!)).status;
    }
    assert.equal(status, 200);
    assert.ok(Date.now() - killedAt < 3000, 'the slot came back later than the lease allows');
  });
});

function blockedRetry(r: RawResponse): number {
  return Math.min(1000, Number(r.headers['retry-after-ms']) || 100);
}

function accessCount(keyId: string, status: number): number {
  return h.logs.filter((l) => l.includes(`"key_id":"${keyId}"`) && l.includes(`"status":${status}`)).length;
}
