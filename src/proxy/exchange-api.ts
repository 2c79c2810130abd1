/**
 * What the composition root hands the exchange table (ExchangeDeps) and what it gets back
 * (Exchanges): one request's life is exchange.ts's.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import type { LogSink } from '../log.js';
import type { AccessWriter } from '../obs/logger.js';
import type { Metrics } from '../obs/metrics.js';
import type { SpanSource } from '../obs/tracing/span.js';
import type { KeyFacts } from '../policy/facts.js';
import type { UsageEvent } from '../protocol/usage.js';
import type { PipelineDeps } from './pipeline.js';
import type { Snapshots } from './snapshot.js';
import type { Forwarder } from './upstream/forward.js';

export interface ExchangeDeps {
  pipeline: PipelineDeps;
  forwarder: Forwarder;
  metrics: Metrics;
  access: AccessWriter;
  /** receives one event per model response that reported usage; null: nobody listens */
  usageSink: ((event: UsageEvent) => void) | null;
  log: LogSink;
  /**
   * The config in force: each request takes the snapshot in force when it arrives and is
   * decided, forwarded and timed under it until it ends (a reload swaps it).
   */
  snapshots: Snapshots;
  /** GET /v1/key: the caller's own key and live figures (DESIGN section 11) */
  describeKey: (facts: KeyFacts) => Promise<unknown>;
  /** one span per request (DESIGN section 13); it starts none while tracing is off */
  traces: SpanSource;
}

/** What a request's `Expect` asks: nothing, 100-continue, or something keyward does not do. */
export type Expectation = 'none' | 'continue' | 'unmet';

export interface Exchanges {
  handle(req: IncomingMessage, res: ServerResponse, expect: Expectation): void;
  /** A CONNECT (Node hands its socket over raw): refused, and counted and logged like any request. */
  refuseConnect(req: IncomingMessage, socket: Duplex): void;
  /** Bytes Node could not parse as HTTP: answered on the socket, which then closes; counted and logged. */
  refuseUnparsed(err: NodeJS.ErrnoException, socket: Duplex): void;
  inFlight(): number;
  /**
   * From now on every response asks the client to close its connection, those in flight
   * included while their headers are still to be sent; `closeIdle` runs after each
   * response that ends during the drain, to let go of its connection if it is idle now.
   */
  startDraining(opts?: { closeIdle?: () => void }): void;
  /** resolves when nothing is in flight, or after `graceMs` */
  drained(graceMs: number): Promise<void>;
  /**
   * The grace is over and the sidecar is about to cut what is still in flight: returns how
   * many requests that is. From now on a response cut short logs no upstream failure.
   */
  cutAtShutdown(): number;
  /**
   * Resolves when no decision is under way (one waiting on Redis when its response was cut
   * still settles what it took), or after `timeoutMs`.
   */
  decided(timeoutMs: number): Promise<void>;
}
