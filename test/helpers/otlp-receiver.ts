/**
 * A local OTLP/HTTP receiver, as a collector would be: an HTTP server on port 0 that takes
 * the JSON the OpenTelemetry JavaScript exporter posts to `/v1/traces`, keeps every body
 * as received, and flattens the spans for tests to read.
 */
import { createServer, type Server } from 'node:http';
import { EventEmitter, once } from 'node:events';

type AnyValue = { stringValue?: string; intValue?: number | string; doubleValue?: number; boolValue?: boolean; arrayValue?: { values?: AnyValue[] } };
type KeyValue = { key: string; value: AnyValue };

export interface ReceivedSpan {
  traceId: string;
  spanId: string;
  /** '' for a root span */
  parentSpanId: string;
  name: string;
  /** OTLP's SpanKind: 2 is SERVER */
  kind: number;
  /** OTLP's status code: 0 unset, 1 ok, 2 error */
  statusCode: number;
  attributes: Record<string, unknown>;
  resource: Record<string, unknown>;
  /** the span's object in the posted JSON, untouched */
  raw: Record<string, unknown>;
}

export interface OtlpReceiver {
  /** the base URL, for `tracing.otlpUrl` */
  url: string;
  spans: ReceivedSpan[];
  /** every request body, parsed */
  bodies: unknown[];
  /** spans of the batches answered with an error status (see `refuse`) */
  refused: ReceivedSpan[];
  /** answers every batch from now on with `status` (a collector that refuses); null accepts again */
  refuse(status: number | null): void;
  /** resolves once at least `n` spans have arrived in all (accepted or refused) */
  waitForSpans(n: number, timeoutMs?: number): Promise<ReceivedSpan[]>;
  /** resolves with the first span that matches, as soon as it arrives */
  waitFor(pred: (s: ReceivedSpan) => boolean, timeoutMs?: number): Promise<ReceivedSpan>;
  close(): Promise<void>;
}

export function valueOf(v: AnyValue): unknown {
  if (v.stringValue !== undefined) return v.stringValue;
  if (v.intValue !== undefined) return Number(v.intValue);
  if (v.doubleValue !== undefined) return v.doubleValue;
  if (v.boolValue !== undefined) return v.boolValue;
  if (v.arrayValue !== undefined) return (v.arrayValue.values ?? []).map(valueOf);
  return undefined;
}

const record = (kvs: KeyValue[] | undefined): Record<string, unknown> => Object.fromEntries((kvs ?? []).map((kv) => [kv.key, valueOf(kv.value)]));

function flatten(body: any): ReceivedSpan[] {
  const out: ReceivedSpan[] = [];
  for (const rs of body.resourceSpans ?? []) {
    const resource = record(rs.resource?.attributes);
    for (const ss of rs.scopeSpans ?? []) {
      for (const s of ss.spans ?? []) {
        out.push({
          traceId: s.traceId, spanId: s.spanId, parentSpanId: s.parentSpanId ?? '', name: s.name, kind: s.kind,
          statusCode: s.status?.code ?? 0, attributes: record(s.attributes), resource, raw: s,
        });
      }
    }
  }
  return out;
}

export async function startOtlpReceiver(): Promise<OtlpReceiver> {
  const spans: ReceivedSpan[] = [];
  const refused: ReceivedSpan[] = [];
  let refusal: number | null = null;
  const bodies: unknown[] = [];
  const events = new EventEmitter();
  /** resolves with `found()` once it is not undefined, checked after every batch */
  const when = <T>(found: () => T | undefined, what: string, timeoutMs: number): Promise<T> => {
    const now = found();
    if (now !== undefined) return Promise.resolve(now);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        events.off('spans', check);
        reject(new Error(`timed out waiting for ${what} (${spans.length} spans, ${refused.length} refused)`));
      }, timeoutMs);
      const check = () => {
        const hit = found();
        if (hit === undefined) return;
        clearTimeout(timer);
        events.off('spans', check);
        resolve(hit);
      };
      events.on('spans', check);
    });
  };
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      if (req.method !== 'POST' || req.url !== '/v1/traces' || !String(req.headers['content-type']).startsWith('application/json')) {
        res.writeHead(404).end();
        return;
      }
      const body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
      bodies.push(body);
      if (refusal !== null) {
        refused.push(...flatten(body));
        res.writeHead(refusal, { 'content-type': 'application/json' }).end('{"code":3,"message":"refused by the test"}');
      } else {
        spans.push(...flatten(body));
        res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
      }
      events.emit('spans');
    });
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const port = (server.address() as { port: number }).port;
  return {
    url: `http://127.0.0.1:${port}`,
    spans,
    bodies,
    refused,
    refuse: (status) => void (refusal = status),
    waitForSpans: (n, timeoutMs = 10_000) => when(() => (spans.length + refused.length >= n ? spans : undefined), `${n} spans`, timeoutMs),
    waitFor: (pred, timeoutMs = 10_000) => when(() => spans.find(pred), 'a matching span', timeoutMs),
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
