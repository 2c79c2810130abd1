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
  /** live spend of the key's and the project's budgets (holds in flight included); null: the replica's figure */
  spent: { key: number | null; project: number | null };
  /** live wallet balance; null: the replica's figure */
  balance: number | null;
}

const round = (n: number) => Math.round(n * 1e9) / 1e9;

interface BudgetFigure { limit: number; spent: number; period: Period | null }

/**
 * The budget a team key is held to first: of its own and its project's, the one with less
 * left (a key with room in its own budget is still refused once its project's is spent), the
 * key's own on a tie.
 */
function bindingBudget(facts: KeyFacts, spent: LiveFigures['spent']): BudgetFigure | null {
  const { key, project } = facts;
  const own = key.budget !== null ? { limit: key.budget, spent: round(spent.key ?? key.spent), period: key.period } : null;
  const shared = project?.budget != null ? { limit: project.budget, spent: round(spent.project ?? project.spent), period: project.period ?? null } : null;
  if (own === null || shared === null) return own ?? shared;
  return shared.limit - shared.spent < own.limit - own.spent ? shared : own;
}

export function keyView(facts: KeyFacts, live: LiveFigures, now: number) {
  const { key } = facts;
  const budget = bindingBudget(facts, live.spent);
  return {
    id: key.id,
    kind: key.kind,
    project: key.projectId,
    user: key.userId,
    models: key.models,
    limits: { rpm: key.rpm, tpm: key.tpm, concurrency: key.concurrency },
    remaining: live.remaining,
    budget: budget && {
      limit: budget.limit,
      spent: budget.spent,
      remaining: round(Math.max(0, budget.limit - budget.spent)),
      period: budget.period,
      resets_at: budget.period ? periodResetsAt(budget.period, now).toISOString() : null,
    },
    balance: key.kind === 'personal' ? round(live.balance ?? facts.walletBalance ?? 0) : null,
  };
}
