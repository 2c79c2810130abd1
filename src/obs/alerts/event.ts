/**
 * Budget alerts (DESIGN section 13), the arithmetic and the event: which thresholds a
 * holder's live figures have reached, and the `budget.threshold` body with its signature.
 * Pure: data in, values out.
 */
import { createHmac } from 'node:crypto';
import type { Holder } from '../../policy/holders.js';

/** Money is compared in nano-units, as the ledger keeps it (src/limits/ledger.ts). */
const NANO = 1e9;
const nano = (amount: number): number => Math.round(amount * NANO);

/** A holder's live figures as the limits store reads them (the Limiter's LedgerFigure). */
export interface AlertFigure {
  id: string;
  /** live spend (budget) or live balance (wallet), holds included */
  live: number;
  /** the epoch the figures belong to */
  epoch: number;
  /** the figure when that epoch was first seen: a wallet's balance at its epoch */
  start: number;
}

export interface Standing {
  /** a budget's limit; a wallet's balance at its epoch */
  budget: number;
  /** live spend; a wallet's balance at its epoch less its live balance */
  spent: number;
  /** the thresholds reached, ascending */
  reached: number[];
}

/**
 * Where a holder stands against `thresholds` (ascending). Null when there is nothing to be a
 * fraction of: no budget, a budget of 0, a wallet that had nothing at its epoch.
 */
export function standing(holder: Pick<Holder, 'kind' | 'limit'>, figure: Pick<AlertFigure, 'live' | 'start'>, thresholds: readonly number[]): Standing | null {
  const budget = holder.kind === 'wallet' ? figure.start : holder.limit;
  if (budget === null || !(budget > 0) || !Number.isFinite(budget)) return null;
  const budgetNano = nano(budget);
  const spentNano = holder.kind === 'wallet' ? nano(figure.start) - nano(figure.live) : nano(figure.live);
  const reached = thresholds.filter((t) => spentNano >= Math.round(t * budgetNano));
  return { budget, spent: spentNano / NANO, reached };
}

/** One threshold a holder reached in one epoch, claimed by this instance. */
export interface Crossing {
  /** the holder's id as the ledger names it: `key:k_1`, `project:p_1`, `wallet:u_1` */
  holder: string;
  threshold: number;
  budget: number;
  spent: number;
  period: string | null;
  epoch: number;
  /** when it was found (ms since the Unix epoch) */
  at: number;
}

/** `key:k_1` -> { kind: 'key', id: 'k_1' } */
export function holderRef(id: string): { kind: string; id: string } {
  const at = id.indexOf(':');
  return at < 0 ? { kind: 'key', id } : { kind: id.slice(0, at), id: id.slice(at + 1) };
}

/** The body POSTed for a crossing, fields in the order DESIGN section 13 lists them. */
export function eventBody(c: Crossing): string {
  return JSON.stringify({
    type: 'budget.threshold',
    holder: holderRef(c.holder),
    threshold: c.threshold,
    budget: c.budget,
    spent: c.spent,
    period: c.period,
    epoch: c.epoch,
    at: new Date(c.at).toISOString(),
  });
}

/** `x-keyward-signature`'s value: the hex HMAC-SHA256 of the body's bytes with the secret. */
export function signature(body: string, secret: string): string {
  return `sha256=${createHmac('sha256', secret).update(body, 'utf8').digest('hex')}`;
}
