/**
 * The config a `serve --workers N` primary hands its workers (DESIGN section 12). The
 * primary alone reads and validates the file; a worker asks for the config when it starts
 * (so a replacement forked after a reload runs the config in force, not whatever the file
 * says now) and is sent each new one. A reload counts as done once every live worker has
 * confirmed it, so `keyward_config_reloads_total{result="ok"}` means in force everywhere.
 */
import type { Worker } from 'node:cluster';
import type { Config } from '../config/schema.js';
import type { LogSink } from '../log.js';
import { sendTo } from './worker-messages.js';

export class WorkerConfigs {
  /** counts the configs put in force; the first is 1 */
  private generation = 1;
  /** the generation each worker last confirmed, by worker id */
  private readonly confirmedBy = new Map<number, number>();
  /** re-checked whenever a worker confirms or goes */
  private readonly waiting = new Set<() => void>();

  constructor(
    private config: Config,
    private readonly o: { workers: () => Iterable<Worker>; log: LogSink },
  ) {}

  /** the config in force */
  get current(): Config {
    return this.config;
  }

  /** A worker listens for messages now: it gets the config in force. */
  hello(w: Worker): void {
    sendTo(w, { type: 'keyward:config', generation: this.generation, config: this.config });
  }

  confirmed(w: Worker, generation: number, error?: string): void {
    if (error !== undefined) this.o.log.error({ worker_id: w.id, generation, err: error }, 'a worker could not apply the config whole');
    this.confirmedBy.set(w.id, Math.max(generation, this.confirmedBy.get(w.id) ?? 0));
    for (const check of this.waiting) check();
  }

  gone(w: Worker): void {
    this.confirmedBy.delete(w.id);
    for (const check of this.waiting) check();
  }

  /**
   * Sends `next` to every worker; resolves once each live worker has confirmed it, or after
   * `timeoutMs` with the ids of those that had not.
   */
  distribute(next: Config, timeoutMs: number): Promise<number[]> {
    const generation = ++this.generation;
    this.config = next;
    for (const w of this.o.workers()) sendTo(w, { type: 'keyward:config', generation, config: next });
    const behind = () => [...this.o.workers()].filter((w) => (this.confirmedBy.get(w.id) ?? 0) < generation).map((w) => w.id);
    return new Promise((resolve) => {
      const done = (ids: number[]) => {
        clearTimeout(timer);
        this.waiting.delete(check);
        resolve(ids);
      };
      const check = () => {
        if (behind().length === 0) done([]);
      };
      const timer = setTimeout(() => done(behind()), timeoutMs);
      this.waiting.add(check);
      check();
    });
  }
}
