/**
 * The header grammar of multipart/form-data (multipart.ts reads the bodies): the boundary
 * a content-type names and the header section of one part, each refused where common
 * parsers would read it differently. Pure.
 */
import { parameterList } from './content-type.js';

/**
 * The boundary from a content-type header, or null. RFC 2046 allows 1-70 characters; a
 * longer one, or a header whose parameters parsers could read another way, is refused
 * rather than guessed at: a parameter named twice, one that does not parse, and the RFC 2231
 * forms `boundary*=` and `boundary*0=`, which Go's parser takes over a plain `boundary=`
 * (the upstream would split the body at a boundary keyward never read).
 */
export function multipartBoundary(contentType: string | undefined): string | null {
  const m = contentType === undefined ? null : /^multipart\/form-data\s*((?:;.*)?)$/is.exec(contentType.trim());
  if (!m) return null;
  const params = parameterList(m[1]!);
  if (params === null || [...params.keys()].some((k) => k.startsWith('boundary*'))) return null;
  const b = params.get('boundary') ?? '';
  // RFC 2046 bchars only: a quoted boundary with a backslash or quote is unescaped by
  // some parsers (Go) and not by others.
  return BOUNDARY.test(b) ? b : null;
}

const BOUNDARY = /^[0-9A-Za-z'()+_,\-./:=? ]{0,69}[0-9A-Za-z'()+_,\-./:=?]$/;
const TOKEN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;
/** The most bytes a part's header section may take. */
export const MAX_HEADER_BYTES = 8192;

export interface PartHead {
  name: string;
  isFile: boolean;
}

/** A part's header section (without the final CRLFCRLF): its form name and kind, or why it is refused. */
export function parsePartHeaders(text: string): { ok: true; part: PartHead } | { ok: false; message: string } {
  const bad = (message: string) => ({ ok: false as const, message });
  if (/\r(?!\n)|(?<!\r)\n/.test(text)) return bad('A multipart part header has a bare CR or LF.');
  let disposition: string | null = null;
  for (const line of text === '' ? [] : text.split('\r\n')) {
    const colon = line.indexOf(':');
    if (colon <= 0 || !TOKEN.test(line.slice(0, colon))) return bad('A multipart part header line is malformed or folded.');
    const name = line.slice(0, colon).toLowerCase();
    const value = line.slice(colon + 1).trim();
    if (name === 'content-disposition') {
      if (disposition !== null) return bad('A multipart part has two Content-Disposition headers.');
      disposition = value;
    } else if (name === 'content-transfer-encoding' && !/^(7bit|8bit|binary)$/i.test(value)) {
      return bad('Multipart parts with a Content-Transfer-Encoding are not accepted.');
    }
  }
  if (disposition === null) return bad('A multipart part has no Content-Disposition header.');
  const m = /^([^;\s]+)\s*(.*)$/.exec(disposition)!;
  if (m[1]!.toLowerCase() !== 'form-data') return bad('A multipart part is not form-data.');
  const params = new Map<string, string>();
  let rest = m[2]!;
  while (rest !== '') {
    const p = /^;\s*([!#$%&'+.^_`|~0-9A-Za-z-]+)=(?:"([^"\\\r\n]*)"|([!#$%&'*+.^_`|~0-9A-Za-z-]+))\s*/.exec(rest);
    if (!p) return bad('A multipart Content-Disposition has a parameter that parsers read differently.');
    const key = p[1]!.toLowerCase();
    if (params.has(key)) return bad(`A multipart part names its "${key}" parameter twice.`);
    params.set(key, p[2] ?? p[3]!);
    rest = rest.slice(p[0].length);
  }
  const name = params.get('name');
  if (name === undefined) return bad('A multipart part has no name.');
  return { ok: true, part: { name, isFile: params.has('filename') } };
}
