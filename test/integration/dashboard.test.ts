/**
 * deploy/grafana/keyward.json: every metric its queries name is one a live sidecar (synced
 * with a console, after real traffic) exports on /metrics, and the exported names carry no
 * doubled prefix.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { configSchema } from '../../src/config/schema.js';
import { createLogger } from '../../src/obs/logger.js';
import { startSidecar, type Sidecar } from '../../src/app/sidecar.js';
import { ReplicaStore } from '../../src/replica/store.js';
import { startConsoleFixture, type ConsoleFixture } from '../helpers/console-fixture.js';
import { lookupSecret, whenReplica } from '../helpers/console-replica.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';

const DASHBOARD = join(import.meta.dirname, '../../deploy/grafana/keyward.json');

let fx: ConsoleFixture;
let upstream: FakeUpstream;
let replica: ReplicaStore;
let sidecar: Sidecar;
let dir: string;
let exported: Set<string>;
/** the /metrics text the set above was read from */
let text: string;

before(async () => {
  fx = await startConsoleFixture();
  dir = mkdtempSync(join(tmpdir(), 'kw-dash-'));
  upstream = await startFakeUpstream();
  await fx.api('PUT', '/admin/v1/wallets/alice', { body: { balance: 5 } });
  const { body } = await fx.api('POST', '/admin/v1/keys', { body: { kind: 'personal', user: 'alice', rpm: 100 } });
  const config = configSchema.parse({
    server: { port: 0 }, admin: { port: 0 },
    upstreams: { default: { url: upstream.url } },
    replica: { path: join(dir, 'replica.sqlite') },
    console: { url: fx.url, token: fx.tokens.sync, waitMs: 2000 },
  });
  replica = new ReplicaStore({ path: config.replica.path });
  const logger = createLogger({ level: 'warn', destination: new Writable({ write: (_c, _e, cb) => cb() }) });
  sidecar = await startSidecar({ config, logger, replica });
  await whenReplica(replica, () => lookupSecret(replica, body.secret) !== null, 10_000);
  // Traffic of both outcomes, so labelled series (requests, decision latency) exist.
  for (const key of [body.secret, 'not-a-key']) {
    await (await fetch(`${sidecar.url}/v1/models`, { headers: { authorization: `Bearer ${key}` } })).arrayBuffer();
  }
  text = await (await fetch(`http://127.0.0.1:${sidecar.adminPort}/metrics`)).text();
  exported = new Set(text.split('\n').filter((l) => l && !l.startsWith('#')).map((l) => /^[a-zA-Z_:][a-zA-Z0-9_:]*/.exec(l)![0]));
});

after(async () => {
  await sidecar?.close({ graceMs: 100 });
  replica?.close();
  await upstream?.close();
  await fx?.close();
  rmSync(dir, { recursive: true, force: true });
});

/** Every PromQL expression in the dashboard: panel targets, nested rows and template queries. */
function queries(dash: any): { where: string; expr: string }[] {
  const out: { where: string; expr: string }[] = [];
  const walk = (panels: any[]) => {
    for (const p of panels ?? []) {
      for (const t of p.targets ?? []) out.push({ where: `panel "${p.title}" ${t.refId}`, expr: t.expr });
      walk(p.panels);
    }
  };
  walk(dash.panels);
  for (const v of dash.templating?.list ?? []) {
    if (v.type === 'query') out.push({ where: `variable ${v.name}`, expr: typeof v.query === 'string' ? v.query : v.query.query });
  }
  return out;
}

test('every metric the dashboard queries is exported by a live sidecar', () => {
  const dash = JSON.parse(readFileSync(DASHBOARD, 'utf8'));
  const all = queries(dash);
  assert.ok(all.length >= 15, 'the dashboard has queries');
  const missing: string[] = [];
  for (const { where, expr } of all) {
    const names = expr.match(/\bkeyward_[a-zA-Z0-9_]+/g) ?? [];
    assert.ok(names.length > 0, `${where} names a keyward metric: ${expr}`);
    for (const name of names) if (!exported.has(name)) missing.push(`${where}: ${name}`);
  }
  assert.deepEqual(missing, []);
});

test('exported metric names have no doubled prefix, and the design\'s metrics are there', () => {
  assert.deepEqual([...exported].filter((n) => /process_process|nodejs_nodejs|keyward_keyward/.test(n)), []);
  for (const name of ['keyward_process_cpu_seconds_total', 'keyward_nodejs_eventloop_lag_p99_seconds', 'keyward_requests_total', 'keyward_decision_seconds_bucket',
    'keyward_replica_version', 'keyward_replica_sync_lag_seconds', 'keyward_redis_errors_total', 'keyward_fail_open_admissions_total', 'keyward_in_flight_requests',
    'keyward_trace_spans_dropped_total', 'keyward_alerts_total']) {
    assert.ok(exported.has(name), name);
  }
});

test('the budget alerts row charts keyward_alerts_total by result, and both series exist before any alert', () => {
  const dash = JSON.parse(readFileSync(DASHBOARD, 'utf8'));
  const row = dash.panels.findIndex((p: any) => p.type === 'row' && p.title === 'Budget alerts');
  assert.ok(row >= 0, 'a Budget alerts row');
  const panels = dash.panels.slice(row + 1).filter((p: any) => p.type !== 'row');
  const exprs = queries({ panels }).map((q) => q.expr).filter((e) => e.includes('keyward_alerts_total'));
  assert.ok(exprs.some((e) => /sum by \(result\)/.test(e)), 'events by result');
  assert.ok(exprs.some((e) => e.includes('result="failed"')), 'failed events on their own');
  // A sidecar without an alerts block still exports both series, so the panels never go blank.
  assert.match(text, /^keyward_alerts_total\{result="sent"\} 0$/m);
  assert.match(text, /^keyward_alerts_total\{result="failed"\} 0$/m);
});
