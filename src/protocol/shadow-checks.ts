/**
 * The checks that may be shadowed (DESIGN section 12), as the config's `limits.shadow` and a
 * key record's `shadow` field name them: the vocabulary both sides of the sync protocol share.
 * What a shadowed check does is policy's (src/policy/shadow.ts). Pure.
 */

/** The names of the checks that can be shadowed, as DESIGN section 12 lists them. */
export const SHADOW_CHECKS = ['rpm', 'tpm', 'concurrency', 'route', 'model', 'budget'] as const;
export type ShadowCheck = (typeof SHADOW_CHECKS)[number];

export const isShadowCheck = (name: string): name is ShadowCheck => (SHADOW_CHECKS as readonly string[]).includes(name);

/**
 * The names a list holds that this build knows, once each, in SHADOW_CHECKS order: what a
 * replica keeps of a record's `shadow` field (a newer console may name checks it does not
 * know; those stay enforced).
 */
export function knownShadowChecks(names: readonly string[] | null | undefined): ShadowCheck[] {
  return names && names.length > 0 ? SHADOW_CHECKS.filter((c) => names.includes(c)) : [];
}
