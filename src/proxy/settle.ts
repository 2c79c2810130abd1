/**
 * The end of an exchange's billing: what a request is billed at, the limits and holds
 * settled to it, and the usage event the console receives.
 */
import { randomUUID } from 'node:crypto';
import type { KeyFacts } from '../policy/facts.js';
import { settledPrompt, settleUsage, type Settled } from '../policy/estimate.js';
import { costOf } from '../policy/pricing.js';
import { isoClock } from '../protocol/iso-clock.js';
import type { UsageEvent } from '../protocol/usage.js';
import type { RequestContext } from './context.js';
import { keyless } from './key-in-fields.js';

/**
 * Settles a request once its response has ended or either side went away: what it is
 * billed at follows the one rule in settleUsage (reported usage, else the estimate);
 * every limit it holds is settled to that, and its concurrency slots are freed.
 */
export function settle(ctx: RequestContext): void {
  // Once: a stalled body settles at the cut, and the response's end must not bill it again without the tap.
  if (ctx.settled === undefined && ctx.metered && ctx.upstreamStart !== null) {
    // A stream cut short still shows what it had generated so far.
    const tapped = ctx.tap?.end() ?? null;
    ctx.tap = null;
    ctx.settled = settleUsage({
      usage: tapped?.usage ?? null,
      // no tap: an unreadable response (null), or none at all because the client left first (nothing seen)
      textChars: tapped ? tapped.textChars : ctx.upstreamStatus === null ? 0 : null,
      inputOnly: tapped?.inputOnly === true,
      promptTokens: settledPrompt(ctx.estimate),
      reservedOutput: ctx.estimate.output,
      upstreamStatus: ctx.upstreamStatus,
      upstreamFailed: ctx.upstreamFailed,
      deferred: ctx.estimate.deferred,
    });
  }
  const settled = ctx.settled;
  ctx.lease?.finish({ tokens: settled ? settled.input_tokens + settled.output_tokens : 0 });
  // The hold becomes the actual cost; nothing generated releases it.
  ctx.hold?.settle(settled ? costOf(ctx.price, { input: settled.input_tokens, output: settled.output_tokens }) : 0);
}

/** a usage event's `at`: one clock for every event, as the access lines share theirs */
const isoNow = isoClock();

/** The usage event of a settled model response, for the console. */
export function usageEvent(ctx: RequestContext, settled: Settled, facts: KeyFacts, status: number): UsageEvent {
  return {
    // A generated request id is this request's alone; a client's may name many requests.
    event_id: ctx.clientReqId ? randomUUID() : ctx.reqId,
    request_id: ctx.reqId,
    key_id: facts.key.id,
    // The console keeps and shows usage: a model name holding a key is kept as the access line has it.
    model: keyless(ctx.model, ctx.keyPrefixes),
    input_tokens: settled.input_tokens,
    output_tokens: settled.output_tokens,
    status,
    at: isoNow(),
    ...(settled.estimated ? { estimated: true } : {}),
  };
}
