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

/**
 * The last key one connection presented, and its hash. A keep-alive client sends the same
 * key on each of its requests, so the connection keeps the hash of its last one: the key
 * is held no longer than the connection that carried it, and compared only with keys sent
 * on that connection.
 */
export interface KeyMemo {
  key: string | null;
  hash: string;
}

export const newKeyMemo = (): KeyMemo => ({ key: null, hash: '' });

/** The key's hash, from the memo when the connection's last key was this one. */
export function hashRemembered(hashKey: KeyHasher, key: string, memo: KeyMemo | undefined): string {
  if (memo === undefined) return hashKey(key);
  if (memo.key !== key) {
    memo.hash = hashKey(key);
    memo.key = key;
  }
  return memo.hash;
}
