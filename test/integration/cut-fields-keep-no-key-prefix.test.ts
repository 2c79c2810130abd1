/**
 * DESIGN section 4: no prefix of a key reaches a log line or a span. The path (512
 * characters) and the attribution headers (256) are logged cut short; a key near the cut
 * would leave its first few characters, too few to be found once cut. So a field is looked
 * at whole, and cut after: a key anywhere in it makes it `[redacted]`, and an attribution
 * URL loses its user-info before the cut could part it from its `@`.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { startHarness, waitForLine, type Harness } from '../helpers/sidecar.js';
import { startOtlpReceiver, type OtlpReceiver } from '../helpers/otlp-receiver.js';
import { send } from '../helpers/http.js';

const KEY = 'sk-kwtest-CUTKEY-0123456789abcdef';

let up: FakeUpstream;
let rx: OtlpReceiver;
let h: Harness;

before(async () => {
  up = await startFakeUpstream();
  rx = await startOtlpReceiver();
  h = await startHarness({ upstream: up.url, keys: { k_cut: { secret: KEY } }, traceTuning: { scheduledDelayMs: 20 }, config: { tracing: { otlpUrl: rx.url } } });
});
after(async () => {
  await h.close();
  await rx.close();
  await up.close();
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
