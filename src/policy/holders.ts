/**
 * Who pays for a request (DESIGN section 6, "Money"): the budget holders a key draws on,
 * each with the replica's figure and epoch, and the one hash tag their ledgers share so
 * a hold on all of them is one atomic step. Pure.
 */
import type { KeyFacts } from './facts.js';
import type { BudgetPeriod } from './period.js';

export interface Holder {
  id: string;
  kind: 'budget' | 'wallet';
  base: number;
  limit: number | null;
  epoch: number;
  code: 'key_budget_exhausted' | 'project_budget_exhausted' | 'insufficient_balance';
  /** the budget's UTC calendar period, named in budget alerts (absent or null: none; a wallet has none) */
  period?: BudgetPeriod | null;
}

export interface Holders {
  /** team key: its project; personal key: its user */
  tag: string;
  holders: Holder[];
}

/**
 * One answer per facts object: the replica hands out the same facts for a key until that
 * key's records change (then new facts), so every request of a key would otherwise build the
 * same ids, tag and holders again, and the ledger's keys from them. Callers only read it.
 */
const memo = new WeakMap<KeyFacts, Holders>();

export function holdersOf(facts: KeyFacts): Holders {
  let h = memo.get(facts);
  if (h === undefined) memo.set(facts, (h = build(facts)));
  return h;
}

function build(facts: KeyFacts): Holders {
  const { key, project } = facts;
  const holders: Holder[] = [];
  if (key.budget !== null) {
    holders.push({ id: `key:${key.id}`, kind: 'budget', base: key.spent, limit: key.budget, epoch: key.epoch, code: 'key_budget_exhausted', period: key.period });
  }
  if (key.kind === 'team') {
    if (project && project.budget !== null) {
      holders.push({ id: `project:${project.id}`, kind: 'budget', base: project.spent, limit: project.budget, epoch: project.epoch, code: 'project_budget_exhausted', period: project.period ?? null });
    }
    return { tag: `p:${key.projectId ?? key.id}`, holders };
  }
  if (key.userId !== null) {
    holders.push({ id: `wallet:${key.userId}`, kind: 'wallet', base: facts.walletBalance ?? 0, limit: null, epoch: facts.walletEpoch ?? 0, code: 'insufficient_balance' });
  }
  return { tag: `u:${key.userId ?? key.id}`, holders };
}
