/**
 * One strict reading of every model request (DESIGN section 5, step 6), end to end on
 * raw sockets: each way to make the upstream read another model than the one keyward
 * checked is refused with 400 (or 403 for an out-of-scope model) and never forwarded.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { once } from 'node:events';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { startHarness, waitForLine, type Harness } from '../helpers/sidecar.js';
import { parseResponses, rawExchange } from '../helpers/raw.js';
import { globMatch } from '../../src/policy/glob.js';

let up: FakeUpstream;
let h: Harness;

before(async () => {
  up = await startFakeUpstream();
  h = await startHarness({ upstream: up.url, keys: { k_scoped: { models: ['gpt-4o-mini', 'whisper-1'] }, k_all: {}, k_tpm_a: { tpm: 1000 }, k_tpm_b: { tpm: 1000 } } });
});
after(async () => {
  await h.close();
  await up.close();
});

const B = 'xYzBoundary';

function request(opts: { path?: string; key?: string; contentType?: string; body: Buffer | string; extraHeaders?: string }): Buffer {
  const body = Buffer.from(opts.body);
  const head = `POST ${opts.path ?? '/v1/chat/completions'} HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${opts.key ?? h.keys.k_scoped}\r\n` +
    `Content-Type: ${opts.contentType ?? 'application/json'}\r\n${opts.extraHeaders ?? ''}Content-Length: ${body.length}\r\nConnection: close\r\n\r\n`;
  return Buffer.concat([Buffer.from(head), body]);
}

async function expectRefused(bytes: Buffer, status = 400, code?: string): Promise<void> {
  const before = up.received.length;
  const ex = await rawExchange(h.sidecar.port, [bytes]);
  assert.equal(ex.responses[0]?.status, status, ex.bytes.toString('latin1').slice(0, 400));
  if (code !== undefined) assert.equal(ex.responses[0]?.headers['x-keyward-error'], code);
  assert.equal(up.received.length, before, 'nothing forwarded');
}

async function expectForwarded(bytes: Buffer): Promise<void> {
  const before = up.received.length;
  const ex = await rawExchange(h.sidecar.port, [bytes]);
  assert.equal(ex.responses[0]?.status, 200, ex.bytes.toString('latin1').slice(0, 400));
  assert.equal(up.received.length, before + 1);
}

const mp = (parts: string) => `--${B}\r\n${parts}\r\n--${B}--\r\n`;
const MP = `multipart/form-data; boundary=${B}`;

describe('a second place for the model', () => {
  test('the baseline is forwarded', () => expectForwarded(request({ body: '{"model":"gpt-4o-mini"}' })));
  test('model in the query string', () => expectRefused(request({ path: '/v1/chat/completions?model=gpt-4o', body: '{"model":"gpt-4o-mini"}' })));
  test('percent-encoded model in the query string', () => expectRefused(request({ path: '/v1/chat/completions?%6dodel=gpt-4o', body: '{"model":"gpt-4o-mini"}' })));
  test('MODEL beside model', () => expectRefused(request({ body: '{"model":"gpt-4o-mini","MODEL":"gpt-4o"}' })));
  test('Model alone', () => expectRefused(request({ key: h.keys.k_all, body: '{"Model":"gpt-4o"}', path: '/v1/images/generations' })));
  test('duplicate model through an escape', () => expectRefused(request({ body: '{"model":"gpt-4o-mini","mod\\u0065l":"gpt-4o"}' })));
  test('models outside the scope', () => expectRefused(request({ body: '{"model":"gpt-4o-mini","models":["gpt-4o"]}' }), 403));
  test('fallbacks outside the scope', () => expectRefused(request({ body: '{"model":"gpt-4o-mini","fallbacks":[{"gpt-4o-mini":["o1"]}]}' }), 403));
  test('extra_body model outside the scope', () => expectRefused(request({ body: '{"model":"gpt-4o-mini","extra_body":{"model":"gpt-4o"}}' }), 403));
  test('fallbacks inside the scope pass', () => expectForwarded(request({ body: '{"model":"gpt-4o-mini","fallbacks":["gpt-4o-mini"]}' })));
  test('two Content-Type lines', () => expectRefused(request({ body: '{"model":"gpt-4o-mini"}', extraHeaders: `Content-Type: ${MP}\r\n` })));
});

describe('a body the upstream decodes differently', () => {
  test('form-encoded body on a JSON route', () => expectRefused(request({ contentType: 'application/x-www-form-urlencoded', body: 'model=gpt-4o' })));
  test('JSON under a content type naming a form', () => expectRefused(request({ contentType: 'application/json; profile=form', body: '{"model":"gpt-4o-mini"}' })));
  test('multipart with an invalid boundary is not read as JSON', () => expectRefused(request({ contentType: `multipart/form-data; boundary=${'b'.repeat(71)}`, body: '{"model":"gpt-4o-mini"}' })));
  test('JSON declared in another charset', () => expectRefused(request({ contentType: 'application/json; charset=iso-8859-1', body: '{"model":"gpt-4o-mini"}' })));
  test('JSON declared utf-8 passes', () => expectForwarded(request({ contentType: 'application/json; charset=UTF-8', body: '{"model":"gpt-4o-mini"}' })));
  // UTF-7 reads `+ACIALAAiAG0-...` as `","model":"...`: the last charset is the one Express's reader decodes with.
  const utf7 = '{"model":"gpt-4o-mini","x":"+ACIALAAiAG0AbwBkAGUAbAAiADoAIgBvADE-"}';
  test('a charset named twice', () => expectRefused(request({ contentType: 'application/json; charset=utf-8; charset=utf-7', body: utf7 })));
  // Express's reader keeps the last of a parameter named twice, a first-match reader the
  // first: whichever order, one of them reads another charset or boundary than keyward would.
  test('a charset named twice, utf-8 last', () => expectRefused(request({ contentType: 'application/json; charset=utf-7; charset=utf-8', body: utf7 })));
  test('a boundary named twice, the body split at the last', () =>
    expectRefused(request({ path: '/v1/audio/transcriptions', contentType: 'multipart/form-data; boundary=first; boundary=second', body: `--second\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n--second--\r\n` })));
  test('a charset inside another parameter\'s quotes', () => expectRefused(request({ contentType: 'application/json; x="; charset=utf-8"; charset=utf-7', body: utf7 })));
  test('a quote left open', () => expectRefused(request({ contentType: 'application/json; x="; charset=utf-8', body: '{"model":"gpt-4o-mini"}' })));
  test('an RFC 2231 charset', () => expectRefused(request({ contentType: "application/json; charset*=utf-7''", body: utf7 })));
  test('utf-8 quoted, beside another parameter, passes', () => expectForwarded(request({ contentType: 'application/json; x="a;b"; charset="utf-8"', body: '{"model":"gpt-4o-mini"}' })));
  test('a quoted boundary with an escape', () => expectRefused(request({ path: '/v1/audio/transcriptions', contentType: 'multipart/form-data; boundary="a\\"b"', body: '--a"b\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n--a"b--' })));
  test('invalid UTF-8', () => expectRefused(request({ body: Buffer.concat([Buffer.from('{"model":"gpt-4o-mini","x":"'), Buffer.from([0xc3]), Buffer.from('"}')]) })));
  test('lone surrogate', () => expectRefused(request({ body: '{"model":"gpt-4o-mini\\ud800"}' })));
  test('BOM', () => expectRefused(request({ body: '\ufeff{"model":"gpt-4o-mini"}' })));
  // An upstream that honours Content-Encoding would decode the bytes into another body than
  // the one checked, even bytes that read as plain JSON.
  for (const coding of ['br', 'gzip', 'deflate', 'GZIP', 'identity, gzip']) {
    test(`Content-Encoding: ${coding} on a body that reads as JSON`, () =>
      expectRefused(request({ body: '{"model":"gpt-4o-mini"}', extraHeaders: `Content-Encoding: ${coding}\r\n` }), 400, 'invalid_request'));
  }
  test('Content-Encoding: identity is no coding and passes', () => expectForwarded(request({ body: '{"model":"gpt-4o-mini"}', extraHeaders: 'Content-Encoding: Identity\r\n' })));
  test('duplicate nested key', () => expectRefused(request({ body: '{"model":"gpt-4o-mini","metadata":{"a":1,"a":2}}' })));
  test('model over 256 characters', () => expectRefused(request({ key: h.keys.k_all, body: JSON.stringify({ model: 'm'.repeat(257) }) })));
});

describe('multipart read as RFC 2046/7578 parsers read it', () => {
  const path = '/v1/audio/transcriptions';
  const CD = (p: string) => `Content-Disposition: form-data; ${p}`;
  test('the baseline is forwarded', () => expectForwarded(request({ path, contentType: MP, body: mp(`${CD('name="model"')}\r\n\r\nwhisper-1\r\n--${B}\r\n${CD('name="file"; filename="a.wav"')}\r\n\r\nRIFF`) })));
  test('a boundary with trailing text is not a delimiter', () =>
    expectRefused(request({ path, contentType: MP, body: mp(`${CD('name="model"')}\r\n\r\nwhisper-1\r\n--${B}X\r\n${CD('name="model"')}\r\n\r\ngpt-4o`) })));
  test('transport padding that python-multipart reads as data', () =>
    expectRefused(request({ path, contentType: MP, body: mp(`${CD('name="x"')}\r\n\r\nv\r\n--${B} \r\n${CD('name="model"')}\r\n\r\nwhisper-1`) })));
  test('array fields (`fallbacks[]`, `models[0]`), which bracket-folding form readers take for the array, are held to the scope', async () => {
    const model = `${CD('name="model"')}\r\n\r\nwhisper-1\r\n--${B}\r\n`;
    const file = `\r\n--${B}\r\n${CD('name="file"; filename="a.wav"')}\r\n\r\nRIFF`;
    for (const name of ['fallbacks[]', 'fallbacks[0]', 'models[]', 'models[x]', 'fallbacks[a][b]']) {
      await expectRefused(request({ path, contentType: MP, body: mp(`${model}${CD(`name="${name}"`)}\r\n\r\ngpt-4o-transcribe${file}`) }), 403);
    }
    // elements repeat, as arrays do: each one is checked
    const two = `${CD('name="fallbacks[]"')}\r\n\r\nwhisper-1\r\n--${B}\r\n${CD('name="fallbacks[]"')}\r\n\r\ngpt-4o-transcribe`;
    await expectRefused(request({ path, contentType: MP, body: mp(`${model}${two}${file}`) }), 403);
    await expectForwarded(request({ path, contentType: MP, body: mp(`${model}${CD('name="fallbacks[]"')}\r\n\r\nwhisper-1${file}`) }));
    // a model given as an array is no single model
    await expectRefused(request({ path, contentType: MP, body: mp(`${CD('name="model[]"')}\r\n\r\ngpt-4o-transcribe${file}`) }));
    await expectRefused(request({ path, contentType: MP, body: mp(`${model}${CD('name="model[0]"')}\r\n\r\ngpt-4o-transcribe${file}`) }));
  });
  test('two name parameters', () => expectRefused(request({ path, contentType: MP, body: mp(`${CD('name="model"; name="x"')}\r\n\r\nwhisper-1`) })));
  test('name*=', () => expectRefused(request({ path, contentType: MP, body: mp(`${CD("name=\"x\"; name*=UTF-8''model")}\r\n\r\ngpt-4o`) })));
  test('two Content-Disposition lines', () => expectRefused(request({ path, contentType: MP, body: mp(`${CD('name="model"')}\r\n${CD('name="x"')}\r\n\r\nwhisper-1`) })));
  test('an RFC 2231 boundary beside the plain one (Go takes it over boundary=)', async () => {
    const body = mp(`${CD('name="model"')}\r\n\r\nwhisper-1`);
    for (const extra of ["boundary*=utf-8''evil", 'boundary*0=ev; boundary*1=il', 'boundary=other']) {
      await expectRefused(request({ path, contentType: `${MP}; ${extra}`, body }));
    }
  });
  test('a models field naming more than 1000 models, the last out of scope', () =>
    expectRefused(request({ path, contentType: MP, body: mp(`${CD('name="model"')}\r\n\r\nwhisper-1\r\n--${B}\r\n${CD('name="models"')}\r\n\r\n${JSON.stringify([...Array(1001).fill('whisper-1'), 'gpt-4o'])}`) })));
  test('a model field naming a list', () => expectRefused(request({ path, contentType: MP, body: mp(`${CD('name="model"')}\r\n\r\nwhisper-1,gpt-4o`) })));
  test('a models field nested deeper than 32 is 400, not a crash', () =>
    expectRefused(request({ path, contentType: MP, body: mp(`${CD('name="model"')}\r\n\r\nwhisper-1\r\n--${B}\r\n${CD('name="models"')}\r\n\r\n${'['.repeat(30000)}${']'.repeat(30000)}`) })));
  test('a streamed body with a Content-Length that never closes never reaches the upstream whole', async () => {
    const unclosed = `--${B}\r\n${CD('name="model"')}\r\n\r\nwhisper-1\r\n--${B}\r\n${CD('name="file"; filename="a.wav"')}\r\n\r\n${'x'.repeat(200_000)}\r\n`;
    await expectRefused(request({ path, contentType: MP, body: unclosed }));
  });
  test('a model field after the file part', () =>
    expectRefused(request({ path, contentType: MP, body: mp(`${CD('name="model"')}\r\n\r\nwhisper-1\r\n--${B}\r\n${CD('name="file"; filename="a"')}\r\n\r\nx\r\n--${B}\r\n${CD('name="model"')}\r\n\r\ngpt-4o`) })));
});

describe('billing that cannot be skipped', () => {
  // The fake upstream reports no usage, so each reservation stays as estimated: a second
  // request right after shows whether the first one reserved anything.
  const status = async (bytes: Buffer) => (await rawExchange(h.sidecar.port, [bytes])).responses[0]?.status;

  test('a multipart body whose file comes first is estimated from its whole size', async () => {
    const body = mp(`Content-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n${'x'.repeat(8000)}`);
    const req = () => request({ key: h.keys.k_tpm_a, path: '/v1/audio/transcriptions', contentType: MP, body });
    assert.equal(await status(req()), 200);
    assert.equal(await status(req()), 429, 'the first request reserved its size');
  });

  // DESIGN section 6: prompt tokens are ceil(body bytes / 4) of a multipart body's whole size,
  // declared in its head, not what had been read when its model field admitted it.
  test('a multipart body whose file arrives after admission is estimated from its declared whole size', { timeout: 10_000 }, async () => {
    const first = Buffer.from(`--${B}\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n--${B}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n`);
    const rest = Buffer.from(`${'x'.repeat(40_000)}\r\n--${B}--\r\n`);
    const total = first.length + rest.length;
    const socket = net.connect(h.sidecar.port, '127.0.0.1');
    socket.on('error', () => {});
    await once(socket, 'connect');
    const got: Buffer[] = [];
    socket.on('data', (c: Buffer) => got.push(c));
    const closed = once(socket, 'close');
    // the upstream sees the head once the model field has admitted the request
    const admitted = once(up.arrivals, 'head');
    // the head alone, declaring the whole length
    const head = request({ path: '/v1/audio/transcriptions', contentType: MP, body: Buffer.alloc(total) }).subarray(0, -total);
    socket.write(Buffer.concat([head, first]));
    await admitted;
    socket.write(rest);
    await closed;
    const id = parseResponses(Buffer.concat(got)).responses[0]?.headers['x-request-id'];
    const line = await waitForLine(h, (l) => l.msg === 'request' && l.req_id === id);
    assert.equal(line.status, 200);
    const e = h.usage.find((u) => u.request_id === id);
    assert.equal(e?.input_tokens, Math.ceil(total / 4), `estimated from ${total} bytes`);
  });

  test('the largest output cap counts, not the first one named', async () => {
    const req = () => request({ key: h.keys.k_tpm_b, body: '{"model":"m","max_tokens":1,"max_completion_tokens":5000}' });
    assert.equal(await status(req()), 200);
    assert.equal(await status(req()), 429, 'the first request reserved 5000 output tokens');
  });
});

test('scope globs match in linear time', () => {
  const glob = `${'*a'.repeat(40)}*b`;
  const input = 'a'.repeat(256);
  const t0 = performance.now();
  assert.equal(globMatch(glob, input), false);
  assert.ok(performance.now() - t0 < 50, 'no backtracking blow-up');
  assert.ok(globMatch('gpt-*-mini*', 'gpt-4o-mini-2024'));
  assert.ok(!globMatch('gpt-*-mini', 'gpt-4o-mini-2024'));
  assert.ok(globMatch('a*a', 'aa'));
  assert.ok(!globMatch('a*a', 'a'));
  assert.ok(globMatch('*', ''));
  assert.ok(globMatch('a.b*', 'a.bc'));
  assert.ok(!globMatch('a.b', 'axb'));
});
