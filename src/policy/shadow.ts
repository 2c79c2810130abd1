/**
 * Shadow limits (DESIGN section 12): checks evaluated without being enforced, named in the
 * config's `limits.shadow` and a key record's `shadow` field (src/protocol/shadow-checks.ts
 * holds the names); a key's set is the union of both. Pure.
 */
import { isShadowCheck, knownShadowChecks, type ShadowCheck } from '../protocol/shadow-checks.js';

/** A set of shadowed checks as bits: a union is one `|`, with nothing allocated per request. */
export type ShadowSet = number;
export const NO_SHADOW: ShadowSet = 0;

const BIT: Readonly<Record<ShadowCheck, number>> = { rpm: 1, tpm: 2, concurrency: 4, route: 8, model: 16, budget: 32 };

/** The set a list names; names this build does not know are left out. */
export function shadowSet(names: readonly string[] | null | undefined): ShadowSet {
  let set = NO_SHADOW;
  for (const n of names ?? []) if (isShadowCheck(n)) set |= BIT[n];
  return set;
}

export const isShadowed = (set: ShadowSet, check: ShadowCheck): boolean => (set & BIT[check]) !== 0;

/** A key's shadowed checks as the stores keep them (replica and console): a JSON list of the known names, null for none. */
export function shadowColumn(names: readonly string[] | null | undefined): string | null {
  const known = knownShadowChecks(names);
  return known.length === 0 ? null : JSON.stringify(known);
}

/** Adds a would-be refusal's code to a request's shadow codes: each code once, in decision order. */
export function addShadowCode(codes: string[], code: string): void {
  if (!codes.includes(code)) codes.push(code);
}

/** Step 5's codes: the budgets a key draws on, exhausted. */
const BUDGET_CODES: ReadonlySet<string> = new Set(['key_budget_exhausted', 'project_budget_exhausted', 'insufficient_balance']);

/** Whether shadowed checks of steps 6 to 8 (not budgets) have recorded codes. */
export const hasLaterStepCodes = (codes: readonly string[]): boolean => codes.some((c) => !BUDGET_CODES.has(c));

/** Leaves only step 5's codes: the request was refused at step 5, before the others' steps. */
export function dropLaterStepCodes(codes: string[]): void {
  let kept = 0;
  for (const c of codes) if (BUDGET_CODES.has(c)) codes[kept++] = c;
  codes.length = kept;
}

/**
 * Adds the code of a budget found exhausted by its live ledger after later steps have
 * recorded theirs: step 5 comes before them, so it goes before the first code that is not
 * a budget's.
 */
export function addExhaustedBudgetCode(codes: string[], code: string): void {
  if (codes.includes(code)) return;
  const at = codes.findIndex((c) => !BUDGET_CODES.has(c));
  if (at === -1) codes.push(code);
  else codes.splice(at, 0, code);
}
