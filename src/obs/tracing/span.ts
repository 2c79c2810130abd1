/**
 * What a request's span is to the code around it (DESIGN section 13): the facts it ends
 * with, the sink that starts it, the events a sink reports. Types only, shared by the
 * holder (sink.ts) and the OpenTelemetry adapter it loads on first use (otel.ts).
 */
import type { IncomingHttpHeaders } from 'node:http';
import type { Config } from '../../config/schema.js';
import type { LogSink } from '../../log.js';

export type TracingConfig = NonNullable<Config['tracing']>;

/** What a request's span carries when it ends: never a key, a key prefix, a hash, a body or a query string. */
export interface SpanFacts {
  /** the route's class, null when none was found: the span is named `keyward <class>` (`keyward none`) */
  routeClass: string | null;
  method: string;
  /** without the query */
  path: string;
  status: number;
  /**
   * why a response that began did not end whole, when keyward's side cut it: its upstream
   * stopped short, or the shutdown grace ran out; null otherwise (a client that left is not
   * one). The status names the head that went out, so alone it would read as a success.
   */
  cut: 'upstream_cut' | 'shutdown_cut' | null;
  route: string | null;
  /** the denial code */
  code: string | null;
  keyId: string | null;
  projectId: string | null;
  model: string | null;
  /** codes of shadowed checks that would have refused (DESIGN section 12) */
  shadow: readonly string[];
  /** arrival to allow/deny, null when no decision was reached */
  decisionMs: number | null;
  inputTokens: number | null;
  outputTokens: number | null;
}

/** One request's span. */
export interface RequestSpan {
  /** what the forwarded request's traceparent becomes (keyward's span as parent); null: headers pass unchanged */
  readonly traceparent: string | null;
  /** once, when the exchange finishes */
  end(facts: SpanFacts): void;
}

/** Where the exchange gets a request's span. */
export interface SpanSource {
  /** a span for a request that just arrived, or null when nothing is traced */
  start(headers: IncomingHttpHeaders): RequestSpan | null;
}

export interface TraceSink {
  /** a span for a request that just arrived, child of its W3C traceparent when it has one */
  start(headers: IncomingHttpHeaders): RequestSpan;
  /** waits for the spans still open, hands everything to the collector, lets go of the exporter */
  close(): Promise<void>;
  /** close() ran out of time: what it had not got to the collector is counted as dropped */
  abandon(): void;
}

/** Export settings that are not configuration: the SDK's defaults, shortened in tests. */
export interface TraceTuning {
  /** one export to the collector, retries included */
  exportTimeoutMs?: number;
  /** how long a finished span may wait for its batch */
  scheduledDelayMs?: number;
  /** finished spans waiting for export; more are dropped (and counted) */
  maxQueueSize?: number;
  maxExportBatchSize?: number;
}

/** What a sink reports back to the holder, which outlives every sink it holds. */
export interface SinkEvents {
  /** spans that will never reach the collector: the queue was full, their export failed, or shutdown could not wait for it */
  dropped(spans: number, reason: 'queue_full' | 'export_failed' | 'shutdown', err?: Error): void;
  /** a batch reached the collector */
  exported(): void;
  log: LogSink;
}

export type SinkFactory = (o: { config: TracingConfig; tuning: TraceTuning; events: SinkEvents }) => TraceSink;
