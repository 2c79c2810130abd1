/**
 * Step 5 with live spend (DESIGN section 5): a budget is exhausted when its live ledger says
 * so, and the replica's figures, which step 5 reads, can lag it. So a model request that a
 * later step (6 to 8) refuses, or would refuse under shadow, asks its ledgers with a hold of
 * 0 (which takes nothing) and is answered as step 5 would have. Only on those requests: one
 * that gets through learns the same at step 9, where it takes its hold.
 */
import { deny, type Denial } from '../errors.js';
import type { Limiter, RedisWait } from '../limits/limiter.js';
import type { KeyFacts } from '../policy/facts.js';
import { holdersOf, type Holder } from '../policy/holders.js';
import { addExhaustedBudgetCode } from '../policy/shadow.js';

export interface LiveBudgetInput {
  facts: KeyFacts;
  /** the request's wait on Redis (limiter.ts) */
  wait: RedisWait;
  /** `budget` is shadowed for this key: exhausted budgets are recorded, not refused */
  shadowed: boolean;
  /** the request's shadow codes, in decision order */
  codes: string[];
}

/** The 402 a live-spent budget answers with, or null (none spent, shadowed, or no answer from the store). */
export async function liveBudgetDenial(limiter: Pick<Limiter, 'hold'>, o: LiveBudgetInput): Promise<Denial | null> {
  const { tag, holders } = holdersOf(o.facts);
  if (holders.length === 0) return null;
  if (o.shadowed) {
    await recordExhausted(limiter, { tag, holders, wait: o.wait, codes: o.codes });
    return null;
  }
  const held = await limiter.hold({ wait: o.wait, tag, holders, amount: 0 });
  if (held.ok) {
    held.hold.settle(0);
    return null;
  }
  return held.code === 'limits_unavailable' ? null : deny(held.code);
}

/** Under shadow: each exhausted holder's code goes where step 5 would have put it. */
async function recordExhausted(limiter: Pick<Limiter, 'hold'>, o: { tag: string; holders: Holder[]; wait: RedisWait; codes: string[] }): Promise<void> {
  let holders = o.holders;
  while (holders.length > 0) {
    const held = await limiter.hold({ wait: o.wait, tag: o.tag, holders, amount: 0 });
    if (held.ok) return held.hold.settle(0);
    if (held.code === 'limits_unavailable') return;
    const code = held.code;
    addExhaustedBudgetCode(o.codes, code);
    const rest = holders.filter((h) => h.code !== code);
    if (rest.length === holders.length) return;
    holders = rest;
  }
}
