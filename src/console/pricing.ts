/**
 * Usage pricing from the console config: per-model anchored globs, first match wins,
 * prices per million input and output tokens. A model no entry matches (or a usage event
 * without a model) costs what `pricing.unpriced` says; the config requires it to be stated.
 */
import type { ConsoleConfig } from './config.js';

export type Pricer = (usage: { model: string | null; inputTokens: number; outputTokens: number }) => number;

/** `*` matches any run of characters; everything else is literal; the whole name must match. */
export function globToRegExp(glob: string): RegExp {
  const body = glob.split('*').map((part) => part.replace(/[.+?^${}()|[\]\\]/g, '\\$&')).join('.*');
  return new RegExp(`^${body}$`, 's');
}

export function makePricer(pricing: ConsoleConfig['pricing']): Pricer {
  const table = pricing.models.map((m) => ({ re: globToRegExp(m.match), input: m.inputPerMillion, output: m.outputPerMillion }));
  const unpriced = { input: pricing.unpriced.inputPerMillion, output: pricing.unpriced.outputPerMillion };
  return ({ model, inputTokens, outputTokens }) => {
    const price = (model !== null && table.find((p) => p.re.test(model))) || unpriced;
    return (inputTokens * price.input + outputTokens * price.output) / 1_000_000;
  };
}
