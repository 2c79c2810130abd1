/**
 * One cluster worker of `keyward serve --workers N`: a whole sidecar (pipeline, limiter,
 * its own connection to the replica file) on the proxy port the workers share, without
 * the parts that must run once per instance. The primary syncs the replica file (each
 * worker notices the writes through SQLite's data_version), pushes usage to the console
 * (workers hand their events over IPC) and answers the admin port (it asks each worker
 * for its metrics).
 */
import type { Config } from '../config/schema.js';
import { flushed, type Logger } from '../obs/logger.js';
import type { UsageEvent } from '../protocol/usage.js';
import { startSidecar, type Sidecar } from './sidecar.js';
import { isMessage, type ToPrimary, type ToWorker } from './worker-messages.js';

/** Usage events ride to the primary in batches: one IPC message per request would cost more than the request. */
const USAGE_BATCH = 200;
const USAGE_FLUSH_MS = 100;

export interface WorkerOptions {
  config: Config;
  logger: Logger;
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

export async function runWorker(opts: WorkerOptions): Promise<Sidecar> {
  const { config, logger } = opts;
  const usage = config.console ? usageToPrimary() : null;

  // Listening before the sidecar starts: a replacement worker can be told to drain (the
  // primary got SIGTERM) while it is still opening the replica, and a message nobody
  // listens for is dropped; the drain then waits for the sidecar instead of being lost.
  let sidecar: Sidecar | null = null;
  let drainMs: number | null = null;
  let draining: Promise<void> | null = null;
  const drain = (graceMs: number) => {
    drainMs ??= graceMs;
    if (sidecar === null) return;
    const s = sidecar;
    draining ??= (async () => {
      await s.close({ graceMs: drainMs });
      await usage?.flush();
      await flushed(logger);
      await send({ type: 'keyward:drained' });
    })().then(
      () => process.exit(0),
      (err: Error) => {
        logger.error({ err: err.message }, 'worker shutdown failed');
        process.exit(1);
      },
    );
  };
  process.on('message', (msg: unknown) => {
    if (!isMessage<ToWorker>(msg)) return;
    if (msg.type === 'keyward:drain') drain(msg.graceMs);
    else if (msg.type === 'keyward:replica-changed') sidecar?.replica.checkExternalWrites();
    else if (msg.type === 'keyward:metrics') {
      // not started yet: nothing counted
      if (sidecar === null) return void send({ type: 'keyward:metrics', id: msg.id, metrics: [] });
      sidecar.metrics.registry.getMetricsAsJSON().then(
        (metrics) => send({ type: 'keyward:metrics', id: msg.id, metrics }),
        () => send({ type: 'keyward:metrics', id: msg.id, metrics: [] }),
      );
    }
  });
  // Ctrl-C reaches every process of the group, and an operator may signal one worker:
  // either way the worker drains instead of dying with requests in flight.
  for (const sig of ['SIGTERM', 'SIGINT'] as const) process.on(sig, () => drain(config.server.shutdownGraceMs));

  // Without `console` the sidecar starts neither a sync client nor a usage pusher: both live in the primary.
  sidecar = await startSidecar({
    config: { ...config, console: undefined },
    logger,
    admin: false,
    ...(usage ? { usageSink: usage.sink } : {}),
  });

  const report = (s: { ready: boolean; version: number | null }) => void send({ type: 'keyward:replica', ready: s.ready, version: s.version });
  report(sidecar.replica.status());
  sidecar.replica.onChange(report);
  if (drainMs !== null) drain(drainMs);
  return sidecar;
}
