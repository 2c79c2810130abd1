/** The Redis clock behind call deadlines (limits/redis/clock.ts), on an injected local clock. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRedisClock, UNKNOWN_OFFSET_MS } from '../../src/limits/redis/clock.js';

test('before any reply a call still has a deadline: local time, a margin for Redis ahead, and the stale bound', () => {
  let t = 1_000_000;
  const clock = createRedisClock(75, () => t);
  // A call sent before the first reply used to carry no deadline and ran whenever Redis got to it.
  assert.equal(clock.deadline(), 1_000_000 + UNKNOWN_OFFSET_MS + 75);
  t += 10;
  assert.equal(clock.deadline(), 1_000_010 + UNKNOWN_OFFSET_MS + 75);
});

test('a reply teaches the offset; the largest recent sample wins and decays by 1 ms a second', () => {
  let t = 1_000_000;
  const clock = createRedisClock(75, () => t);
  clock.learn(1_000_000 + 5_000); // Redis 5 s ahead
  assert.equal(clock.deadline(), 1_000_000 + 5_000 + 75);
  clock.learn(t + 4_000); // a lower sample (a slow reply) does not pull it down
  assert.equal(clock.deadline(), 1_000_000 + 5_000 + 75);
  t += 10_000;
  clock.learn(t - 2_000); // 10 s later, Redis seems behind: the offset decays by 10 ms, no more
  assert.equal(clock.deadline(), t + 4_990 + 75);
  clock.learn(undefined);
  assert.equal(clock.deadline(), t + 4_990 + 75, 'a reply without a time changes nothing');
});

test('without a stale bound no deadline is sent', () => {
  assert.equal(createRedisClock(undefined).deadline(), 0);
});
