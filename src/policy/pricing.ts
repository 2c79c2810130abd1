/**
 * Prices from the console's `price` records (DESIGN section 7) and what a request costs
 * (section 6). Pure. The most specific record wins: one named exactly, else the longest
 * matching glob, so `gpt-4o-mini*` beats `gpt-4o*` whatever order the console sent them in.
 */
import { modelInScope } from './decide.js';

/** What `input` and `output` tokens cost, per `per` tokens, in the console's currency. */
export interface Price {
  input: number;
  output: number;
  per: number;
}

export interface PriceEntry extends Price {
  /** anchored glob (`*` the only wildcard), or an exact model name */
  model: string;
}

const wildcards = (glob: string) => glob.split('*').length - 1;

/**
 * Most specific first: longer patterns before shorter, then fewer wildcards (more literal
 * text), then by name, so equal candidates still pick the same entry every time.
 */
function moreSpecific(a: PriceEntry, b: PriceEntry): boolean {
  if (a.model.length !== b.model.length) return a.model.length > b.model.length;
  const wa = wildcards(a.model);
  const wb = wildcards(b.model);
  if (wa !== wb) return wa < wb;
  return a.model < b.model;
}

/**
 * The name a request or usage without a model is priced by: the catch-all record `*`, which
 * the console publishes for the rate it charges such usage, so both sides price it alike.
 */
export const priceName = (model: string | null): string => model ?? '*';

export function pickPrice(prices: readonly PriceEntry[], model: string): Price | null {
  let best: PriceEntry | null = null;
  for (const p of prices) {
    if (p.model === model) return { input: p.input, output: p.output, per: p.per };
    if (!p.model.includes('*')) continue;
    if ((best === null || moreSpecific(p, best)) && modelInScope([p.model], model)) best = p;
  }
  return best === null ? null : { input: best.input, output: best.output, per: best.per };
}

/** Cost of `tokens` at `price`; an unpriced model costs 0 (it holds nothing). */
export function costOf(price: Price | null, tokens: { input: number; output: number }): number {
  if (price === null) return 0;
  return (tokens.input * price.input + tokens.output * price.output) / price.per;
}
