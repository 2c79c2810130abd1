/**
 * A budget spent by settled usage refuses the next request at once, without waiting for
 * the console (DESIGN sections 5 and 6): requests that hold nothing, count_tokens among
 * them, are judged by the live ledger too, not only by the replica's `spent`. In process
 * and with Redis limits.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { startHarness, waitForLine, type Harness } from '../helpers/sidecar.js';
import { send } from '../helpers/http.js';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';

const prefix = `kwlive${randomBytes(4).toString('hex')}`;
let up: FakeUpstream;

before(async () => {
  // A chat answer reports 5,000 prompt tokens: at 1 a token, far past the key's budget of 1,000.
  up = await startFakeUpstream((req, res) => {
    const usage = req.url?.includes('count_tokens') ? { input_tokens: 5 } : { usage: { prompt_tokens: 5000, completion_tokens: 1, total_tokens: 5001 } };
    const text = JSON.stringify(usage);
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
    res.end(text);
  });
});
after(async () => {
  await up.close();
  const redis = new Redis(TEST_REDIS_URL);
  const keys = await redis.keys(`{${prefix}*`);
  if (keys.length) await redis.del(...keys);
  redis.disconnect();
});

const VARIANTS = [
  { name: 'in process', config: {} },
  { name: 'Redis limits', config: { redis: { url: TEST_REDIS_URL, prefix: `${prefix}a`, timeoutMs: 1000 } } },
] as const;

for (const variant of VARIANTS) {
  describe(`live budgets, ${variant.name}`, () => {
    let h: Harness;
    before(async () => {
      h = await startHarness({
        upstream: up.url,
        keys: { k_team: { kind: 'team', project: 'p_1', budget: 1000, spent: 0 }, k_rpm: { kind: 'team', project: 'p_1', budget: 1, spent: 0, rpm: 2 }, k_order: { kind: 'team', project: 'p_1', budget: 1000, spent: 0, rpm: 1 },
          k_sh_both: { kind: 'team', project: 'p_1', budget: 1000, spent: 0, rpm: 1, shadow: ['budget', 'rpm'] },
          k_sh_budget: { kind: 'team', project: 'p_1', budget: 1000, spent: 0, rpm: 1, shadow: ['budget'] },
          k_sh_rpm: { kind: 'team', project: 'p_1', budget: 1000, spent: 0, rpm: 1, shadow: ['rpm'] },
          k_sh_rpm_small: { kind: 'team', project: 'p_1', budget: 1, spent: 0, rpm: 1, shadow: ['rpm'] },
          // One key spends what it draws on, the other has a budget of its own too small for its hold.
          k_p2_spender: { kind: 'team', project: 'p_2' },
          k_p2_small: { kind: 'team', project: 'p_2', budget: 3, spent: 0 },
          k_w_spender: { kind: 'personal', user: 'u_2' },
          k_w_small: { kind: 'personal', user: 'u_2', budget: 3, spent: 0 },
        },
        records: [
          { type: 'project', id: 'p_1', status: 'enabled', budget: null, spent: 0 },
          { type: 'project', id: 'p_2', status: 'enabled', budget: 1000, spent: 0 },
          { type: 'wallet', user: 'u_2', balance: 1000 },
          { type: 'price', model: 'priced-*', input: 1, output: 1, per: 1 },
        ],
        config: variant.config,
      });
    });
    after(() => h.close());

    const countTokens = () =>
      send(h.url, {
        method: 'POST',
        path: '/v1/messages/count_tokens',
        headers: { 'x-api-key': h.keys.k_team!, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'priced-model', messages: [] }),
      });

    test('count_tokens passes while the budget lasts, and is refused 402 once settled usage has spent it', async () => {
      assert.equal((await countTokens()).status, 200, 'the budget is far from spent');
      const settled = waitForLine(h, (l) => l.msg === 'request' && l.route === 'chat.completions');
      const chat = await send(h.url, {
        method: 'POST',
        path: '/v1/chat/completions',
        headers: { authorization: `Bearer ${h.keys.k_team}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'priced-model', max_tokens: 1, messages: [] }),
      });
      assert.equal(chat.status, 200, 'a hold of a few tokens fits');
      assert.equal((await settled).input_tokens, 5000);
      const before = up.received.length;
      const res = await countTokens();
      assert.equal(res.status, 402, 'the replica still says spent 0: only the live ledger knows');
      assert.equal(res.headers['x-keyward-error'], 'key_budget_exhausted');
      assert.equal(up.received.length, before, 'nothing reached the upstream');
    });

    test('a budget spent live is 402 before a later step refuses: a key out of RPM, a bad body', async () => {
      const post = (body: string) =>
        send(h.url, { method: 'POST', path: '/v1/chat/completions', headers: { authorization: `Bearer ${h.keys.k_order}`, 'content-type': 'application/json' }, body });
      const chat = JSON.stringify({ model: 'priced-model', max_tokens: 1, messages: [] });
      const settled = waitForLine(h, (l) => l.msg === 'request' && l.key_id === 'k_order');
      assert.equal((await post(chat)).status, 200, 'the one request of the minute, far within the budget');
      assert.equal((await settled).input_tokens, 5000);
      const before = up.received.length;
      // The replica still says spent 0; the live ledger says 5,001 of 1,000.
      const late = await post(chat);
      assert.deepEqual([late.status, late.headers['x-keyward-error']], [402, 'key_budget_exhausted'], 'out of RPM as well, and step 5 comes first');
      const bad = await post('{"model":');
      assert.deepEqual([bad.status, bad.headers['x-keyward-error']], [402, 'key_budget_exhausted'], 'an unreadable body as well');
      assert.equal(up.received.length, before, 'nothing reached the upstream');
    });

    /** keyward_shadow_denials_total for `code` on /metrics now */
    const shadowCount = async (code: string): Promise<number> => {
      const text = (await send(`http://127.0.0.1:${h.sidecar.adminPort}`, { path: '/metrics' })).body.toString();
      return Number(new RegExp(`^keyward_shadow_denials_total\\{code="${code}"\\} (\\d+)$`, 'm').exec(text)?.[1] ?? 0);
    };

    test('budget shadowed and spent live: its code comes first in x-keyward-shadow, forwarded or refused by an enforced RPM', async () => {
      const post = (key: string) =>
        send(h.url, { method: 'POST', path: '/v1/chat/completions', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: JSON.stringify({ model: 'priced-model', max_tokens: 1, messages: [] }) });
      for (const id of ['k_sh_both', 'k_sh_budget']) {
        const settled = waitForLine(h, (l) => l.msg === 'request' && l.key_id === id);
        assert.equal((await post(h.keys[id]!)).status, 200, 'the one request of the minute');
        assert.equal((await settled).input_tokens, 5000, 'its usage spends the budget of 1,000');
      }
      // RPM and budget shadowed: forwarded; step 5's code before step 8's.
      const both = await post(h.keys.k_sh_both!);
      assert.equal(both.status, 200);
      assert.equal(both.headers['x-keyward-shadow'], 'key_budget_exhausted,rpm_exceeded');
      // Only the budget shadowed: the enforced RPM refuses, and the answer names the shadowed budget too.
      const rpm = await post(h.keys.k_sh_budget!);
      assert.deepEqual([rpm.status, rpm.headers['x-keyward-error']], [429, 'rpm_exceeded']);
      assert.equal(rpm.headers['x-keyward-shadow'], 'key_budget_exhausted');
      // The metric counts what enforcing would add: the forwarded request, not the refused one.
      assert.equal(await shadowCount('key_budget_exhausted'), 1);
    });

    test('only RPM shadowed, budget spent live: the 402 names no shadowed RPM, which step 5 comes before', async () => {
      const post = () =>
        send(h.url, { method: 'POST', path: '/v1/chat/completions', headers: { authorization: `Bearer ${h.keys.k_sh_rpm}`, 'content-type': 'application/json' }, body: JSON.stringify({ model: 'priced-model', max_tokens: 1, messages: [] }) });
      const settled = waitForLine(h, (l) => l.msg === 'request' && l.key_id === 'k_sh_rpm');
      assert.equal((await post()).status, 200, 'the one request of the minute');
      assert.equal((await settled).input_tokens, 5000, 'its usage spends the budget of 1,000');
      const shadowRpm = () => shadowCount('rpm_exceeded');
      const counted = await shadowRpm();
      const logged = waitForLine(h, (l) => l.msg === 'request' && l.key_id === 'k_sh_rpm' && l.status === 402);
      const late = await post();
      assert.deepEqual([late.status, late.headers['x-keyward-error']], [402, 'key_budget_exhausted']);
      assert.equal(late.headers['x-keyward-shadow'], undefined, 'enforcing RPM would have changed nothing');
      assert.equal((await logged).shadow, undefined);
      assert.equal(await shadowRpm(), counted, 'nor does the shadow count');
      // The same for a request that is not metered: count_tokens holds 0 at step 9.
      const counting = await send(h.url, { method: 'POST', path: '/v1/messages/count_tokens', headers: { 'x-api-key': h.keys.k_sh_rpm!, 'content-type': 'application/json' }, body: JSON.stringify({ model: 'priced-model', messages: [] }) });
      assert.deepEqual([counting.status, counting.headers['x-keyward-error'], counting.headers['x-keyward-shadow']], [402, 'key_budget_exhausted', undefined]);
    });

    test('only RPM shadowed, a hold that does not fit an unspent budget: the 402 still names the shadowed RPM', async () => {
      const post = (model: string) =>
        send(h.url, { method: 'POST', path: '/v1/chat/completions', headers: { authorization: `Bearer ${h.keys.k_sh_rpm_small}`, 'content-type': 'application/json' }, body: JSON.stringify({ model, max_tokens: 1, messages: [] }) });
      assert.equal((await post('free-model')).status, 200, 'the one request of the minute, holding 0');
      // About 15 tokens at 1 each do not fit a budget of 1 that nothing has spent: step 9's refusal, after step 8.
      const priced = await post('priced-model');
      assert.deepEqual([priced.status, priced.headers['x-keyward-error'], priced.headers['x-keyward-shadow']], [402, 'key_budget_exhausted', 'rpm_exceeded']);
      const message = (JSON.parse(priced.body.toString()) as { error: { message: string } }).error.message;
      assert.match(message, /could cost more than is left of this key's budget.*max_tokens/, 'not "used up": nothing is spent yet');
    });

    test('a holder spent live answers step 5 before a key budget the hold does not fit: the holder\'s code, "used up"', async () => {
      const chat = (key: string, maxTokens: number) =>
        send(h.url, {
          method: 'POST',
          path: '/v1/chat/completions',
          headers: { authorization: `Bearer ${h.keys[key]}`, 'content-type': 'application/json' },
          body: JSON.stringify({ model: 'priced-model', max_tokens: maxTokens, messages: [] }),
        });
      for (const [spender, small, code, usedUp] of [
        ['k_p2_spender', 'k_p2_small', 'project_budget_exhausted', /project's budget is used up/],
        ['k_w_spender', 'k_w_small', 'insufficient_balance', /wallet balance is used up/],
      ] as const) {
        const settled = waitForLine(h, (l) => l.msg === 'request' && l.key_id === spender);
        assert.equal((await chat(spender, 1)).status, 200);
        assert.equal((await settled).input_tokens, 5000, 'its usage spends the 1,000 its holder had');
        // About 100 tokens do not fit the key's own budget of 3, which nothing has spent.
        const before = up.received.length;
        const res = await chat(small, 100);
        assert.deepEqual([res.status, res.headers['x-keyward-error']], [402, code], 'the holder spent before this request comes first');
        assert.match((JSON.parse(res.body.toString()) as { error: { message: string } }).error.message, usedUp);
        assert.equal(up.received.length, before, 'nothing reached the upstream');
      }
    });

    test('a request refused 402 at its spend hold takes no request from the key\'s RPM', async () => {
      const chat = (model: string) =>
        send(h.url, {
          method: 'POST',
          path: '/v1/chat/completions',
          headers: { authorization: `Bearer ${h.keys.k_rpm}`, 'content-type': 'application/json' },
          body: JSON.stringify({ model, max_tokens: 1, messages: [] }),
        });
      // The priced request's hold (about 15 tokens at 1 each) does not fit a budget of 1.
      for (let i = 0; i < 2; i++) assert.equal((await chat('priced-model')).status, 402);
      // An unpriced request holds 0, which fits: the key's 2 requests a minute are both still there.
      assert.equal((await chat('free-model')).status, 200);
      assert.equal((await chat('free-model')).status, 200);
      assert.equal((await chat('free-model')).status, 429, 'the third request of the minute');
    });
  });
}
