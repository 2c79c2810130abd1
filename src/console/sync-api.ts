/**
 * Sync protocol v1 (DESIGN section 7) as the console serves it: snapshot, long-poll
 * changes with 410 for a cursor the feed no longer holds (pruned, or of a history this
 * store does not cover it with), and usage ingestion. The caller
 * has already checked the sync token.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { CHANGES_PATH, MAX_TAG_CHARS, SNAPSHOT_PATH, USAGE_PATH } from '../protocol/records.js';
import { parseUsageLines } from '../protocol/usage.js';
import { ApiError, MethodNotAllowed, invalid } from './errors.js';
import { intParam, readBody, sendJson } from './http.js';
import type { LogSink } from '../log.js';
import type { Pricer } from './pricing.js';
import { streamSnapshot } from './snapshot.js';
import type { ConsoleStore } from './store.js';
import { ingestUsage } from './usage.js';

export const MAX_WAIT_MS = 60_000;

export interface SyncContext {
  req: IncomingMessage;
  res: ServerResponse;
  path: string;
  query: URLSearchParams;
  store: ConsoleStore;
  pricer: Pricer;
  maxUsageBytes: number;
  log: LogSink;
}

/**
 * The history tag a sidecar sends back, bounded. Any other text of that length is a tag
 * this store does not have (410, then a snapshot), not a bad request: a sidecar may carry
 * a tag another console gave it, and a 400 would leave it retrying forever.
 */
function tagParam(q: URLSearchParams): string | null {
  const raw = q.get('tag');
  if (raw === null) return null;
  if (raw.length === 0 || raw.length > MAX_TAG_CHARS) throw invalid(`tag must be 1 to ${MAX_TAG_CHARS} characters`);
  return raw;
}

async function changes(c: SyncContext): Promise<void> {
  const after = intParam(c.query, 'after', { min: 0, max: Number.MAX_SAFE_INTEGER });
  const tag = tagParam(c.query);
  const waitMs = intParam(c.query, 'waitMs', { min: 0, max: MAX_WAIT_MS, def: 0 });
  // A sidecar that hangs up (or restarts) must not leave a waiter behind.
  const gone = new AbortController();
  const onClose = () => gone.abort();
  c.res.once('close', onClose);
  try {
    const answer = await c.store.feed.next({ after, tag, waitMs, signal: gone.signal });
    if (c.res.destroyed) return;
    if (answer.kind === 'gone') {
      const where = tag === null ? `version ${after}` : `version ${after} of history ${tag}`;
      sendJson(c.res, 410, { error: { code: 'cursor_gone', message: `${where} is not in the retained history; take a snapshot` }, version: answer.version });
    } else if (answer.kind === 'changes') {
      sendJson(c.res, 200, answer.body);
    } else {
      sendJson(c.res, 200, { version: answer.version, ...(answer.tag === null ? {} : { tag: answer.tag }), changes: [] });
    }
  } finally {
    c.res.off('close', onClose);
  }
}

async function usage(c: SyncContext): Promise<void> {
  // The clocks are compared when the head arrives: reading the body and waiting for the store are not skew.
  const arrived = c.store.now();
  const body = await readBody(c.req, c.maxUsageBytes);
  const { events, errors } = parseUsageLines(body.toString('utf8'));
  const date = c.req.headers.date;
  const result = ingestUsage({ store: c.store, pricer: c.pricer, events, ...(date !== undefined ? { sent: { date, arrived } } : {}) });
  if (errors.length > 0) c.log.warn({ invalid: errors.length, first: errors[0] }, 'usage lines rejected');
  // Valid lines are charged even when others are not: retrying cannot fix a malformed line.
  sendJson(c.res, 200, { ...result, invalid: errors.length, errors: errors.slice(0, 20) });
}

export async function handleSync(c: SyncContext): Promise<void> {
  const method = c.req.method;
  if (c.path === SNAPSHOT_PATH && method === 'GET') {
    c.res.writeHead(200, { 'content-type': 'application/x-ndjson', 'cache-control': 'no-store' });
    const { version, records } = await streamSnapshot({ db: c.store.db, res: c.res });
    c.log.info({ version, records }, 'snapshot served');
    return;
  }
  if (c.path === CHANGES_PATH && method === 'GET') return changes(c);
  if (c.path === USAGE_PATH && method === 'POST') return usage(c);
  if (c.path === SNAPSHOT_PATH || c.path === CHANGES_PATH || c.path === USAGE_PATH) {
    throw new MethodNotAllowed([c.path === USAGE_PATH ? 'POST' : 'GET']);
  }
  throw new ApiError(404, 'not_found', 'no such endpoint');
}
