/**
 * For tests that stop a console, put its store back from a backup and start it again:
 * copying the store's files, calls that survive the restart, and a sidecar fetch that can
 * be held while the console is away.
 */
import { copyFileSync, existsSync, rmSync } from 'node:fs';
import type { ConsoleFixture } from './console-fixture.js';
import { bearer, jsonBody, send } from './http.js';

const STORE_FILES = ['', '-wal', '-shm'];

/** Copies a stopped store's files (those there are) over `to`'s, as a backup is taken or put back. */
export function copyStore(from: string, to: string): void {
  for (const suffix of STORE_FILES) {
    rmSync(`${to}${suffix}`, { force: true });
    if (existsSync(`${from}${suffix}`)) copyFileSync(`${from}${suffix}`, `${to}${suffix}`);
  }
}

/**
 * An admin API call on a connection of its own. fetch's pool may hand a request a
 * keep-alive connection the stopped console closed and this process has not yet seen
 * closed; a POST sent on it fails rather than being retried.
 */
export async function adminCall(fx: ConsoleFixture, method: string, path: string, body?: unknown): Promise<{ status: number; body: any }> {
  const res = await send(fx.url, { method, path, ...(body === undefined ? { headers: bearer(fx.tokens.admin) } : jsonBody(body, bearer(fx.tokens.admin))) });
  return { status: res.status, body: res.body.length > 0 ? res.json() : null };
}

/** A sync GET on a connection of its own (see adminCall); returns status and raw text. */
export async function syncCall(fx: ConsoleFixture, path: string): Promise<{ status: number; text: string }> {
  const res = await send(fx.url, { path, headers: bearer(fx.tokens.sync) });
  return { status: res.status, text: res.body.toString('utf8') };
}

/**
 * A fetch that waits while its gate is shut: a sidecar between two attempts (busy, or
 * backing off) while its console is stopped, restored and written to.
 */
export function gatedFetch(): { through: typeof fetch; shut(): void; open(): void } {
  let gate: Promise<void> = Promise.resolve();
  let release = () => {};
  return {
    through: async (input, init) => {
      await gate;
      return fetch(input, init);
    },
    shut: () => {
      gate = new Promise<void>((r) => (release = r));
    },
    open: () => release(),
  };
}
