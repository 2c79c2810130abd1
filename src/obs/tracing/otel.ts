/**
 * The OpenTelemetry SDK behind a TraceSink, imported (dynamically, by sink.ts) only when
 * `tracing` is configured. The smallest set of the official packages that exports over
 * OTLP/HTTP and speaks W3C trace context:
 * - @opentelemetry/api: the span, context and propagation types every other package uses;
 * - @opentelemetry/sdk-trace: the tracer provider, the ParentBased(TraceIdRatioBased)
 *   sampler and the BatchSpanProcessor, which keeps export off the request's path;
 * - @opentelemetry/exporter-trace-otlp-http: the exporter (JSON over HTTP to `/v1/traces`);
 * - @opentelemetry/core: the W3C trace-context propagator and the export result codes;
 * - @opentelemetry/resources: the resource (service.name, and OTEL_RESOURCE_ATTRIBUTES /
 *   OTEL_SERVICE_NAME from the environment, as every OpenTelemetry SDK reads them).
 * No global provider, context manager or propagator is registered: keyward calls its own
 * tracer and propagator, so a reload can build a second provider beside the first.
 */
import type { IncomingHttpHeaders } from 'node:http';
import { ROOT_CONTEXT, SpanKind, SpanStatusCode, defaultTextMapGetter, defaultTextMapSetter, trace, type Attributes, type Span, type Tracer } from '@opentelemetry/api';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { defaultResource, detectResources, resourceAttributesEnvDetector, resourceFromAttributes, serviceNameEnvDetector } from '@opentelemetry/resources';
import { BatchSpanProcessor, ParentBasedSampler, TraceIdRatioBasedSampler, TracerProvider } from '@opentelemetry/sdk-trace';
import { type CountedProcessor, countedExport } from './counting.js';
import type { RequestSpan, SinkEvents, SinkFactory, SpanFacts, TraceSink, TraceTuning, TracingConfig } from './span.js';

const PROPAGATOR = new W3CTraceContextPropagator();

/**
 * The SDK's own batch defaults, named: the queue bound is also what the drop count mirrors
 * (counting.ts). The export timeout is left to the exporter (10 s, or
 * OTEL_EXPORTER_OTLP_TRACES_TIMEOUT) unless tuned.
 */
const DEFAULTS = { scheduledDelayMs: 5_000, maxQueueSize: 2_048, maxExportBatchSize: 512 };

/** The attributes of DESIGN section 13, exactly: what is unknown is left out rather than set empty. */
function attributesOf(f: SpanFacts): Attributes {
  const a: Attributes = { 'http.request.method': f.method, 'url.path': f.path, 'http.response.status_code': f.status };
  if (f.route !== null) a['keyward.route'] = f.route;
  if (f.code !== null) a['keyward.code'] = f.code;
  if (f.keyId !== null) a['keyward.key_id'] = f.keyId;
  if (f.projectId !== null) a['keyward.project_id'] = f.projectId;
  if (f.model !== null) a['keyward.model'] = f.model;
  if (f.shadow.length > 0) a['keyward.shadow'] = [...f.shadow];
  if (f.decisionMs !== null) a['keyward.decision_ms'] = Math.round(f.decisionMs * 1000) / 1000;
  if (f.inputTokens !== null) a['keyward.usage.input_tokens'] = f.inputTokens;
  if (f.outputTokens !== null) a['keyward.usage.output_tokens'] = f.outputTokens;
  return a;
}

/** The W3C traceparent that names `span` as the parent: same trace, its span id, its sampled flag. */
function traceparentOf(span: Span): string | null {
  const carrier: Record<string, string> = {};
  PROPAGATOR.inject(trace.setSpan(ROOT_CONTEXT, span), carrier, defaultTextMapSetter);
  return carrier.traceparent ?? null;
}

const UNTRACED: RequestSpan = { traceparent: null, end() {} };

class OtelRequestSpan implements RequestSpan {
  private ended = false;

  constructor(
    private readonly span: Span,
    readonly traceparent: string | null,
    private readonly owner: OtelSink,
  ) {}

  end(facts: SpanFacts): void {
    if (this.ended) return;
    this.ended = true;
    const span = this.span;
    try {
      // An unsampled span records nothing: its attributes are not worth building.
      if (span.isRecording()) {
        span.updateName(`keyward ${facts.routeClass ?? 'none'}`);
        span.setAttributes(attributesOf(facts));
        // A refusal the client caused (4xx) is the server working; only a 5xx is an error,
        // or a response cut on keyward's side after its head went out (its status reads 200).
        if (facts.status >= 500) span.setStatus({ code: SpanStatusCode.ERROR, ...(facts.code !== null ? { message: facts.code } : {}) });
        else if (facts.cut !== null) span.setStatus({ code: SpanStatusCode.ERROR, message: facts.cut });
      }
      span.end();
    } catch {
      // A fault in the tracer costs this span, never the exchange that ends it.
    } finally {
      this.owner.spanEnded();
    }
  }
}

class OtelSink implements TraceSink {
  private readonly provider: TracerProvider;
  private readonly tracer: Tracer;
  private readonly propagate: boolean;
  /** spans started and not yet ended: a replaced sink closes once this is 0 */
  private open = 0;
  private onIdle: (() => void) | null = null;
  private readonly processor: CountedProcessor;

  constructor(o: { config: TracingConfig; tuning: TraceTuning; events: SinkEvents }) {
    const t = { ...DEFAULTS, ...o.tuning };
    const exporter = new OTLPTraceExporter({
      url: `${o.config.otlpUrl.replace(/\/+$/, '')}/v1/traces`,
      ...(t.exportTimeoutMs !== undefined ? { timeoutMillis: t.exportTimeoutMs } : {}),
    });
    const processor = (this.processor = countedExport({
      exporter,
      events: o.events,
      capacity: t.maxQueueSize,
      batch: (counted) =>
        new BatchSpanProcessor({ exporter: counted, maxQueueSize: t.maxQueueSize, maxExportBatchSize: Math.min(t.maxExportBatchSize, t.maxQueueSize), scheduledDelayMillis: t.scheduledDelayMs }),
    }));
    const resource = defaultResource()
      .merge(resourceFromAttributes({ 'service.name': 'keyward', 'process.pid': process.pid }))
      .merge(detectResources({ detectors: [resourceAttributesEnvDetector, serviceNameEnvDetector] }));
    this.provider = new TracerProvider({
      resource,
      sampler: new ParentBasedSampler({ root: new TraceIdRatioBasedSampler(o.config.sampleRatio) }),
      spanProcessors: [processor],
    });
    this.tracer = this.provider.getTracer('keyward');
    this.propagate = o.config.propagate;
  }

  start(headers: IncomingHttpHeaders): RequestSpan {
    let span: Span;
    let traceparent: string | null;
    try {
      const parent = PROPAGATOR.extract(ROOT_CONTEXT, headers, defaultTextMapGetter);
      span = this.tracer.startSpan('keyward', { kind: SpanKind.SERVER }, parent);
      // A tracestate that came without a valid traceparent belongs to no trace (W3C Trace
      // Context discards it). Naming keyward's new trace beside it would hand the gateway
      // another trace's vendor state as this one's, and tracestate is not keyward's to
      // change: the lines pass as they came.
      const orphanState = headers.tracestate !== undefined && trace.getSpanContext(parent) === undefined;
      traceparent = this.propagate && !orphanState ? traceparentOf(span) : null;
    } catch {
      // A fault in the tracer leaves the request untraced, its headers as received.
      return UNTRACED;
    }
    this.open++;
    return new OtelRequestSpan(span, traceparent, this);
  }

  spanEnded(): void {
    if (--this.open === 0) this.onIdle?.();
  }

  async close(): Promise<void> {
    if (this.open > 0) await new Promise<void>((resolve) => (this.onIdle = resolve));
    // Flushes the batch still queued, then lets go of the exporter's connections. A last
    // export that fails is counted and logged like any other, not reported again here. The
    // shutdown does not wait for an export already under way: that is waited for here.
    await this.provider.shutdown().catch(() => {});
    await this.processor.idle();
  }

  abandon(): void {
    this.processor.abandon();
  }
}

export const createOtelSink: SinkFactory = (o) => new OtelSink(o);
