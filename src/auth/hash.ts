/**
 * Key hashing (DESIGN section 4). The hash is the only form of a key that is stored or
 * compared; the plain key never leaves the request that carried it.
 */
import * as crypto from 'node:crypto';

export type HashAlgorithm = 'sha256' | 'hmac-sha256';

export interface HashOptions {
  hash: HashAlgorithm;
  /** required with hmac-sha256 */
  pepper?: string | undefined;
}

export type KeyHasher = (key: string) => string;

export function makeKeyHasher(opts: HashOptions): KeyHasher {
  if (opts.hash === 'hmac-sha256') {
    const pepper = opts.pepper;
    if (!pepper) throw new Error('keys.hash hmac-sha256 needs keys.pepper');
    return (key) => crypto.createHmac('sha256', pepper).update(key, 'utf8').digest('hex');
  }
  // One-shot: no Hash object per key. A string is hashed as UTF-8.
  return (key) => crypto.hash('sha256', key, 'hex');
}
