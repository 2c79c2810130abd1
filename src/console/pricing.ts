/**
 * Usage pricing from the console config: per-model anchored globs, first match wins,
 * prices per million input and output tokens. A model no entry matches (or a usage event
 * without a model) costs what `pricing.unpriced` says; the config requires it to be stated.
 */
import { globMatch } from '../policy/glob.js';
import type { ConsoleConfig } from './config.js';

export type Pricer = (usage: { model: string | null; inputTokens: number; outputTokens: number }) => number;

export function makePricer(pricing: ConsoleConfig['pricing']): Pricer {
  const table = pricing.models.map((m) => ({ glob: m.match, input: m.inputPerMillion, output: m.outputPerMillion }));
  const unpriced = { input: pricing.unpriced.inputPerMillion, output: pricing.unpriced.outputPerMillion };
  return ({ model, inputTokens, outputTokens }) => {
    const price = (model !== null && table.find((p) => globMatch(p.glob, model))) || unpriced;
    return (inputTokens * price.input + outputTokens * price.output) / 1_000_000;
  };
}
