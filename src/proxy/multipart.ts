/**
 * Reads form fields from the head of a multipart/form-data body, stopping at the first
 * file part, so the upload itself streams through untouched. Pure and incremental: feed
 * it the bytes seen so far; it says whether it needs more.
 */

export type FieldScan =
  | { state: 'more' }
  /** fields before the first file part (or the end); `bytes` is how many body bytes they took */
  | { state: 'done'; fields: Map<string, string[]>; bytes: number }
  | { state: 'error'; message: string };

/** boundary from a content-type header, or null */
export function multipartBoundary(contentType: string | undefined): string | null {
  if (!contentType || !/^multipart\/form-data\s*(;|$)/i.test(contentType)) return null;
  const m = /;\s*boundary=(?:"([^"]{1,200})"|([^\s;]{1,200}))/i.exec(contentType);
  return m ? (m[1] ?? m[2] ?? null) : null;
}

const CRLFCRLF = Buffer.from('\r\n\r\n');

function disposition(headerText: string): { name: string | null; isFile: boolean } {
  const line = headerText.split('\r\n').find((l) => /^content-disposition\s*:/i.test(l)) ?? '';
  const name = /;\s*name="([^"]*)"/i.exec(line)?.[1] ?? /;\s*name=([^;\s]+)/i.exec(line)?.[1] ?? null;
  return { name, isFile: /;\s*filename\*?=/i.test(line) };
}

/**
 * Scans `buf` (the body so far). `ended` says no more bytes will come. Fields are
 * collected until a part with a filename, the closing delimiter, or the end.
 */
export function scanFields(buf: Buffer, boundary: string, ended: boolean): FieldScan {
  const delim = Buffer.from(`--${boundary}`);
  const nextDelim = Buffer.from(`\r\n--${boundary}`);
  const fields = new Map<string, string[]>();
  let pos = buf.indexOf(delim);
  if (pos === -1) return ended ? { state: 'error', message: 'The multipart body has no boundary delimiter.' } : { state: 'more' };
  for (;;) {
    const afterDelim = pos + delim.length;
    if (buf.length < afterDelim + 2) return ended ? { state: 'done', fields, bytes: buf.length } : { state: 'more' };
    if (buf[afterDelim] === 45 && buf[afterDelim + 1] === 45) return { state: 'done', fields, bytes: afterDelim + 2 }; // "--": close
    const headersEnd = buf.indexOf(CRLFCRLF, afterDelim);
    if (headersEnd === -1) return ended ? { state: 'error', message: 'A multipart part has unterminated headers.' } : { state: 'more' };
    const part = disposition(buf.toString('latin1', afterDelim, headersEnd));
    if (part.isFile) return { state: 'done', fields, bytes: pos };
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
