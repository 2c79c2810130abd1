/**
 * Fields the client chooses (its request id, path, model, attribution headers) are logged
 * and traced as sent. DESIGN section 4: no key and no prefix of a key ever reaches a log
 * line or an error body. So a field that holds a key the request carries, or the key's
 * first KEY_PREFIX_CHARS characters, is written as REDACTED. "Carries" is read widely,
 * since a client that sends its key the wrong way still sent it: any Authorization or
 * Proxy-Authorization value (Bearer, Basic decoded, another scheme, or none), and the
 * api-key headers of other vendors beside x-api-key and x_api_key (x-api-key to CGI-style
 * servers). Text shaped like a console key (`kw_` and what follows) is REDACTED too,
 * carried or not. An attribution URL loses its user-info, as a request target does. Pure.
 */
import type { IncomingHttpHeaders } from 'node:http';
import { BEARER, utf8Of } from '../auth/credentials.js';
import { KEY_PREFIX } from '../auth/keyformat.js';

export const REDACTED = '[redacted]';
/** The shortest leading part of a key looked for: shorter ones (`sk-`) name a vendor, not a key. */
const KEY_PREFIX_CHARS = 8;

/**
 * What a field is looked for: the leading parts of the keys in the raw header lines, empty
 * for most requests' non-credential lines. Names compared by length first: most are neither.
 */
export function keyPrefixes(raw: readonly string[]): string[] {
  let out: string[] | null = null;
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!;
    // Length and first letter first: most lines (content-length is 14 long) are none of these.
    const first = name.charCodeAt(0) | 32;
    const n = name.length;
    if (first === 97 /* a */ ? n !== 13 && n !== 7 : first === 120 /* x */ ? n !== 9 && n !== 14 && n !== 17 : first !== 112 /* p */ || n !== 19) continue;
    const lower = name.toLowerCase();
    const value = raw[i + 1]!;
    // LiteLLM's header takes a Bearer value as well as a bare key.
    if (lower === 'authorization' || lower === 'proxy-authorization' || lower === 'x-litellm-api-key') out = credentialParts(value, out ?? []);
    // `x_api_key` too: CGI-style servers read it as x-api-key (credentials.ts).
    else if (lower === 'x-api-key' || lower === 'x_api_key' || lower === 'api-key' || lower === 'x-goog-api-key') out = withPrefix(value.trim(), out ?? []);
  }
  return out ?? NONE;
}

const NONE: string[] = [];
const SCHEME = /^([A-Za-z][A-Za-z0-9!#$%&'*+.^_`|~-]*)[ \t]+(.*)$/;

/** The key in an Authorization value, whatever its scheme: Bearer's token, Basic's user and password, another scheme's rest, or the value itself. */
function credentialParts(value: string, out: string[]): string[] {
  const bearer = BEARER.exec(value)?.[1]?.trim();
  if (bearer !== undefined) return withPrefix(bearer, out);
  // Outside the two credential forms, a part shorter than a prefix (a Basic user name) is
  // not taken for a key: it would hide every field that happens to contain it.
  const m = SCHEME.exec(value.trim());
  if (m === null) return withPrefix(value.trim(), out, KEY_PREFIX_CHARS);
  const rest = m[2]!.trim();
  withPrefix(rest, out, KEY_PREFIX_CHARS);
  if (m[1]!.toLowerCase() === 'basic') {
    const decoded = Buffer.from(rest, 'base64').toString('latin1');
    const colon = decoded.indexOf(':');
    if (colon >= 0) {
      withPrefix(decoded.slice(0, colon), out, KEY_PREFIX_CHARS);
      withPrefix(decoded.slice(colon + 1), out, KEY_PREFIX_CHARS);
    }
  }
  return out;
}

/**
 * Adds the key's leading part when the key has at least `min` characters, and the part after
 * it when the key is long enough to have one: a field holding the key without its first
 * characters (`kw_` dropped) still holds its secret.
 */
function withPrefix(key: string, out: string[], min = 1): string[] {
  pushParts(key, out, min);
  // A header is read a byte a character; fields decoded as UTF-8 (a JSON body, attribution) spell a non-ASCII key otherwise.
  const decoded = utf8Of(key);
  if (decoded !== key) pushParts(decoded, out, min);
  return out;
}

function pushParts(key: string, out: string[], min: number): void {
  if (key.length < min) return;
  out.push(key.slice(0, KEY_PREFIX_CHARS));
  if (key.length >= 2 * KEY_PREFIX_CHARS) out.push(key.slice(KEY_PREFIX_CHARS, 2 * KEY_PREFIX_CHARS));
}

/** A console key's prefix and enough of its body to be one, not a word that starts alike. */
const CONSOLE_KEY = /kw_[0-9A-Za-z]{5}/;

/**
 * `value`, or REDACTED when it holds one of `prefixes` or text shaped like a console key,
 * as written or percent-decoded (a path spells `_` as `%5F` as well).
 */
export function keyless<T extends string | null>(value: T, prefixes: readonly string[]): T | typeof REDACTED {
  if (value === null) return value;
  if (holdsKey(value, prefixes)) return REDACTED;
  if (value.includes('%') && holdsKey(percentDecoded(value), prefixes)) return REDACTED;
  return value;
}

function holdsKey(value: string, prefixes: readonly string[]): boolean {
  if (value.includes(KEY_PREFIX) && CONSOLE_KEY.test(value)) return true;
  for (const p of prefixes) if (value.includes(p)) return true;
  return false;
}

const ESCAPE = /%([0-9A-Fa-f]{2})/g;
/** Keys are ASCII, so each escape decodes to one character; repeated for `%255F` (encoded twice), a few rounds at most. */
function percentDecoded(value: string): string {
  let out = value;
  for (let round = 0; round < 3 && out.includes('%'); round++) {
    const next = out.replace(ESCAPE, (_, hex: string) => String.fromCharCode(parseInt(hex, 16)));
    if (next === out) break;
    out = next;
  }
  return out;
}

const USER_INFO = /^([A-Za-z][A-Za-z0-9+.-]*:\/\/)[^/?#]*@/;

/** An attribution URL without its user-info (`https://user:secret@host/` -> `https://host/`). */
export const withoutUserInfo = (url: string | null): string | null => (url === null || !url.includes('@') ? url : url.replace(USER_INFO, '$1'));

/**
 * The headers a request's span starts from: a `tracestate` holding a key the request
 * carries is left out of the span, whose context an exporter sends (DESIGN section 13:
 * never a key in span data). The header itself is forwarded as received.
 */
export function traceHeaders(headers: IncomingHttpHeaders, prefixes: readonly string[]): IncomingHttpHeaders {
  const state = headers.tracestate;
  if (state === undefined || keyless(Array.isArray(state) ? state.join(',') : state, prefixes) !== REDACTED) return headers;
  return { ...headers, tracestate: undefined };
}
