/**
 * DESIGN section 6 with Redis limits and bucket slices: a response whose usage is far past
 * its reservation puts the key's TPM bucket into debt, and the next request waits for the
 * bucket to refill, whether the one that overdrew was admitted from the instance's slice
 * of the bucket or by Redis while a slice was live. A slice of a bucket in debt goes back;
 * nothing is admitted from tokens the debt has already used.
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

const prefix = `kwdebt${randomBytes(4).toString('hex')}`;
let h: Harness;
let close: () => Promise<void>;

before(async () => {
  ({ h, close } = await startBehindUpstream({
    // count_tokens counts; a chat reports 10,000 tokens against a TPM of 1,000.
    handler: (req, res) =>
      answerJson(res, req.url?.includes('count_tokens') ? { input_tokens: 3 } : { id: 'c', choices: [], usage: { prompt_tokens: 9000, completion_tokens: 1000, total_tokens: 10000 } }),
    keys: { k: { tpm: 1000 } },
    config: { redis: { url: TEST_REDIS_URL, prefix, timeoutMs: 1000 } },
  }));
});
after(async () => {
  await close();
  await deleteByPrefixAndDisconnect(new Redis(TEST_REDIS_URL), prefix);
});

const chat = () => postChat(h.url, h.keys.k!, { model: 'gpt-4o-mini', max_tokens: 10, messages: [] });

test('after a response overdraws the TPM bucket, the next request is refused until it refills, slice or not', async () => {
  // A request before the overdraw gives the key demand enough for a slice of its bucket.
  const counted = await send(h.url, { method: 'POST', path: '/v1/messages/count_tokens', headers: { 'x-api-key': h.keys.k!, 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o-mini', messages: [] }) });
  assert.equal(counted.status, 200);
  assert.equal((await chat()).status, 200, 'the bucket holds its estimate');
  const usage = h.usage.length;
  for (let i = 0; i < 3; i++) {
    const refused = await chat();
    assert.deepEqual([refused.status, refused.headers['x-keyward-error']], [429, 'tpm_exceeded'], `request ${i + 2}`);
    assert.ok(Number(refused.headers['retry-after']) > 60, 'the wait is the debt\'s, minutes at 1,000 a minute');
  }
  assert.equal(h.usage.length, usage, 'nothing more was billed');
});
