/**
 * DESIGN section 6: a budget spent by settled usage refuses the next request at once, with
 * Redis limits as in process. A usage figure so large that its cost in nano-units is past
 * the store's 64-bit integers (an upstream reporting 1e308 tokens) is settled at a bounded
 * cost, not dropped by Redis with the wallet left as it was.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import { answerJson } from '../helpers/upstream.js';
import { startBehindUpstream, type Harness } from '../helpers/sidecar.js';
import { postChat, send } from '../helpers/http.js';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';
import { deleteByPrefixAndDisconnect } from '../helpers/redis-harness.js';

const prefix = `kwhuge${randomBytes(4).toString('hex')}`;
let h: Harness;
let close: () => Promise<void>;

before(async () => {
  ({ h, close } = await startBehindUpstream({
    handler: (_req, res) => answerJson(res, { id: 'c', choices: [], usage: { prompt_tokens: 1e308, completion_tokens: 1e308 } }),
    keys: { k_me: { kind: 'personal', user: 'u_1' } },
    records: [{ type: 'wallet', user: 'u_1', balance: 1000 }, { type: 'price', model: 'priced-*', input: 1, output: 1, per: 1 }],
    config: { redis: { url: TEST_REDIS_URL, prefix, timeoutMs: 1000 } },
  }));
});
after(async () => {
  await close();
  await deleteByPrefixAndDisconnect(new Redis(TEST_REDIS_URL), prefix);
});

const chat = () => postChat(h.url, h.keys.k_me!, { model: 'priced-model', max_tokens: 10, messages: [] });

test('a response reporting 1e308 tokens spends the wallet in Redis, and the next request is 402', async () => {
  assert.equal((await chat()).status, 200);
  // Settlements reach Redis in batches: the live balance says when this one has.
  const balance = async () => (JSON.parse((await send(h.url, { path: '/v1/key', headers: { authorization: `Bearer ${h.keys.k_me}` } })).body.toString()) as { balance: number }).balance;
  const deadline = Date.now() + 5000;
  let live = await balance();
  while (live >= 0 && Date.now() < deadline) live = await balance();
  assert.ok(live < 0, `the settlement was dropped: live balance ${live}`);
  const next = await chat();
  assert.deepEqual([next.status, next.headers['x-keyward-error']], [402, 'insufficient_balance']);
});
