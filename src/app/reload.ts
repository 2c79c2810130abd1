/**
 * Live reload (DESIGN section 12): on SIGHUP, or when the config file's content changes on
 * disk, `serve` reads the file again, validates it exactly as `check-config` does, and puts
 * it in force for every request that arrives after. An invalid file changes nothing (one
 * error line names every problem); settings that need new listeners or stores keep their
 * running values (one warning line names each as "needs a restart"). Reloads run one at a
 * time; triggers that come during one are answered by one more read after it.
 */
import { ConfigError } from '../config/load.js';
import { loadConfig, type LoadedConfig } from '../config/file.js';
import { changedSettings, planReload } from '../config/reload-plan.js';
import type { Config } from '../config/schema.js';
import { ConfigWatch } from '../config/watch.js';
import type { LogSink } from '../log.js';
import type { ConfigStatus, Metrics } from '../obs/metrics.js';

export type ReloadTrigger = 'SIGHUP' | 'file';

/**
 * SIGHUP's default action ends the process. `serve` answers it from its first moment, so a
 * SIGHUP while it starts, or while it drains after SIGTERM, never cuts a stream. One that
 * comes before reloading starts (the file read, the listeners not yet up) is remembered,
 * and answered by a read as soon as reloading starts.
 */
let heldSighup = false;
function noteSighup(): void {
  heldSighup = true;
}
/** What bin/keyward.mjs holds while the modules load: whether a SIGHUP came, and its listener. */
const EARLY = Symbol.for('keyward.earlySighup');
interface EarlySighup {
  held: boolean;
  listener: () => void;
}
export function holdSighup(): void {
  if (!process.listeners('SIGHUP').includes(noteSighup)) process.on('SIGHUP', noteSighup);
  const scope = globalThis as Record<symbol, EarlySighup | undefined>;
  const early = scope[EARLY];
  if (!early) return;
  process.off('SIGHUP', early.listener);
  if (early.held) heldSighup = true;
  delete scope[EARLY];
}

export interface ReloaderOptions {
  file: string;
  /** what the process started with */
  loaded: LoadedConfig;
  log: LogSink;
  /** puts a config in force: this process's sidecar, or every worker */
  apply: (config: Config) => Promise<void>;
  now?: () => number;
}

export class ConfigReloader {
  private running: Config;
  private hash: string;
  private readonly reloads = { ok: 0, error: 0 };
  private lastSuccessAt: number;
  /** settings of the file in force that wait for a restart */
  private restartPending = 0;
  /** the reload under way, and the one that will run after it (asked for meanwhile) */
  private busy: Promise<void> | null = null;
  private queued: Promise<void> | null = null;
  private watch: ConfigWatch | null = null;
  private readonly onSighup = () => {
    heldSighup = false;
    void this.reload('SIGHUP');
  };
  private readonly now: () => number;

  constructor(private readonly o: ReloaderOptions) {
    this.running = o.loaded.config;
    this.hash = o.loaded.hash;
    this.now = o.now ?? Date.now;
    this.lastSuccessAt = this.now();
  }

  /** Reloads on SIGHUP and on a change of the file's content. */
  start(): void {
    holdSighup();
    process.on('SIGHUP', this.onSighup);
    this.watch = new ConfigWatch({ file: this.o.file, hash: this.hash, log: this.o.log, onChange: () => void this.reload('file') });
    if (heldSighup) this.onSighup();
  }

  close(): void {
    process.off('SIGHUP', this.onSighup);
    this.watch?.close();
    this.watch = null;
  }

  status(): ConfigStatus {
    return { reloads: { ...this.reloads }, lastSuccessAt: this.lastSuccessAt, hash: this.hash, restartPending: this.restartPending };
  }

  /**
   * Reads the file and puts it in force if it is valid; resolves once that is done (never
   * rejects). Asked while a reload runs, it reads once more after it: triggers that come
   * meanwhile share that read, which sees the file as it is by then.
   */
  reload(trigger: ReloadTrigger): Promise<void> {
    if (this.queued) return this.queued;
    if (!this.busy) return this.run(trigger);
    this.queued = this.busy.then(() => {
      this.queued = null;
      return this.run(trigger);
    });
    return this.queued;
  }

  private run(trigger: ReloadTrigger): Promise<void> {
    this.busy = this.once(trigger)
      .catch((err: Error) => this.failed({ trigger, problems: [err.message] }, 'config reload failed'))
      .finally(() => {
        this.busy = null;
      });
    return this.busy;
  }

  private async once(trigger: ReloadTrigger): Promise<void> {
    let loaded: LoadedConfig;
    try {
      loaded = loadConfig(this.o.file);
    } catch (err) {
      const problems = err instanceof ConfigError ? err.problems : [(err as Error).message];
      return this.failed({ trigger, problems }, `config reload refused, the running config stays in force: ${problems.join('; ')}`);
    }
    const plan = planReload(this.running, loaded.config);
    if (plan.needsRestart.length > 0) {
      this.o.log.warn({ trigger, needs_restart: plan.needsRestart }, `config reload: ${plan.needsRestart.map((k) => `${k} needs a restart`).join(', ')}; the running values stay`);
    }
    try {
      await this.o.apply(plan.config);
    } catch (err) {
      return this.failed({ trigger, problems: [(err as Error).message] }, 'config reload could not be applied');
    }
    const changed = changedSettings(this.running, plan.config);
    this.running = plan.config;
    this.hash = loaded.hash;
    this.restartPending = plan.needsRestart.length;
    this.reloads.ok++;
    this.lastSuccessAt = this.now();
    this.o.log.info({ trigger, hash: loaded.hash, changed }, 'config reloaded');
  }

  private failed(fields: { trigger: ReloadTrigger; problems: string[] }, msg: string): void {
    this.reloads.error++;
    this.o.log.error({ ...fields, file: this.o.file, hash_in_force: this.hash }, msg);
  }
}

/** Reloads `file` into `apply` from now on, with the config metrics on `metrics`. */
export function startReloading(o: ReloaderOptions & { metrics: Metrics }): ConfigReloader {
  const reloader = new ConfigReloader(o);
  o.metrics.trackConfig(() => reloader.status());
  reloader.start();
  return reloader;
}
