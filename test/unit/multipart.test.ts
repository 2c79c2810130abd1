import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createMultipartGuard, MultipartReader } from '../../src/proxy/body/multipart.js';
import { multipartBoundary } from '../../src/proxy/body/multipart-head.js';

const BOUNDARIES: [string | undefined, string | null][] = [
  ['multipart/form-data; boundary=abc123', 'abc123'],
  ['multipart/form-data;boundary=abc123', 'abc123'],
  ['Multipart/Form-Data; BOUNDARY=XyZ', 'XyZ'],
  ['multipart/form-data; boundary="quoted boundary=with stuff"', 'quoted boundary=with stuff'],
  ['multipart/form-data; boundary="semi;colon"', null],
  ['multipart/form-data; charset=utf-8; boundary=zz', 'zz'],
  ['multipart/form-data; boundary=zz; charset=utf-8', 'zz'],
  ['multipart/form-data; boundary=----WebKitFormBoundary7MA4YWxkTrZu0gW', '----WebKitFormBoundary7MA4YWxkTrZu0gW'],
  ['multipart/form-data ; boundary=sp', 'sp'],
  ['multipart/form-data', null],
  ['multipart/form-data; charset=utf-8', null],
  ['multipart/form-data; boundary=', null],
  ['multipart/mixed; boundary=abc', null],
  ['multipart/form-datax; boundary=abc', null],
  ['application/json', null],
  ['text/plain; boundary=abc', null],
  ['application/x-www-form-urlencoded', null],
  ['', null],
  [undefined, null],
];

for (const [ct, want] of BOUNDARIES) {
  test(`multipartBoundary(${JSON.stringify(ct)}) = ${JSON.stringify(want)}`, () => {
    assert.equal(multipartBoundary(ct), want);
  });
}

type Part = { name?: string; filename?: string; filenameStar?: boolean; value: string; type?: string };

function body(boundary: string, parts: Part[], close = true): Buffer {
  let s = '';
  for (const p of parts) {
    let disp = 'form-data';
    if (p.name !== undefined) disp += `; name="${p.name}"`;
    if (p.filename !== undefined) disp += p.filenameStar ? `; filename*=UTF-8''${p.filename}` : `; filename="${p.filename}"`;
    s += `--${boundary}\r\nContent-Disposition: ${disp}\r\n`;
    if (p.type) s += `Content-Type: ${p.type}\r\n`;
    s += `\r\n${p.value}\r\n`;
  }
  if (close) s += `--${boundary}--\r\n`;
  return Buffer.from(s, 'utf8');
}

const B = '----WebKitFormBoundary7MA4YWxkTrZu0gW';
const FILE = { name: 'file', filename: 'audio.mp3', type: 'application/octet-stream', value: 'ID3\u0000binary--data\r\n--not-the-boundary' };

/** Feeds the chunks to a reader in order; the fields it read and its problem, if any. */
function feed(boundary: string, chunks: Buffer[]) {
  const reader = new MultipartReader(boundary);
  const fields: Record<string, string> = {};
  for (const chunk of chunks) {
    const r = reader.push(chunk);
    if (!Array.isArray(r)) return { fields, problem: r.problem };
    for (const e of r) if (e.type === 'field') fields[e.name] = e.value;
  }
  return { fields, problem: reader.end() };
}

/** `buf` in `size`-byte chunks. */
function read(boundary: string, buf: Buffer, size = buf.length) {
  const chunks: Buffer[] = [];
  for (let i = 0; i < buf.length; i += Math.max(1, size)) chunks.push(buf.subarray(i, i + Math.max(1, size)));
  return feed(boundary, chunks);
}

/** `buf` in two chunks, split at `at`. */
const readSplit = (boundary: string, buf: Buffer, at: number) => feed(boundary, [buf.subarray(0, at), buf.subarray(at)]);

const raw = (s: string) => Buffer.from(s, 'utf8');
const CD = (params: string) => `Content-Disposition: form-data; ${params}`;

const OK: [string, Buffer, Record<string, string>][] = [
  ['model then file', body(B, [{ name: 'model', value: 'whisper-1' }, FILE]), { model: 'whisper-1' }],
  ['file then fields that select nothing', body(B, [FILE, { name: 'language', value: 'en' }]), {}],
  ['only fields', body(B, [{ name: 'prompt', value: 'x' }, { name: 'model', value: 'dall-e-2' }]), { model: 'dall-e-2' }],
  ['unquoted name', raw(`--${B}\r\nContent-Disposition: form-data; name=model\r\n\r\nm1\r\n--${B}--\r\n`), { model: 'm1' }],
  ['header names in any case', raw(`--${B}\r\ncontent-disposition: FORM-DATA; NAME="model"\r\n\r\nm2\r\n--${B}--`), { model: 'm2' }],
  ['value with "--boundary" not at a line start', body(B, [{ name: 'model', value: `a--${B}` }]), { model: `a--${B}` }],
  ['models field as JSON', body(B, [{ name: 'model', value: 'a' }, { name: 'models', value: '["b","c"]' }]), { model: 'a', models: '["b","c"]' }],
  ['whitespace epilogue', raw(`--${B}\r\n${CD('name="model"')}\r\n\r\nm\r\n--${B}--\r\n\r\n `), { model: 'm' }],
  ['binary transfer encoding is plain', raw(`--${B}\r\n${CD('name="model"')}\r\nContent-Transfer-Encoding: binary\r\n\r\nm\r\n--${B}--`), { model: 'm' }],
];

for (const [name, buf, want] of OK) {
  test(`multipart reads: ${name}`, () => {
    for (const size of [buf.length, 7, 1]) {
      const got = read(B, buf, size);
      assert.equal(got.problem, null, `chunks of ${size}`);
      assert.deepEqual(got.fields, want, `chunks of ${size}`);
    }
  });
}

test('multipart reads every accepted body the same wherever one chunk ends and the next begins', () => {
  for (const [name, buf, want] of OK) {
    for (let at = 1; at < buf.length; at++) {
      const got = readSplit(B, buf, at);
      assert.equal(got.problem, null, `${name}, split at ${at}`);
      assert.deepEqual(got.fields, want, `${name}, split at ${at}`);
    }
  }
});

test('a field value that ends in part of the delimiter is read whole wherever the chunk ends', () => {
  // The value's last bytes are the delimiter's first ones: the tail kept between chunks is content.
  const value = `v\r\n--${B.slice(0, 20)}`;
  const buf = body(B, [{ name: 'model', value }, FILE]);
  for (let at = 1; at < buf.length; at++) assert.deepEqual(readSplit(B, buf, at), { fields: { model: value }, problem: null }, `split at ${at}`);
});

const BAD: [string, Buffer, RegExp][] = [
  ['a preamble', raw(`preamble\r\n--${B}\r\n${CD('name="model"')}\r\n\r\nm\r\n--${B}--`), /start with its boundary/],
  ['a leading CRLF', raw(`\r\n--${B}\r\n${CD('name="model"')}\r\n\r\nm\r\n--${B}--`), /start with its boundary/],
  ['transport padding after a delimiter', raw(`--${B}\r\n${CD('name="x"')}\r\n\r\nv\r\n--${B} \r\n${CD('name="model"')}\r\n\r\nm\r\n--${B}--`), /padding/],
  ['boundary followed by other text inside a value', raw(`--${B}\r\n${CD('name="model"')}\r\n\r\nm\r\n--${B}X\r\n${CD('name="y"')}\r\n\r\nv\r\n--${B}--`), /inside content/],
  ['two model fields', body(B, [{ name: 'model', value: 'a' }, { name: 'model', value: 'b' }]), /more than once/],
  ['model after the file part', body(B, [{ name: 'model', value: 'a' }, FILE, { name: 'model', value: 'b' }]), /after the file part/],
  ['model only after the file part', body(B, [FILE, { name: 'model', value: 'b' }]), /after the file part/],
  ['fallbacks after the file part', body(B, [FILE, { name: 'fallbacks', value: 'b' }]), /after the file part/],
  ['Model in another case', body(B, [{ name: 'Model', value: 'a' }]), /letter case/],
  ['model as a file', body(B, [{ name: 'model', filename: 'm.txt', value: 'a' }]), /must not be a file/],
  ['model as a file with an empty filename', body(B, [{ name: 'model', filename: '', value: 'a' }]), /must not be a file/],
  ['two name parameters', raw(`--${B}\r\n${CD('name="x"; name="model"')}\r\n\r\nm\r\n--${B}--`), /twice/],
  ['two name parameters, other case', raw(`--${B}\r\n${CD('name="x"; NAME="model"')}\r\n\r\nm\r\n--${B}--`), /twice/],
  ['name*=', raw(`--${B}\r\n${CD("name*=UTF-8''model")}\r\n\r\nm\r\n--${B}--`), /parameter/],
  ['filename*=', body(B, [{ name: 'file', filename: 'a', filenameStar: true, value: 'x' }]), /parameter/],
  ['two Content-Disposition lines', raw(`--${B}\r\n${CD('name="x"')}\r\n${CD('name="model"')}\r\n\r\nm\r\n--${B}--`), /two Content-Disposition/],
  ['no Content-Disposition', raw(`--${B}\r\nContent-Type: text/plain\r\n\r\nm\r\n--${B}--`), /no Content-Disposition/],
  ['backslash in a quoted name', raw(`--${B}\r\n${CD('name="mo\\"del"')}\r\n\r\nm\r\n--${B}--`), /parameter/],
  ['folded header line', raw(`--${B}\r\nContent-Disposition: form-data;\r\n name="model"\r\n\r\nm\r\n--${B}--`), /malformed or folded/],
  ['bare LF in headers', raw(`--${B}\r\n${CD('name="x"')}\n${CD('name="model"')}\r\n\r\nm\r\n--${B}--`), /bare CR or LF/],
  ['not form-data', raw(`--${B}\r\nContent-Disposition: attachment; name="model"\r\n\r\nm\r\n--${B}--`), /not form-data/],
  ['quoted-printable model', raw(`--${B}\r\n${CD('name="model"')}\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\ngpt=2D4o\r\n--${B}--`), /Transfer-Encoding/],
  ['_charset_ field', body(B, [{ name: '_charset_', value: 'utf-16' }, { name: 'model', value: 'a' }]), /_charset_/],
  ['a part after the closing delimiter', raw(`--${B}\r\n${CD('name="x"')}\r\n\r\nv\r\n--${B}--\r\n--${B}\r\n${CD('name="model"')}\r\n\r\nm\r\n--${B}--`), /closing/],
  ['no closing delimiter', raw(`--${B}\r\n${CD('name="model"')}\r\n\r\nm\r\n`), /ends before/],
  ['model over 256 characters', body(B, [{ name: 'model', value: 'm'.repeat(257) }]), /256/],
  ['empty model', body(B, [{ name: 'model', value: '' }]), /1 to 256/],
  ['model not UTF-8', Buffer.concat([raw(`--${B}\r\n${CD('name="model"')}\r\n\r\nm`), Buffer.from([0xff]), raw(`\r\n--${B}--`)]), /UTF-8/],
];

for (const [name, buf, want] of BAD) {
  test(`multipart refuses: ${name}`, () => {
    for (const size of [buf.length, 5, 1]) assert.match(read(B, buf, size).problem ?? 'accepted', want, `chunks of ${size}`);
    for (let at = 1; at < buf.length; at++) assert.match(readSplit(B, buf, at).problem ?? 'accepted', want, `split at ${at}`);
  });
}

test('the guard withholds the chunk in which a late model part shows, and never ends the body', async () => {
  const buf = body(B, [{ name: 'model', value: 'a' }, FILE, { name: 'model', value: 'b' }]);
  const reader = new MultipartReader(B);
  const split = buf.indexOf('name="file"') + 40;
  assert.ok(Array.isArray(reader.push(buf.subarray(0, split))));
  const guard = createMultipartGuard(reader, null);
  const out: Buffer[] = [];
  guard.on('data', (c: Buffer) => out.push(c));
  const failed = new Promise<Error>((resolve) => guard.once('error', resolve));
  const rest = buf.subarray(split);
  const lateAt = rest.indexOf('name="model"');
  guard.write(rest.subarray(0, lateAt - 10));
  guard.write(rest.subarray(lateAt - 10));
  guard.end();
  const err = await failed;
  assert.match(err.message, /after the file part/);
  assert.equal(Buffer.concat(out).toString(), rest.subarray(0, lateAt - 10).toString());
});

test('with a Content-Length, the guard withholds the last chunk of a body that never closes', async () => {
  const whole = body(B, [{ name: 'model', value: 'a' }, FILE]);
  const unclosed = whole.subarray(0, whole.lastIndexOf(`--${B}--`));
  const reader = new MultipartReader(B);
  const split = unclosed.indexOf('name="file"') + 40;
  assert.ok(Array.isArray(reader.push(unclosed.subarray(0, split))));
  const rest = unclosed.subarray(split);
  const guard = createMultipartGuard(reader, rest.length);
  const out: Buffer[] = [];
  guard.on('data', (c: Buffer) => out.push(c));
  const failed = new Promise<Error>((resolve) => guard.once('error', resolve));
  guard.write(rest.subarray(0, 10));
  guard.write(rest.subarray(10));
  const err = await failed;
  assert.match(err.message, /clos/i);
  assert.equal(Buffer.concat(out).length, 10, 'the chunk that completes the declared length is not passed on');
});

test('a reader sealed at admission refuses a model field that comes later', () => {
  const reader = new MultipartReader(B);
  const buf = body(B, [{ name: 'prompt', value: 'p'.repeat(100) }, { name: 'model', value: 'b' }]);
  assert.ok(Array.isArray(reader.push(buf.subarray(0, 60))));
  assert.equal(reader.seal(), null);
  const r = reader.push(buf.subarray(60));
  assert.ok(!Array.isArray(r));
});

test('memory stays bounded on a long file part', () => {
  const reader = new MultipartReader(B);
  reader.push(raw(`--${B}\r\n${CD('name="file"; filename="a"')}\r\n\r\n`));
  const chunk = Buffer.alloc(1 << 16, 0x61);
  for (let i = 0; i < 200; i++) assert.ok(Array.isArray(reader.push(chunk)));
  assert.ok((reader as unknown as { buf: Buffer }).buf.length < 100);
});

test('boundaries outside the RFC 2046 character set are refused, not unescaped', () => {
  assert.equal(multipartBoundary('multipart/form-data; boundary="a\\"b"'), null);
  assert.equal(multipartBoundary('multipart/form-data; boundary="a\\\\b"'), null);
  assert.equal(multipartBoundary('multipart/form-data; boundary="ends with space "'), null);
  assert.equal(multipartBoundary(`multipart/form-data; boundary=${'b'.repeat(70)}`), 'b'.repeat(70));
  assert.equal(multipartBoundary(`multipart/form-data; boundary=${'b'.repeat(71)}`), null);
});

test('a part header section over 8 KB is refused, whole or in pieces', () => {
  const buf = raw(`--${B}\r\nX-Pad: ${'p'.repeat(9000)}\r\n${CD('name="model"')}\r\n\r\nm\r\n--${B}--`);
  for (const size of [buf.length, 1000]) assert.match(read(B, buf, size).problem ?? 'accepted', /too large/);
});
