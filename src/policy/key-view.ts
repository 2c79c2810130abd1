/**
 * What `GET /v1/key` answers (DESIGN section 11): the caller's own key, its limits, what
 * remains of them, and its live budget or balance. Pure: the live figures are handed in.
 * Never the key or its hash.
 */
import type { KeyFacts } from './facts.js';

export type Period = 'day' | 'week' | 'month';

/** The next UTC calendar boundary of a budget period (weeks start on Monday). */
export function periodResetsAt(period: Period, now: number): Date {
  const d = new Date(now);
  const y = d.getUTCFullYear();
  const m = d.getUTCMonth();
  const day = d.getUTCDate();
  if (period === 'day') return new Date(Date.UTC(y, m, day + 1));
  if (period === 'month') return new Date(Date.UTC(y, m + 1, 1));
  const sinceMonday = (d.getUTCDay() + 6) % 7;
  return new Date(Date.UTC(y, m, day - sinceMonday + 7));
}

export interface LiveFigures {
  /** what remains of the key's own RPM and TPM buckets; null for a limit the key does not have */
  remaining: { requests: number | null; tokens: number | null };
  /** live spend of the budget shown (holds in flight included); null: the replica's figure */
  spent: number | null;
  /** live wallet balance; null: the replica's figure */
  balance: number | null;
}

const round = (n: number) => Math.round(n * 1e9) / 1e9;

export function keyView(facts: KeyFacts, live: LiveFigures, now: number) {
  const { key, project } = facts;
  // The key's own budget; a team key without one shows its project's.
  const own = key.budget !== null;
  const holder = own ? { limit: key.budget!, spent: key.spent, period: key.period } : project?.budget != null ? { limit: project.budget, spent: project.spent, period: project.period ?? null } : null;
  const spent = holder ? round(live.spent ?? holder.spent) : 0;
  return {
    id: key.id,
    kind: key.kind,
    project: key.projectId,
    user: key.userId,
    models: key.models,
    limits: { rpm: key.rpm, tpm: key.tpm, concurrency: key.concurrency },
    remaining: live.remaining,
    budget: holder && {
      limit: holder.limit,
      spent,
      remaining: round(Math.max(0, holder.limit - spent)),
      period: holder.period,
      resets_at: holder.period ? periodResetsAt(holder.period, now).toISOString() : null,
    },
    balance: key.kind === 'personal' ? round(live.balance ?? facts.walletBalance ?? 0) : null,
  };
}
