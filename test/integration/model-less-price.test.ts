/**
 * A model request that names no model (an image generation, say) is priced as the console
 * charges it: by the catch-all price record `*`, which the console publishes for its
 * `pricing.unpriced` rate. The spend hold and the settled cost use it, so such requests
 * cannot run a budget past its end unseen (DESIGN section 6: never hold more than R).
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { startHarness, waitForLine, type Harness } from '../helpers/sidecar.js';
import { send } from '../helpers/http.js';

let up: FakeUpstream;
let h: Harness;

before(async () => {
  up = await startFakeUpstream((_req, res) => {
    const text = JSON.stringify({ created: 1, data: [] });
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
    res.end(text);
  });
  h = await startHarness({
    upstream: up.url,
    keys: {
      k_small: { kind: 'team', project: 'p_1', budget: 10, spent: 0 },
      k_large: { kind: 'team', project: 'p_1', budget: 1_000_000, spent: 0 },
    },
    // one unit a token: an image request's estimate (its prompt and 1,024 output tokens) is past 10
    records: [{ type: 'project', id: 'p_1', status: 'enabled', budget: null, spent: 0 }, { type: 'price', model: '*', input: 1, output: 1, per: 1 }],
  });
});
after(async () => {
  await h.close();
  await up.close();
});

const image = (key: string) =>
  send(h.url, {
    method: 'POST',
    path: '/v1/images/generations',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'a lighthouse at dusk' }),
  });

test('without a model: the hold is priced by `*`, so an estimate past the budget is 402 and not forwarded', async () => {
  const res = await image(h.keys.k_small!);
  assert.equal(res.status, 402);
  assert.equal(res.headers['x-keyward-error'], 'key_budget_exhausted');
  assert.equal(up.received.length, 0);
});

test('without a model: the settled cost is the `*` price of the estimate, as the console bills it', async () => {
  const line = waitForLine(h, (l) => l.msg === 'request' && l.route === 'images' && l.status === 200);
  assert.equal((await image(h.keys.k_large!)).status, 200);
  const logged = await line;
  assert.equal(logged.usage_estimated, true);
  const key = (await send(h.url, { path: '/v1/key', headers: { authorization: `Bearer ${h.keys.k_large}` } })).json<{ budget: { spent: number } }>();
  assert.equal(key.budget.spent, (logged.input_tokens as number) + (logged.output_tokens as number));
});
