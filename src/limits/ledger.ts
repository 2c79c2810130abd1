/**
 * Spend-hold arithmetic (DESIGN section 6, "Money"): the one statement of these rules in
 * TypeScript (ledger-memory.ts uses it); lua/ledger-rules.lua states liveNano and holdFits
 * for the scripts (hold.lua, ledger.lua), and settle.lua applies settlements the same way.
 *
 * Money is kept in integer nano-units (1e-9 of the console's currency) so that sums of
 * holds and settlements never drift: holds round up (never hold less than the estimate),
 * settlements and replica figures round to the nearest unit. Lua numbers are doubles, so
 * figures stay exact up to 2^53 nano-units (about 9 million in the console's currency).
 *
 * Per holder: epoch, base0 (the replica figure when the epoch was first seen), settled
 * (costs settled since) and the holds in flight.
 *   budget: live spend   = max(base, base0 + settled) + holds
 *   wallet: live balance = min(base, base0 - settled) - holds
 * The max/min keeps a settled cost from counting twice once the console's own figure
 * includes it.
 */
import type { Holder } from '../policy/holders.js';

export const NANO = 1e9;
/** Ledger state is dropped a day after its last use; the next hold restarts it from the replica. */
export const LEDGER_TTL_MS = 86_400_000;

/** A fraction of a nano-unit below this is float noise (0.1 * 1e9 = 100000000.00000001). */
const NOISE = 1e-3;

/** A hold in nano-units, rounded up; an estimate that is not a number holds nothing, an infinite one never fits. */
export function holdNano(amount: number): number {
  if (Number.isNaN(amount) || amount <= 0) return 0;
  return Math.min(Number.MAX_SAFE_INTEGER, Math.ceil(amount * NANO - NOISE));
}
export const toNano = (amount: number): number => Math.round(amount * NANO);
/** What a hold of `heldNano` settles at: the actual cost, or, when that figure is unreadable, what was held rather than nothing. */
export const settledNano = (actual: number, heldNano: number): number =>
  // Bounded as a hold is: a cost past it would overflow the store's integer and be dropped.
  Number.isFinite(actual) ? Math.min(Number.MAX_SAFE_INTEGER, toNano(Math.max(0, actual))) : heldNano;
/** An epoch as the scripts take it: a whole number, never negative. */
export const epochArg = (epoch: number): number => Math.max(0, Math.floor(epoch));
export const fromNano = (nano: number): number => nano / NANO;

export interface LedgerState {
  epoch: number;
  base0: number;
  settled: number;
  held: number;
}

/**
 * The state a hold sees: a first or higher epoch restarts the ledger (null = restart);
 * a lower epoch (this instance's replica lags) keeps the stored ledger and trusts base0
 * over the stale figure.
 */
export function effectiveBase(state: LedgerState | undefined, holder: Pick<Holder, 'epoch'>, baseNano: number): { restart: boolean; base: number } {
  if (!state || holder.epoch > state.epoch) return { restart: true, base: baseNano };
  return { restart: false, base: holder.epoch < state.epoch ? state.base0 : baseNano };
}

/** Live spend (budget) or live balance (wallet) in nano-units. */
export function liveNano(kind: Holder['kind'], base: number, s: LedgerState): number {
  return kind === 'wallet' ? Math.min(base, s.base0 - s.settled) - s.held : Math.max(base, s.base0 + s.settled) + s.held;
}

/**
 * Whether a hold of `amount` nano fits one holder. A budget already at or over its limit
 * refuses even a zero hold (it is exhausted); a wallet needs a positive live balance.
 */
export function holdFits(kind: Holder['kind'], live: number, amount: number, limitNano: number | null): boolean {
  if (kind === 'wallet') return live > 0 && amount <= live;
  if (limitNano === null) return true;
  return live < limitNano && live + amount <= limitNano;
}
