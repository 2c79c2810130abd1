/**
 * The console's own key format (DESIGN section 8): a fixed prefix, 256 random bits in
 * base62, and a CRC32 checksum suffix, so secret scanners and the sidecar (with
 * `keys.format: keyward`) can reject mistyped or foreign keys without a lookup.
 *
 *   kw_<43 base62 chars of 32 random bytes>_<6 base62 chars of CRC32(prefix + body)>
 */
import { randomBytes } from 'node:crypto';

export const KEY_PREFIX = 'kw_';
const BODY_LEN = 43; // ceil(256 / log2(62))
const CHECK_LEN = 6; // 62^6 > 2^32
const ALPHABET = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz';
const KEY_RE = /^kw_([0-9A-Za-z]{43})_([0-9A-Za-z]{6})$/;

function toBase62(n: bigint, width: number): string {
  let out = '';
  while (n > 0n) {
    out = ALPHABET[Number(n % 62n)] + out;
    n /= 62n;
  }
  return out.padStart(width, '0');
}

const CRC_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let i = 0; i < 256; i++) {
    let c = i;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    t[i] = c >>> 0;
  }
  return t;
})();

export function crc32(text: string): number {
  let c = 0xffffffff;
  for (let i = 0; i < text.length; i++) c = CRC_TABLE[(c ^ text.charCodeAt(i)) & 0xff]! ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

function checksum(body: string): string {
  return toBase62(BigInt(crc32(KEY_PREFIX + body)), CHECK_LEN);
}

/** Makes a new key; `random` is injectable so tests can make deterministic keys. */
export function generateKey(random: (n: number) => Buffer = randomBytes): string {
  const body = toBase62(BigInt('0x' + random(32).toString('hex')), BODY_LEN);
  return `${KEY_PREFIX}${body}_${checksum(body)}`;
}

/** True when the key has the prefix, the shape and a matching checksum. */
export function isWellFormedKey(key: string): boolean {
  const m = KEY_RE.exec(key);
  return m !== null && checksum(m[1]!) === m[2];
}

/** Anything shaped like a key of this format, checksum or not. */
const KEY_SHAPE = /kw_[0-9A-Za-z]{43}_[0-9A-Za-z]{6}/g;

/**
 * A key that lost a few characters at either end in a paste: `kw_` and most of a body, or
 * most of a body, `_` and some of its checksum. It still gives the key away (the checksum
 * can be made again from the body, a lost prefix is known); ids, names and model globs
 * hardly ever hold a run of 40 letters and digits.
 */
const NEAR_KEY = /kw_[0-9A-Za-z]{40}|[0-9A-Za-z]{40}_[0-9A-Za-z]/;

/** Whether text holds something shaped like a key, whole or nearly: never an id, a name or a glob. */
export const holdsKeyShape = (text: string): boolean => text.search(KEY_SHAPE) !== -1 || NEAR_KEY.test(text);

/**
 * What is left of a key that lost a character or its prefix in a paste: `kw_` and enough of
 * a body to be one (as the sidecar's key-in-fields.ts reads it), or a body's worth of base62
 * without it. Either gives the key away: the checksum can be made again from the body.
 */
const KEY_PART = /kw_[0-9A-Za-z]{5}[0-9A-Za-z_]*|[0-9A-Za-z]{40,}(?:_[0-9A-Za-z]*)?/g;

/** Text with every key, or what is left of one, replaced: for log lines and answers built from what a caller sent. */
export const withoutKeys = (text: string): string => text.replace(KEY_SHAPE, '[redacted]').replace(KEY_PART, '[redacted]');
