import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createLateFieldGuard, multipartBoundary, scanFields, type FieldScan } from '../../src/proxy/multipart.js';

const BOUNDARIES: [string | undefined, string | null][] = [
  ['multipart/form-data; boundary=abc123', 'abc123'],
  ['multipart/form-data;boundary=abc123', 'abc123'],
  ['Multipart/Form-Data; BOUNDARY=XyZ', 'XyZ'],
  ['multipart/form-data; boundary="quoted boundary;with=stuff"', 'quoted boundary;with=stuff'],
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

const done = (r: FieldScan) => {
  assert.equal(r.state, 'done', JSON.stringify(r));
  return r as Extract<FieldScan, { state: 'done' }>;
};
const asObject = (m: Map<string, string[]>) => Object.fromEntries(m);
const fileOffset = (buf: Buffer) => buf.indexOf(Buffer.from(`--${B}\r\nContent-Disposition: form-data; name="file"`));

test('fields before the first file part; bytes is where the file part starts', () => {
  const buf = body(B, [{ name: 'model', value: 'whisper-1' }, { name: 'language', value: 'en' }, FILE, { name: 'late', value: 'after-file' }]);
  for (const ended of [true, false]) {
    const r = done(scanFields(buf, B, ended));
    assert.deepEqual(asObject(r.fields), { model: ['whisper-1'], language: ['en'] });
    assert.equal(r.bytes, fileOffset(buf));
    assert.ok(r.bytes > 0);
  }
});

test('a file part first: no fields, bytes 0', () => {
  const buf = body(B, [FILE, { name: 'model', value: 'x' }]);
  const r = done(scanFields(buf, B, true));
  assert.equal(r.fields.size, 0);
  assert.equal(r.bytes, 0);
});

test('filename* also marks a file part', () => {
  const buf = body(B, [{ name: 'purpose', value: 'batch' }, { ...FILE, filenameStar: true }, { name: 'model', value: 'x' }]);
  const r = done(scanFields(buf, B, true));
  assert.deepEqual(asObject(r.fields), { purpose: ['batch'] });
});

test('duplicate model fields are all collected', () => {
  const buf = body(B, [{ name: 'model', value: 'a' }, { name: 'model', value: 'b' }, FILE]);
  const r = done(scanFields(buf, B, true));
  assert.deepEqual(r.fields.get('model'), ['a', 'b']);
});

test('only fields: stops at the closing delimiter; bytes is the end of the delimiter', () => {
  const buf = body(B, [{ name: 'model', value: 'dall-e-3' }, { name: 'prompt', value: 'a cat\r\non two lines' }]);
  const close = buf.indexOf(Buffer.from(`--${B}--`));
  for (const ended of [true, false]) {
    const r = done(scanFields(buf, B, ended));
    assert.deepEqual(asObject(r.fields), { model: ['dall-e-3'], prompt: ['a cat\r\non two lines'] });
    assert.equal(r.bytes, close + B.length + 4);
  }
});

test('values are UTF-8, names may be unquoted, parts without a name are skipped', () => {
  const raw =
    `--${B}\r\nContent-Disposition: form-data; name=model\r\n\r\nmodèle\r\n` +
    `--${B}\r\ncontent-disposition: form-data\r\n\r\nanonymous\r\n` +
    `--${B}\r\nCONTENT-DISPOSITION: form-data; name="n"\r\nContent-Type: text/plain\r\n\r\n✓\r\n` +
    `--${B}--\r\n`;
  const r = done(scanFields(Buffer.from(raw), B, true));
  assert.deepEqual(asObject(r.fields), { model: ['modèle'], n: ['✓'] });
});

test('a preamble before the first delimiter is skipped', () => {
  const buf = Buffer.concat([Buffer.from('This is the preamble.\r\n'), body(B, [{ name: 'model', value: 'm' }, FILE])]);
  const r = done(scanFields(buf, B, true));
  assert.deepEqual(r.fields.get('model'), ['m']);
  assert.equal(r.bytes, fileOffset(buf));
});

// Incremental: every prefix answers 'more' until it holds enough, then exactly the whole-body answer.
const INCREMENTAL: [name: string, boundary: string, buf: Buffer][] = [
  ['fields then file', B, body(B, [{ name: 'model', value: 'whisper-1' }, { name: 'temperature', value: '0.2' }, FILE])],
  ['fields then close', B, body(B, [{ name: 'model', value: 'gpt-image-1' }, { name: 'prompt', value: 'x'.repeat(100) }])],
  ['duplicate models then file, one-letter boundary', 'b', body('b', [{ name: 'model', value: 'a' }, { name: 'model', value: 'b' }, FILE])],
  ['file first', B, body(B, [FILE])],
];

for (const [name, boundary, buf] of INCREMENTAL) {
  test(`incremental: ${name}`, () => {
    const whole = done(scanFields(buf, boundary, true));
    let first = -1;
    for (let n = 0; n <= buf.length; n++) {
      const r = scanFields(buf.subarray(0, n), boundary, false);
      if (first === -1) {
        if (r.state === 'more') continue;
        first = n;
      }
      const d = done(r);
      assert.deepEqual(asObject(d.fields), asObject(whole.fields), `prefix ${n}`);
      assert.equal(d.bytes, whole.bytes, `prefix ${n}`);
    }
    assert.ok(first > 0, 'never finished');
    // it needs no byte of the file content: the file part's headers are enough
    const fileStart = buf.indexOf(Buffer.from('ID3'));
    if (fileStart !== -1) assert.ok(first <= fileStart, `needed ${first} bytes, file content starts at ${fileStart}`);
  });
}

test('incremental: chunked feeding (growing buffer) agrees with the whole body', () => {
  const buf = body(B, [{ name: 'model', value: 'whisper-1' }, FILE]);
  let acc = Buffer.alloc(0);
  let r: FieldScan = { state: 'more' };
  for (let i = 0; i < buf.length && r.state === 'more'; i += 7) {
    acc = Buffer.concat([acc, buf.subarray(i, i + 7)]);
    r = scanFields(acc, B, false);
  }
  assert.deepEqual(asObject(done(r).fields), { model: ['whisper-1'] });
  assert.equal(done(r).bytes, fileOffset(buf));
});

const BROKEN: [string, string, 'more' | 'error'][] = [
  ['no delimiter at all', 'hello world', 'error'],
  ['unterminated headers', `--${B}\r\nContent-Disposition: form-data; name="model"\r\n`, 'error'],
  ['unterminated field', `--${B}\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-1`, 'error'],
  ['field cut inside the next delimiter', `--${B}\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n--${B.slice(0, 5)}`, 'error'],
];

for (const [name, raw, endedState] of BROKEN) {
  test(`broken body: ${name} -> 'more' while open, '${endedState}' when ended`, () => {
    assert.equal(scanFields(Buffer.from(raw), B, false).state, 'more');
    const r = scanFields(Buffer.from(raw), B, true);
    assert.equal(r.state, endedState);
    if (r.state === 'error') assert.ok(r.message.length > 0);
  });
}

test('a different boundary in the body is not a delimiter', () => {
  const buf = body('other', [{ name: 'model', value: 'm' }]);
  assert.equal(scanFields(buf, B, true).state, 'error');
  assert.equal(scanFields(buf, B, false).state, 'more');
});

test('an over-long boundary parameter is never silently truncated', () => {
  // RFC 2046 caps boundaries at 70 characters; a longer one may be refused (null), but a
  // truncated boundary would make a body the upstream accepts unreadable here.
  for (const long of ['x'.repeat(250), 'y'.repeat(201)]) {
    for (const ct of [`multipart/form-data; boundary=${long}`, `multipart/form-data; boundary="${long}"`]) {
      const b = multipartBoundary(ct);
      assert.ok(b === null || b === long, `${ct.slice(0, 40)}…: got a ${b?.length}-character boundary`);
    }
  }
});

test('a delimiter must start a line: "--boundary" inside the preamble text is not a part', () => {
  // RFC 2046 (and busboy, python-multipart): the first delimiter is at the start of the body or after CRLF.
  // Otherwise the sidecar reads a `model` field that the upstream treats as preamble.
  const head = `junk--${B}\r\nContent-Disposition: form-data; name="model"\r\n\r\nallowed-model\r\n`;
  const buf = Buffer.concat([Buffer.from(head), body(B, [FILE])]);
  const r = scanFields(buf, B, true);
  assert.ok(r.state === 'error' || (r.state === 'done' && !r.fields.has('model')), JSON.stringify(r, (_k, v) => (v instanceof Map ? Object.fromEntries(v) : v)));
});

test('a model field after the file part is caught by the late-field guard, before the body completes', async () => {
  const buf = body(B, [{ name: 'model', value: 'whisper-1' }, FILE, { name: 'model', value: 'other-model' }]);
  const first = scanFields(buf, B, true);
  assert.equal(first.state, 'done');
  const fileAt = first.state === 'done' ? first.fileAt! : 0;
  for (const size of [1, 7, 64, buf.length]) {
    const guard = createLateFieldGuard({ boundary: B, field: 'model' });
    const passed: Buffer[] = [];
    guard.on('data', (c: Buffer) => passed.push(c));
    const failed = new Promise<Error>((resolve) => guard.once('error', resolve));
    const rest = buf.subarray(fileAt);
    for (let i = 0; i < rest.length && !guard.destroyed; i += size) guard.write(rest.subarray(i, i + size));
    const err = await failed;
    assert.match(err.message, /again after the file part/);
    assert.ok(!Buffer.concat(passed).includes(Buffer.from(`--${B}--`)), `chunk size ${size}: the closing delimiter went through`);
  }
  // A body without a late model field passes through whole and unchanged.
  const clean = body(B, [{ name: 'model', value: 'whisper-1' }, FILE, { name: 'language', value: 'en' }]);
  const cleanScan = scanFields(clean, B, true);
  const guard = createLateFieldGuard({ boundary: B, field: 'model' });
  const out: Buffer[] = [];
  guard.on('data', (c: Buffer) => out.push(c));
  const rest = clean.subarray(cleanScan.state === 'done' ? cleanScan.fileAt! : 0);
  for (let i = 0; i < rest.length; i += 5) guard.write(rest.subarray(i, i + 5));
  guard.end();
  await new Promise((r) => guard.once('end', r));
  assert.deepEqual(Buffer.concat(out), rest);
});
