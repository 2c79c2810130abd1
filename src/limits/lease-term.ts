/**
 * How long a lease (a concurrency slot, a block of slots, a spend hold or slice) lives in
 * the store without a refresh: the config's `limits.leaseMs`, which a reload may change
 * (DESIGN section 12). Every grant and refresh reads the term in force when it is sent, so
 * a new term applies to the next of each; a lease granted before keeps the expiry it was
 * given until its next refresh. The keepers move their timers when the term changes
 * (leases.ts), and what this instance believes of a lease's expiry never outlasts what the
 * store was last told (`lifetimeFrom`).
 */
/** Several refreshes fall within one lifetime, so one that fails or comes late does not let a live lease expire. */
const defaultRefreshEveryMs = (ms: number): number => Math.floor(ms / 3);

/** Changes remembered for `lifetimeFrom`: far more than fall within one call's round trip. */
const HISTORY = 16;

export class LeaseTerm {
  readonly #fixedRefreshMs: number | undefined;
  /** the terms put in force, oldest first, each from when (performance.now()); the last is in force */
  readonly #terms: { from: number; ms: number }[];
  /** the shortest of the terms no longer remembered */
  #forgottenMs = Infinity;
  readonly #listeners: ((previous: { ms: number; refreshEveryMs: number }) => void)[] = [];

  /** `refreshEveryMs`: a fixed refresh period (0: no timer, tests refresh by hand); by default a third of the term. */
  constructor(ms: number, refreshEveryMs?: number) {
    this.#fixedRefreshMs = refreshEveryMs;
    this.#terms = [{ from: -Infinity, ms }];
  }

  /** The lifetime a grant or refresh sent now gives a lease. */
  get ms(): number {
    return this.#terms[this.#terms.length - 1]!.ms;
  }

  /** How often live leases are refreshed under the term in force. */
  get refreshEveryMs(): number {
    return this.#fixedRefreshMs ?? defaultRefreshEveryMs(this.ms);
  }

  /** Puts a new term in force from `at`; listeners hear the previous one. */
  set(ms: number, at: number = performance.now()): void {
    if (ms === this.ms) return;
    const previous = { ms: this.ms, refreshEveryMs: this.refreshEveryMs };
    this.#terms.push({ from: at, ms });
    if (this.#terms.length > HISTORY) this.#forgottenMs = Math.min(this.#forgottenMs, this.#terms.shift()!.ms);
    for (const listener of this.#listeners) listener(previous);
  }

  onChange(listener: (previous: { ms: number; refreshEveryMs: number }) => void): void {
    this.#listeners.push(listener);
  }

  /**
   * The lifetime a call sent at `sentAt` can be counted on for: the shortest term in force
   * since then. A later call, sent under a shorter term, may have shortened the expiry in
   * the store before this one's reply is read.
   */
  lifetimeFrom(sentAt: number): number {
    let ms = Infinity;
    for (let i = this.#terms.length - 1; i >= 0; i--) {
      const term = this.#terms[i]!;
      ms = Math.min(ms, term.ms);
      if (term.from <= sentAt) return ms;
    }
    return Math.min(ms, this.#forgottenMs);
  }
}
