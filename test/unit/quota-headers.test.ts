/**
 * The x-ratelimit-* headers (DESIGN section 11): reset durations written as OpenAI writes
 * them so its clients parse them (`1s`, `6m0s`), and the remaining figures.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { addQuotaHeaders, formatReset } from '../../src/proxy/quota-headers.js';

test('reset durations: milliseconds under a second, then seconds, minutes and hours as OpenAI writes them', () => {
  const cases: [number, string][] = [
    [0, '0ms'], [-5, '0ms'], [0.2, '1ms'], [771, '771ms'], [999, '999ms'],
    [1_000, '1s'], [1_500, '1.5s'], [59_863, '59.863s'], [59_999.5, '1m0s'],
    [60_000, '1m0s'], [106_800, '1m46.8s'], [360_000, '6m0s'], [3_599_999, '59m59.999s'],
    [3_600_000, '1h0m0s'], [3_661_500, '1h1m1.5s'], [86_400_000, '24h0m0s'],
  ];
  for (const [ms, text] of cases) assert.equal(formatReset(ms), text, `${ms} ms`);
});

function lines(quota: Parameters<typeof addQuotaHeaders>[1]): Record<string, string> {
  const out: Record<string, string> = {};
  addQuotaHeaders({ add: (n, v) => void (out[n] = v) }, quota);
  return out;
}

// Buckets refill continuously, so `remaining` is fractional: the header says the whole
// requests or tokens that fit now (rounded down, never below 0), never one that does not.
test('remaining is rounded down and held at 0; a key without a limit gets no header for it', () => {
  const both = { requests: { limit: 10, remaining: 4.7, resetMs: 1500 }, tokens: { limit: 1000, remaining: 0.999, resetMs: 60_000 } };
  assert.deepEqual(lines(both), {
    'x-ratelimit-limit-requests': '10',
    'x-ratelimit-remaining-requests': '4',
    'x-ratelimit-reset-requests': '1.5s',
    'x-ratelimit-limit-tokens': '1000',
    'x-ratelimit-remaining-tokens': '0',
    'x-ratelimit-reset-tokens': '1m0s',
  });
  assert.deepEqual(lines({ requests: null, tokens: { limit: 5, remaining: -3.2, resetMs: 10 } }), {
    'x-ratelimit-limit-tokens': '5',
    'x-ratelimit-remaining-tokens': '0',
    'x-ratelimit-reset-tokens': '10ms',
  });
  assert.deepEqual(lines({ requests: null, tokens: null }), {});
});
