/**
 * What the decision pipeline answers (DESIGN section 5): an Allow that the exchange
 * forwards, or a Deny that it renders, each with what was learnt on the way.
 */
import type { Denial, ErrorStyle } from '../errors.js';
import type { Hold, Lease, Quota } from '../limits/limiter.js';
import type { Price } from '../policy/pricing.js';
import type { Estimate } from '../policy/estimate.js';
import type { KeyFacts } from '../policy/facts.js';
import type { Route } from '../routes.js';
import type { BodySource } from './body/read.js';

/** What was learnt before the decision, for the access line either way. */
export interface Seen {
  route: Route | null;
  facts: KeyFacts | null;
  upstream: string | null;
  model: string | null;
  /** codes of shadowed checks that would have refused, each once, in decision order (DESIGN section 12) */
  shadow: string[];
}

export interface Allow {
  allow: true;
  seen: Seen & { route: Route; facts: KeyFacts; upstream: string };
  /** what to forward instead of the request stream; null when nothing was consumed */
  body: BodySource | null;
  /** the body was read here, so an `Expect: 100-continue` has been answered already */
  bodyRead: boolean;
  /** held limits (null when nothing is limited); the exchange settles it */
  lease: Lease | null;
  /** the key's own RPM/TPM figures after this admission, for the x-ratelimit-* headers */
  quota: Quota;
  /** the spend hold on every budget the key draws on (null: none); the exchange settles it */
  hold: Hold | null;
  /** the price the hold was computed at, and the settlement will be */
  price: Price | null;
  /** the TPM reservation: prompt estimate plus the output reserved */
  tokens: number;
  estimate: Estimate;
  /**
   * A model request that generates: its usage is settled and billed. Not count_tokens,
   * and not a bodiless call on a stored response (a retrieval or a cancel generates nothing).
   */
  metered: boolean;
}

export interface Deny {
  allow: false;
  seen: Seen;
  denial: Denial;
  style: ErrorStyle;
  /** a 429 for the key's own RPM or TPM: the key's figures, sent as x-ratelimit-* headers (DESIGN section 11) */
  quota: Quota | null;
}

export type Decision = Allow | Deny;

/** Every Deny is built here: the route's error style, or openai before a route is known. */
export const denied = (seen: Seen, denial: Denial, quota: Quota | null = null): Deny => ({ allow: false, seen, denial, style: seen.route?.style ?? 'openai', quota });
