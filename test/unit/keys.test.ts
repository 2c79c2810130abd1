import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, createHmac, randomBytes } from 'node:crypto';
import { crc32, generateKey, isWellFormedKey, KEY_PREFIX } from '../../src/auth/keyformat.js';
import { hashRemembered, makeKeyHasher, newKeyMemo } from '../../src/auth/hash.js';

const SHAPE = /^kw_[0-9A-Za-z]{43}_[0-9A-Za-z]{6}$/;
const ALNUM = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz';

test('crc32 matches the standard check values', () => {
  const vectors: [string, number][] = [
    ['', 0],
    ['a', 0xe8b7be43],
    ['123456789', 0xcbf43926],
    ['The quick brown fox jumps over the lazy dog', 0x414fa339],
  ];
  for (const [text, want] of vectors) assert.equal(crc32(text), want, text);
});

test('generated keys are well formed, distinct, and use the kw_ prefix', () => {
  const seen = new Set<string>();
  for (let i = 0; i < 1000; i++) {
    const k = generateKey();
    assert.match(k, SHAPE);
    assert.ok(k.startsWith(KEY_PREFIX));
    assert.ok(isWellFormedKey(k), k);
    seen.add(k);
  }
  assert.equal(seen.size, 1000);
});

test('generateKey draws at least 160 random bits and every bit reaches the key', () => {
  let asked = 0;
  const base = Buffer.from(randomBytes(32));
  const key = (buf: Buffer) =>
    generateKey((n) => {
      asked = n;
      return Buffer.from(buf.subarray(0, n));
    });
  const k0 = key(base);
  assert.ok(asked * 8 >= 160, `asked for only ${asked} bytes`);
  const keys = new Set([k0]);
  for (let bit = 0; bit < asked * 8; bit++) {
    const flipped = Buffer.from(base);
    flipped[bit >> 3]! ^= 1 << (bit & 7);
    const k = key(flipped);
    assert.ok(isWellFormedKey(k));
    keys.add(k);
  }
  assert.equal(keys.size, asked * 8 + 1, 'two different random inputs gave the same key');
});

test('extreme random inputs still give well-formed keys of the same length', () => {
  for (const fill of [0x00, 0xff, 0x80, 0x01]) {
    const k = generateKey((n) => Buffer.alloc(n, fill));
    assert.match(k, SHAPE, `fill ${fill}`);
    assert.ok(isWellFormedKey(k));
  }
});

test('a single changed character anywhere fails the check', () => {
  for (let i = 0; i < 20; i++) {
    const k = generateKey();
    for (let pos = 0; pos < k.length; pos++) {
      const c = k[pos]!;
      // two substitutions per position: the next alphanumeric, and a case flip where there is one
      const subs = new Set<string>();
      if (ALNUM.includes(c)) subs.add(ALNUM[(ALNUM.indexOf(c) + 1 + (i % 61)) % 62]!);
      else subs.add(c === '_' ? '-' : 'x');
      const flipped = c === c.toLowerCase() ? c.toUpperCase() : c.toLowerCase();
      if (flipped !== c) subs.add(flipped);
      for (const s of subs) {
        const bad = k.slice(0, pos) + s + k.slice(pos + 1);
        assert.equal(isWellFormedKey(bad), false, `${k} with ${JSON.stringify(s)} at ${pos}`);
      }
    }
  }
});

test('malformed keys are rejected', () => {
  const k = generateKey();
  const body = k.slice(3, 46);
  const check = k.slice(47);
  const bad = [
    '',
    'kw_',
    k.slice(0, -1),
    `${k}0`,
    ` ${k}`,
    `${k} `,
    `KW_${body}_${check}`,
    `kx_${body}_${check}`,
    `kw-${body}_${check}`,
    `kw_${body}-${check}`,
    `kw_${body}${check}`,
    `kw_${body.slice(1)}_${check}`,
    `kw_${body}_${check.slice(1)}`,
    `kw_${body}_000000`,
    'sk-ant-api03-abcdefghijklmnopqrstuvwxyz',
  ];
  for (const b of bad) assert.equal(isWellFormedKey(b), false, JSON.stringify(b));
  assert.equal(isWellFormedKey(k), true);
  // swapping two adjacent different characters is caught too
  for (let pos = 3; pos < 45; pos++) {
    if (k[pos] === k[pos + 1]) continue;
    const swapped = k.slice(0, pos) + k[pos + 1] + k[pos] + k.slice(pos + 2);
    assert.equal(isWellFormedKey(swapped), false, `swap at ${pos}`);
  }
});

test('sha256 hasher: lowercase hex of the UTF-8 key, same as node:crypto', () => {
  const h = makeKeyHasher({ hash: 'sha256' });
  assert.equal(h('abc'), 'ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad');
  for (const key of [generateKey(), 'sk-ant-api03-x', 'clé-ü-✓', '']) {
    const want = createHash('sha256').update(Buffer.from(key, 'utf8')).digest('hex');
    assert.equal(h(key), want);
    assert.match(h(key), /^[0-9a-f]{64}$/);
  }
  assert.notEqual(h('a'), h('b'));
});

test('hmac-sha256 hasher: keyed by the pepper, differs from plain sha256', () => {
  const pepper = 'pepper-0123456789abcdef';
  const h = makeKeyHasher({ hash: 'hmac-sha256', pepper });
  const plain = makeKeyHasher({ hash: 'sha256' });
  for (const key of [generateKey(), 'clé-ü-✓']) {
    assert.equal(h(key), createHmac('sha256', pepper).update(Buffer.from(key, 'utf8')).digest('hex'));
    assert.match(h(key), /^[0-9a-f]{64}$/);
    assert.notEqual(h(key), plain(key));
    assert.notEqual(h(key), makeKeyHasher({ hash: 'hmac-sha256', pepper: `${pepper}x` })(key));
  }
  // RFC 4231 test case 2
  assert.equal(
    makeKeyHasher({ hash: 'hmac-sha256', pepper: 'Jefe' })('what do ya want for nothing?'),
    '5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843',
  );
});

test('hmac-sha256 needs a pepper', () => {
  assert.throws(() => makeKeyHasher({ hash: 'hmac-sha256' }), /pepper/);
  assert.throws(() => makeKeyHasher({ hash: 'hmac-sha256', pepper: undefined }), /pepper/);
  assert.throws(() => makeKeyHasher({ hash: 'hmac-sha256', pepper: '' }), /pepper/);
});

test('a connection memo hashes a key once while it repeats, and again for any other key', () => {
  const plain = makeKeyHasher({ hash: 'sha256' });
  const hashed: string[] = [];
  const counting = (key: string) => {
    hashed.push(key);
    return plain(key);
  };
  const memo = newKeyMemo();
  const keys = ['sk-a', 'sk-a', 'sk-a', 'sk-b', 'sk-a', 'sk-a', 'sk-a\u0000', 'sk-a'];
  const hashes = keys.map((k) => hashRemembered(counting, k, memo));
  assert.deepEqual(hashes, keys.map(plain));
  assert.deepEqual(hashed, ['sk-a', 'sk-b', 'sk-a', 'sk-a\u0000', 'sk-a']);
  // Without a memo (a caller with no connection) every key is hashed.
  hashed.length = 0;
  hashRemembered(counting, 'sk-a', undefined);
  hashRemembered(counting, 'sk-a', undefined);
  assert.equal(hashed.length, 2);
});
