/**
 * Reads form fields from the head of a multipart/form-data body, stopping at the first
 * file part, so the upload itself streams through untouched. Pure and incremental: feed
 * it the bytes seen so far; it says whether it needs more.
 */
import { Transform } from 'node:stream';

export type FieldScan =
  | { state: 'more' }
  /** fields before the first file part (or the end); `bytes` is how many body bytes they took */
  | { state: 'done'; fields: Map<string, string[]>; bytes: number; fileAt: number | null }
  | { state: 'error'; message: string };

/**
 * The boundary from a content-type header, or null. RFC 2046 allows 1-70 characters; a
 * longer one, or a header naming two boundaries, is refused rather than guessed at, so
 * the sidecar never reads a body differently from the upstream.
 */
export function multipartBoundary(contentType: string | undefined): string | null {
  if (!contentType || !/^multipart\/form-data\s*(;|$)/i.test(contentType)) return null;
  const all = [...contentType.matchAll(/;\s*boundary=(?:"([^"]*)"|([^\s;]*))/gi)];
  if (all.length !== 1) return null;
  const b = all[0]![1] ?? all[0]![2] ?? '';
  return b.length >= 1 && b.length <= 70 ? b : null;
}

/** The first delimiter: at the very start of the body or at the start of a line. */
function firstDelimiter(buf: Buffer, delim: Buffer): number {
  for (let at = buf.indexOf(delim); at !== -1; at = buf.indexOf(delim, at + 1)) {
    if (at === 0 || (buf[at - 2] === 13 && buf[at - 1] === 10)) return at;
  }
  return -1;
}

/** The form-field name a part's headers give, and whether the part is a file. */
export function partDisposition(headerText: string): { name: string | null; isFile: boolean } {
  const line = headerText.split('\r\n').find((l) => /^content-disposition\s*:/i.test(l)) ?? '';
  const name = /;\s*name="([^"]*)"/i.exec(line)?.[1] ?? /;\s*name=([^;\s]+)/i.exec(line)?.[1] ?? null;
  return { name, isFile: /;\s*filename\*?=/i.test(line) };
}

const CRLFCRLF = Buffer.from('\r\n\r\n');


/**
 * Scans `buf` (the body so far). `ended` says no more bytes will come. Fields are
 * collected until a part with a filename, the closing delimiter, or the end.
 */
export function scanFields(buf: Buffer, boundary: string, ended: boolean): FieldScan {
  const delim = Buffer.from(`--${boundary}`);
  const nextDelim = Buffer.from(`\r\n--${boundary}`);
  const fields = new Map<string, string[]>();
  let pos = firstDelimiter(buf, delim);
  if (pos === -1) return ended ? { state: 'error', message: 'The multipart body has no boundary delimiter.' } : { state: 'more' };
  for (;;) {
    const afterDelim = pos + delim.length;
    if (buf.length < afterDelim + 2) return ended ? { state: 'done', fields, bytes: buf.length, fileAt: null } : { state: 'more' };
    if (buf[afterDelim] === 45 && buf[afterDelim + 1] === 45) return { state: 'done', fields, bytes: afterDelim + 2, fileAt: null }; // "--": close
    const headersEnd = buf.indexOf(CRLFCRLF, afterDelim);
    if (headersEnd === -1) return ended ? { state: 'error', message: 'A multipart part has unterminated headers.' } : { state: 'more' };
    const part = partDisposition(buf.toString('latin1', afterDelim, headersEnd));
    if (part.isFile) return { state: 'done', fields, bytes: pos, fileAt: pos };
    const valueStart = headersEnd + 4;
    const valueEnd = buf.indexOf(nextDelim, valueStart);
    if (valueEnd === -1) return ended ? { state: 'error', message: 'A multipart field is not terminated.' } : { state: 'more' };
    if (part.name !== null) {
      const list = fields.get(part.name) ?? [];
      list.push(buf.toString('utf8', valueStart, valueEnd));
      fields.set(part.name, list);
    }
    pos = valueEnd + 2;
  }
}

/** A form field the sidecar already read appeared again after the first file part. */
export class LateFieldError extends Error {
  readonly code = 'KW_BODY_REJECTED';
}

/**
 * Looks in `data` (bytes from the first file part on) for a part named `field`. Returns
 * found, or the offset from which bytes must be kept to finish the search once more
 * arrive (a marker or a part's headers cut at the end).
 */
export function scanLateField(data: Buffer, opts: { boundary: string; field: string; maxHeaderBytes?: number }): { found: true } | { found: false; keepFrom: number } {
  const marker = Buffer.from(`\r\n--${opts.boundary}`);
  const maxHeader = opts.maxHeaderBytes ?? 8192;
  let keepFrom = Math.max(0, data.length - marker.length + 1);
  let from = 0;
  for (let at = data.indexOf(marker, from); at !== -1; at = data.indexOf(marker, from)) {
    const headersStart = at + marker.length;
    const headersEnd = data.indexOf(CRLFCRLF, headersStart);
    if (headersEnd === -1) {
      if (data.length - headersStart <= maxHeader) keepFrom = Math.min(keepFrom, at);
      break;
    }
    if (partDisposition(data.toString('latin1', headersStart, headersEnd)).name === opts.field) return { found: true };
    from = headersEnd;
  }
  return { found: false, keepFrom };
}

export const lateFieldMessage = (field: string) => `The form names "${field}" again after the file part; send it once, before the file.`;

/**
 * Watches the streamed rest of a multipart body (from the first file part on) for a
 * part named `field`. The sidecar checked the first value; an upstream that takes the
 * last value would use another, so such a body is refused. A chunk that completes such
 * a part's headers is never passed on. Memory stays bounded: at most one part header
 * plus one chunk is held.
 */
export function createLateFieldGuard(opts: { boundary: string; field: string; maxHeaderBytes?: number }): Transform {
  let carry: Buffer = Buffer.alloc(0);
  return new Transform({
    transform(chunk: Buffer, _enc, cb) {
      const data = carry.length > 0 ? Buffer.concat([carry, chunk]) : chunk;
      const r = scanLateField(data, opts);
      if (r.found) {
        cb(new LateFieldError(lateFieldMessage(opts.field)));
        return;
      }
      carry = Buffer.from(data.subarray(r.keepFrom));
      cb(null, chunk);
    },
  });
}
