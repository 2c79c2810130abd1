/**
 * Shadow evaluation over the Limiter contract (DESIGN section 12): the enforced algorithm
 * with a shadowed refusal turned into a forward. Admissions and holds are all or nothing and
 * name what refused; when that check is shadowed for the key, its code is recorded and the
 * limiter is asked again with that one check turned off (its limit treated as unlimited; for
 * a hold, without the refusing holder), until it admits or an enforced check refuses. A
 * would-be refusal so takes nothing from that check's bucket, slots or ledger, and every
 * other check takes and settles exactly as if all were enforced. The limiters and their
 * scripts stay as they are; a request with nothing shadowed makes the one call it always did.
 */
import { addShadowCode, isShadowed, NO_SHADOW, type ShadowSet } from '../policy/shadow.js';
import type { ShadowCheck } from '../protocol/shadow-checks.js';
import { isLimited, type AdmitInput, type AdmitResult, type HoldInput, type HoldResult, type LimitCheck, type Limiter, type LimitRefusal, type Quota, type QuotaFigures } from './limiter.js';

/** The shadow name that covers each check. */
const SHADOW_NAME: Readonly<Record<LimitCheck, ShadowCheck>> = {
  route_concurrency: 'route',
  route_rpm: 'route',
  rpm: 'rpm',
  tpm: 'tpm',
  concurrency: 'concurrency',
  model_rpm: 'model',
  model_tpm: 'model',
};

/** A conforming limiter refuses each check at most once: then it is off. The bound guards against one that does not. */
const MAX_ASKS = Object.keys(SHADOW_NAME).length + 1;

export interface ShadowOptions {
  /** the checks shadowed for this key (the config's and the key's own) */
  shadow: ShadowSet;
  /** the request's would-be refusal codes so far; each new one is added once, in decision order */
  codes: string[];
}

/** The admission with `check` turned off: its limit treated as unlimited. */
export function withoutCheck(input: AdmitInput, check: LimitCheck): AdmitInput {
  const { route, limits, modelLimit } = input;
  switch (check) {
    case 'route_concurrency':
      return { ...input, route: { ...route, concurrency: 0 } };
    case 'route_rpm':
      return { ...input, route: { ...route, rpm: 0 } };
    case 'rpm':
    case 'tpm':
    case 'concurrency':
      return { ...input, limits: { ...limits, [check]: null } };
    case 'model_rpm':
      return { ...input, modelLimit: modelLimit ? { ...modelLimit, rpm: null } : null };
    case 'model_tpm':
      return { ...input, modelLimit: modelLimit ? { ...modelLimit, tpm: null } : null };
  }
}

/**
 * Step 8 under shadow. The admitted quota shows a key's own RPM or TPM bucket that was turned
 * off as the refusal found it (remaining 0), as for an enforced limit: nothing took from it since.
 */
export function admitShadowed(limiter: Pick<Limiter, 'admit'>, input: AdmitInput, o: ShadowOptions): Promise<AdmitResult> {
  // Nothing shadowed (most keys): the limiter's own answer, with nothing in between.
  return o.shadow === NO_SHADOW ? limiter.admit(input) : askUntilEnforced(limiter, input, o);
}

async function askUntilEnforced(limiter: Pick<Limiter, 'admit'>, input: AdmitInput, o: ShadowOptions): Promise<AdmitResult> {
  let ask = input;
  let requests: QuotaFigures | null = null;
  let tokens: QuotaFigures | null = null;
  for (let n = 1; ; n++) {
    const r = await limiter.admit(ask);
    const shown = requests || tokens ? (q: Quota): Quota => ({ requests: requests ?? q.requests, tokens: tokens ?? q.tokens }) : null;
    if (r.ok) return shown ? { ok: true, lease: r.lease, quota: shown(r.quota) } : r;
    if (r.code === 'limits_unavailable') return r;
    // An enforced refusal (a 429 for the key's own TPM, say) shows a shadowed bucket's figures too.
    if (!isShadowed(o.shadow, SHADOW_NAME[r.check]) || n >= MAX_ASKS) return enforcedWait(limiter, ask, o.shadow, shown ? { ...r, quota: shown(r.quota) } : r);
    addShadowCode(o.codes, r.code);
    if (r.check === 'rpm') requests = r.quota.requests;
    if (r.check === 'tpm') tokens = r.quota.tokens;
    ask = withoutCheck(ask, r.check);
  }
}

/** Whether `check` still limits the admission `input` asks for. */
function limits(input: AdmitInput, check: LimitCheck): boolean {
  switch (check) {
    case 'route_concurrency':
      return isLimited(input.route.concurrency);
    case 'route_rpm':
      return isLimited(input.route.rpm);
    case 'rpm':
    case 'tpm':
    case 'concurrency':
      return isLimited(input.limits[check]);
    case 'model_rpm':
      return isLimited(input.modelLimit?.rpm);
    case 'model_tpm':
      return isLimited(input.modelLimit?.tpm);
  }
}

const ALL_CHECKS = Object.keys(SHADOW_NAME) as LimitCheck[];

/**
 * An enforced refusal's wait counts the enforced checks alone (DESIGN section 6: the time
 * until the request fits). A limiter's wait is the longest of every check that fails, and a
 * shadowed one failing after the enforced one would lengthen it, so the limiter is asked
 * once more with every shadowed check off: a refusal takes nothing. Should that ask fit
 * (the enforced bucket refilled in between), it is given back and the request may retry at once.
 */
async function enforcedWait(limiter: Pick<Limiter, 'admit'>, ask: AdmitInput, shadow: ShadowSet, refusal: LimitRefusal): Promise<LimitRefusal> {
  const checks = ALL_CHECKS.filter((c) => isShadowed(shadow, SHADOW_NAME[c]) && limits(ask, c));
  if (checks.length === 0) return refusal;
  const again = await limiter.admit(checks.reduce(withoutCheck, ask));
  if (again.ok) {
    again.lease.cancel();
    return { ...refusal, retryAfterMs: 0 };
  }
  return again.code === 'limits_unavailable' ? refusal : { ...refusal, retryAfterMs: Math.min(refusal.retryAfterMs, again.retryAfterMs) };
}

/** Step 9 under shadow: with `budget` shadowed, a holder that cannot fit the hold is left out of it. */
export function holdShadowed(limiter: Pick<Limiter, 'hold'>, input: HoldInput, o: ShadowOptions): Promise<HoldResult> {
  return isShadowed(o.shadow, 'budget') ? holdUntilEnforced(limiter, input, o) : limiter.hold(input);
}

async function holdUntilEnforced(limiter: Pick<Limiter, 'hold'>, input: HoldInput, o: ShadowOptions): Promise<HoldResult> {
  let ask = input;
  for (;;) {
    const r = await limiter.hold(ask);
    if (r.ok || r.code === 'limits_unavailable') return r;
    const holders = ask.holders.filter((h) => h.code !== r.code);
    if (holders.length === ask.holders.length) return r;
    addShadowCode(o.codes, r.code);
    ask = { ...ask, holders };
  }
}
