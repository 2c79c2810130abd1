import assert from 'node:assert/strict';
import { test } from 'node:test';
import { settleUsage, type FinishedRequest } from '../../src/policy/estimate.js';
import { keyView, periodResetsAt } from '../../src/policy/key-view.js';
import type { KeyFacts } from '../../src/policy/facts.js';

const base: FinishedRequest = { usage: null, textChars: 0, promptTokens: 100, reservedOutput: 1024, upstreamStatus: 200, upstreamFailed: false, deferred: false };

// [what, request, expected settlement]
const CASES: [string, Partial<FinishedRequest>, ReturnType<typeof settleUsage>][] = [
  ['reported usage wins', { usage: { input_tokens: 7, output_tokens: 3 }, textChars: 400 }, { input_tokens: 7, output_tokens: 3, estimated: false }],
  ['no usage: prompt estimate + ceil(chars / 4)', { textChars: 41 }, { input_tokens: 100, output_tokens: 11, estimated: true }],
  ['no usage, nothing seen: never zero output', { textChars: 0 }, { input_tokens: 100, output_tokens: 1, estimated: true }],
  ['unreadable response: the whole reservation', { textChars: null }, { input_tokens: 100, output_tokens: 1024, estimated: true }],
  ['client gone before the response (499, no status)', { upstreamStatus: null, textChars: 0 }, { input_tokens: 100, output_tokens: 1, estimated: true }],
  ['upstream unreachable or timed out before any output: nothing', { upstreamStatus: null, upstreamFailed: true }, null],
  ['upstream 5xx without usage: nothing', { upstreamStatus: 503 }, null],
  ['upstream 4xx without usage: nothing was generated', { upstreamStatus: 400 }, null],
  ['an error status after generated text and no usage: the estimate', { upstreamStatus: 500, textChars: 41 }, { input_tokens: 100, output_tokens: 11, estimated: true }],
  ['a reported input alone (a stream cut before its final counts): that input, the output from the text', { usage: { input_tokens: 100_000, output_tokens: 1 }, inputOnly: true, textChars: 41 }, { input_tokens: 100_000, output_tokens: 11, estimated: true }],
  ['a reported input alone, the text unreadable: the whole reserved output', { usage: { input_tokens: 7, output_tokens: 1 }, inputOnly: true, textChars: null }, { input_tokens: 7, output_tokens: 1024, estimated: true }],
  ['a reported input alone, nothing generated yet: never zero output', { usage: { input_tokens: 7, output_tokens: 0 }, inputOnly: true, textChars: 0 }, { input_tokens: 7, output_tokens: 1, estimated: true }],
  ['an error status that still reports usage is billed', { upstreamStatus: 500, usage: { input_tokens: 5, output_tokens: 0 } }, { input_tokens: 5, output_tokens: 0, estimated: false }],
  ['a background response (answered before its generation): the whole reservation', { deferred: true, textChars: 0 }, { input_tokens: 100, output_tokens: 1024, estimated: true }],
  ['a background response that reports usage after all is billed at it', { deferred: true, usage: { input_tokens: 7, output_tokens: 30 } }, { input_tokens: 7, output_tokens: 30, estimated: false }],
  ['reported zero output beside generated text: the text counts', { usage: { input_tokens: 11, output_tokens: 0 }, textChars: 400 }, { input_tokens: 11, output_tokens: 100, estimated: true }],
  ['reported zero output, no text seen (embeddings): zero', { usage: { input_tokens: 11, output_tokens: 0 }, textChars: 0 }, { input_tokens: 11, output_tokens: 0, estimated: false }],
  ['a figure past any real request is held to 10 M', { usage: { input_tokens: 2 ** 40, output_tokens: 2 ** 40 } }, { input_tokens: 10_000_000, output_tokens: 10_000_000, estimated: true }],
];

for (const [what, over, expected] of CASES) {
  test(`settlement: ${what}`, () => assert.deepEqual(settleUsage({ ...base, ...over }), expected));
}

test('period boundaries are UTC calendar days, Monday weeks and months', () => {
  const now = Date.UTC(2026, 10, 25, 15, 30); // Wednesday 25 Nov 2026
  assert.equal(periodResetsAt('day', now).toISOString(), '2026-11-26T00:00:00.000Z');
  assert.equal(periodResetsAt('week', now).toISOString(), '2026-11-30T00:00:00.000Z');
  assert.equal(periodResetsAt('month', now).toISOString(), '2026-12-01T00:00:00.000Z');
  assert.equal(periodResetsAt('month', Date.UTC(2026, 11, 31, 23)).toISOString(), '2027-01-01T00:00:00.000Z');
  assert.equal(periodResetsAt('week', Date.UTC(2026, 10, 30, 0, 0)).toISOString(), '2026-12-07T00:00:00.000Z', 'on Monday itself: the next Monday');
});

test('key view: figures, live spend and balance, never the hash', () => {
  const facts: KeyFacts = {
    key: { id: 'k_1', kind: 'team', userId: null, projectId: 'p_1', status: 'active', budget: 10, spent: 2, models: ['gpt-4o*'], routing: null, rpm: 60, tpm: null, concurrency: 2, epoch: 3, ips: null, allowBrowser: false, modelLimits: null, period: 'month', shadow: [] },
    project: { id: 'p_1', status: 'enabled', budget: 100, spent: 50, epoch: 0 },
    walletBalance: null,
    walletEpoch: null,
  };
  const v = keyView(facts, { remaining: { requests: 59, tokens: null }, spent: { key: 2.5, project: null }, balance: null }, Date.UTC(2026, 10, 25));
  assert.deepEqual(v, {
    id: 'k_1', kind: 'team', project: 'p_1', user: null, models: ['gpt-4o*'],
    limits: { rpm: 60, tpm: null, concurrency: 2 },
    remaining: { requests: 59, tokens: null },
    budget: { limit: 10, spent: 2.5, remaining: 7.5, period: 'month', resets_at: '2026-12-01T00:00:00.000Z' },
    balance: null,
  });
  const personal = keyView({ ...facts, key: { ...facts.key, kind: 'personal', budget: null, projectId: null, userId: 'u_1' }, project: null, walletBalance: 5 }, { remaining: { requests: null, tokens: null }, spent: NO_SPEND, balance: 4.25 }, 0);
  assert.equal(personal.budget, null);
  assert.equal(personal.balance, 4.25);
  // A team key without a budget of its own shows its project's, with the project's period.
  const shared = keyView({ ...facts, key: { ...facts.key, budget: null }, project: { ...facts.project!, period: 'week' } }, { remaining: { requests: null, tokens: null }, spent: NO_SPEND, balance: null }, Date.UTC(2026, 10, 25));
  assert.deepEqual(shared.budget, { limit: 100, spent: 50, remaining: 50, period: 'week', resets_at: '2026-11-30T00:00:00.000Z' });
  // A key with room of its own in a project nearly spent shows the project's: it binds first.
  const bound = keyView(facts, { remaining: { requests: 59, tokens: null }, spent: { key: 1, project: 99.5 }, balance: null }, Date.UTC(2026, 10, 25));
  assert.deepEqual(bound.budget, { limit: 100, spent: 99.5, remaining: 0.5, period: null, resets_at: null });
  const tie = keyView(facts, { remaining: { requests: 59, tokens: null }, spent: { key: 1, project: 91 }, balance: null }, Date.UTC(2026, 10, 25));
  assert.equal(tie.budget?.limit, 10, 'the key\'s own on a tie');
});

const NO_SPEND = { key: null, project: null };
