/**
 * Reading the refusals in admit.lua's and lease.lua's replies (their headers state the
 * shapes). A reply this build cannot read (an outcome, code or check it does not know, as a
 * script of another version could send) is an error, never a guess: UnknownScriptReplyError
 * rejects the call like a Redis failure, so it is counted and `onError` applies.
 */
import { CHECKS, CHECK_CODES, CODES, quotaFromReply, refusedQuota } from '../bucket.js';
import type { LimitCheck, LimitCode, LimitRefusal } from '../limiter.js';

/** A script answered with something this build does not know. */
export class UnknownScriptReplyError extends Error {
  constructor(script: string, reply: unknown) {
    super(`${script} answered ${JSON.stringify(reply)?.slice(0, 200) ?? String(reply)}, which this version of keyward does not know`);
    this.name = 'UnknownScriptReplyError';
  }
}

/** The entry `n` (1-based) of `list`, or undefined for anything else. */
const nth = <T>(list: readonly T[], n: unknown): T | undefined => (typeof n === 'number' && Number.isInteger(n) && n >= 1 ? list[n - 1] : undefined);

/** Throws unless the reply's outcome (its first entry) is one of `known`. */
export function knownOutcome(script: string, reply: unknown, known: readonly number[]): number[] {
  if (!Array.isArray(reply) || !known.includes(reply[0] as number)) throw new UnknownScriptReplyError(script, reply);
  return reply as number[];
}

/** Throws unless admit.lua's refusal names a known code and a check that answers with it. */
export function checkAdmitRefusal(v: number[]): void {
  const code = nth(CODES, v[1]);
  const check = nth(CHECKS, v[8]);
  if (code === undefined || check === undefined || CHECK_CODES[check] !== code) throw new UnknownScriptReplyError('admit.lua', v);
}

/** A refusal from a reply's wait (its third entry) and the key's quota figures in it. */
const refusal = (code: LimitCode, check: LimitCheck, v: number[], figures: number[], limits: { rpm: number; tpm: number }): LimitRefusal => ({
  ok: false,
  code,
  check,
  retryAfterMs: v[2] ?? 1,
  quota: refusedQuota(quotaFromReply(limits.rpm, limits.tpm, figures), check),
});

/** admit.lua's refusal (checked by checkAdmitRefusal); `limits`: the key's own RPM and TPM capacities. */
export function admitRefusal(v: number[], limits: { rpm: number; tpm: number }): LimitRefusal {
  const check = CHECKS[v[8]! - 1]!;
  return refusal(CHECK_CODES[check], check, v, v.slice(4, 8), limits);
}

/** lease.lua refuses only on the key's own limits: its code names the check. */
const LEASE_CHECKS: Partial<Record<LimitCode, LimitCheck>> = { rpm_exceeded: 'rpm', tpm_exceeded: 'tpm', concurrency_exceeded: 'concurrency' };

/** lease.lua's refusal; throws on a code it does not send. */
export function leaseRefusal(v: number[], limits: { rpm: number; tpm: number }): LimitRefusal {
  const code = nth(CODES, v[1]);
  const check = code && LEASE_CHECKS[code];
  if (!code || !check) throw new UnknownScriptReplyError('lease.lua', v);
  return refusal(code, check, v, v.slice(5, 9), limits);
}
