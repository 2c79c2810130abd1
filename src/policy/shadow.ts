/**
 * Shadow limits (DESIGN section 12): the checks that may be evaluated without being
 * enforced, named in the config's `limits.shadow` and a key record's `shadow` field; a key's
 * set is the union of both. Pure.
 */

/** The names of the checks that can be shadowed, as DESIGN section 12 lists them. */
export const SHADOW_CHECKS = ['rpm', 'tpm', 'concurrency', 'route', 'model', 'budget'] as const;
export type ShadowCheck = (typeof SHADOW_CHECKS)[number];

/** A set of shadowed checks as bits: a union is one `|`, with nothing allocated per request. */
export type ShadowSet = number;
export const NO_SHADOW: ShadowSet = 0;

const BIT: Readonly<Record<ShadowCheck, number>> = { rpm: 1, tpm: 2, concurrency: 4, route: 8, model: 16, budget: 32 };

export const isShadowCheck = (name: string): name is ShadowCheck => Object.hasOwn(BIT, name);

/** The set a list names; names this build does not know are left out. */
export function shadowSet(names: readonly string[] | null | undefined): ShadowSet {
  let set = NO_SHADOW;
  for (const n of names ?? []) if (isShadowCheck(n)) set |= BIT[n];
  return set;
}

export const isShadowed = (set: ShadowSet, check: ShadowCheck): boolean => (set & BIT[check]) !== 0;

/**
 * The names a list holds that this build knows, once each, in SHADOW_CHECKS order: what a
 * replica keeps of a record's `shadow` field (a newer console may name checks it does not
 * know; those stay enforced).
 */
export function knownShadowChecks(names: readonly string[] | null | undefined): ShadowCheck[] {
  const set = shadowSet(names);
  return SHADOW_CHECKS.filter((c) => isShadowed(set, c));
}

/** A key's shadowed checks as the stores keep them (replica and console): a JSON list of the known names, null for none. */
export function shadowColumn(names: readonly string[] | null | undefined): string | null {
  const known = knownShadowChecks(names);
  return known.length === 0 ? null : JSON.stringify(known);
}

/** Adds a would-be refusal's code to a request's shadow codes: each code once, in decision order. */
export function addShadowCode(codes: string[], code: string): void {
  if (!codes.includes(code)) codes.push(code);
}
