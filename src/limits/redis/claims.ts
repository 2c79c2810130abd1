/**
 * Claims on Redis (Limiter.claimOnce, lua/claim.lua): one hash per holder beside its ledger,
 * `{<prefix>:t:<tag>}:c:<holder>`, holding the claims of the holder's latest epoch. One
 * script call per claim, on single node and Cluster alike (one key, so one hash slot).
 */
import { epochArg } from '../ledger.js';
import { type ClaimInput, type ClaimResult, claimResult } from '../limiter.js';
import { ledgerHashTag } from './ledger.js';
import type { RunScript } from './scripts.js';

export const claimKey = (prefix: string, input: Pick<ClaimInput, 'tag' | 'holder'>): string =>
  `${ledgerHashTag(prefix, input.tag)}:c:${encodeURIComponent(input.holder)}`;

/** The token that holds the claim, null for an older epoch (claim.lua). Rejects when Redis fails. */
export async function claimedByOnRedis(run: RunScript, prefix: string, input: ClaimInput): Promise<string | null> {
  return (await claimOnRedisRaw(run, prefix, input)).holder;
}

/** Rejects when Redis fails; createLimiter turns that into `unavailable`. */
export async function claimOnRedis(run: RunScript, prefix: string, input: ClaimInput): Promise<ClaimResult> {
  const { holder, pending } = await claimOnRedisRaw(run, prefix, input);
  return claimResult(input.token, holder, pending);
}

async function claimOnRedisRaw(run: RunScript, prefix: string, input: ClaimInput): Promise<{ holder: string | null; pending: boolean }> {
  const args = [epochArg(input.epoch), input.name, input.token, Math.max(1, Math.ceil(input.ttlMs)), Math.max(0, Math.ceil(input.pendingMs ?? 0)), input.turn ?? ''];
  const reply = await run('keywardClaim', [claimKey(prefix, input)], args);
  const [holder, pending] = Array.isArray(reply) ? reply : [reply, 0];
  return { holder: typeof holder === 'string' && holder !== '' ? holder : null, pending: Number(pending) === 1 };
}
