/**
 * UTC calendar periods of budgets (DESIGN sections 7, 8 and 11): a day, an ISO week
 * (starting Monday 00:00 UTC) or a calendar month. Pure: the console restarts a budget at
 * each boundary, the sidecar shows when the next one comes.
 */

export type BudgetPeriod = 'day' | 'week' | 'month';

const DAY_MS = 86_400_000;

/** Start (ms since the epoch) of the period that contains `ms`. */
export function periodStart(period: BudgetPeriod, ms: number): number {
  const d = new Date(ms);
  const midnight = Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), d.getUTCDate());
  if (period === 'day') return midnight;
  if (period === 'week') return midnight - ((d.getUTCDay() + 6) % 7) * DAY_MS; // getUTCDay: 0 = Sunday
  return Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), 1);
}

/** Start of the period after the one that contains `ms`: when the budget restarts next. */
export function nextPeriodStart(period: BudgetPeriod, ms: number): number {
  const start = periodStart(period, ms);
  if (period === 'day') return start + DAY_MS;
  if (period === 'week') return start + 7 * DAY_MS;
  const d = new Date(start);
  return Date.UTC(d.getUTCFullYear(), d.getUTCMonth() + 1, 1);
}
