/**
 * The console's price table: what it charges usage at, and what it publishes to sidecars
 * as `price` records (DESIGN section 7) so their spend holds use the same prices. Both
 * pick a model's price the same way, through the shared pickPrice: an exact name, then the
 * longest matching glob; usage without a model is priced as `*` (priceName). A model no
 * entry matches costs what `pricing.unpriced` says; the config requires it to be stated.
 */
import type { DeleteChange, SyncRecord } from '../protocol/records.js';
import { costOf, pickPrice, priceName, type Price, type PriceEntry } from '../policy/pricing.js';
import type { ConsoleConfig } from './config.js';
import type { ConsoleStore } from './store.js';

export type Pricer = (usage: { model: string | null; inputTokens: number; outputTokens: number }) => number;

const PER = 1_000_000;

/**
 * The published table: one record per configured glob, prices per million tokens. A
 * non-zero `unpriced` rate is published as the catch-all `*` (the least specific glob, so
 * every other entry wins over it) unless the config names `*` itself, so sidecars hold
 * for models the console will charge for.
 */
export function priceTable(pricing: ConsoleConfig['pricing']): PriceEntry[] {
  const table = pricing.models.map((m) => ({ model: m.match, input: m.inputPerMillion, output: m.outputPerMillion, per: PER }));
  const { inputPerMillion: input, outputPerMillion: output } = pricing.unpriced;
  if ((input > 0 || output > 0) && !table.some((p) => p.model === '*')) table.push({ model: '*', input, output, per: PER });
  return table;
}

export function makePricer(pricing: ConsoleConfig['pricing']): Pricer {
  const table = priceTable(pricing);
  const unpriced: Price = { input: pricing.unpriced.inputPerMillion, output: pricing.unpriced.outputPerMillion, per: PER };
  return ({ model, inputTokens, outputTokens }) => {
    const price = pickPrice(table, priceName(model)) ?? unpriced;
    return costOf(price, { input: inputTokens, output: outputTokens });
  };
}

interface PriceRow { model: string; input: number; output: number; per: number }

/**
 * Makes the published price records match `table`: upserts for new and changed entries,
 * deletes for entries no longer there, in one write (nothing when nothing changed, so a
 * restart with the same config adds no changes to the feed).
 */
export function publishPrices(store: ConsoleStore, table: PriceEntry[]): { upserted: number; deleted: number } {
  return store.write(() => {
    const current = new Map((store.db.prepare('SELECT model, input, output, per FROM prices').all() as PriceRow[]).map((r) => [r.model, r]));
    const upsert = store.db.prepare(`INSERT INTO prices (model, input, output, per) VALUES (@model, @input, @output, @per)
      ON CONFLICT(model) DO UPDATE SET input = excluded.input, output = excluded.output, per = excluded.per`);
    const remove = store.db.prepare('DELETE FROM prices WHERE model = ?');
    const records: SyncRecord[] = [];
    const deletes: DeleteChange[] = [];
    const wanted = new Set<string>();
    for (const p of table) {
      wanted.add(p.model);
      const had = current.get(p.model);
      if (had && had.input === p.input && had.output === p.output && had.per === p.per) continue;
      upsert.run(p);
      records.push({ type: 'price', model: p.model, input: p.input, output: p.output, per: p.per });
    }
    for (const model of current.keys()) {
      if (wanted.has(model)) continue;
      remove.run(model);
      deletes.push({ op: 'delete', type: 'price', model });
    }
    return { result: { upserted: records.length, deleted: deletes.length }, records, deletes };
  });
}
