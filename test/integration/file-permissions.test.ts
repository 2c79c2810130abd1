/**
 * The replica and the console store hold key hashes and balances: they and their -wal
 * and -shm files are created 0600 whatever the umask, and an earlier run's wider files
 * are narrowed on open.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { chmodSync, existsSync, mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ReplicaStore } from '../../src/replica/store.js';
import { openConsoleDb } from '../../src/console/db.js';

const mode = (p: string) => statSync(p).mode & 0o777;

function withUmask<T>(mask: number, fn: () => T): T {
  const old = process.umask(mask);
  try {
    return fn();
  } finally {
    process.umask(old);
  }
}

test('the replica, its -wal and -shm are 0600', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'kw-perm-'));
  try {
    const path = join(dir, 'sub', 'replica.sqlite');
    const store = withUmask(0o022, () => new ReplicaStore({ path }));
    store.applySnapshot({ version: 1, records: [{ line: 2, record: { type: 'wallet', user: 'u_1', balance: 1 } }], source: 'test' });
    for (const p of [path, `${path}-wal`, `${path}-shm`]) {
      assert.ok(existsSync(p), p);
      assert.equal(mode(p).toString(8), '600', p);
    }
    assert.equal(mode(join(dir, 'sub')).toString(8), '700');
    await store.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a replica left world-readable by an earlier run is narrowed', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'kw-perm-'));
  try {
    const path = join(dir, 'replica.sqlite');
    const first = new ReplicaStore({ path });
    await first.close();
    chmodSync(path, 0o644);
    writeFileSync(`${path}-shm`, '');
    chmodSync(`${path}-shm`, 0o666);
    const store = new ReplicaStore({ path });
    assert.equal(mode(path).toString(8), '600');
    assert.equal(mode(`${path}-shm`).toString(8), '600');
    await store.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('the console store, its -wal and -shm are 0600', () => {
  const dir = mkdtempSync(join(tmpdir(), 'kw-perm-'));
  try {
    const path = join(dir, 'console.sqlite');
    const db = withUmask(0o000, () => openConsoleDb(path));
    db.exec("CREATE TABLE IF NOT EXISTS t (x); INSERT INTO t VALUES (1)");
    for (const p of [path, `${path}-wal`, `${path}-shm`]) assert.equal(mode(p).toString(8), '600', p);
    db.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
