/**
 * A connection that pipelines requests and reads nothing is read no further once its
 * requests wait past a bound: Node parses every request it reads at once, so without the
 * pause one client sending a few MB would queue tens of thousands of requests in memory
 * (and the close that ends them would stall the event loop for every other client).
 */
import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, test } from 'node:test';
import { MAX_IN_FLIGHT } from '../../src/proxy/in-flight.js';
import { bearer, send } from '../helpers/http.js';
import { startHarness, type Harness } from '../helpers/sidecar.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';

let up: FakeUpstream;
let h: Harness;
const held: (() => void)[] = [];
let arrived = 0;
let onArrival: (() => void) | null = null;
before(async () => {
  // The upstream answers nothing until the test ends: the connection's first requests stay in flight.
  up = await startFakeUpstream((_req, res) => {
    arrived++;
    onArrival?.();
    held.push(() => res.writeHead(200, { 'content-type': 'application/json' }).end('{}'));
  });
  h = await startHarness({ upstream: up.url, keys: { k: {} } });
});
after(async () => {
  for (const release of held) release();
  await h.close();
  await up.close();
});

/** The sidecar's keyward_in_flight_requests, read on its admin port. */
async function inFlight(): Promise<number> {
  const r = await send(`http://127.0.0.1:${h.sidecar.adminPort}`, { path: '/metrics' });
  return Number(/^keyward_in_flight_requests (\d+)$/m.exec(r.body.toString())?.[1]);
}

test('20,000 pipelined requests on a connection that reads nothing: a bounded number is taken in, other clients are served', { timeout: 30_000 }, async () => {
  const one = `GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${h.keys.k}\r\n\r\n`;
  const flood = net.connect(Number(new URL(h.url).port), '127.0.0.1');
  flood.pause(); // never reads its answers
  flood.on('error', () => undefined);
  const firstOnes = new Promise<void>((resolve) => (onArrival = () => arrived >= MAX_IN_FLIGHT && resolve()));
  flood.write(one.repeat(20_000));
  await firstOnes;
  // Waiting requests past the bound stop the reading: poll until they are there.
  for (let at = performance.now(); (await inFlight()) <= 2 * MAX_IN_FLIGHT; ) assert.ok(performance.now() - at < 10_000, 'requests queue behind the first ones');
  // Nothing signals that no more is read: give a free reader time to take in thousands more.
  await new Promise((r) => setTimeout(r, 500));
  const taken = await inFlight();
  // One read is at most 64 KB: about 800 of these requests, with those in flight and waiting.
  assert.ok(taken <= 1_000, `${taken} requests of one connection taken in`);
  assert.equal(arrived, MAX_IN_FLIGHT, 'no more reach the upstream while the first ones are in flight');
  const other = await send(h.url, { path: '/v1/key', headers: bearer(h.keys.k!) });
  assert.equal(other.status, 200);
  flood.destroy();
});
