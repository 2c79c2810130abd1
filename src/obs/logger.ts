/**
 * pino JSON on stdout (DESIGN section 9). Request lines are built from an explicit
 * field list, never from headers, so no credential can slip into a log line.
 */
import pino from 'pino';
import { fitLine } from './line-fit.js';
import { isoClock } from '../protocol/iso-clock.js';

/**
 * The sidecar's logger: pino, plus the access-line writer that shares its destination
 * (handed to both here, so nothing reaches into pino's internals to find it).
 */
export type Logger = pino.Logger & { readonly access: AccessWriter };

/**
 * Largest write a pipe takes whole (POSIX PIPE_BUF on Linux): cluster workers share one
 * stdout, and writes this size or smaller from two processes never interleave.
 */
export const PIPE_ATOMIC_BYTES = 4096;

/** Credential fields a logged object may carry: at its top, one level down, in its headers, or in a nested object's (a request logged whole). */
const REDACTED = [
  'authorization', '*.authorization', 'key', '*.key',
  'headers.authorization', 'headers["x-api-key"]', '*.headers.authorization', '*.headers["x-api-key"]',
];

/**
 * stdout or a file, written asynchronously. `shared`: other processes write to the same
 * stdout, so every write holds whole lines within PIPE_ATOMIC_BYTES (sonic-boom's maxWrite
 * counts bytes).
 *
 * minLength 1 writes as soon as there is anything, as 0 (the default) would, and makes
 * sonic-boom's flush(cb) wait until every byte is written, which with 0 calls back at once.
 * `flushed` relies on it before exit: pino's exit-time flush skips a write in flight (one
 * waiting on a slow stdout reader), which then reaches the reader cut short or not at all.
 */
export function logDestination(dest: string | number = 1, opts: { shared?: boolean } = {}): pino.DestinationStream {
  return pino.destination({ dest, sync: false, minLength: 1, ...(opts.shared ? { maxWrite: PIPE_ATOMIC_BYTES } : {}) });
}

export function createLogger(opts: {
  level: string;
  destination?: pino.DestinationStream;
  /** fields on every line after `service`, e.g. the cluster worker's id; never a key */
  fields?: Record<string, string | number>;
  /** stdout is shared with other processes (cluster workers): keep writes line-atomic */
  shared?: boolean;
}): Logger {
  const destination = opts.destination ?? logDestination(1, { shared: opts.shared ?? false });
  const fields = opts.fields ?? {};
  const logger = pino(
    {
      level: opts.level,
      base: { service: 'keyward', ...fields },
      timestamp: pino.stdTimeFunctions.isoTime,
      formatters: { level: (label) => ({ level: label }) },
      // Shared stdout: every line within one atomic pipe write (line-fit.ts).
      ...(opts.shared ? { hooks: { streamWrite: (line: string) => fitLine(line, PIPE_ATOMIC_BYTES) } } : {}),
      // Defence in depth: should a header object ever be logged by mistake, these never print.
      redact: { paths: REDACTED, censor: '[redacted]' },
    },
    destination,
  );
  const extra = Object.entries(fields).map(([k, v]) => `,${JSON.stringify(k)}:${JSON.stringify(v)}`).join('');
  return Object.assign(logger, { access: accessWriter({ stream: destination, extra, chunkBytes: opts.shared ? PIPE_ATOMIC_BYTES : Infinity, enabled: () => logger.isLevelEnabled('info') }) });
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
  usage_estimated: boolean | null;
  client_ip: string | null;
  api_version: string | null;
  duration_ms: number;
  upstream_ms: number | null;
  /** codes of shadowed checks that would have refused (DESIGN section 12); the field is written only when there are any */
  shadow: readonly string[];
}

export interface AccessWriter {
  /**
   * `logged`: whether the level the request arrived under writes access lines (a reload may
   * have changed the logger's since); without it, the logger's level now decides.
   */
  (line: AccessLine, logged?: boolean): void;
  /** hands every held line to the logger's stream now */
  flush(): void;
}

/**
 * The longest an access line waits before it is handed to the stream. Short: a held line
 * that is alive when a young-generation collection runs is copied and then promoted, so
 * the longer lines wait, the more of each collection's work they become. Under load a
 * short wait still gathers many lines into each write.
 */
const ACCESS_FLUSH_MS = 5;
const ACCESS_BATCH_LINES = 512;

/**
 * Whether JSON writes the string as it is, between quotes: printable ASCII without `"`
 * or `\\`. Most fields (ids, paths, models, addresses) are; the rest go through
 * JSON.stringify.
 */
function plain(v: string): boolean {
  for (let i = 0; i < v.length; i++) {
    const c = v.charCodeAt(i);
    if (c < 0x20 || c > 0x7e || c === 0x22 || c === 0x5c) return false;
  }
  return true;
}

/**
 * JSON text of a duration in ms rounded to µs (`Math.round(ms * 1000) / 1000`), the same
 * text as `String(ms)`, made from integers: formatting a fraction goes through V8's
 * shortest-digits search, which cost more than the rest of the two fields. Anything else
 * (null, negative, past 23 days, more digits) is left to `String`.
 */
export function msText(ms: number | null): string {
  if (ms === null) return 'null';
  const us = Math.round(ms * 1000);
  if (!(us >= 0 && us < 2e12) || us / 1000 !== ms) return String(ms);
  const whole = (us / 1000) | 0;
  let frac = us - whole * 1000;
  if (frac === 0) return String(whole);
  let digits = 3;
  while (frac % 10 === 0) {
    frac /= 10;
    digits--;
  }
  // the fraction's leading zeros: 0.005 is 5 in three digits, 0.05 is 5 in two
  const zeros = digits - (frac < 10 ? 1 : frac < 100 ? 2 : 3);
  return `${whole}${zeros === 0 ? '.' : zeros === 1 ? '.0' : '.00'}${frac}`;
}

/** JSON text of a string field, or null. */
const str = (v: string | null): string => (v === null ? 'null' : plain(v) ? `"${v}"` : JSON.stringify(v));

/**
 * str() for one field, remembering its last value: most fields repeat from line to line
 * (a key's ids and kind, the route, the method, the model), often as the same string the
 * replica or the route table handed out, whose comparison is then a pointer's.
 */
function field(): (v: string | null) => string {
  let last: string | null = null;
  let text = 'null';
  return (v) => {
    if (v !== last) {
      last = v;
      text = str(v);
    }
    return text;
  };
}

/** An access line as pino would write it (level, time, service, extra fields, then the line's). */
function lineFormat(extra: string): (l: AccessLine) => string {
  const isoTime = isoClock();
  const f = {
    method: field(), path: field(), route: field(), code: field(), keyId: field(), keyKind: field(), projectId: field(),
    userId: field(), model: field(), routing: field(), appName: field(), appUrl: field(), clientIp: field(), apiVersion: field(),
  };
  return (l) =>
    `{"level":"info","time":"${isoTime()}","service":"keyward"${extra},"req_id":${str(l.req_id)},"method":${f.method(l.method)},` +
    `"path":${f.path(l.path)},"route":${f.route(l.route)},"status":${l.status},"code":${f.code(l.code)},"key_id":${f.keyId(l.key_id)},` +
    `"key_kind":${f.keyKind(l.key_kind)},"project_id":${f.projectId(l.project_id)},"user_id":${f.userId(l.user_id)},"model":${f.model(l.model)},` +
    `"routing":${f.routing(l.routing)},"app_name":${f.appName(l.app_name)},"app_url":${f.appUrl(l.app_url)},"input_tokens":${l.input_tokens},` +
    `"output_tokens":${l.output_tokens},"usage_estimated":${l.usage_estimated},` +
    `"client_ip":${f.clientIp(l.client_ip)},"api_version":${f.apiVersion(l.api_version)},"duration_ms":${msText(l.duration_ms)},"upstream_ms":${msText(l.upstream_ms)},` +
    `${l.shadow.length === 0 ? '' : `"shadow":[${l.shadow.map(str).join(',')}],`}"msg":"request"}\n`;
}

/** Writes whole lines, each write within chunkBytes (a longer line goes alone). */
function writeLines(stream: pino.DestinationStream, lines: string[], chunkBytes: number): void {
  if (chunkBytes === Infinity) return void stream.write(lines.join(''));
  let chunk = '';
  let bytes = 0;
  for (const line of lines) {
    const n = Buffer.byteLength(line);
    if (bytes > 0 && bytes + n > chunkBytes) {
      stream.write(chunk);
      chunk = '';
      bytes = 0;
    }
    chunk += line;
    bytes += n;
  }
  if (bytes > 0) stream.write(chunk);
}

/**
 * Access lines, serialised by hand from the fixed field list (pino's generic path walks
 * every field of an object it knows nothing about) and handed to the logger's stream in
 * batches: a stream write per line would cost more than building the line. The lines
 * keep pino's shape (level, time, service, msg) and go to the same destination as every
 * other log line.
 */
function accessWriter(opts: { stream: pino.DestinationStream; extra: string; chunkBytes: number; enabled: () => boolean }): AccessWriter {
  const stream = opts.stream as pino.DestinationStream & { flushSync?: () => void };
  const format = lineFormat(opts.extra);
  let held: string[] = [];
  let timer: NodeJS.Timeout | null = null;
  const flush = () => {
    if (timer) clearTimeout(timer);
    timer = null;
    if (held.length === 0) return;
    const lines = held;
    held = [];
    writeLines(stream, lines, opts.chunkBytes);
  };
  process.once('exit', () => {
    flush();
    stream.flushSync?.();
  });
  // A line only gets near chunkBytes when clients send long non-ASCII paths, models and
  // attribution headers; a UTF-16 unit is at most 3 UTF-8 bytes, so the length test spares
  // every other line the work.
  const mayOverflow = opts.chunkBytes / 3;
  const write = ((l: AccessLine, logged?: boolean) => {
    if (!(logged ?? opts.enabled())) return;
    let line = format(l);
    if (line.length > mayOverflow) line = fitLine(line, opts.chunkBytes);
    held.push(line);
    if (held.length >= ACCESS_BATCH_LINES) flush();
    else if (timer === null) timer = setTimeout(flush, ACCESS_FLUSH_MS);
  }) as AccessWriter;
  write.flush = flush;
  return write;
}

/** How long `flushed` waits for stdout's reader before the process exits anyway. */
const FLUSH_TIMEOUT_MS = 5_000;

/**
 * Resolves once every line is written (before a process exits), or after `timeoutMs`: a
 * reader that stopped reading must not hold a shutdown for ever.
 */
export function flushed(logger: pino.Logger, timeoutMs = FLUSH_TIMEOUT_MS): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, timeoutMs);
    logger.flush(() => {
      clearTimeout(timer);
      resolve();
    });
  });
}
