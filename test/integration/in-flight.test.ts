/**
 * One connection that pipelines many requests has at most MAX_IN_FLIGHT of them in flight:
 * the upstream sees no more at once, and every request is still answered, in order.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { MAX_IN_FLIGHT } from '../../src/proxy/in-flight.js';
import { rawExchange } from '../helpers/raw.js';
import { startHarness, type Harness } from '../helpers/sidecar.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';

let up: FakeUpstream;
let h: Harness;
let now = 0;
let most = 0;
before(async () => {
  up = await startFakeUpstream((_req, res, rec) => {
    most = Math.max(most, ++now);
    // Each answer waits a little, so requests forwarded together overlap at the upstream.
    setTimeout(() => {
      now--;
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ url: rec.url }));
    }, 20);
  });
  h = await startHarness({ upstream: up.url, keys: { k: {} } });
});
after(async () => {
  await h.close();
  await up.close();
});

test(`pipelined requests on one connection: at most ${MAX_IN_FLIGHT} in flight, all answered in order`, async () => {
  const n = 50;
  const requests = Array.from({ length: n }, (_, i) => `GET /v1/models/m-${i} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${h.keys.k}\r\n\r\n`).join('');
  const r = await rawExchange(Number(new URL(h.url).port), [requests], { expect: n, timeoutMs: 20_000 });
  assert.equal(r.responses.length, n);
  assert.deepEqual(r.responses.map((x) => x.status), Array(n).fill(200));
  assert.deepEqual(r.responses.map((x) => JSON.parse(x.body.toString()).url), Array.from({ length: n }, (_, i) => `/v1/models/m-${i}`));
  assert.ok(most <= MAX_IN_FLIGHT, `${most} requests of one connection at the upstream at once`);
  assert.ok(most >= 2, 'pipelined requests still go in parallel up to the bound');
});
