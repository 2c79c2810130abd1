/**
 * Budget holders by id as the replica has them now: budget alerts check a holder again
 * with its latest figures when a check could not be made, or when the replica changed
 * (src/obs/alerts/watch.ts).
 */
import type Database from 'better-sqlite3';
import { keyHolder, projectHolder, walletHolder, type BudgetRecord, type Holder } from '../policy/holders.js';

/** `key:k_1`, `project:p_1`, `wallet:u_1` -> the holder now; null when there is none (no record, no budget). */
export function holderLookup(db: Database.Database): (id: string) => Holder | null {
  const key = db.prepare('SELECT id, budget, spent, epoch, period FROM keys WHERE id = ?');
  const project = db.prepare('SELECT id, budget, spent, epoch, period FROM projects WHERE id = ?');
  const wallet = db.prepare('SELECT balance, epoch FROM wallets WHERE user_id = ?');
  return (id) => {
    const at = id.indexOf(':');
    const kind = id.slice(0, at);
    const ref = id.slice(at + 1);
    if (kind === 'key' || kind === 'project') {
      const row = (kind === 'key' ? key : project).get(ref) as BudgetRecord | undefined;
      return row === undefined ? null : kind === 'key' ? keyHolder(row) : projectHolder(row);
    }
    if (kind === 'wallet') return walletHolder(ref, (wallet.get(ref) as { balance: number; epoch: number } | undefined) ?? null);
    return null;
  };
}
