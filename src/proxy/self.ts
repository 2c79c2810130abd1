/**
 * GET /v1/key (DESIGN section 11): answered by keyward, never forwarded. Reads what
 * remains of the key's limits and its live budget or balance from the limits store and
 * shapes them with the pure key view; never the key or its hash.
 */
import type { Limiter } from '../limits/limiter.js';
import type { KeyFacts } from '../policy/facts.js';
import { holdersOf } from '../policy/holders.js';
import { keyView } from '../policy/key-view.js';

export /** GET /v1/key: the key's figures with what remains of its limits and its live budget or balance. */
async function describeKey(limiter: Limiter, facts: KeyFacts): Promise<unknown> {
  const { key } = facts;
  const { tag, holders } = holdersOf(facts);
  const [quota, live] = await Promise.all([
    limiter.peek({ keyId: key.id, limits: { rpm: key.rpm, tpm: key.tpm, concurrency: key.concurrency } }),
    holders.length ? limiter.ledger({ tag, holders }) : Promise.resolve([]),
  ]);
  const figure = (id: string) => live.find((f) => f.id === id)?.live ?? null;
  // The budget shown is the key's own, else its project's (as keyView picks).
  const spent = key.budget !== null ? figure(`key:${key.id}`) : figure(`project:${key.projectId}`);
  const remaining = { requests: quota.requests ? Math.floor(quota.requests.remaining) : null, tokens: quota.tokens ? Math.floor(quota.tokens.remaining) : null };
  return keyView(facts, { remaining, spent, balance: figure(`wallet:${key.userId}`) }, Date.now());
}

