/**
 * keyward_decision_seconds (DESIGN section 9), counted in plain numbers and written in
 * Prometheus' text format at scrape time, as prom-client writes a histogram (the unit
 * test holds the two to the same text). Every request is observed once, and prom-client's
 * `observe` builds and hashes a label set, validates it and turns the bucket's bound into
 * a property name on each call; here an observation is a scan of ten bounds and three
 * additions. With `serve --workers N` each worker hands its counts to the primary, which
 * adds them up.
 */

export type Outcome = 'allow' | 'deny';

const DECISION_NAME = 'keyward_decision_seconds';
const HELP = 'Time from request arrival to the allow/deny decision';
const DECISION_BOUNDS: readonly number[] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5];

/** One outcome's counts: `buckets[i]` holds the values in (bound i-1, bound i]; larger ones are only in `count`. */
export interface OutcomeCounts {
  outcome: Outcome;
  buckets: number[];
  sum: number;
  count: number;
}

/** Plain data (it crosses the workers' IPC channel), in the order the outcomes were first seen. */
export type DecisionCounts = OutcomeCounts[];

const fresh = (outcome: Outcome): OutcomeCounts => ({ outcome, buckets: DECISION_BOUNDS.map(() => 0), sum: 0, count: 0 });

export class DecisionHistogram {
  readonly #seen: OutcomeCounts[] = [];
  #allow: OutcomeCounts | null = null;
  #deny: OutcomeCounts | null = null;

  observe(outcome: Outcome, seconds: number): void {
    // prom-client refuses such a value; a clock difference never is one
    if (!Number.isFinite(seconds)) return;
    const c = outcome === 'allow' ? (this.#allow ??= this.#add('allow')) : (this.#deny ??= this.#add('deny'));
    let i = 0;
    while (i < DECISION_BOUNDS.length && seconds > DECISION_BOUNDS[i]!) i++;
    if (i < DECISION_BOUNDS.length) c.buckets[i]!++;
    c.sum += seconds;
    c.count++;
  }

  /** A copy of the counts so far. */
  counts(): DecisionCounts {
    return this.#seen.map((c) => ({ outcome: c.outcome, buckets: [...c.buckets], sum: c.sum, count: c.count }));
  }

  #add(outcome: Outcome): OutcomeCounts {
    const c = fresh(outcome);
    this.#seen.push(c);
    return c;
  }
}

/** The counts of several processes added up, each outcome where it was first seen. */
export function addCounts(parts: readonly DecisionCounts[]): DecisionCounts {
  const total: OutcomeCounts[] = [];
  for (const part of parts) {
    for (const c of part) {
      let t = total.find((x) => x.outcome === c.outcome);
      if (!t) total.push((t = fresh(c.outcome)));
      c.buckets.forEach((n, i) => (t.buckets[i]! += n));
      t.sum += c.sum;
      t.count += c.count;
    }
  }
  return total;
}

/** The histogram in Prometheus' text format, without a final newline (prom-client's layout). */
export function decisionText(counts: DecisionCounts): string {
  const lines = [`# HELP ${DECISION_NAME} ${HELP}`, `# TYPE ${DECISION_NAME} histogram`];
  for (const c of counts) {
    const label = `outcome="${c.outcome}"`;
    let below = 0;
    DECISION_BOUNDS.forEach((bound, i) => {
      below += c.buckets[i]!;
      lines.push(`${DECISION_NAME}_bucket{le="${bound}",${label}} ${below}`);
    });
    // Counts and sum are finite (observe drops anything else): written as JavaScript
    // writes a number, as prom-client writes them.
    lines.push(`${DECISION_NAME}_bucket{le="+Inf",${label}} ${c.count}`);
    lines.push(`${DECISION_NAME}_sum{${label}} ${c.sum}`);
    lines.push(`${DECISION_NAME}_count{${label}} ${c.count}`);
  }
  return lines.join('\n');
}
