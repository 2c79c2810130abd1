/**
 * What the SDK end-to-end suites share: a fake upstream answering like the vendor's API with
 * a sidecar in front of it, and the check that a denial surfaces as the SDK's error class
 * without reaching the upstream.
 */
import assert from 'node:assert/strict';
import { startBehindUpstream, type UpstreamHarness } from './sidecar.js';
import type { FakeUpstream, Handler } from './upstream.js';

/**
 * The upstream answering with `handler`, behind a sidecar with four keys: k_ok (any model),
 * k_scoped (only `scopedModels`), k_rpm1 (one request a minute) and k_broke (an empty wallet).
 */
export function startSdkBed(handler: Handler, scopedModels: string[]): Promise<UpstreamHarness> {
  return startBehindUpstream({
    handler,
    keys: {
      k_ok: {},
      k_scoped: { models: scopedModels },
      k_rpm1: { rpm: 1 },
      k_broke: { user: 'u_broke' },
    },
    records: [{ type: 'wallet', user: 'u_broke', balance: 0 }],
  });
}

/** Runs `call`, expects it to throw `cls`, and checks that nothing reached `up`. */
export async function deniedUnforwarded<E extends Error>(
  up: FakeUpstream,
  cls: abstract new (...args: never[]) => E,
  call: () => Promise<unknown>,
): Promise<E> {
  const before = up.received.length;
  const err = await call().then(
    () => assert.fail('expected the request to be denied'),
    (e: unknown) => e,
  );
  assert.ok(err instanceof cls, `expected ${cls.name}, got ${(err as Error)?.constructor?.name}: ${String(err)}`);
  assert.equal(up.received.length, before, 'the upstream never received the denied request');
  return err;
}
