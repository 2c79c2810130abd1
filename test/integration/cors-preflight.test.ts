/**
 * keyward never answers a CORS preflight with CORS headers (DESIGN section 4): a browser
 * sends no key on a preflight, so it is refused, and one crafted with a key that allows
 * browsers is forwarded without the upstream's CORS grants.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { startHarness, type Harness } from '../helpers/sidecar.js';

let up: FakeUpstream;
let h: Harness;

before(async () => {
  up = await startFakeUpstream((_req, res) => {
    res.writeHead(204, {
      'access-control-allow-origin': '*',
      'Access-Control-Allow-Methods': 'POST',
      'access-control-allow-headers': 'authorization',
      'x-upstream': 'kept',
    });
    res.end();
  });
  h = await startHarness({ upstream: up.url, keys: { k_web: { allowBrowser: true } } });
});
after(async () => {
  await h.close();
  await up.close();
});

const preflight = (headers: Record<string, string>) =>
  fetch(`${h.url}/v1/images/generations`, { method: 'OPTIONS', headers: { origin: 'https://app.example', 'access-control-request-method': 'POST', ...headers } });

const corsHeaders = (r: Response) => [...r.headers.keys()].filter((n) => n.startsWith('access-control-'));

test('a browser preflight (no key) is refused without CORS headers and never forwarded', async () => {
  const before = up.received.length;
  const r = await preflight({});
  assert.equal(r.status, 401);
  assert.deepEqual(corsHeaders(r), []);
  assert.equal(up.received.length, before);
});

test('a preflight sent with a browser key is forwarded, and the upstream\'s CORS grants are not relayed', async () => {
  const before = up.received.length;
  const r = await preflight({ authorization: `Bearer ${h.keys.k_web}` });
  assert.equal(r.status, 204);
  assert.equal(up.received.length, before + 1, 'forwarded');
  assert.deepEqual(corsHeaders(r), []);
  assert.equal(r.headers.get('x-upstream'), 'kept', 'the rest of the head is relayed');
});

test('an OPTIONS request that is no preflight keeps the upstream\'s head', async () => {
  const r = await fetch(`${h.url}/v1/images/generations`, { method: 'OPTIONS', headers: { authorization: `Bearer ${h.keys.k_web}` } });
  assert.equal(r.status, 204);
  assert.equal(r.headers.get('access-control-allow-origin'), '*');
});
