/**
 * Budget alerts (DESIGN section 13) as the sidecar holds them: the `alerts` block in force,
 * the watch that finds crossings (watch.ts) and the delivery that sends them (delivery.ts).
 * `configure` puts a new block in force at run time (a reload, DESIGN section 12): the next
 * check uses its thresholds, the next event its webhook and secret. An event already found
 * is sent as it was made.
 */
import type { AlertsConfig } from '../../config/schema.js';
import type { LogSink } from '../../log.js';
import type { Holder } from '../../policy/holders.js';
import { type Crossing, eventBody, holderRef, signature } from './event.js';
import { type ClaimTurn, DELIVERY_DEFAULTS, Delivery, type DeliveryTuning } from './delivery.js';
import { AlertWatch, type AlertStore, CLAIM_TTL_MS, type ClaimRef } from './watch.js';

export interface AlertTuning extends DeliveryTuning {
  /** how long touched holders gather before one check reads them all */
  checkDelayMs?: number;
  /** when a claim the store could not answer is asked again */
  claimRetryMs?: number;
  /** how long replica changes gather before the recent holders are looked at again */
  recheckMs?: number;
  /** how long a claim stays this instance's without a renewal (default: two of the longest retry waits and an attempt) */
  claimPendingMs?: number;
}

export interface AlertsOptions {
  store: AlertStore;
  log: LogSink;
  tuning?: AlertTuning;
  /** wall clock of the events' `at` */
  now?: () => number;
  /** a holder as the replica has it now (the replica's `holder`), null when gone */
  current?: (id: string) => Holder | null;
}

/** Replica changes gather this long before recent holders are looked at again (each look is a replica read per holder). */
const RECHECK_MS = 1_000;

/** At shutdown, how long the last events may take to reach the webhook. */
export const ALERT_FLUSH_MS = 2_000;

export class Alerts {
  private config: AlertsConfig | undefined = undefined;
  private readonly watch: AlertWatch;
  private readonly delivery: Delivery;
  /** crossings claimed after the block was removed: never sent */
  private dropped = 0;
  private recheck: NodeJS.Timeout | null = null;

  private readonly pendingMs: number;

  constructor(private readonly o: AlertsOptions) {
    const t = o.tuning ?? {};
    const d = { ...DELIVERY_DEFAULTS, ...t };
    // Renewed at each attempt: longer than the longest wait between two attempts' starts.
    this.pendingMs = t.claimPendingMs ?? 2 * d.maxRetryMs + d.attemptTimeoutMs;
    this.delivery = new Delivery(o.log, { claimRenewMs: this.pendingMs / 3, ...t });
    this.watch = new AlertWatch({
      store: o.store,
      thresholds: () => this.config?.thresholds ?? null,
      found: (c, claim) => this.send(c, claim),
      pendingMs: this.pendingMs,
      log: o.log,
      ...(o.now ? { now: o.now } : {}),
      ...(t.checkDelayMs !== undefined ? { checkDelayMs: t.checkDelayMs } : {}),
      ...(t.claimRetryMs !== undefined ? { claimRetryMs: t.claimRetryMs } : {}),
      ...(o.current ? { current: (h: Holder) => o.current!(h.id) } : {}),
    });
  }

  /** The replica changed: recent holders whose figures moved are checked again (once per RECHECK_MS at most). */
  replicaChanged(): void {
    if (!this.config || this.recheck) return;
    this.recheck = setTimeout(() => {
      this.recheck = null;
      if (this.config) this.watch.replicaChanged();
    }, this.o.tuning?.recheckMs ?? RECHECK_MS);
    this.recheck.unref();
  }

  /** Puts `config` in force (alerts off when undefined). */
  configure(config: AlertsConfig | undefined): void {
    this.config = config;
  }

  /** Whether holds need reporting at all (src/limits/hold-watch.ts). */
  get watching(): boolean {
    return this.config !== undefined;
  }

  /** A hold or settlement drew on these holders: they are checked in the background. */
  touched(input: { tag: string; holders: readonly Holder[] }): void {
    if (this.config) this.watch.touched(input.tag, input.holders);
  }

  stats(): { sent: number; failed: number } {
    const { sent, failed } = this.delivery.stats();
    return { sent, failed: failed + this.dropped };
  }

  /** Resolves once every touched holder has been checked and every event found sent or given up. */
  async idle(): Promise<void> {
    await this.watch.idle();
    await this.delivery.idle();
  }

  /** Checks what the last requests touched, stops finding; events found get a last attempt within `timeoutMs`. */
  async close(timeoutMs = ALERT_FLUSH_MS): Promise<void> {
    if (this.recheck) clearTimeout(this.recheck);
    this.recheck = null;
    await this.watch.idle();
    await this.watch.close();
    await this.delivery.close(timeoutMs);
  }

  private send(c: Crossing, ref: ClaimRef): void {
    const config = this.config;
    const about = { holder: holderRef(c.holder), threshold: c.threshold, epoch: c.epoch };
    // False only when another token holds the claim: none (a newer epoch forgot it) leaves
    // nobody else to send the event, and a claim not told stays pending until its time is up.
    const claim = (turn: ClaimTurn): Promise<boolean> =>
      this.o.store.claimedBy({ ...ref, ttlMs: CLAIM_TTL_MS, pendingMs: this.pendingMs, turn }).then(
        (holder) => holder === null || holder === ref.token,
        () => true,
      );
    if (!config) {
      // Turned off between the claim and now: the claim is spent, so say what was not sent.
      this.dropped++;
      this.o.log.warn({ ...about, reason: 'alerts turned off' }, 'budget alert not delivered');
      void claim('done');
      return;
    }
    const body = eventBody(c);
    const headers: Record<string, string> = { 'content-type': 'application/json', 'user-agent': 'keyward' };
    if (config.secret !== undefined) headers['x-keyward-signature'] = signature(body, config.secret);
    this.delivery.add({ url: config.webhookUrl, body, headers, lane: c.holder, about, claim });
  }
}
