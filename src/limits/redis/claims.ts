/**
 * Claims on Redis (Limiter.claimOnce, lua/claim.lua): one hash per holder beside its ledger,
 * `{<prefix>:t:<tag>}:c:<holder>`, holding the claims of the holder's latest epoch. One
 * script call per claim, on single node and Cluster alike (one key, so one hash slot).
 */
import { epochArg } from '../ledger.js';
import type { ClaimInput, ClaimResult } from '../limiter.js';
import { ledgerHashTag } from './ledger.js';
import type { RunScript } from './scripts.js';

export const claimKey = (prefix: string, input: Pick<ClaimInput, 'tag' | 'holder'>): string =>
  `${ledgerHashTag(prefix, input.tag)}:c:${encodeURIComponent(input.holder)}`;

/** The token that holds the claim, null for an older epoch (claim.lua). Rejects when Redis fails. */
export async function claimedByOnRedis(run: RunScript, prefix: string, input: ClaimInput): Promise<string | null> {
  const holder = await run('keywardClaim', [claimKey(prefix, input)], [epochArg(input.epoch), input.name, input.token, Math.max(1, Math.ceil(input.ttlMs))]);
  return typeof holder === 'string' ? holder : null;
}

/** Rejects when Redis fails; createLimiter turns that into `unavailable`. */
export async function claimOnRedis(run: RunScript, prefix: string, input: ClaimInput): Promise<ClaimResult> {
  return (await claimedByOnRedis(run, prefix, input)) === input.token ? 'claimed' : 'taken';
}
