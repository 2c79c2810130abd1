/**
 * A response whose head went out as 200 and that keyward's side then cut (its upstream
 * stopped short, or the shutdown grace ran out) is a failed request, though its status reads
 * as a success: its span's status is error, as the OpenTelemetry HTTP conventions ask of a
 * 2xx "unless there was another error". A client that leaves is not keyward's failure (499,
 * unset), nor is a response that ended whole. Real sidecar, fake upstream, local collector.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { startFakeUpstream, type FakeUpstream, type Handler } from '../helpers/upstream.js';
import { startHarness, type Harness } from '../helpers/sidecar.js';
import { startOtlpReceiver, type OtlpReceiver, type ReceivedSpan } from '../helpers/otlp-receiver.js';
import { send } from '../helpers/http.js';

/** The request's model says what the upstream does: a stream it cuts, one that never ends, or a whole answer. */
const handler: Handler = (_req, res, rec) => {
  const { model } = JSON.parse(rec.body.toString('utf8')) as { model: string };
  if (model === 'whole') {
    res.writeHead(200, { 'content-type': 'application/json' });
    return void res.end('{"usage":{"prompt_tokens":1,"completion_tokens":1}}');
  }
  res.writeHead(200, { 'content-type': 'text/event-stream' });
  res.write('data: {"choices":[{"delta":{"content":"hi"}}]}\n\n');
  if (model === 'cut') setImmediate(() => res.destroy());
};

let rx: OtlpReceiver;
let up: FakeUpstream;
let h: Harness;

before(async () => {
  rx = await startOtlpReceiver();
  up = await startFakeUpstream(handler);
  h = await startHarness({ upstream: up.url, keys: { k: {} }, config: { tracing: { otlpUrl: rx.url } }, traceTuning: { scheduledDelayMs: 20 } });
});

after(async () => {
  await up.close();
  await rx.close();
});

const chat = (model: string) => JSON.stringify({ model, stream: true, messages: [] });
const spanOf = (model: string) => (s: ReceivedSpan) => s.attributes['keyward.model'] === model;

/** Sends a chat request on a raw socket and resolves once the first response bytes are in; the socket stays open. */
async function streamStarted(model: string): Promise<net.Socket> {
  const s = net.connect(Number(new URL(h.url).port), '127.0.0.1');
  const body = chat(model);
  s.write(`POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${h.keys.k}\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`);
  await new Promise((resolve) => s.once('data', resolve));
  return s;
}

test('an upstream that cuts its 200 stream: the span is an error, its status code the 200 that went out', async () => {
  await send(h.url, { method: 'POST', path: '/v1/chat/completions', headers: { authorization: `Bearer ${h.keys.k}`, 'content-type': 'application/json' }, body: chat('cut') }).catch(() => {});
  const span = await rx.waitFor(spanOf('cut'));
  assert.equal(span.attributes['http.response.status_code'], 200);
  assert.equal(span.statusCode, 2, 'a response the upstream cut is not a success');
  assert.equal((span.raw.status as { message?: string }).message, 'upstream_cut');
});

test('a whole 200 and a client that leaves mid-stream: the status stays unset', async () => {
  const r = await send(h.url, { method: 'POST', path: '/v1/chat/completions', headers: { authorization: `Bearer ${h.keys.k}`, 'content-type': 'application/json' }, body: chat('whole') });
  assert.equal(r.status, 200);
  const whole = await rx.waitFor(spanOf('whole'));
  assert.equal(whole.statusCode, 0);
  (await streamStarted('left')).destroy();
  const left = await rx.waitFor(spanOf('left'));
  assert.equal(left.attributes['http.response.status_code'], 499);
  assert.equal(left.statusCode, 0, 'a client that left is not the server failing');
});

test('a stream the shutdown grace cuts: the span is an error', async () => {
  const s = await streamStarted('endless');
  s.on('error', () => {});
  await h.close(); // grace 500 ms, then what is in flight is cut; its span is flushed by then
  s.destroy();
  const span = await rx.waitFor(spanOf('endless'));
  assert.equal(span.statusCode, 2);
  assert.equal((span.raw.status as { message?: string }).message, 'shutdown_cut');
});
