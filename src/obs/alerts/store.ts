/**
 * What the alerts need of the limits store, as structural types (obs/ imports nothing of
 * limits/): the composition root hands in the Limiter.
 */
import type { Holder } from '../../policy/holders.js';
import type { AlertFigure } from './event.js';

/** What the alerts read and claim: the Limiter's `ledger`, `claimOnce` and `claimedBy` (src/limits/limiter.ts). */
export interface AlertStore {
  /** `sharedOnly`: rejects when the shared store cannot answer, never this process's own figures */
  ledger(input: { tag: string; holders: Holder[]; sharedOnly: true }): Promise<AlertFigure[]>;
  /** `held`: another instance claimed it and has not delivered it yet (see ClaimRef) */
  claimOnce(input: ClaimRef & { ttlMs: number; pendingMs?: number; turn?: 'renew' | 'done' | 'release' }): Promise<'claimed' | 'taken' | 'held' | 'unavailable'>;
  /** the Limiter's claimedBy: who holds a claim, after `turn` when one is given (rejects when the store cannot answer) */
  claimedBy(input: ClaimRef & { ttlMs: number; pendingMs?: number; turn?: 'renew' | 'done' | 'release' }): Promise<string | null>;
}

/**
 * A crossing's claim in the store. It stays pending while its event is being delivered: the
 * claimer renews it with each attempt and says `done` once the event is delivered or given
 * up after its retry window, and `release` when it stops before (a shutdown). A claim left
 * pending past its time (its instance died) is taken over by the next instance that checks
 * the holder, which sends the event itself: so a crossing is sent once, and still sent when
 * the instance that claimed it goes away with it undelivered.
 */
export interface ClaimRef {
  tag: string;
  holder: string;
  epoch: number;
  name: string;
  token: string;
}
