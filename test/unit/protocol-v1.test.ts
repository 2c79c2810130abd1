import { test } from 'node:test';
import assert from 'node:assert/strict';
import { cidrContains, parseCidr, parseIPv4, parseIPv6 } from '../../src/protocol/cidr.js';
import { parseChange, parseChangeBatch, parseRecord } from '../../src/protocol/records.js';
import { LineSplitter, SnapshotError, parseSnapshotText } from '../../src/protocol/ndjson.js';
import { parseUsageLines } from '../../src/protocol/usage.js';

const HASH = 'a'.repeat(64);
const oldKey = {
  type: 'key', id: 'k_1', hash: HASH, kind: 'team', user: null, project: 'p_1', status: 'active', budget: 5, spent: 1,
  models: null, routing: null, rpm: null, tpm: null, concurrency: null,
};

test('an old-style key, project and wallet without the v1 fields load with the defaults', () => {
  const k = parseRecord(oldKey);
  assert.ok(k.ok);
  assert.deepEqual(k.value, { ...oldKey, epoch: 0, ips: null, allowBrowser: false, modelLimits: null, period: null, shadow: [] });
  const p = parseRecord({ type: 'project', id: 'p_1', status: 'enabled', budget: null, spent: 0 });
  assert.ok(p.ok);
  assert.deepEqual(p.value, { type: 'project', id: 'p_1', status: 'enabled', budget: null, spent: 0, epoch: 0, period: null });
  const w = parseRecord({ type: 'wallet', user: 'u_1', balance: 5 });
  assert.ok(w.ok);
  assert.deepEqual(w.value, { type: 'wallet', user: 'u_1', balance: 5, epoch: 0 });
});

test('v1 additions sent as null take their defaults, as when absent; a wrong type is still refused', () => {
  const k = parseRecord({ ...oldKey, epoch: null, ips: null, allowBrowser: null, modelLimits: null, period: null, shadow: null });
  assert.ok(k.ok, JSON.stringify(k));
  assert.deepEqual(k.value, { ...oldKey, epoch: 0, ips: null, allowBrowser: false, modelLimits: null, period: null, shadow: [] });
  const p = parseRecord({ type: 'project', id: 'p_1', status: 'enabled', budget: null, spent: 0, epoch: null, period: null });
  assert.ok(p.ok && p.value.type === 'project' && p.value.epoch === 0);
  const w = parseChange({ op: 'upsert', type: 'wallet', user: 'u_1', balance: 5, epoch: null });
  assert.ok(w.ok && w.value.op === 'upsert' && w.value.type === 'wallet' && w.value.epoch === 0);
  for (const bad of [{ allowBrowser: 'no' }, { epoch: -1 }, { shadow: 'budget' }]) assert.equal(parseRecord({ ...oldKey, ...bad }).ok, false, JSON.stringify(bad));
});

test('a wallet delete may name the wallet by its user, as its record does; by id as before', () => {
  assert.deepEqual(parseChange({ op: 'delete', type: 'wallet', user: 'u_1' }), { ok: true, value: { op: 'delete', type: 'wallet', id: 'u_1' } });
  assert.deepEqual(parseChange({ op: 'delete', type: 'wallet', id: 'u_2' }), { ok: true, value: { op: 'delete', type: 'wallet', id: 'u_2' } });
  assert.equal(parseChange({ op: 'delete', type: 'wallet' }).ok, false, 'naming nothing');
  // Only a wallet is named by its user: a key delete naming a user names nothing.
  assert.equal(parseChange({ op: 'delete', type: 'key', user: 'u_1' }).ok, false);
});

test("a key's hash in capitals is the same hash: read as lowercase, anything but 64 hex characters refused", () => {
  const upper = parseRecord({ ...oldKey, hash: 'AB'.repeat(32) });
  assert.ok(upper.ok && upper.value.type === 'key');
  assert.equal(upper.value.hash, 'ab'.repeat(32));
  assert.equal(parseRecord({ ...oldKey, hash: 'g'.repeat(64) }).ok, false);
  assert.equal(parseRecord({ ...oldKey, hash: 'a'.repeat(63) }).ok, false);
});

test('the v1 key fields are read and validated', () => {
  const k = parseRecord({
    ...oldKey, epoch: 3, ips: ['10.0.0.0/8', '2001:db8::/32'], allowBrowser: true, period: 'month',
    modelLimits: [{ models: 'gpt-4o*', rpm: 10, tpm: 20000 }, { models: 'o1*', rpm: 2 }],
  });
  assert.ok(k.ok, !k.ok ? k.error : '');
  assert.equal(k.value.type === 'key' && k.value.epoch, 3);
  assert.deepEqual(k.value.type === 'key' && k.value.modelLimits, [{ models: 'gpt-4o*', rpm: 10, tpm: 20000 }, { models: 'o1*', rpm: 2, tpm: null }]);
  const bad = (extra: Record<string, unknown>) => {
    const r = parseRecord({ ...oldKey, ...extra });
    assert.equal(r.ok, false, JSON.stringify(extra));
    return r.ok ? '' : r.error;
  };
  assert.match(bad({ epoch: -1 }), /epoch/);
  assert.match(bad({ epoch: 1.5 }), /epoch/);
  assert.match(bad({ ips: ['10.0.0.0/33'] }), /ips\.0: expected a CIDR/);
  assert.match(bad({ ips: ['10.0.0.0'] }), /ips\.0/);
  assert.match(bad({ ips: 'x' }), /ips/);
  assert.match(bad({ allowBrowser: 'yes' }), /allowBrowser/);
  assert.match(bad({ period: 'year' }), /period/);
  assert.match(bad({ modelLimits: [{ models: '', rpm: 1 }] }), /modelLimits\.0\.models/);
  assert.match(bad({ modelLimits: [{ models: 'x', rpm: -1 }] }), /modelLimits\.0\.rpm/);
  // unknown fields do not excuse bad known ones
  assert.match(bad({ futureField: 1, rpm: 'many' }), /rpm/);
  assert.match(bad({ shadow: 'rpm' }), /shadow/);
  assert.match(bad({ shadow: [1] }), /shadow\.0/);
});

test("a key record's shadow list: known checks kept once each; a name this build does not know is dropped, the record kept", () => {
  const k = parseRecord({ ...oldKey, shadow: ['tpm', 'rpm', 'tpm', 'budget'] });
  assert.ok(k.ok && k.value.type === 'key');
  assert.deepEqual(k.value.shadow, ['rpm', 'tpm', 'budget']);
  const newer = parseRecord({ ...oldKey, shadow: ['rpm', 'some-future-check'] });
  assert.ok(newer.ok && newer.value.type === 'key', 'a newer console naming more checks does not lose the key');
  assert.deepEqual(newer.value.shadow, ['rpm']);
});

test('a reader ignores fields it does not know, in records, changes, meta and usage events', () => {
  const k = parseRecord({ ...oldKey, colour: 'blue', nested: { a: 1 } });
  assert.ok(k.ok);
  assert.equal('colour' in k.value, false);
  const snap = parseSnapshotText(`{"type":"meta","version":4,"generatedBy":"console 9"}\n${JSON.stringify({ ...oldKey, colour: 'x' })}\n`);
  assert.equal(snap.version, 4);
  assert.equal(snap.records.length, 1);
  const del = parseChange({ op: 'delete', type: 'key', id: 'k_1', reason: 'rotated' });
  assert.deepEqual(del, { ok: true, value: { op: 'delete', type: 'key', id: 'k_1' } });
  const u = parseUsageLines('{"request_id":"r","key_id":"k","model":"m","input_tokens":1,"output_tokens":2,"status":200,"at":"2026-01-01T00:00:00Z","cached_tokens":5}\n');
  assert.equal(u.errors.length, 0);
  assert.equal(u.events.length, 1);
});

test('records and changes of a type this version does not know are skipped; a known record with a bad value is not', () => {
  const snap = parseSnapshotText(`{"type":"meta","version":7}\n{"type":"team_member","id":"m_1","user":"u_1"}\n${JSON.stringify(oldKey)}\n`);
  assert.deepEqual(snap.records.map((r) => r.record.type), ['key']);
  const batch = parseChangeBatch({ version: 8, changes: [{ op: 'upsert', type: 'team_member', id: 'm_1' }, { op: 'delete', type: 'team_member', id: 'm_1' }, { op: 'delete', type: 'key', id: 'k_1' }] });
  assert.ok(batch.ok);
  assert.deepEqual(batch.value.changes, [{ op: 'delete', type: 'key', id: 'k_1' }]);
  // a record without a type, or a key whose period this version cannot read, is still refused
  assert.equal(parseChangeBatch({ version: 9, changes: [{ op: 'upsert', id: 'x' }] }).ok, false);
  assert.equal(parseChangeBatch({ version: 9, changes: [{ op: 'upsert', ...oldKey, period: 'quarter' }] }).ok, false);
});

test('a personal key needs a user and a team key a project: a key that names neither is refused, in a snapshot line and in a change', () => {
  assert.equal(parseRecord(oldKey).ok, true);
  const personal = { ...oldKey, kind: 'personal', user: 'u_1', project: null };
  assert.equal(parseRecord(personal).ok, true);
  const noUser = parseRecord({ ...personal, user: null });
  assert.equal(noUser.ok, false);
  assert.match((noUser as { error: string }).error, /personal key needs a user/);
  assert.equal(parseRecord({ ...oldKey, user: 'u_1', project: null }).ok, false, 'a team key without its project');
  assert.equal(parseChange({ op: 'upsert', ...personal, user: null, project: 'p_1' }).ok, false);
});

test('a change is an upsert or a delete: another op, or none, is refused even when the record after it is valid', () => {
  assert.equal(parseChange({ op: 'upsert', ...oldKey }).ok, true);
  for (const op of ['insert', 'patch', 'UPSERT', undefined]) {
    const c = parseChange({ ...(op === undefined ? {} : { op }), ...oldKey });
    assert.equal(c.ok, false, String(op));
    assert.match((c as { error: string }).error, /op must be "upsert" or "delete"/);
  }
});

test('amounts that can only be wrong are refused: a negative key or project budget', () => {
  assert.equal(parseRecord({ ...oldKey, budget: 0 }).ok, true);
  assert.equal(parseRecord({ ...oldKey, budget: -5 }).ok, false, 'key budget');
  assert.equal(parseRecord({ type: 'project', id: 'p_1', status: 'enabled', budget: -1, spent: 0 }).ok, false, 'project budget');
});

test('ids and batch versions that can name nothing are refused: an empty key id, a negative or fractional version', () => {
  assert.equal(parseRecord({ ...oldKey, id: '' }).ok, false, 'empty key id');
  assert.equal(parseChange({ op: 'delete', type: 'key', id: '' }).ok, false);
  assert.equal(parseChangeBatch({ version: 3, changes: [] }).ok, true);
  for (const version of [-1, 2.5]) assert.equal(parseChangeBatch({ version, changes: [] }).ok, false, String(version));
});

test('a snapshot line past the bound is refused while it streams, naming its line, before it is held whole', () => {
  const s = new LineSplitter(16);
  assert.deepEqual(s.push(Buffer.from('{"type":"meta"}\n')).map((l) => l.line), [1]);
  // 17 bytes and no newline yet: refused now, not once the rest of the line has been buffered
  assert.throws(() => s.push(Buffer.from('x'.repeat(17))), (e: Error) => e instanceof SnapshotError && e.line === 2 && /longer than 16 bytes/.test(e.message));
});

test('price records: upsert and delete by model', () => {
  const p = parseRecord({ type: 'price', model: 'gpt-4o*', input: 2.5, output: 10, per: 1000000 });
  assert.deepEqual(p, { ok: true, value: { type: 'price', model: 'gpt-4o*', input: 2.5, output: 10, per: 1000000 } });
  assert.equal(parseRecord({ type: 'price', model: 'gpt-4o*', input: -1, output: 10, per: 1 }).ok, false);
  assert.equal(parseRecord({ type: 'price', model: 'gpt-4o*', input: 1, output: 10, per: 0 }).ok, false);
  assert.equal(parseRecord({ type: 'price', model: '', input: 1, output: 1, per: 1 }).ok, false);
  const batch = parseChangeBatch({
    version: 9,
    changes: [{ op: 'upsert', type: 'price', model: 'o1', input: 15, output: 60, per: 1e6 }, { op: 'delete', type: 'price', model: 'gpt-4o*' }],
  });
  assert.ok(batch.ok);
  assert.deepEqual(batch.value.changes[1], { op: 'delete', type: 'price', model: 'gpt-4o*' });
  // a price is deleted by its model, a key by its id
  assert.equal(parseChange({ op: 'delete', type: 'price', id: 'gpt-4o*' }).ok, false);
  assert.equal(parseChange({ op: 'delete', type: 'key', model: 'k_1' }).ok, false);
});

test('usage events may say they are estimated', () => {
  const line = (extra: string) => `{"request_id":"r","key_id":"k","model":"m","input_tokens":1,"output_tokens":2,"status":499,"at":"2026-01-01T00:00:00Z"${extra}}`;
  const u = parseUsageLines(`${line(',"estimated":true')}\n${line('')}\n${line(',"estimated":"yes"')}\n`);
  assert.equal(u.events[0]!.estimated, true);
  assert.equal(u.events[1]!.estimated, undefined);
  assert.equal(u.errors.length, 1);
  assert.equal(u.errors[0]!.line, 3);
});

test('a usage event with a negative token count is refused (it would credit the key), the other lines kept', () => {
  const ok = { request_id: 'r1', key_id: 'k_1', model: 'gpt-4o', input_tokens: 10, output_tokens: 5, status: 200, at: '2026-01-01T00:00:00Z' };
  const { events, errors } = parseUsageLines([ok, { ...ok, request_id: 'r2', input_tokens: -1000 }, { ...ok, request_id: 'r3', output_tokens: -1 }].map((e) => JSON.stringify(e)).join('\n'));
  assert.deepEqual(events.map((e) => e.request_id), ['r1']);
  assert.deepEqual(errors.map((e) => e.line), [2, 3]);
});

test('CIDR ranges: IPv4 and IPv6, prefix length in range, strict forms', () => {
  const good = ['10.0.0.0/8', '192.168.0.0/16', '0.0.0.0/0', '1.2.3.4/32', '::/0', '::1/128', '2001:db8::/32', 'fe80::1:2/64',
    '::ffff:10.0.0.0/104', '1:2:3:4:5:6:7:8/128', '1:2:3:4:5:6:1.2.3.4/128', 'a::b:1.2.3.4/96', 'ABCD:ef01::/16'];
  for (const c of good) assert.ok(parseCidr(c), c);
  const bad = ['10.0.0.0', '10.0.0.0/33', '10.0.0.0/-1', '10.0.0.0/08', '10.0.0/8', '10.0.0.256/8', '010.0.0.0/8', '1.2.3.4/ 8',
    '::/129', '1::2::3/64', '1:2:3:4:5:6:7:8:9/64', '1:2:3:4:5:6:7::8/64x', 'fe80::1%eth0/64', 'g::/8', '12345::/8', '/8', '10.0.0.0/8/8',
    ':1:2:3:4:5:6:7/64', 'localhost/8', ''];
  for (const c of bad) assert.equal(parseCidr(c), null, c);
  assert.deepEqual([...parseIPv6('::ffff:1.2.3.4')!], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 1, 2, 3, 4]);
  assert.deepEqual([...parseIPv6('2001:db8::1')!.slice(0, 4)], [0x20, 0x01, 0x0d, 0xb8]);
  assert.equal(parseIPv6('1:2:3:4:5:6:7::8'), null, ':: must stand for at least one group');
});

test('cidrContains masks to the prefix and keeps families apart', () => {
  const r = parseCidr('10.0.0.0/8')!;
  assert.equal(cidrContains(r, parseIPv4('10.200.3.4')!), true);
  assert.equal(cidrContains(r, parseIPv4('11.0.0.1')!), false);
  const odd = parseCidr('192.168.4.0/22')!;
  assert.equal(cidrContains(odd, parseIPv4('192.168.7.255')!), true);
  assert.equal(cidrContains(odd, parseIPv4('192.168.8.0')!), false);
  assert.equal(cidrContains(parseCidr('2001:db8::/32')!, parseIPv6('2001:db8:ffff::1')!), true);
  assert.equal(cidrContains(parseCidr('2001:db8::/32')!, parseIPv6('2001:db9::1')!), false);
  assert.equal(cidrContains(parseCidr('0.0.0.0/0')!, parseIPv6('::1')!), false);
  assert.equal(cidrContains(parseCidr('::/0')!, parseIPv4('1.1.1.1')!), false);
});
