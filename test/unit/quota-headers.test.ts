/**
 * The reset durations of the x-ratelimit-* headers (DESIGN section 11), written as OpenAI
 * writes them so its clients parse them: `1s`, `6m0s`.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { formatReset } from '../../src/proxy/quota-headers.js';

test('reset durations: milliseconds under a second, then seconds, minutes and hours as OpenAI writes them', () => {
  const cases: [number, string][] = [
    [0, '0ms'], [-5, '0ms'], [0.2, '1ms'], [771, '771ms'], [999, '999ms'],
    [1_000, '1s'], [1_500, '1.5s'], [59_863, '59.863s'], [59_999.5, '1m0s'],
    [60_000, '1m0s'], [106_800, '1m46.8s'], [360_000, '6m0s'], [3_599_999, '59m59.999s'],
    [3_600_000, '1h0m0s'], [3_661_500, '1h1m1.5s'], [86_400_000, '24h0m0s'],
  ];
  for (const [ms, text] of cases) assert.equal(formatReset(ms), text, `${ms} ms`);
});
