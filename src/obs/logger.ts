/**
 * pino JSON on stdout (DESIGN section 9). Request lines are built from an explicit
 * field list, never from headers, so no credential can slip into a log line.
 */
import pino, { type Logger } from 'pino';

export type { Logger };

/** stdout or a file, written asynchronously; pino flushes what is left when the process exits. */
export function logDestination(dest: string | number = 1): pino.DestinationStream {
  return pino.destination({ dest, sync: false });
}

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
    opts.destination ?? logDestination(1),
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

export interface AccessWriter {
  (line: AccessLine): void;
  /** hands every held line to the logger's stream now */
  flush(): void;
}

/** The longest an access line waits before it is handed to the stream. */
const ACCESS_FLUSH_MS = 50;
const ACCESS_BATCH_LINES = 512;

/**
 * Access lines, serialised by hand from the fixed field list (a few microseconds instead
 * of pino's generic path) and handed to the logger's stream in batches: one stream write
 * per line cost more than building the line. The lines keep pino's shape (level, time,
 * service, msg) and go to the same destination as every other log line.
 */
export function accessWriter(logger: Logger): AccessWriter {
  const stream = (logger as unknown as Record<symbol, { write(s: string): unknown; flushSync?: () => void }>)[pino.symbols.streamSym]!;
  const str = (v: string | null) => (v === null ? 'null' : JSON.stringify(v));
  let held: string[] = [];
  let timer: NodeJS.Timeout | null = null;
  const flush = () => {
    if (timer) clearTimeout(timer);
    timer = null;
    if (held.length === 0) return;
    const text = held.join('');
    held = [];
    stream.write(text);
  };
  process.once('exit', () => {
    flush();
    stream.flushSync?.();
  });
  const write = ((l: AccessLine) => {
    if (!logger.isLevelEnabled('info')) return;
    held.push(
      `{"level":"info","time":"${new Date().toISOString()}","service":"keyward","req_id":${str(l.req_id)},"method":${str(l.method)},` +
        `"path":${str(l.path)},"route":${str(l.route)},"status":${l.status},"code":${str(l.code)},"key_id":${str(l.key_id)},` +
        `"key_kind":${str(l.key_kind)},"project_id":${str(l.project_id)},"user_id":${str(l.user_id)},"model":${str(l.model)},` +
        `"routing":${str(l.routing)},"app_name":${str(l.app_name)},"app_url":${str(l.app_url)},"input_tokens":${l.input_tokens},` +
        `"output_tokens":${l.output_tokens},"api_version":${str(l.api_version)},"duration_ms":${l.duration_ms},"upstream_ms":${l.upstream_ms},"msg":"request"}\n`,
    );
    if (held.length >= ACCESS_BATCH_LINES) flush();
    else if (timer === null) timer = setTimeout(flush, ACCESS_FLUSH_MS);
  }) as AccessWriter;
  write.flush = flush;
  return write;
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
