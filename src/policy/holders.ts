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

/** What a key's or a project's record says of its budget. */
export interface BudgetRecord {
  id: string;
  budget: number | null;
  spent: number;
  epoch: number;
  period?: BudgetPeriod | null;
}

/** The key's own budget holder; null without a budget. */
export const keyHolder = (k: BudgetRecord): Holder | null =>
  k.budget === null ? null : { id: `key:${k.id}`, kind: 'budget', base: k.spent, limit: k.budget, epoch: k.epoch, code: 'key_budget_exhausted', period: k.period ?? null };

/** A project's budget holder; null without a budget. */
export const projectHolder = (p: BudgetRecord): Holder | null =>
  p.budget === null ? null : { id: `project:${p.id}`, kind: 'budget', base: p.spent, limit: p.budget, epoch: p.epoch, code: 'project_budget_exhausted', period: p.period ?? null };

/** A user's wallet holder (no wallet record: a balance of 0 at epoch 0). */
export const walletHolder = (userId: string, wallet: { balance: number; epoch: number } | null): Holder => ({
  id: `wallet:${userId}`, kind: 'wallet', base: wallet?.balance ?? 0, limit: null, epoch: wallet?.epoch ?? 0, code: 'insufficient_balance',
});

function build(facts: KeyFacts): Holders {
  const { key, project } = facts;
  const holders: Holder[] = [];
  const own = keyHolder(key);
  if (own) holders.push(own);
  if (key.kind === 'team') {
    const shared = project ? projectHolder(project) : null;
    if (shared) holders.push(shared);
    return { tag: `p:${key.projectId ?? key.id}`, holders };
  }
  if (key.userId !== null) {
    const balance = facts.walletBalance;
    holders.push(walletHolder(key.userId, balance === null ? null : { balance, epoch: facts.walletEpoch ?? 0 }));
  }
  return { tag: `u:${key.userId ?? key.id}`, holders };
}
