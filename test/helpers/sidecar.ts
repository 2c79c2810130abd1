/**
 * Starts a real sidecar on port 0 with a replica in a temp dir, seeded with keys the
 * test describes, and captures its log lines so tests can scan them.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { EventEmitter } from 'node:events';
import { Writable } from 'node:stream';
import { generateKey } from '../../src/auth/keyformat.js';
import { makeKeyHasher } from '../../src/auth/hash.js';
import { configSchema, type Config } from '../../src/config/schema.js';
import type { Limiter } from '../../src/limits/limiter.js';
import { createLogger } from '../../src/obs/logger.js';
import { startSidecar, type Sidecar } from '../../src/app/sidecar.js';
import type { TraceTuning } from '../../src/obs/tracing/span.js';
import type { AlertTuning } from '../../src/obs/alerts/alerts.js';
import { ReplicaStore } from '../../src/replica/store.js';
import type { KeyRecord, SyncRecord } from '../../src/protocol/records.js';
import type { UsageEvent } from '../../src/protocol/usage.js';
import { startFakeUpstream, type FakeUpstream, type Handler } from './upstream.js';

export type KeySpec = Partial<Omit<KeyRecord, 'type' | 'hash'>> & { secret?: string };

export interface Harness {
  sidecar: Sidecar;
  url: string;
  replica: ReplicaStore;
  dir: string;
  /** plain keys by key id */
  keys: Record<string, string>;
  logs: string[];
  /** emits 'line' for every log line written */
  logEvents: EventEmitter;
  usage: UsageEvent[];
  config: Config;
  close(): Promise<void>;
}

export function keyRecord(id: string, spec: KeySpec, hash: string): KeyRecord {
  const kind = spec.kind ?? (spec.project ? 'team' : 'personal');
  return {
    type: 'key', id, hash, kind,
    user: spec.user ?? (kind === 'personal' ? 'u_default' : null),
    project: spec.project ?? null,
    status: spec.status ?? 'active', budget: spec.budget ?? null, spent: spec.spent ?? 0,
    models: spec.models ?? null, routing: spec.routing ?? null,
    rpm: spec.rpm ?? null, tpm: spec.tpm ?? null, concurrency: spec.concurrency ?? null,
    ...(spec.epoch !== undefined ? { epoch: spec.epoch } : {}),
    ...(spec.ips !== undefined ? { ips: spec.ips } : {}),
    ...(spec.allowBrowser !== undefined ? { allowBrowser: spec.allowBrowser } : {}),
    ...(spec.modelLimits !== undefined ? { modelLimits: spec.modelLimits } : {}),
    ...(spec.period !== undefined ? { period: spec.period } : {}),
    ...(spec.shadow !== undefined ? { shadow: spec.shadow } : {}),
  };
}

export interface HarnessOptions {
  upstream: string;
  keys: Record<string, KeySpec>;
  /** extra records: wallets and projects. A wallet for u_default with balance 10 is always added. */
  records?: SyncRecord[];
  config?: Record<string, unknown>;
  limiter?: Limiter;
  /** leave the replica empty (never synced) */
  empty?: boolean;
  /** trace export timings, shortened so a test need not wait for the SDK's batch delay */
  traceTuning?: TraceTuning;
  /** budget alerts' retry schedule, shortened so a test need not wait minutes */
  alertTuning?: AlertTuning;
}

export async function startHarness(opts: HarnessOptions): Promise<Harness> {
  const dir = mkdtempSync(join(tmpdir(), 'kw-test-'));
  const config = configSchema.parse({
    server: { port: 0 },
    admin: { port: 0 },
    upstreams: { default: { url: opts.upstream } },
    replica: { path: join(dir, 'replica.sqlite') },
    logging: { level: 'info' },
    ...opts.config,
  });
  const hash = makeKeyHasher(config.keys);
  const keys: Record<string, string> = {};
  const records: SyncRecord[] = [{ type: 'wallet', user: 'u_default', balance: 10 }, ...(opts.records ?? [])];
  for (const [id, spec] of Object.entries(opts.keys)) {
    keys[id] = spec.secret ?? generateKey();
    records.push(keyRecord(id, spec, hash(keys[id]!)));
  }
  const replica = new ReplicaStore({ path: config.replica.path });
  if (!opts.empty) replica.applySnapshot({ version: 1, records: records.map((record, i) => ({ line: i + 2, record })), source: 'test' });
  const logs: string[] = [];
  const logEvents = new EventEmitter();
  const destination = new Writable({
    write(chunk: Buffer, _enc, cb) {
      for (const line of chunk.toString('utf8').split('\n').filter(Boolean)) {
        logs.push(line);
        logEvents.emit('line', line);
      }
      cb();
    },
  });
  const usage: UsageEvent[] = [];
  const logger = createLogger({ level: 'info', destination });
  const sidecar = await startSidecar({ config, logger, replica, usageSink: (e) => usage.push(e), ...(opts.limiter ? { limiter: opts.limiter } : {}), ...(opts.traceTuning ? { traceTuning: opts.traceTuning } : {}), ...(opts.alertTuning ? { alertTuning: opts.alertTuning } : {}) });
  return {
    sidecar, url: sidecar.url, replica, dir, keys, logs, logEvents, usage, config,
    async close() {
      await sidecar.close({ graceMs: 500 });
      await replica.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A fake upstream and a sidecar harness in front of it; `close` stops the sidecar, then the upstream. */
export interface UpstreamHarness {
  up: FakeUpstream;
  h: Harness;
  close(): Promise<void>;
}

/**
 * Starts a fake upstream answering with `handler` (echoJson by default) and a sidecar
 * harness in front of it, set up as the other options say: the setup most proxy tests share.
 */
export async function startBehindUpstream({ handler, ...opts }: Omit<HarnessOptions, 'upstream'> & { handler?: Handler }): Promise<UpstreamHarness> {
  const up = await startFakeUpstream(handler);
  let h: Harness;
  try {
    h = await startHarness({ ...opts, upstream: up.url });
  } catch (err) {
    await up.close();
    throw err;
  }
  return {
    up, h,
    async close() {
      await h.close();
      await up.close();
    },
  };
}

/** The parsed access-log lines (msg "request"). */
export function accessLines(h: Harness): Record<string, unknown>[] {
  return h.logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.msg === 'request');
}

/** Resolves with the first access-log line matching `pred`, as soon as it is written. */
export function waitForLine(h: Harness, pred: (l: Record<string, unknown>) => boolean, timeoutMs = 5000): Promise<Record<string, unknown>> {
  const hit = accessLines(h).find(pred);
  if (hit) return Promise.resolve(hit);
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      h.logEvents.off('line', onLine);
      reject(new Error('no matching access-log line'));
    }, timeoutMs);
    const onLine = (line: string) => {
      const l = JSON.parse(line) as Record<string, unknown>;
      if (l.msg === 'request' && pred(l)) {
        clearTimeout(timer);
        h.logEvents.off('line', onLine);
        resolve(l);
      }
    };
    h.logEvents.on('line', onLine);
  });
}
