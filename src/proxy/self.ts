/**
 * GET /v1/key (DESIGN section 11): answered by keyward, never forwarded. Reads what
 * remains of the key's limits and its live budget or balance from the limits store and
 * shapes them with the pure key view; never the key or its hash.
 */
import type { ServerResponse } from 'node:http';
import { deny } from '../errors.js';
import { LimitsUnavailableError, type Limiter } from '../limits/limiter.js';
import type { LogSink } from '../log.js';
import type { KeyFacts } from '../policy/facts.js';
import { holdersOf } from '../policy/holders.js';
import { keyView } from '../policy/key-view.js';
import type { RequestContext } from './context.js';
import { sendDenial } from './denial.js';

/** GET /v1/key: the key's figures with what remains of its limits and its live budget or balance. */
export async function describeKey(limiter: Limiter, facts: KeyFacts): Promise<unknown> {
  const { key } = facts;
  const { tag, holders } = holdersOf(facts);
  const [quota, live] = await Promise.all([
    limiter.peek({ keyId: key.id, limits: { rpm: key.rpm, tpm: key.tpm, concurrency: key.concurrency } }),
    holders.length ? limiter.ledger({ tag, holders }) : Promise.resolve([]),
  ]);
  const figure = (id: string) => live.find((f) => f.id === id)?.live ?? null;
  const spent = { key: figure(`key:${key.id}`), project: figure(`project:${key.projectId}`) };
  const remaining = { requests: quota.requests ? Math.floor(quota.requests.remaining) : null, tokens: quota.tokens ? Math.floor(quota.tokens.remaining) : null };
  return keyView(facts, { remaining, spent, balance: figure(`wallet:${key.userId}`) }, Date.now());
}


/** Writes the key view; 503 when the store is down and `onError: closed`, 500 when reading it failed otherwise. */
export function answerSelf(res: ServerResponse, ctx: RequestContext, o: { facts: KeyFacts; describeKey: (facts: KeyFacts) => Promise<unknown>; log: LogSink }): void {
  o.describeKey(o.facts).then(
    (view) => {
      const body = JSON.stringify(view);
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(body)), 'x-request-id': ctx.reqId, 'cache-control': 'no-store' });
      res.end(body);
    },
    (err: Error) => {
      if (err instanceof LimitsUnavailableError) return sendDenial(res, ctx, deny('limits_unavailable', { retryAfterMs: err.retryAfterMs }), { style: 'openai' });
      o.log.error({ req_id: ctx.reqId, err: err.message }, 'key view failed');
      sendDenial(res, ctx, deny('internal_error'), { style: 'openai' });
    },
  );
}
