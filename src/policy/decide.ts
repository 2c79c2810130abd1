/**
 * The decision core (DESIGN section 5, steps 3-5 and 7). Pure: takes what the replica
 * knows about a key and returns an allowance or a denial. Steps 1-2 live in routes and
 * credentials, step 6 (the body) in the proxy, step 8 in the limiter.
 */
import { deny, type Denial } from '../errors.js';
import type { RouteClass } from '../routes.js';
import type { FactsKey, FactsProject } from './facts.js';
import { globMatch } from './glob.js';
import { addShadowCode } from './shadow.js';

/** The parts of the facts each decision reads (tests build just these). */
export type PolicyKey = Pick<FactsKey, 'id' | 'kind' | 'status' | 'budget' | 'spent' | 'models'>;
export type PolicyProject = Pick<FactsProject, 'status' | 'budget' | 'spent'>;
export interface PolicyFacts {
  key: PolicyKey;
  project: PolicyProject | null;
  walletBalance: number | null;
}

const exhausted = (spent: number, budget: number | null) => budget !== null && spent >= budget;

/** Step 3: a known key that is not deleted. `facts` null means no key has this hash. */
export function checkKey(facts: PolicyFacts | null, unknown: () => Denial): Denial | null {
  if (facts === null) return unknown();
  if (facts.key.status === 'deleted') return deny('api_key_deleted');
  return null;
}

/**
 * Step 5's budget checks under shadow (DESIGN section 12): with `budget` shadowed, an
 * exhausted budget or wallet adds its code to `codes` and the request goes on.
 */
export interface BudgetShadow {
  budget: boolean;
  codes: string[];
}

/** The denial of an exhausted budget or wallet, or null when `budget` is shadowed (its code recorded). */
function budgetDenial(code: 'key_budget_exhausted' | 'project_budget_exhausted' | 'insufficient_balance', shadow: BudgetShadow | undefined): Denial | null {
  if (!shadow?.budget) return deny(code);
  addShadowCode(shadow.codes, code);
  return null;
}

/** Steps 4-5: standing of the key's project or wallet for the route's class. */
export function checkStanding(facts: PolicyFacts, routeClass: RouteClass, shadow?: BudgetShadow): Denial | null {
  if (routeClass === 'listing' || routeClass === 'self') return null;
  const { key, project } = facts;
  if (routeClass === 'files') {
    // A team key whose project is missing from the replica is treated as disabled: fail closed.
    if (key.kind === 'team' && (project === null || project.status !== 'enabled')) {
      return deny('project_disabled', { status: 403 });
    }
    return null;
  }
  if (key.kind === 'team') {
    if (project === null || project.status !== 'enabled') {
      return deny('project_disabled', { status: 402 });
    }
    const keyBudget = exhausted(key.spent, key.budget) ? budgetDenial('key_budget_exhausted', shadow) : null;
    if (keyBudget) return keyBudget;
    return exhausted(project.spent, project.budget) ? budgetDenial('project_budget_exhausted', shadow) : null;
  }
  return (facts.walletBalance ?? 0) <= 0 ? budgetDenial('insufficient_balance', shadow) : null;
}

export function modelInScope(scope: readonly string[] | null, model: string): boolean {
  if (scope === null || scope.length === 0) return true;
  for (const glob of scope) if (globMatch(glob, model)) return true;
  return false;
}

/**
 * Step 7. A request that names no model (allowed on routes where the model is
 * optional upstream) passes an empty scope but not a restricted one, since the
 * upstream would pick a default model the key may not be allowed to use.
 */
export function checkModel(key: PolicyKey, model: string | null, shown: ShownAs = asSent): Denial | null {
  if (model === null) {
    if (key.models === null || key.models.length === 0) return null;
    return deny('model_not_allowed', { variant: 'unnamed' });
  }
  if (modelInScope(key.models, model)) return null;
  return deny('model_not_allowed', { params: { model: shown(truncate(model)) } });
}

/** Step 7 for the further models a body selects (`models`, `fallbacks`). */
export function checkModels(key: PolicyKey, models: readonly string[], shown: ShownAs = asSent): Denial | null {
  for (const m of models) if (!modelInScope(key.models, m)) return deny('model_not_allowed', { params: { model: shown(truncate(m)) } });
  return null;
}

/** How a refused model's name is repeated in the answer: the caller hides one that holds a key. */
export type ShownAs = (model: string) => string;
const asSent: ShownAs = (model) => model;

function truncate(s: string): string {
  // eslint-disable-next-line no-control-regex
  const clean = s.replace(/[\x00-\x1f\x7f]/g, '');
  return clean.length > 128 ? `${clean.slice(0, 128)}…` : clean;
}

/** The key's first `modelLimits` entry whose glob matches the model: its limits apply in addition to the key's own. */
export function modelLimitFor(key: Pick<FactsKey, 'modelLimits'>, model: string | null): { pattern: string; rpm: number | null; tpm: number | null } | null {
  if (model === null || !key.modelLimits) return null;
  const entry = key.modelLimits.find((m) => modelInScope([m.models], model));
  return entry ? { pattern: entry.models, rpm: entry.rpm, tpm: entry.tpm } : null;
}
