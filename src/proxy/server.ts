/**
 * Composition: builds the replica, limiter, forwarder, metrics and admin listener from
 * the config, runs the pipeline for each request, writes the access log line when the
 * response ends, and drains on shutdown. Adapters meet only here.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { performance } from 'node:perf_hooks';
import { makeKeyHasher } from '../auth/hash.js';
import type { Config } from '../config/schema.js';
import { deny } from '../errors.js';
import type { Limiter } from '../limits/limiter.js';
import { createLimiter } from '../limits/failover.js';
import { startAdmin, type AdminServer } from '../obs/admin.js';
import { accessWriter, type Logger } from '../obs/logger.js';
import { createMetrics, type Metrics } from '../obs/metrics.js';
import { ReplicaStore } from '../replica/store.js';
import { replicaSyncTarget } from '../replica/sync-target.js';
import { createSyncClient, createUsagePusher, type SyncClient, type UsagePusher } from '../sync/client.js';
import { buildRules } from '../routes.js';
import type { UsageEvent } from '../sync/protocol.js';
import { accessLine, newContext, type RequestContext } from './context.js';
import { createForwarder, type Forwarder } from './forward.js';
import { handleRequest, sendDenial, type PipelineDeps } from './pipeline.js';
import { answerParserRefusal } from './framing.js';
import { createUsageTap } from './usage.js';
import { watchBodyIdle } from './body.js';

export interface SidecarOptions {
  config: Config;
  logger: Logger;
  /** injected in tests; by default built from `config.redis` */
  limiter?: Limiter;
  /** injected in tests; by default opened at `config.replica.path` */
  replica?: ReplicaStore;
  /** receives one event per model response that reported usage; by default the console's usage push */
  usageSink?: (event: UsageEvent) => void;
}

/** Usage events held for the console while it is away; what overflows is counted as dropped. */
const USAGE_BUFFER = 100_000;

export interface Sidecar {
  port: number;
  adminPort: number;
  url: string;
  replica: ReplicaStore;
  limiter: Limiter;
  metrics: Metrics;
  /** present when `console` is configured */
  sync: SyncClient | null;
  usage: UsagePusher | null;
  /** stop accepting, let in-flight requests finish within `graceMs`, release everything */
  close(opts?: { graceMs?: number }): Promise<void>;
}

function listen(server: Server, port: number, host: string): Promise<number> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      const addr = server.address();
      resolve(typeof addr === 'object' && addr ? addr.port : port);
    });
  });
}

export async function startSidecar(opts: SidecarOptions): Promise<Sidecar> {
  const { config, logger } = opts;
  const replica = opts.replica ?? new ReplicaStore({ path: config.replica.path });
  const limiter =
    opts.limiter ??
    createLimiter({
      redis: config.redis ?? null,
      leaseMs: config.limits.leaseMs,
      log: (event, fields) => logger.warn(fields, event),
    });
  const consoleCfg = config.console;
  const sync = consoleCfg
    ? createSyncClient({ url: consoleCfg.url, token: consoleCfg.token, waitMs: consoleCfg.waitMs, target: replicaSyncTarget(replica), log: logger })
    : null;
  const usagePusher = consoleCfg && !opts.usageSink
    ? createUsagePusher({ url: consoleCfg.url, token: consoleCfg.token, maxBuffer: USAGE_BUFFER, batchSize: 500, flushMs: 1000, log: logger })
    : null;
  const usageSink = opts.usageSink ?? (usagePusher ? (e: UsageEvent) => usagePusher.push(e) : null);
  let inFlight = 0;
  const metrics = createMetrics({
    replica: () => replica.status(),
    limiter: () => limiter.stats(),
    inFlight: () => inFlight,
    ...(sync ? { sync: () => sync.status() } : {}),
    ...(usagePusher ? { usage: () => usagePusher.stats() } : {}),
  });
  const writeAccess = accessWriter(logger);
  const contexts = new WeakMap<IncomingMessage, RequestContext>();
  const versionHeader = `${config.messages.vendor}-version`;
  let draining = false;
  let drained: (() => void) | null = null;
  const warnedModes = new Set<string>();

  const forwarder: Forwarder = createForwarder({
    upstreams: config.upstreams,
    onResponse(proxyRes, req) {
      const ctx = contexts.get(req);
      if (!ctx) return;
      if (ctx.upstreamStart !== null) ctx.upstreamMs = performance.now() - ctx.upstreamStart;
      // The client can quote the id its access-log line carries, unless the upstream names its own.
      if (proxyRes.headers['x-request-id'] === undefined) proxyRes.headers['x-request-id'] = ctx.reqId;
      if (ctx.route?.class !== 'model') return;
      const tap = createUsageTap({ contentType: proxyRes.headers['content-type'], contentEncoding: proxyRes.headers['content-encoding'] });
      if (!tap) return;
      proxyRes.on('data', (chunk: Buffer) => tap.push(chunk));
      proxyRes.once('end', () => {
        ctx.usage = tap.end();
      });
    },
    onFailure(kind, err, req, res) {
      const ctx = contexts.get(req);
      if (!ctx) return;
      if (res.headersSent) {
        res.destroy(); // mid-response: the client must see a broken response, not a truncated "success"
        return;
      }
      const denial =
        kind === 'rejected'
          ? deny('invalid_request', err.message)
          : kind === 'timeout'
            ? deny('upstream_timeout', 'The upstream gateway did not answer in time.')
            : deny('upstream_unavailable', 'The upstream gateway could not be reached.');
      if (kind !== 'rejected') logger.warn({ req_id: ctx.reqId, upstream: ctx.upstream, err: err.message }, 'upstream failure');
      sendDenial(req, res, ctx, denial, ctx.route?.style ?? 'openai');
    },
  });

  const upstreams = new Map(Object.entries(config.upstreams).map(([name, u]) => [name, u.capacity]));
  const deps: PipelineDeps = {
    rules: buildRules(config.routes),
    hashKey: makeKeyHasher(config.keys),
    keyFormat: config.keys.format,
    lookup: (hash) => replica.lookup(hash),
    ready: () => replica.status().ready,
    limiter,
    forwarder,
    upstreams,
    maxJsonBodyBytes: config.server.maxJsonBodyBytes,
    defaultOutputTokens: config.limits.defaultOutputTokens,
    onUnknownRouting(mode) {
      if (warnedModes.has(mode) || warnedModes.size > 100) return;
      warnedModes.add(mode);
      logger.warn({ routing: mode }, 'key routing mode names no upstream; using default');
    },
    onDecision(ctx, outcome) {
      metrics.decision(outcome, (performance.now() - ctx.start) / 1000);
    },
  };

  const finish = (res: ServerResponse, ctx: RequestContext) => {
    inFlight--;
    const countTokens = ctx.route?.countTokens ?? false;
    const usage = ctx.usage;
    ctx.lease?.finish({ tokens: countTokens ? 0 : usage ? usage.input_tokens + usage.output_tokens : null });
    // 499: the client went away before the response was complete (nginx's convention)
    const status = res.writableFinished ? res.statusCode : 499;
    if (usage && !countTokens && ctx.facts && usageSink) {
      usageSink({
        request_id: ctx.reqId,
        key_id: ctx.facts.key.id,
        model: ctx.model,
        input_tokens: usage.input_tokens,
        output_tokens: usage.output_tokens,
        status,
        at: new Date().toISOString(),
      });
    }
    metrics.request(ctx.route?.name ?? 'none', status, ctx.code ?? '');
    writeAccess(accessLine(ctx, status, performance.now()));
    if (inFlight === 0 && drained) drained();
  };

  // A body that stalls is cut with 408: the upstream request (if any) is destroyed before
  // it is complete, the limits lease is given back, and the connection is closed.
  const cutStalledBody = (req: IncomingMessage, res: ServerResponse, ctx: RequestContext) => {
    forwarder.abort(req);
    ctx.lease?.finish({ tokens: 0 });
    // Read nothing more: a body completed after the 408 must not go on to admission.
    req.socket.pause();
    res.shouldKeepAlive = false;
    if (res.headersSent) return void res.destroy();
    const ms = config.server.bodyIdleTimeoutMs;
    sendDenial(req, res, ctx, deny('invalid_request', `The request body stalled: no byte arrived for ${ms} ms.`, { status: 408 }), ctx.route?.style ?? 'openai');
    // Half-close so the client reads the answer, then let go of the socket.
    res.once('finish', () => setTimeout(() => req.socket.destroy(), 1000).unref());
  };

  const requestOn = new WeakMap<object, { req: IncomingMessage; res: ServerResponse }>();
  const onRequest = (req: IncomingMessage, res: ServerResponse, expectContinue: boolean) => {
    requestOn.set(req.socket, { req, res });
    const ctx = newContext(req, { versionHeader, now: performance.now() });
    contexts.set(req, ctx);
    inFlight++;
    res.once('close', () => finish(res, ctx));
    res.once('close', watchBodyIdle(req, { idleMs: config.server.bodyIdleTimeoutMs, onIdle: () => cutStalledBody(req, res, ctx) }));
    if (draining) res.setHeader('connection', 'close');
    handleRequest(req, res, ctx, deps, expectContinue).catch((err: Error) => {
      logger.error({ req_id: ctx.reqId, err: err.message }, 'request failed');
      if (!res.headersSent) sendDenial(req, res, ctx, deny('internal_error', 'The sidecar failed to handle the request.'), ctx.route?.style ?? 'openai');
      else res.destroy();
    });
  };

  const server = createServer({ keepAliveTimeout: 65_000, requestTimeout: 0, headersTimeout: 60_000 });
  server.on('request', (req, res) => onRequest(req, res, false));
  // Expect: 100-continue is answered only once the credentials have been checked.
  server.on('checkContinue', (req, res) => onRequest(req, res, true));
  server.on('clientError', (err: NodeJS.ErrnoException, socket) => answerParserRefusal(err, socket, requestOn.get(socket)));

  const port = await listen(server, config.server.port, config.server.host);
  let admin: AdminServer;
  try {
    admin = await startAdmin({
      host: config.admin.host,
      port: config.admin.port,
      registry: metrics.registry,
      notReadyReason: () => (draining ? 'draining' : replica.status().ready ? null : 'replica not loaded: no sync or import yet'),
    });
  } catch (err) {
    server.close();
    throw err;
  }

  // Not awaited: the replica serves what it has (a previous run's data) while the first sync runs.
  void sync?.start();

  return {
    port,
    adminPort: admin.port,
    sync,
    usage: usagePusher,
    url: `http://${config.server.host.includes(':') ? `[${config.server.host}]` : config.server.host}:${port}`,
    replica,
    limiter,
    metrics,
    async close({ graceMs = config.server.shutdownGraceMs } = {}) {
      draining = true;
      server.close();
      server.closeIdleConnections();
      if (inFlight > 0) {
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, graceMs);
          drained = () => {
            clearTimeout(timer);
            resolve();
          };
        });
      }
      server.closeAllConnections();
      writeAccess.flush();
      forwarder.close();
      await admin.close();
      // Last: the responses above may still have produced usage to push.
      await usagePusher?.stop();
      await sync?.stop();
      await limiter.close();
      if (!opts.replica) replica.close();
    },
  };
}
