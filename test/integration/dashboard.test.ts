/**
 * deploy/grafana/keyward.json: every metric its queries name is one a live sidecar (synced
 * with a console, after real traffic, reloading its config file) exports on /metrics, and
 * the exported names carry no doubled prefix.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { stringify } from 'yaml';
import { loadConfig } from '../../src/config/file.js';
import { createLogger } from '../../src/obs/logger.js';
import { startSidecar, type Sidecar } from '../../src/app/sidecar.js';
import { startReloading, type ConfigReloader } from '../../src/app/reload.js';
import { ReplicaStore } from '../../src/replica/store.js';
import { startConsoleFixture, type ConsoleFixture } from '../helpers/console-fixture.js';
import { lookupSecret, whenReplica } from '../helpers/console-replica.js';
import { startFakeUpstream, type FakeUpstream } from '../helpers/upstream.js';

const DASHBOARD = join(import.meta.dirname, '../../deploy/grafana/keyward.json');

let fx: ConsoleFixture;
let upstream: FakeUpstream;
let replica: ReplicaStore;
let sidecar: Sidecar;
let reloader: ConfigReloader;
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
  // A key whose RPM of 1 is shadowed: its second request is a shadow denial.
  const shadowed = (await fx.api('POST', '/admin/v1/keys', { body: { kind: 'personal', user: 'alice', rpm: 1, shadow: ['rpm'] } })).body;
  // A config file, reloaded as `serve` reloads it: the config metrics are on /metrics too.
  const file = join(dir, 'keyward.yaml');
  writeFileSync(file, stringify({
    server: { port: 0 }, admin: { port: 0 },
    upstreams: { default: { url: upstream.url } },
    replica: { path: join(dir, 'replica.sqlite') },
    console: { url: fx.url, token: fx.tokens.sync, waitMs: 2000 },
  }));
  const loaded = loadConfig(file);
  const { config } = loaded;
  replica = new ReplicaStore({ path: config.replica.path });
  const logger = createLogger({ level: 'warn', destination: new Writable({ write: (_c, _e, cb) => cb() }) });
  sidecar = await startSidecar({ config, logger, replica });
  reloader = startReloading({ file, loaded, log: logger, metrics: sidecar.metrics, apply: (c) => sidecar.reconfigure(c) });
  await whenReplica(replica, () => lookupSecret(replica, shadowed.secret) !== null, 10_000);
  // Traffic of both outcomes and a shadow denial, so labelled series (requests, decision latency, shadow denials) exist.
  for (const key of [body.secret, 'not-a-key']) {
    await (await fetch(`${sidecar.url}/v1/models`, { headers: { authorization: `Bearer ${key}` } })).arrayBuffer();
  }
  for (let i = 0; i < 2; i++) {
    const chat = { method: 'POST', headers: { authorization: `Bearer ${shadowed.secret}`, 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', messages: [] }) };
    const res = await fetch(`${sidecar.url}/v1/chat/completions`, chat);
    await res.arrayBuffer();
    assert.equal(res.status, 200);
  }
  text = await (await fetch(`http://127.0.0.1:${sidecar.adminPort}/metrics`)).text();
  exported = new Set(text.split('\n').filter((l) => l && !l.startsWith('#')).map((l) => /^[a-zA-Z_:][a-zA-Z0-9_:]*/.exec(l)![0]));
});

after(async () => {
  reloader?.close();
  await sidecar?.close({ graceMs: 100 });
  await replica?.close();
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
  // The reload panels: reloads by result, time since the last success, the hash in force.
  for (const name of ['keyward_config_reloads_total', 'keyward_config_last_reload_success_timestamp_seconds', 'keyward_config_info',
    'keyward_shadow_denials_total']) {
    assert.ok(all.some(({ expr }) => expr.includes(name)), `a panel queries ${name}`);
  }
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
    'keyward_fail_open_holds_total', 'keyward_usage_events_rejected_total', 'keyward_trace_spans_dropped_total', 'keyward_config_reloads_total', 'keyward_config_last_reload_success_timestamp_seconds', 'keyward_config_info',
    'keyward_alerts_total']) {
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
