/**
 * Live reload with `keyward serve --workers 2` (a real primary and two worker processes,
 * the real Redis): the primary reads the file and every worker applies the config it
 * sends, a worker started after the reload (a replacement) runs the reloaded config and
 * not the file, and the reload metrics on the primary's admin port count each reload once.
 * Which worker answered is read from the `worker` field of the access lines.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { spawnSidecar, type SidecarProcess } from '../helpers/process.js';
import { accessLines, configMetrics, metricSum, scrape, untilLogged, untilScraped } from '../helpers/instance.js';
import { bearer, send } from '../helpers/http.js';
import { chatUpstream, importKeys, logLines, nextReload } from '../helpers/reload.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { configHash } from '../../src/config/file.js';
import { TEST_REDIS_URL } from '../helpers/redis-url.js';

const prefix = `kwrw${randomBytes(4).toString('hex')}`;
const secret = `sk-workers-${randomBytes(8).toString('hex')}`;

let dir: string;
let file: string;
let up: FakeUpstream;
let kw: SidecarProcess;

const yaml = (routes: string) =>
  `server: { port: 0 }\nadmin: { port: 0 }\nupstreams: { default: { url: ${up.url} } }\nreplica: { path: ${join(dir, 'replica.sqlite')} }\n` +
  `redis: { url: ${TEST_REDIS_URL}, prefix: ${prefix}, timeoutMs: 1000 }\nlogging: { level: info }\nroutes: ${routes}\n`;
const WITH_RERANK = '[ { path: /v1/rerank, methods: [POST], class: model } ]';

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'kw-reload-workers-'));
  file = join(dir, 'workers.yaml');
  up = await startFakeUpstream(chatUpstream('A'));
  await importKeys(dir, join(dir, 'replica.sqlite'), { k_w: { secret } });
  kw = await spawnSidecar({ dir, name: 'workers', yaml: yaml('[]'), args: ['--workers', '2'] });
});

after(async () => {
  await kw?.stop('SIGKILL');
  await up?.close();
  const redis = new Redis(TEST_REDIS_URL);
  const keys = await redis.keys(`{${prefix}:*`);
  if (keys.length > 0) await redis.del(...keys);
  redis.disconnect();
  rmSync(dir, { recursive: true, force: true });
});

/** One rerank request on a new connection (the cluster hands connections to the workers in turn); its request id. */
async function rerank(): Promise<{ status: number; id: string }> {
  const sent = send(kw.url, { method: 'POST', path: '/v1/rerank', headers: { ...bearer(secret), 'content-type': 'application/json' }, body: '{"model":"m"}' });
  // A connection handed to a worker that died never gets an answer: fail rather than wait forever.
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error('no answer within 5 s')), 5_000)));
  const r = await Promise.race([sent, late]).finally(() => clearTimeout(timer));
  return { status: r.status, id: String(r.headers['x-request-id']) };
}

/** Sends rerank requests until each worker in `workers` has answered one with `status`; fails after 40. */
async function answeredBy(workers: number[], status: number): Promise<void> {
  const seen = new Set<number>();
  for (let i = 0; i < 40 && workers.some((w) => !seen.has(w)); i++) {
    const r = await rerank();
    await untilLogged(kw, () => accessLines(kw).some((l) => l.req_id === r.id), 'its access line');
    const line = accessLines(kw).find((l) => l.req_id === r.id)!;
    assert.equal(r.status, status, `worker ${line.worker} answered ${r.status}`);
    seen.add(line.worker);
  }
  assert.deepEqual([...seen].filter((w) => workers.includes(w)).sort(), [...workers].sort(), `answered by workers ${[...seen].join(', ')}`);
}

test('a reload reaches both workers, and a worker started after it runs the reloaded config', async () => {
  await answeredBy([1, 2], 404);
  const start = configMetrics(await scrape(kw));
  assert.deepEqual({ ok: start.ok, error: start.error, hashes: start.hashes }, { ok: 0, error: 0, hashes: [configHash(yaml('[]'))] });

  writeFileSync(file, yaml(WITH_RERANK));
  const reloaded = await nextReload(kw, start, 'ok');
  // Counted once, on the primary: the workers' registries do not add to it.
  assert.deepEqual({ ok: reloaded.metrics.ok, error: reloaded.metrics.error, hashes: reloaded.metrics.hashes }, { ok: 1, error: 0, hashes: [configHash(yaml(WITH_RERANK))] });
  // "ok" is counted once both workers confirmed the config: the route answers on each at once.
  await answeredBy([1, 2], 200);

  // An invalid file: counted once, and every worker keeps the config in force.
  writeFileSync(file, yaml('[ { path: rerank, class: nope } ]'));
  const refused = await nextReload(kw, reloaded.metrics, 'error');
  assert.deepEqual({ ok: refused.metrics.ok, error: refused.metrics.error, hashes: refused.metrics.hashes }, { ok: 1, error: 1, hashes: [configHash(yaml(WITH_RERANK))] });
  // The line goes out through the log stream, which can reach this process after the scrape did.
  const refusals = () => logLines(kw).filter((l) => l.level === 'error' && /config reload refused/.test(String(l.msg))).length;
  await untilLogged(kw, () => refusals() > 0, 'the refusal logged');
  await answeredBy([1, 2], 200);
  assert.equal(refusals(), 1);

  // A worker that dies is replaced, and the replacement runs the config in force, which it
  // gets from the primary: the file on disk now is the refused one.
  const pids = (logLines(kw).find((l) => l.msg === 'keyward listening')!.pids as number[]).slice();
  process.kill(pids[0]!, 'SIGKILL');
  await untilScraped(kw, (m) => metricSum(m, 'keyward_worker_restarts_total') === 1 && metricSum(m, 'keyward_workers') === 2, 'the replacement worker', 10_000);
  await answeredBy([3], 200);

  // SIGHUP to a worker (a closing terminal signals the whole process group) is left to the primary: the worker lives on.
  process.kill(pids[1]!, 'SIGHUP');
  await answeredBy([2, 3], 200);
  assert.equal(metricSum(await scrape(kw), 'keyward_worker_restarts_total'), 1);
});
