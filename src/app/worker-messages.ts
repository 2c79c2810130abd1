/**
 * The messages a `serve --workers N` primary and its workers exchange over the cluster's
 * IPC channel. Every type carries the `keyward:` prefix so they never collide with
 * messages of node's cluster module or prom-client.
 */
import type { Worker } from 'node:cluster';
import type { MetricObjectWithValues, MetricValue } from 'prom-client';
import type { Config } from '../config/schema.js';
import type { DecisionCounts } from '../obs/decision-histogram.js';
import type { UsageEvent } from '../protocol/usage.js';
import type { FileIdentity } from '../replica/replica-file.js';

/** primary -> worker */
export type ToWorker =
  | { type: 'keyward:metrics'; id: number }
  /**
   * The config to run with: the answer to a worker's hello, and every reload after it. The
   * primary alone reads the file; `generation` counts the configs it has put in force.
   */
  | { type: 'keyward:config'; generation: number; config: Config }
  /** stop accepting, let in-flight requests finish within graceMs, send what is left, exit 0 */
  | { type: 'keyward:drain'; graceMs: number }
  /** the primary wrote the replica file (sync): look now rather than at the next data_version poll */
  | { type: 'keyward:replica-changed' };

/** worker -> primary */
export type ToPrimary =
  /** the worker listens for messages now: it waits for its config */
  | { type: 'keyward:hello' }
  /** config `generation` is in force in the worker (error: it could not be applied whole) */
  | { type: 'keyward:configured'; generation: number; error?: string }
  /** a scrape's answer: the registry's metrics, and the decision histogram's counts kept beside it */
  | { type: 'keyward:metrics'; id: number; metrics: MetricObjectWithValues<MetricValue<string>>[]; decisions: DecisionCounts }
  /** usage events for the console, in the order the worker produced them */
  | { type: 'keyward:usage'; events: UsageEvent[] }
  /** the worker's view of the replica, at start and after every change: /readyz waits for every worker */
  | { type: 'keyward:replica'; ready: boolean; version: number | null }
  /** a lookup met damage in the replica file (its device and inode): the primary, which owns it, moves it aside */
  | { type: 'keyward:replica-damaged'; file: FileIdentity }
  /**
   * sent last: every earlier message of this worker has been delivered (IPC keeps order);
   * with what it counted at the end, which the primary keeps in its totals
   */
  | { type: 'keyward:drained'; final?: { metrics: MetricObjectWithValues<MetricValue<string>>[]; decisions: DecisionCounts } };

export function isMessage<T extends { type: string }>(msg: unknown): msg is T {
  return typeof msg === 'object' && msg !== null && typeof (msg as { type?: unknown }).type === 'string' && (msg as { type: string }).type.startsWith('keyward:');
}

/**
 * Sends to a worker; `onFailed` runs when the message cannot reach it. A worker can die
 * between the isConnected() check and the write, before the primary has read the end of
 * its channel: that write fails with EPIPE, and without a callback it becomes an 'error'
 * event on the Worker that nobody handles, which would end the primary and every
 * connection of the other workers with it. The exit handler deals with the dead worker.
 */
export function sendTo(w: Worker, msg: ToWorker, onFailed: () => void = () => {}): void {
  if (!w.isConnected()) return onFailed();
  w.send(msg, (err) => {
    if (err) onFailed();
  });
}
