/**
 * Secret storage (DESIGN section 8): each key's secret is kept encrypted with AES-256-GCM
 * under a master key from the environment, so an authorized user can reveal it again.
 * The key id is bound in as additional data, so a ciphertext copied onto another key's
 * row does not decrypt. The master key itself never appears in a message or a log line.
 */
import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';

export class MasterKeyError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'MasterKeyError';
  }
}

export interface Sealed {
  iv: Buffer;
  tag: Buffer;
  ciphertext: Buffer;
}

const HEX64 = /^[0-9a-fA-F]{64}$/;
const BASE64 = /^[A-Za-z0-9+/_-]+={0,2}$/;

/**
 * Reads the 32-byte master key from `env[name]`: 64 hex characters (`openssl rand -hex 32`)
 * or base64 of 32 bytes (`openssl rand -base64 32`). Messages name the variable, never the value.
 */
export function readMasterKey(opts: { env: NodeJS.ProcessEnv; name: string }): Buffer {
  const raw = opts.env[opts.name]?.trim();
  if (!raw) {
    throw new MasterKeyError(`${opts.name} is not set: the console needs a 32-byte master key (generate one with \`openssl rand -hex 32\`)`);
  }
  if (HEX64.test(raw)) return Buffer.from(raw, 'hex');
  if (BASE64.test(raw)) {
    const bytes = Buffer.from(raw, raw.includes('-') || raw.includes('_') ? 'base64url' : 'base64');
    if (bytes.length === 32) return bytes;
  }
  throw new MasterKeyError(`${opts.name} is malformed: expected 32 bytes as 64 hex characters or as base64`);
}

export function seal(opts: { masterKey: Buffer; plaintext: string; aad: string }): Sealed {
  const iv = randomBytes(12);
  const cipher = createCipheriv('aes-256-gcm', opts.masterKey, iv);
  cipher.setAAD(Buffer.from(opts.aad, 'utf8'));
  const ciphertext = Buffer.concat([cipher.update(opts.plaintext, 'utf8'), cipher.final()]);
  return { iv, tag: cipher.getAuthTag(), ciphertext };
}

/** Throws MasterKeyError when the data was sealed under another master key, or tampered with. */
export function open(opts: { masterKey: Buffer; sealed: Sealed; aad: string }): string {
  try {
    const decipher = createDecipheriv('aes-256-gcm', opts.masterKey, opts.sealed.iv);
    decipher.setAAD(Buffer.from(opts.aad, 'utf8'));
    decipher.setAuthTag(opts.sealed.tag);
    return Buffer.concat([decipher.update(opts.sealed.ciphertext), decipher.final()]).toString('utf8');
  } catch {
    throw new MasterKeyError('cannot decrypt: wrong master key or damaged data');
  }
}

const CHECK_PLAINTEXT = 'keyward-console-master-key-check';

/** A store opened with another master key fails at start-up, not at the first reveal. */
export function verifyMasterKey(opts: { db: import('better-sqlite3').Database; masterKey: Buffer }): void {
  const { db, masterKey } = opts;
  const row = db.prepare(`SELECT value FROM meta WHERE name = 'master_check'`).get() as { value: Buffer } | undefined;
  if (!row) {
    const s = seal({ masterKey, plaintext: CHECK_PLAINTEXT, aad: 'master_check' });
    db.prepare(`INSERT INTO meta (name, value) VALUES ('master_check', ?)`).run(Buffer.concat([s.iv, s.tag, s.ciphertext]));
    return;
  }
  const v = row.value;
  try {
    open({ masterKey, sealed: { iv: v.subarray(0, 12), tag: v.subarray(12, 28), ciphertext: v.subarray(28) }, aad: 'master_check' });
  } catch {
    throw new MasterKeyError('the master key does not match the one this console store was created with');
  }
}

export class KeyHashingError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'KeyHashingError';
  }
}

/**
 * A store whose keys were hashed under other `keys.hash` or `keys.pepper` settings fails at
 * start-up: its old keys would keep their hashes and new ones get the new kind, so no
 * sidecar setting could match both. One active key's secret, hashed again, tells.
 */
export function verifyKeyHashing(opts: { db: import('better-sqlite3').Database; masterKey: Buffer; hasher: (key: string) => string }): void {
  const row = opts.db.prepare(`SELECT id, hash, secret_iv, secret_tag, secret_ct FROM keys WHERE status = 'active' AND secret_ct IS NOT NULL LIMIT 1`).get() as
    { id: string; hash: string; secret_iv: Buffer; secret_tag: Buffer; secret_ct: Buffer } | undefined;
  if (!row) return;
  const secret = open({ masterKey: opts.masterKey, sealed: { iv: row.secret_iv, tag: row.secret_tag, ciphertext: row.secret_ct }, aad: row.id });
  if (opts.hasher(secret) !== row.hash) {
    throw new KeyHashingError(
      'keys.hash or keys.pepper differs from the settings this store\'s keys were hashed with: set them back (they must also match every sidecar\'s)',
    );
  }
}
