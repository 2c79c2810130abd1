/**
 * pino JSON on stdout (DESIGN section 9). Request lines are built from an explicit
 * field list, never from headers, so no credential can slip into a log line.
 */
import pino, { type Logger } from 'pino';

export type { Logger };

export function createLogger(opts: { level: string; destination?: pino.DestinationStream }): Logger {
  return pino(
    {
      level: opts.level,
      base: { service: 'keyward' },
      timestamp: pino.stdTimeFunctions.isoTime,
      formatters: { level: (label) => ({ level: label }) },
      // Defence in depth: should a header object ever be logged by mistake, these never print.
      redact: { paths: ['authorization', '*.authorization', 'headers.authorization', 'headers["x-api-key"]', 'key', '*.key'], censor: '[redacted]' },
    },
    opts.destination ?? pino.destination({ fd: 1, sync: false }),
  );
}

/** One line per request, written when the response has ended. */
export interface AccessLine {
  req_id: string;
  method: string;
  path: string;
  route: string | null;
  status: number;
  code: string | null;
  key_id: string | null;
  key_kind: string | null;
  project_id: string | null;
  user_id: string | null;
  model: string | null;
  routing: string | null;
  app_name: string | null;
  app_url: string | null;
  input_tokens: number | null;
  output_tokens: number | null;
  api_version: string | null;
  duration_ms: number;
  upstream_ms: number | null;
}

/**
 * Writes access lines straight to the logger's destination, serialised by hand from the
 * fixed field list: the request path's one log line costs a few microseconds instead of
 * pino's generic serialisation. The line has pino's shape (level, time, service, msg).
 */
export function accessWriter(logger: Logger): (line: AccessLine) => void {
  const stream = (logger as unknown as Record<symbol, { write(s: string): unknown }>)[pino.symbols.streamSym]!;
  return (line) => {
    if (!logger.isLevelEnabled('info')) return;
    let out = `{"level":"info","time":"${new Date().toISOString()}","service":"keyward"`;
    for (const k in line) {
      const v = line[k as keyof AccessLine];
      out += `,"${k}":${typeof v === 'string' ? JSON.stringify(v) : v === null ? 'null' : String(v)}`;
    }
    stream.write(`${out},"msg":"request"}\n`);
  };
}

const CONTROL = /[\x00-\x1f\x7f]/g; // eslint-disable-line no-control-regex

/** Attribution headers: trimmed, control characters removed, at most 256 characters. */
export function cleanAttribution(value: string | string[] | undefined): string | null {
  if (value === undefined) return null;
  const v = (Array.isArray(value) ? value[0] ?? '' : value).replace(CONTROL, '').trim().slice(0, 256);
  return v === '' ? null : v;
}

const SANE_REQUEST_ID = /^[A-Za-z0-9._:@/+=-]{1,128}$/;

export function saneRequestId(value: string | string[] | undefined): string | null {
  const v = Array.isArray(value) ? value[0] : value;
  return v !== undefined && SANE_REQUEST_ID.test(v) ? v : null;
}
