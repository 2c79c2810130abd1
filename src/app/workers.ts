/**
 * `keyward serve --workers N`: a node:cluster primary and N workers (src/proxy/worker.ts).
 *
 * What runs where, and why:
 * - Workers run the whole request path and share the proxy port (the cluster's
 *   round-robin hands each new connection to the next worker). Each has its own limiter
 *   connection to the one Redis, so a limit holds across workers as across instances.
 * - The primary runs what must run once per instance: the sync client, which writes the
 *   one replica file (workers see its commits through SQLite's data_version within
 *   200 ms, as they see `keyward import`); the usage pusher, fed by the workers over IPC,
 *   so each event is buffered and pushed once and one buffer bound holds per instance;
 *   and the admin port: /healthz and /readyz from its own state, /metrics as the sum of
 *   every worker's registry and its own (prom-client's aggregation: counters and
 *   histograms add up, gauges per their aggregator).
 * - SIGTERM to the primary: /readyz turns 503, every worker drains its in-flight
 *   requests within server.shutdownGraceMs and hands over its last usage events, then
 *   the primary pushes them, stops syncing and exits 0.
 * - A worker that dies unexpectedly is replaced after a pause.
 * - The primary reads the config file; each worker gets the config from it over IPC, at
 *   start and at every reload (worker-configs.ts), so all of them run the same config.
 */
import cluster, { type Worker } from 'node:cluster';
import { availableParallelism } from 'node:os';
import { Gauge, Counter, type Registry } from 'prom-client';
import type { Config } from '../config/schema.js';
import { startAdmin } from '../obs/admin.js';
import type { Logger } from '../obs/logger.js';
import { createMetrics, type Metrics } from '../obs/metrics.js';
import { ReplicaStore } from '../replica/store.js';
import type { UsagePusher } from '../sync/client.js';
import { consoleClients, replicaOwnership } from './console-clients.js';
import { httpUrl } from './listen.js';
import { WorkerConfigs } from './worker-configs.js';
import { isMessage, sendTo, type ToPrimary, type ToWorker } from './worker-messages.js';
import { WorkerScrapes } from './worker-scrapes.js';
import type { FileIdentity } from '../replica/replica-file.js';

const RESTART_DELAY_MS = 1_000;
/** A worker that cannot stay up (a replica file gone bad) is started again less and less often, up to this. */
const RESTART_DELAY_MAX_MS = 60_000;
/** A worker up this long ended a run of failures: the next restart waits RESTART_DELAY_MS again. */
const STAYED_UP_MS = 60_000;
/** A reload is logged as not confirmed by the workers that have not applied it within this. */
const RECONFIGURE_TIMEOUT_MS = 5_000;

/** `--workers` value: a positive integer, or `auto` for the number of cores. */
export function parseWorkers(value: string): number {
  if (value === 'auto') return availableParallelism();
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1 || n > 1024) throw new Error(`--workers expects a positive integer or "auto", got "${value}"`);
  return n;
}

export interface WorkersOptions {
  config: Config;
  logger: Logger;
  workers: number;
}

export interface WorkerPool {
  url: string;
  port: number;
  adminPort: number;
  /** the primary's own metrics, which /metrics adds the workers' to */
  metrics: Metrics;
  /** pids of the live workers */
  pids(): number[];
  /** the config the workers run */
  config(): Config;
  /** Puts `next` in force in every worker; resolves once each has confirmed it (or did not in time: logged). */
  reconfigure(next: Config): Promise<void>;
  /** drain every worker within `graceMs`, push the last usage, stop syncing */
  close(opts?: { graceMs?: number }): Promise<void>;
}

/** The primary's workers: forks them, replaces one that dies, hears what they report. */
class Workers {
  readonly live = new Map<number, Worker>();
  /** each worker's last reported replica readiness */
  private readonly ready = new Map<number, boolean>();
  private readonly listening = new Set<number>();
  /** resolves a worker's drain, by worker id */
  private readonly drained = new Map<number, () => void>();
  /** workers that drained and said so before exiting (a signal to one worker, or the primary's drain) */
  private readonly drainedSelf = new Set<number>();
  private restarts = 0;
  /** the wait before the next restart: doubled by each worker that ends soon after its start */
  private restartDelayMs = RESTART_DELAY_MS;
  private readonly forkedAt = new Map<number, number>();
  private closing = false;
  /** set while the first workers start: a worker that exits then fails the start */
  private startupFailed: ((err: Error) => void) | null = null;
  readonly scrapes: WorkerScrapes;
  readonly configs: WorkerConfigs;

  constructor(private readonly o: { config: Config; logger: Logger; usage: UsagePusher | null; registry: Registry; replicaDamaged: (file: FileIdentity) => void }) {
    this.scrapes = new WorkerScrapes({ own: o.registry, workers: () => this.live.values() });
    this.configs = new WorkerConfigs(o.config, { workers: () => this.live.values(), log: o.logger });
    const listening = () => this.listening.size;
    const restarts = () => this.restarts;
    new Gauge({ name: 'keyward_workers', help: 'Workers serving the proxy port', registers: [o.registry], collect() { this.set(listening()); } });
    new Counter({ name: 'keyward_worker_restarts_total', help: 'Workers replaced after an unexpected exit', registers: [o.registry], collect() { this.reset(); this.inc(restarts()); } });
  }

  /** Forks `n` workers; resolves with the proxy port once every one listens, rejects when one exits first. */
  async start(n: number): Promise<number> {
    try {
      return await new Promise<number>((resolve, reject) => {
        this.startupFailed = reject;
        let first: number | null = null;
        const started = new Set<number>();
        const onListening = (w: Worker, address: { port: number }) => {
          first ??= address.port;
          started.add(w.id);
          if (started.size >= n) {
            cluster.off('listening', onListening);
            resolve(first);
          }
        };
        cluster.on('listening', onListening);
        for (let i = 0; i < n; i++) this.fork();
      });
    } finally {
      this.startupFailed = null;
    }
  }

  /** Null when the primary's replica is loaded and so is every listening worker's, else why not. */
  notReadyReason(replicaReady: boolean): string | null {
    if (this.closing) return 'draining';
    if (!replicaReady) return 'replica not loaded: no sync or import yet';
    if (this.listening.size === 0) return 'no worker listening';
    for (const id of this.listening) if (this.ready.get(id) !== true) return `worker ${id} has not loaded the replica yet`;
    return null;
  }

  tellAll(msg: ToWorker): void {
    for (const w of this.live.values()) sendTo(w, msg);
  }

  kill(): void {
    this.closing = true;
    for (const w of this.live.values()) w.process.kill('SIGKILL');
  }

  /** Tells every worker to drain; resolves when each has drained, or exited. */
  async drain(graceMs: number): Promise<void> {
    this.closing = true;
    const exits = [...this.live.values()].map(
      (w) =>
        new Promise<void>((resolve) => {
          // A worker that overruns its grace (plus time to hand over its usage) is killed.
          const timer = setTimeout(() => w.process.kill('SIGKILL'), graceMs + 5_000);
          this.drained.set(w.id, () => {
            clearTimeout(timer);
            resolve();
          });
          // A worker that cannot be told is exiting already: its exit resolves this.
          sendTo(w, { type: 'keyward:drain', graceMs });
        }),
    );
    await Promise.all(exits);
  }

  private fork(): void {
    const w = cluster.fork();
    this.forkedAt.set(w.id, performance.now());
    this.live.set(w.id, w);
    w.on('message', (msg: unknown) => this.heard(w, msg));
    // Failed writes to a worker are handled where they are sent; this keeps anything else
    // that goes wrong on its channel from ending the primary.
    w.on('error', (err: Error) => this.o.logger.warn({ worker_id: w.id, err: err.message }, 'worker channel error'));
    w.on('listening', () => this.listening.add(w.id));
    w.on('exit', (code: number, signal: string | null) => this.exited(w, code, signal));
  }

  private heard(w: Worker, msg: unknown): void {
    if (!isMessage<ToPrimary>(msg)) return;
    if (msg.type === 'keyward:hello') this.configs.hello(w);
    else if (msg.type === 'keyward:configured') this.configs.confirmed(w, msg.generation, msg.error);
    else if (msg.type === 'keyward:usage') {
      if (this.o.usage) for (const e of msg.events) this.o.usage.push(e);
    } else if (msg.type === 'keyward:metrics') this.scrapes.answered(msg.id, msg);
    else if (msg.type === 'keyward:replica') this.ready.set(w.id, msg.ready);
    else if (msg.type === 'keyward:replica-damaged') this.o.replicaDamaged(msg.file);
    else if (msg.type === 'keyward:drained') {
      if (msg.final) this.scrapes.final(w.id, msg.final);
      this.drainedSelf.add(w.id);
      this.drained.get(w.id)?.();
    }
  }

  private exited(w: Worker, code: number, signal: string | null): void {
    this.live.delete(w.id);
    this.scrapes.retire(w.id);
    this.listening.delete(w.id);
    this.ready.delete(w.id);
    this.configs.gone(w);
    this.drained.get(w.id)?.();
    const drainedSelf = this.drainedSelf.delete(w.id) && code === 0;
    if (this.closing) return;
    if (this.startupFailed) return this.startupFailed(new Error(`worker ${w.id} exited (${signal ?? `code ${code}`}) before listening`));
    this.restarts++;
    const upMs = performance.now() - (this.forkedAt.get(w.id) ?? 0);
    this.forkedAt.delete(w.id);
    if (upMs >= STAYED_UP_MS || drainedSelf) this.restartDelayMs = RESTART_DELAY_MS;
    const delay = this.restartDelayMs;
    // A worker an operator stopped (a signal to it alone) drained and said so: no failure, no backoff.
    if (!drainedSelf) this.restartDelayMs = Math.min(RESTART_DELAY_MAX_MS, delay * 2);
    // `worker_id`: the line is the primary's (its `worker` is 0), about another worker.
    const line = { worker_id: w.id, code, signal, up_ms: Math.round(upMs), restart_in_ms: delay };
    if (drainedSelf) this.o.logger.info(line, 'worker drained and exited; starting another');
    else this.o.logger.error(line, 'worker exited unexpectedly; starting another');
    setTimeout(() => {
      if (!this.closing) this.fork();
    }, delay);
  }
}

export async function startWorkers(opts: WorkersOptions): Promise<WorkerPool> {
  const { config, logger } = opts;
  if (!cluster.isPrimary) throw new Error('startWorkers runs in the cluster primary');
  if (opts.workers > 1 && !config.redis) {
    // The in-process limiter counts one process's requests: N workers would each allow the whole limit.
    throw new Error(`--workers ${opts.workers} needs redis.url in the config: without Redis each worker would enforce every limit on its own`);
  }
  // Opened before any worker starts, so the schema exists before N processes open the file at once.
  const replica = new ReplicaStore({ path: config.replica.path, ...replicaOwnership(config, logger) });
  const { sync, usage } = consoleClients({ config, replica, logger, pushUsage: true });
  const metrics = createMetrics({
    replica: () => replica.status(),
    limiter: () => ({ redisErrors: 0, failOpenAdmissions: 0, failOpenHolds: 0, slotsHeld: 0 }),
    ...(sync ? { sync: () => sync.status() } : {}),
    ...(usage ? { usage: () => usage.stats() } : {}),
  });
  // Workers only read the file: damage one of them meets is the primary's to move aside.
  const workers = new Workers({ config, logger, usage, registry: metrics.registry, replicaDamaged: (file) => void replica.quarantine({ ifFile: file }) });
  const admin = await startAdmin({
    host: config.admin.host,
    port: config.admin.port,
    exposition: workers.scrapes,
    notReadyReason: () => workers.notReadyReason(replica.status().ready),
  });
  // Workers poll the file every 200 ms; after the primary's own writes they need not wait for it.
  replica.onChange(() => workers.tellAll({ type: 'keyward:replica-changed' }));

  let port: number;
  try {
    port = await workers.start(opts.workers);
  } catch (err) {
    workers.kill();
    await admin.close();
    await replica.close();
    throw err;
  }
  // Not awaited: workers serve what the replica file holds while the first sync runs.
  void sync?.start();

  return {
    url: httpUrl(config.server.host, port),
    port,
    adminPort: admin.port,
    metrics,
    pids: () => [...workers.live.values()].map((w) => w.process.pid!).filter(Boolean),
    config: () => workers.configs.current,
    async reconfigure(next) {
      logger.level = next.logging.level;
      const behind = await workers.configs.distribute(next, RECONFIGURE_TIMEOUT_MS);
      if (behind.length > 0) logger.warn({ workers: behind }, `workers ${behind.join(', ')} did not confirm the new config within ${RECONFIGURE_TIMEOUT_MS} ms`);
    },
    async close({ graceMs = workers.configs.current.server.shutdownGraceMs } = {}) {
      await workers.drain(graceMs);
      await admin.close();
      // Last: the workers' final usage events arrived before their "drained".
      await usage?.stop();
      await sync?.stop();
      await replica.close();
    },
  };
}
