/**
 * A client that half-closes right after sending its whole request still gets the whole
 * answer when that answer is decided after a round trip to Redis (DESIGN section 5, error
 * bodies): the connection's reading is held while the request is decided, so Node reads
 * the FIN only after the answer is out. Once a request is forwarded, a FIN means the
 * client has gone, as before: the forwarded request is cut and logged 499; one admitted
 * after a round trip is not forwarded when the FIN came while it was decided.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import type { FakeUpstream } from '../helpers/upstream.js';
import { startBehindUpstream, waitForLine, type Harness } from '../helpers/sidecar.js';
import { parseResponses, rawExchange } from '../helpers/raw.js';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';
import { deleteByPrefixAndDisconnect } from '../helpers/redis-harness.js';

const prefix = `kwhc${randomBytes(4).toString('hex')}`;
let up: FakeUpstream;
let h: Harness;
let close: () => Promise<void>;

before(async () => {
  ({ up, h, close } = await startBehindUpstream({
    keys: {
      // a per-model limit takes the per-request path: every admission is a Redis call
      k_model: { modelLimits: [{ models: 'gpt-4o', rpm: 1 }] },
      // a budget far below the request's cost: the hold is one exact Redis call
      k_budget: { kind: 'team', project: 'p_1', budget: 1, spent: 0 },
      k_view: { rpm: 10 },
      // a team key with an RPM of 1: its files uploads are admitted in Redis
      k_files: { kind: 'team', project: 'p_1', rpm: 1 },
      k_ok: {},
      // every admission a Redis call, and plenty of room: admitted after a round trip
      k_admitted_late: { modelLimits: [{ models: 'gpt-4o', rpm: 100 }] },
    },
    records: [{ type: 'project', id: 'p_1', status: 'enabled', budget: null, spent: 0 }, { type: 'price', model: 'priced-*', input: 1, output: 1, per: 1 }],
    config: { redis: { url: TEST_REDIS_URL, prefix, timeoutMs: 1000 } },
  }));
});
after(async () => {
  await close();
  await deleteByPrefixAndDisconnect(new Redis(TEST_REDIS_URL), prefix);
});

/** Sends the whole request, half-closes at once, and reads everything until the sidecar closes. */
const halfClosed = async (request: string): Promise<Buffer> => (await rawExchange(h.sidecar.port, [request], { halfClose: true })).bytes;

const chat = (key: string, body = '{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":8}') =>
  `POST /v1/chat/completions HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${key}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;

/** The one answer in `bytes`, its JSON body parsed; fails when there is none or more. */
function onlyAnswer(bytes: Buffer): { status: number; headers: Record<string, string>; json: Record<string, unknown> } {
  const { responses, rest } = parseResponses(bytes);
  assert.equal(responses.length, 1, `one answer: ${JSON.stringify(bytes.toString('latin1'))}`);
  assert.equal(rest.length, 0);
  const [res] = responses;
  assert.equal(Number(res!.headers['content-length']), res!.body.length, 'the whole body');
  return { status: res!.status, headers: res!.headers, json: JSON.parse(res!.body.toString()) as Record<string, unknown> };
}

describe('a client that half-closes after its request', () => {
  test('gets a 429 that took a Redis call, whole, and nothing reaches the upstream', async () => {
    const first = onlyAnswer((await rawExchange(h.sidecar.port, [chat(h.keys.k_model!)], { expect: 1 })).bytes);
    assert.equal(first.status, 200, 'the first request is admitted');
    const before = up.received.length;
    const res = onlyAnswer(await halfClosed(chat(h.keys.k_model!)));
    assert.equal(res.status, 429);
    assert.equal(res.headers['x-keyward-error'], 'rpm_exceeded');
    assert.equal(res.headers['content-type'], 'application/json');
    assert.ok(Number(res.headers['retry-after']) >= 1);
    assert.equal((res.json.error as { code: string }).code, 'rpm_exceeded');
    assert.equal(up.received.length, before, 'nothing reached the upstream');
  });

  test('gets that 429 whole when its body comes in a later packet, the FIN with it', async () => {
    const request = chat(h.keys.k_model!);
    const cut = request.indexOf('\r\n\r\n') + 4;
    const bytes = await new Promise<Buffer>((resolve, reject) => {
      const chunks: Buffer[] = [];
      const socket = net.connect(h.sidecar.port, '127.0.0.1', () => {
        socket.write(request.slice(0, cut));
        // the head is read and the request handled before the body and the FIN arrive
        setTimeout(() => socket.end(request.slice(cut)), 20);
      });
      socket.on('data', (c: Buffer) => chunks.push(c));
      socket.on('error', reject);
      socket.on('close', () => resolve(Buffer.concat(chunks)));
    });
    const res = onlyAnswer(bytes);
    assert.equal(res.status, 429);
    assert.equal(res.headers['x-keyward-error'], 'rpm_exceeded');
  });

  test('gets a 402 from a spend hold that took a Redis call, whole', async () => {
    const res = onlyAnswer(await halfClosed(chat(h.keys.k_budget!, '{"model":"priced-model","messages":[],"max_tokens":8}')));
    assert.equal(res.status, 402);
    assert.equal(res.headers['x-keyward-error'], 'key_budget_exhausted');
    assert.equal((res.json.error as { type: string }).type, 'insufficient_quota');
  });

  test('gets its key view, which reads live figures from Redis, whole', async () => {
    const res = onlyAnswer(await halfClosed(`GET /v1/key HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k_view}\r\n\r\n`));
    assert.equal(res.status, 200);
    assert.equal((res.json.limits as { rpm: number }).rpm, 10);
  });

  test('gets a files-route 429 whole, its body never read by the decision', async () => {
    const upload = `POST /v1/files HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k_files}\r\nContent-Type: application/octet-stream\r\nContent-Length: 5\r\n\r\nhello`;
    const first = onlyAnswer((await rawExchange(h.sidecar.port, [upload], { expect: 1 })).bytes);
    assert.equal(first.status, 200, 'the first upload is admitted');
    const before = up.received.length;
    const res = onlyAnswer(await halfClosed(upload));
    assert.equal(res.status, 429);
    assert.equal(res.headers['x-keyward-error'], 'rpm_exceeded');
    assert.equal(up.received.length, before, 'nothing reached the upstream');
  });

  test('gets its key view whole when the request carries a body it never reads', async () => {
    const res = onlyAnswer(await halfClosed(`GET /v1/key HTTP/1.1\r\nHost: kw\r\nAuthorization: Bearer ${h.keys.k_view}\r\nContent-Length: 2\r\n\r\n{}`));
    assert.equal(res.status, 200);
    assert.equal((res.json.limits as { rpm: number }).rpm, 10);
  });

  test('admitted after a round trip, a client whose FIN came meanwhile has gone: nothing is forwarded or billed', async () => {
    const before = up.received.length;
    const line = waitForLine(h, (l) => l.msg === 'request' && l.key_id === 'k_admitted_late');
    const bytes = await halfClosed(chat(h.keys.k_admitted_late!));
    assert.equal(bytes.length, 0, `no answer on a connection the client has left: ${JSON.stringify(bytes.toString('latin1').slice(0, 300))}`);
    const logged = await line;
    assert.deepEqual([logged.status, logged.input_tokens], [499, null], 'logged 499, nothing settled');
    assert.equal(up.received.length, before, 'nothing reached the upstream');
    assert.equal(h.usage.filter((e) => e.key_id === 'k_admitted_late').length, 0, 'no usage event');
  });

  test('once forwarded, a FIN means the client has gone: the request is cut and logged 499', async () => {
    const before = up.received.length;
    const line = waitForLine(h, (l) => l.msg === 'request' && l.key_id === 'k_ok');
    const bytes = await halfClosed(chat(h.keys.k_ok!));
    assert.equal(bytes.length, 0, `no answer on a connection the client has left: ${JSON.stringify(bytes.toString('latin1').slice(0, 300))}`);
    assert.equal((await line).status, 499);
    assert.equal(up.received.length, before + 1, 'the request was forwarded before the FIN was read');
  });
});
