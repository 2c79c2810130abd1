/**
 * Fields the client chooses (its request id, path, model, attribution headers) are logged
 * and traced as sent. DESIGN section 4: no key and no prefix of a key ever reaches a log
 * line. So a field that holds a key the request carries (an `authorization` Bearer value or
 * an `x-api-key` value, whether or not the route reads it), or the key's first
 * KEY_PREFIX_CHARS characters, is written as REDACTED; and an attribution URL loses its
 * user-info, as a request target does. Pure.
 */
import { BEARER } from '../auth/credentials.js';

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
    let key: string | null = null;
    if (name.length === 13 && name.toLowerCase() === 'authorization') key = BEARER.exec(raw[i + 1]!)?.[1]?.trim() ?? null;
    else if (name.length === 9 && name.toLowerCase() === 'x-api-key') key = raw[i + 1]!.trim();
    if (key) (out ??= []).push(key.slice(0, KEY_PREFIX_CHARS));
  }
  return out ?? NONE;
}

const NONE: string[] = [];

/** `value`, or REDACTED when it holds one of `prefixes`. */
export function keyless<T extends string | null>(value: T, prefixes: readonly string[]): T | typeof REDACTED {
  if (value === null || prefixes.length === 0) return value;
  for (const p of prefixes) if (value.includes(p)) return REDACTED;
  return value;
}

const USER_INFO = /^([A-Za-z][A-Za-z0-9+.-]*:\/\/)[^/?#]*@/;

/** An attribution URL without its user-info (`https://user:secret@host/` -> `https://host/`). */
export const withoutUserInfo = (url: string | null): string | null => (url === null || !url.includes('@') ? url : url.replace(USER_INFO, '$1'));
