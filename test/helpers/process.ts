/** Runs `keyward serve` as a real child process and reads back where it listens. */
import { spawn, type ChildProcess } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';

/**
 * Node arguments that run the CLI from source through tsx. Tests never go through
 * bin/keyward.mjs, which runs dist/: a stale build must not answer for the code under test
 * (test/integration/build.test.ts covers the compiled entry).
 */
export const KEYWARD_ARGS = ['--import', 'tsx', join(import.meta.dirname, '../../src/cli.ts')];

export interface SidecarProcess {
  child: ChildProcess;
  url: string;
  adminPort: number;
  /** every stdout line so far */
  lines: string[];
  /**
   * Resolves with the exit code once the process has exited and its stdout has been read
   * to the end: 'exit' can come before the last lines are read, so assertions on `lines`
   * after an exit wait for this.
   */
  closed: Promise<number | null>;
  /** signals the process and waits for `closed` */
  stop(signal?: NodeJS.Signals): Promise<number | null>;
}

export async function spawnSidecar(opts: {
  dir: string;
  name: string;
  /** written to `<dir>/<name>.yaml`, which is served (unless `file` names another) */
  yaml?: string;
  /** an existing config file to serve instead, e.g. one in a ConfigMap-style volume */
  file?: string;
  /** after `serve --config FILE` */
  args?: string[];
  /** added to this process's environment */
  env?: Record<string, string>;
}): Promise<SidecarProcess> {
  const cfg = opts.file ?? join(opts.dir, `${opts.name}.yaml`);
  if (opts.file === undefined) writeFileSync(cfg, opts.yaml ?? '');
  const child = spawn(process.execPath, [...KEYWARD_ARGS, 'serve', '--config', cfg, ...(opts.args ?? [])], { stdio: ['ignore', 'pipe', 'inherit'], ...(opts.env ? { env: { ...process.env, ...opts.env } } : {}) });
  const lines: string[] = [];
  const closed = new Promise<number | null>((resolve) => child.once('close', (code) => resolve(code)));
  const rl = createInterface({ input: child.stdout! });
  const listening = new Promise<{ url: string; adminPort: number }>((resolve, reject) => {
    rl.on('line', (line) => {
      lines.push(line);
      const l = JSON.parse(line) as { msg?: string; listen?: string; admin_port?: number };
      if (l.msg === 'keyward listening') resolve({ url: l.listen!, adminPort: l.admin_port! });
    });
    child.once('exit', (code) => reject(new Error(`sidecar ${opts.name} exited with ${code} before listening`)));
  });
  const { url, adminPort } = await listening;
  return {
    child,
    url,
    adminPort,
    lines,
    closed,
    async stop(signal = 'SIGTERM') {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
      return closed;
    },
  };
}
