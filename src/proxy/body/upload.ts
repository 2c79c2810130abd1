/**
 * Streamed bodies held to `server.maxUploadBytes` (DESIGN section 2): multipart bodies on
 * model routes and every body on files routes pass through unbuffered, so their size is
 * checked as they pass. A declared length over the limit is refused before a byte is
 * read; a chunked body is counted on its way to the upstream and cut the moment it goes
 * over, without passing on the chunk that went over.
 */
import type { IncomingMessage } from 'node:http';
import { EventEmitter } from 'node:events';
import { Transform } from 'node:stream';
import { deny, type Denial } from '../../errors.js';

export function bodyTooLarge(limit: number): Denial {
  return deny('body_too_large', { params: { limit } });
}

/**
 * A streamed body refused itself midway. The code is the one the forwarder reads as
 * "the body rejected itself"; the denial is what the client is answered with.
 */
export class BodyRejected extends Error {
  readonly code = 'KW_BODY_REJECTED';
  constructor(readonly denial: Denial) {
    super(denial.message);
  }
}

/** The Content-Length the request declares, or null (chunked, or none). */
export function declaredLength(req: IncomingMessage): number | null {
  const raw = req.headers['content-length'];
  if (raw === undefined) return null;
  const n = Number(raw);
  return Number.isSafeInteger(n) && n >= 0 ? n : null;
}

/** Whether a declared length already breaks `limit` (0: no limit). */
export function declaredOver(req: IncomingMessage, limit: number): boolean {
  const n = declaredLength(req);
  return limit > 0 && n !== null && n > limit;
}

/**
 * Whether the body has to be counted as it passes: only a body without a declared length
 * can outgrow the limit, since Node's parser ends a sized body at its length.
 */
export function needsCounting(req: IncomingMessage, limit: number): boolean {
  return limit > 0 && declaredLength(req) === null && req.headers['transfer-encoding'] !== undefined;
}

/** Passes bytes on until more than `limit` have gone by in all (`already` were read before). */
export function byteLimit(limit: number, already = 0): Transform {
  let seen = already;
  return new Transform({
    transform(chunk: Buffer, _enc, cb) {
      seen += chunk.length;
      if (seen > limit) cb(new BodyRejected(bodyTooLarge(limit)));
      else cb(null, chunk);
    },
  });
}

/**
 * What a stage refusing the body does to the request: it is no longer piped anywhere, and
 * the rest of it is read and dropped, so the connection (closed after the answer) does not
 * sit on unread bytes the client is still sending while its answer is written.
 */
export function dropRest(req: IncomingMessage, stage: NodeJS.WritableStream): void {
  req.unpipe(stage);
  req.resume();
}

export type UploadResult = { ok: true; source: UploadSource | null } | { ok: false; denial: Denial };

/**
 * A files-route body, piped only when the forwarder asks for it (a request denied later
 * leaves its body untouched, for Node to discard), through a byte counter. Emits
 * 'reject' with a BodyRejected when the body goes over the limit; the forwarder destroys
 * the upstream request on it.
 */
export class UploadSource extends EventEmitter {
  constructor(
    private readonly req: IncomingMessage,
    private readonly limit: number,
  ) {
    super();
  }

  pipe<T extends NodeJS.WritableStream>(dest: T): T {
    const counter = byteLimit(this.limit);
    counter.once('error', (err) => {
      dropRest(this.req, counter);
      this.emit('reject', err);
    });
    this.req.pipe(counter).pipe(dest);
    return dest;
  }
}

/**
 * A files-route body against `limit` (0: no limit): refused at once when its declared
 * length is over, counted on the way when it is chunked, left alone otherwise.
 */
export function openUpload(req: IncomingMessage, opts: { limit: number }): UploadResult {
  if (declaredOver(req, opts.limit)) return { ok: false, denial: bodyTooLarge(opts.limit) };
  return { ok: true, source: needsCounting(req, opts.limit) ? new UploadSource(req, opts.limit) : null };
}

/** The bytes a Content-Length says are still to come after `read` of them, or null without one. */
export function toComeAfter(req: IncomingMessage, read: number): number | null {
  const declared = Number(req.headers['content-length']);
  return req.headers['content-length'] !== undefined && Number.isSafeInteger(declared) ? declared - read : null;
}
