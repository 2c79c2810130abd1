/**
 * One cluster worker of `keyward serve --workers N`: a whole sidecar (pipeline, limiter,
 * its own connection to the replica file) on the proxy port the workers share, without
 * the parts that must run once per instance. The primary syncs the replica file (each
 * worker notices the writes through SQLite's data_version), pushes usage to the console
 * (workers hand their events over IPC), answers the admin port (it asks each worker
 * for its metrics) and reads the config file: a worker gets its config from the primary,
 * at start and at every reload, so every worker runs the same one.
 */
import type { Config } from '../config/schema.js';
import { flushed, type Logger } from '../obs/logger.js';
import type { UsageEvent } from '../protocol/usage.js';
import { holdSighup } from './reload.js';
import { startSidecar, type Sidecar } from './sidecar.js';
import { isMessage, type ToPrimary, type ToWorker } from './worker-messages.js';

/** Usage events ride to the primary in batches: one IPC message per request would cost more than the request. */
const USAGE_BATCH = 200;
const USAGE_FLUSH_MS = 100;

export interface WorkerOptions {
  /** the worker's logger, made once the primary has sent the config it is to run with */
  logger: (config: Config) => Logger;
}

function send(msg: ToPrimary): Promise<void> {
  return new Promise((resolve) => {
    if (!process.send || !process.connected) return resolve();
    // The callback fires once the message is handed to the channel (or it failed: the primary is gone).
    process.send(msg, undefined, undefined, () => resolve());
  });
}

/** Batches usage events for the primary; `flush` sends what is held and resolves once it is handed over. */
function usageToPrimary(): { sink: (e: UsageEvent) => void; flush: () => Promise<void> } {
  let held: UsageEvent[] = [];
  let timer: NodeJS.Timeout | null = null;
  const flush = (): Promise<void> => {
    if (timer) clearTimeout(timer);
    timer = null;
    if (held.length === 0) return Promise.resolve();
    const events = held;
    held = [];
    return send({ type: 'keyward:usage', events });
  };
  return {
    sink(e) {
      held.push(e);
      if (held.length >= USAGE_BATCH) void flush();
      else if (timer === null) timer = setTimeout(() => void flush(), USAGE_FLUSH_MS);
    },
    flush,
  };
}

/** The worker's own view of the config: the console clients run in the primary. */
const own = (config: Config): Config => ({ ...config, console: undefined });

type ConfigMessage = Extract<ToWorker, { type: 'keyward:config' }>;

/** The worker's life: wait for the config, run the sidecar, take up reloads, drain when told. */
class WorkerProcess {
  private sidecar: Sidecar | null = null;
  private logger: Logger | null = null;
  /** the last config the primary sent */
  private latest: ConfigMessage | null = null;
  private gotConfig: () => void = () => {};
  private readonly firstConfig = new Promise<void>((resolve) => (this.gotConfig = resolve));
  private usage: ReturnType<typeof usageToPrimary> | null = null;
  /** told to drain; with the grace the primary named (null: the config's) */
  private drainAsked = false;
  private drainMs: number | null = null;
  private draining: Promise<void> | null = null;

  constructor(private readonly o: WorkerOptions) {}

  heard(msg: ToWorker): void {
    if (msg.type === 'keyward:drain') this.drain(msg.graceMs);
    else if (msg.type === 'keyward:config') this.configMessage(msg);
    else if (msg.type === 'keyward:replica-changed') this.replicaChanged();
    else if (msg.type === 'keyward:metrics') this.answerScrape(msg.id);
  }

  /** Runs the sidecar with the primary's config; resolves once it listens. */
  async start(): Promise<Sidecar> {
    await this.firstConfig;
    const first = this.latest!;
    const logger = (this.logger = this.o.logger(first.config));
    this.usage = first.config.console ? usageToPrimary() : null;
    // Without `console` the sidecar starts neither a sync client nor a usage pusher: both live in the primary.
    const sidecar = await startSidecar({
      config: own(first.config), logger, admin: false, ...(this.usage ? { usageSink: this.usage.sink } : {}),
      onReplicaDamage: (file) => void send({ type: 'keyward:replica-damaged', file }),
    });
    this.sidecar = sidecar;
    void send({ type: 'keyward:configured', generation: first.generation });
    // A reload that arrived while the sidecar was starting.
    if (this.latest !== first) this.apply(this.latest!);
    const report = (s: { ready: boolean; version: number | null }) => void send({ type: 'keyward:replica', ready: s.ready, version: s.version });
    report(sidecar.replica.status());
    sidecar.replica.onChange(report);
    if (this.drainAsked) this.drain(null);
    return sidecar;
  }

  /** Stops accepting, lets in-flight requests finish within `graceMs` (default: the config's), exits. */
  drain(graceMs: number | null): void {
    this.drainAsked = true;
    this.drainMs ??= graceMs;
    const s = this.sidecar;
    if (s === null) return;
    this.draining ??= (async () => {
      await s.close({ graceMs: this.drainMs ?? s.config().server.shutdownGraceMs });
      await this.usage?.flush();
      await flushed(this.logger!);
      const { registry, decisionCounts } = s.metrics;
      const metrics = await registry.getMetricsAsJSON().catch(() => []);
      await send({ type: 'keyward:drained', final: { metrics, decisions: decisionCounts() } });
    })().then(
      () => process.exit(0),
      (err: Error) => {
        this.logger!.error({ err: err.message }, 'worker shutdown failed');
        process.exit(1);
      },
    );
  }

  private configMessage(msg: ConfigMessage): void {
    const first = this.latest === null;
    this.latest = msg;
    if (first) this.gotConfig();
    // Before the sidecar runs, start() takes up the latest one.
    else if (this.sidecar) this.apply(msg);
  }

  private apply(msg: ConfigMessage): void {
    this.sidecar!.reconfigure(own(msg.config)).then(
      () => void send({ type: 'keyward:configured', generation: msg.generation }),
      (err: Error) => {
        this.logger!.error({ err: err.message }, 'config reload could not be applied whole');
        void send({ type: 'keyward:configured', generation: msg.generation, error: err.message });
      },
    );
  }

  /** The primary wrote the replica: a file it put in the place of this one's is taken up. */
  private replicaChanged(): void {
    const replica = this.sidecar?.replica;
    if (!replica) return;
    try {
      if (replica.detached()) replica.reattach();
      else replica.checkExternalWrites();
    } catch (err) {
      // The file open stays served (store.ts, reattach); the primary's next write tells again.
      this.logger?.error({ err: (err as Error).message }, 'the replica file the primary wrote could not be taken up: serving the one open');
    }
  }

  private answerScrape(id: number): void {
    // not started yet: nothing counted
    if (this.sidecar === null) return void send({ type: 'keyward:metrics', id, metrics: [], decisions: [] });
    const { registry, decisionCounts } = this.sidecar.metrics;
    registry.getMetricsAsJSON().then(
      (metrics) => send({ type: 'keyward:metrics', id, metrics, decisions: decisionCounts() }),
      () => send({ type: 'keyward:metrics', id, metrics: [], decisions: decisionCounts() }),
    );
  }
}

export async function runWorker(opts: WorkerOptions): Promise<Sidecar> {
  const worker = new WorkerProcess(opts);
  // Listening before anything else: a message nobody listens for is dropped. A replacement
  // worker can be told to drain (the primary got SIGTERM) while it is still starting; the
  // drain then waits for the sidecar instead of being lost.
  process.on('message', (msg: unknown) => {
    if (isMessage<ToWorker>(msg)) worker.heard(msg);
  });
  // Ctrl-C reaches every process of the group, and an operator may signal one worker:
  // either way the worker drains instead of dying with requests in flight.
  for (const sig of ['SIGTERM', 'SIGINT'] as const) process.on(sig, () => worker.drain(null));
  // The primary reads the file and sends the config; a SIGHUP to the whole group must not end a worker.
  holdSighup();
  void send({ type: 'keyward:hello' });
  return worker.start();
}
