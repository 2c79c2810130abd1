/**
 * DESIGN section 4: no key, and no prefix of one, reaches a log line or a span.
 * - `x_api_key` is a header the sidecar itself treats as one an upstream may read a key
 *   from (CGI-style servers read it as x-api-key, credentials.ts), so a key it carries is
 *   kept out of the fields the client chooses, as the other key headers' are: here the
 *   path, on a refusal and on a forward.
 * - The path (512 characters) and the attribution headers (256) are logged cut short; a
 *   key near the cut would leave its first few characters, too few to be found once cut.
 *   So a field is looked at whole, and cut after: a key anywhere in it makes it
 *   `[redacted]`, and an attribution URL loses its user-info before the cut could part it
 *   from its `@`.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { startHarness, waitForLine, type Harness } from '../helpers/sidecar.js';
import { startOtlpReceiver, type OtlpReceiver } from '../helpers/otlp-receiver.js';
import { send } from '../helpers/http.js';

const KEY = 'sk-kwtest-CUTKEY-0123456789abcdef';
const MAIN = 'sk-kwtest-UNDERSCORE-main-0123456789';
const OTHER = 'sk-kwtest-UNDERSCORE-other-9876543210';

let up: FakeUpstream;
let rx: OtlpReceiver;
let h: Harness;

before(async () => {
  up = await startFakeUpstream();
  rx = await startOtlpReceiver();
  h = await startHarness({
    upstream: up.url,
    keys: { k_cut: { secret: KEY }, k_main: { secret: MAIN }, k_other: { secret: OTHER } },
    traceTuning: { scheduledDelayMs: 20 },
    config: { tracing: { otlpUrl: rx.url } },
  });
});
after(async () => {
  await h.close();
  await rx.close();
  await up.close();
});

test('a key sent only in x_api_key is not logged nor traced from the path', async () => {
  const line = waitForLine(h, (l) => l.req_id === 'underscored-1');
  const res = await send(h.url, { path: `/v1/models/${OTHER}`, headers: { x_api_key: OTHER, 'x-request-id': 'underscored-1' } });
  assert.equal(res.status, 401);
  assert.equal((await line).path, '[redacted]');
  const span = await rx.waitFor((s) => s.attributes['http.response.status_code'] === 401 && s.attributes['keyward.code'] === 'missing_api_key');
  assert.equal(span.attributes['url.path'], '[redacted]');
  assert.ok(!JSON.stringify(rx.bodies).includes(OTHER.slice(0, 8)), 'no prefix of the key in what the collector got');
});

test('a value in x_api_key beside the credential is kept out of a forwarded request\'s path', async () => {
  // Not a key of the replica's, so no conflict: forwarded, and still a header an upstream reads keys from.
  const carried = 'sk-elsewhere-0123456789abcdef';
  const line = waitForLine(h, (l) => l.req_id === 'underscored-2');
  const res = await send(h.url, { path: `/v1/models/${carried}`, headers: { authorization: `Bearer ${MAIN}`, x_api_key: carried, 'x-request-id': 'underscored-2' } });
  assert.equal(res.status, 200);
  assert.equal((await line).path, '[redacted]');
  assert.ok(!h.logs.join('\n').includes(carried.slice(0, 8)) && !h.logs.join('\n').includes(OTHER.slice(0, 8)), 'no prefix of either key in any log line');
});

test('a key cut short by the path\'s 512 characters leaves none of it in the access line or the span', async () => {
  // the cut at 512 leaves the key's first 6 characters
  const path = `/v1/models/${'a'.repeat(512 - 11 - 6)}${KEY}`;
  const line = waitForLine(h, (l) => l.req_id === 'cut-path');
  const res = await send(h.url, { path, headers: { authorization: `Bearer ${KEY}`, 'x-request-id': 'cut-path' } });
  assert.equal(res.status, 200);
  assert.equal((await line).path, '[redacted]');
  const span = await rx.waitFor((s) => s.attributes['keyward.key_id'] === 'k_cut' && s.attributes['keyward.route'] === 'models');
  assert.equal(span.attributes['url.path'], '[redacted]');
});

test('a key cut short by an attribution header\'s 256 characters leaves none of it', async () => {
  const line = waitForLine(h, (l) => l.req_id === 'cut-attribution');
  const res = await send(h.url, {
    path: '/v1/models',
    headers: {
      authorization: `Bearer ${KEY}`, 'x-request-id': 'cut-attribution',
      'x-app-name': `${'n'.repeat(250)}${KEY}`,
      'x-app-url': `https://u:${'p'.repeat(240)}${KEY}@apps.example/x`,
      'keyward-version': `${'v'.repeat(251)}${KEY}`,
    },
  });
  assert.equal(res.status, 200);
  const l = await line;
  assert.deepEqual([l.app_name, l.app_url, l.api_version], ['[redacted]', 'https://apps.example/x', '[redacted]']);
  assert.ok(!h.logs.join('\n').includes(KEY.slice(0, 5)), 'not even the first 5 characters');
});

test('long fields without a key are still cut as before', async () => {
  const line = waitForLine(h, (l) => l.req_id === 'cut-plain');
  await send(h.url, { path: `/v1/models/${'b'.repeat(600)}`, headers: { authorization: `Bearer ${KEY}`, 'x-request-id': 'cut-plain', 'x-app-name': 'm'.repeat(300) } });
  const l = await line;
  assert.equal(l.path, `/v1/models/${'b'.repeat(501)}`);
  assert.equal(l.app_name, 'm'.repeat(256));
});
