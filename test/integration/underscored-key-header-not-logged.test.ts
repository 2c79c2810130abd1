/**
 * DESIGN section 4: no key reaches a log line or a span. `x_api_key` is a header the
 * sidecar itself treats as one an upstream may read a key from (CGI-style servers read it
 * as x-api-key, credentials.ts), so a key it carries is kept out of the fields the client
 * chooses, as the other key headers' are: here the path, on a refusal and on a forward.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { startHarness, waitForLine, type Harness } from '../helpers/sidecar.js';
import { startOtlpReceiver, type OtlpReceiver } from '../helpers/otlp-receiver.js';
import { send } from '../helpers/http.js';

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
    keys: { k_main: { secret: MAIN }, k_other: { secret: OTHER } },
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
