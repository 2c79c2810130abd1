import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createDecipheriv, randomBytes } from 'node:crypto';
import { MasterKeyError, open, readMasterKey, seal } from '../../src/console/crypto.js';
import { makePricer } from '../../src/console/pricing.js';
import { globMatch } from '../../src/policy/glob.js';

test('sealed secrets round-trip and are bound to the key id', () => {
  const masterKey = randomBytes(32);
  const sealed = seal({ masterKey, plaintext: 'kw_secret', aad: 'k_1' });
  assert.equal(sealed.iv.length, 12);
  assert.equal(sealed.tag.length, 16);
  assert.ok(!sealed.ciphertext.includes(Buffer.from('kw_secret')));
  assert.equal(open({ masterKey, sealed, aad: 'k_1' }), 'kw_secret');
  assert.throws(() => open({ masterKey, sealed, aad: 'k_2' }), MasterKeyError);
  assert.throws(() => open({ masterKey: randomBytes(32), sealed, aad: 'k_1' }), MasterKeyError);
  const tampered = { ...sealed, ciphertext: Buffer.from(sealed.ciphertext) };
  tampered.ciphertext[0]! ^= 1;
  assert.throws(() => open({ masterKey, sealed: tampered, aad: 'k_1' }), MasterKeyError);
});

test('sealed with AES-256-GCM (DESIGN section 8): node:crypto opens it as such, and no other cipher does', () => {
  const masterKey = randomBytes(32);
  const sealed = seal({ masterKey, plaintext: 'kw_secret', aad: 'k_1' });
  const openAs = (cipher: string) => {
    const d = createDecipheriv(cipher as 'aes-256-gcm', masterKey, sealed.iv);
    d.setAAD(Buffer.from('k_1'));
    d.setAuthTag(sealed.tag);
    return Buffer.concat([d.update(sealed.ciphertext), d.final()]).toString('utf8');
  };
  assert.equal(openAs('aes-256-gcm'), 'kw_secret');
  assert.throws(() => openAs('chacha20-poly1305'));
});

test('the master key is read as 64 hex or base64 of 32 bytes; errors name the variable, never the value', () => {
  const bytes = randomBytes(32);
  assert.deepEqual(readMasterKey({ env: { MK: bytes.toString('hex') }, name: 'MK' }), bytes);
  assert.deepEqual(readMasterKey({ env: { MK: bytes.toString('base64') }, name: 'MK' }), bytes);
  assert.deepEqual(readMasterKey({ env: { MK: bytes.toString('base64url') }, name: 'MK' }), bytes);
  assert.throws(() => readMasterKey({ env: {}, name: 'MK' }), (e: Error) => e instanceof MasterKeyError && /MK is not set/.test(e.message));
  for (const bad of ['abc', randomBytes(16).toString('hex'), randomBytes(31).toString('base64'), 'z'.repeat(64)]) {
    assert.throws(
      () => readMasterKey({ env: { MK: bad }, name: 'MK' }),
      (e: Error) => e instanceof MasterKeyError && /MK is malformed/.test(e.message) && !e.message.includes(bad),
    );
  }
});

test('pricing: anchored globs, the most specific entry wins, unpriced is explicit', () => {
  assert.ok(globMatch('gpt-4o*', 'gpt-4o-2024'));
  assert.ok(!globMatch('gpt-4o*', 'x-gpt-4o'));
  assert.ok(!globMatch('a.b', 'axb'));
  const price = makePricer({
    // the most specific entry wins whatever the order, as on the sidecars
    models: [
      { match: 'gpt-4o*', inputPerMillion: 2.5, outputPerMillion: 10 },
      { match: 'gpt-4o-mini*', inputPerMillion: 0.15, outputPerMillion: 0.6 },
    ],
    unpriced: { inputPerMillion: 1, outputPerMillion: 2 },
  });
  assert.equal(price({ model: 'gpt-4o-mini', inputTokens: 1_000_000, outputTokens: 1_000_000 }), 0.75);
  assert.equal(price({ model: 'gpt-4o', inputTokens: 1000, outputTokens: 100 }), 0.0035);
  assert.equal(price({ model: 'x-gpt-4o', inputTokens: 1_000_000, outputTokens: 500_000 }), 2, 'globs are anchored');
  assert.equal(price({ model: 'llama', inputTokens: 1_000_000, outputTokens: 500_000 }), 2);
  assert.equal(price({ model: null, inputTokens: 1_000_000, outputTokens: 0 }), 1);
  // A table that names `*` itself: usage without a model costs what sidecars hold for it, the `*` rate.
  const star = makePricer({ models: [{ match: '*', inputPerMillion: 3, outputPerMillion: 3 }], unpriced: { inputPerMillion: 1, outputPerMillion: 1 } });
  assert.equal(star({ model: null, inputTokens: 1_000_000, outputTokens: 0 }), 3);
});
