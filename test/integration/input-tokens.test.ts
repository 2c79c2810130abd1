/**
 * OpenAI's token count for a Responses request (`POST /v1/responses/input_tokens`) is
 * counted as Anthropic's count_tokens is (DESIGN section 3: "model, never charged
 * tokens"): it is admitted like a model request (scope, RPM, budgets still refuse), but it
 * takes nothing from TPM, holds nothing, and sends the console no usage event.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { startHarness, waitForLine, type Harness } from '../helpers/sidecar.js';

let up: FakeUpstream;
let h: Harness;

before(async () => {
  up = await startFakeUpstream((_req, res) => {
    const text = JSON.stringify({ object: 'response.input_tokens', input_tokens: 11 });
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
    res.end(text);
  });
  h = await startHarness({
    upstream: up.url,
    keys: { k_me: { kind: 'personal', user: 'u_1', tpm: 5000, rpm: 100, models: ['gpt-4o*'] } },
    records: [{ type: 'wallet', user: 'u_1', balance: 10 }, { type: 'price', model: 'gpt-4o*', input: 1, output: 1, per: 1000 }],
  });
});
after(async () => {
  await h.close();
  await up.close();
});

test('input_tokens takes no TPM, holds nothing from the wallet and sends no usage event; scope still applies', async () => {
  const client = new OpenAI({ apiKey: h.keys.k_me!, baseURL: `${h.url}/v1`, maxRetries: 0 });
  for (let i = 0; i < 3; i++) {
    const line = waitForLine(h, (l) => l.msg === 'request' && l.route === 'responses.input_tokens' && l.req_id === `count-${i}`);
    const { data, response } = await client.responses.inputTokens
      .count({ model: 'gpt-4o', input: 'hello there' }, { headers: { 'x-request-id': `count-${i}` } })
      .withResponse();
    assert.equal(data.input_tokens, 11);
    assert.equal(response.headers.get('x-ratelimit-remaining-tokens'), '5000', 'no TPM reserved');
    assert.equal(response.headers.get('x-ratelimit-remaining-requests'), String(99 - i), 'RPM counts it');
    await line;
  }
  assert.deepEqual(h.usage.filter((e) => e.request_id.startsWith('count-')), [], 'no usage event: nothing was generated');
  const key = (await client.get('/key')) as { balance: number };
  assert.equal(key.balance, 10, 'nothing held or spent from the wallet');
  await assert.rejects(client.responses.inputTokens.count({ model: 'o3', input: 'hi' }), (e: Error) => e instanceof OpenAI.PermissionDeniedError);
});
