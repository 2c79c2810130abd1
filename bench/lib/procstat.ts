/**
 * What the kernel says about a process and the machine, from /proc: CPU time (utime +
 * stime, which includes threads that have exited), per-thread scheduler statistics (time
 * on a CPU and time runnable but waiting for one: the run delay), and the machine's busy
 * time. Every reader returns null where /proc is missing or the process is gone, so a
 * benchmark on another system prints "n/a" instead of failing.
 */
import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';

export const CLK_TCK = Number(spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).stdout?.trim()) || 100;

/** The pid and every descendant's (a cluster primary's workers). */
export function processTree(pid: number): number[] {
  const out = [pid];
  try {
    for (const tid of readdirSync(`/proc/${pid}/task`)) {
      const kids = readFileSync(`/proc/${pid}/task/${tid}/children`, 'utf8').trim();
      for (const k of kids ? kids.split(' ') : []) out.push(...processTree(Number(k)));
    }
  } catch {
    // gone, or no /proc: what was found so far
  }
  return out;
}

/** The fields of /proc/<pid>/stat after the command name (which may contain spaces): field N is at N - 3. */
export function statFields(text: string): string[] {
  return text.slice(text.lastIndexOf(')') + 2).trim().split(' ');
}

/** CPU seconds (user + system) one process has used so far. */
export function ownCpuSeconds(pid: number): number | null {
  try {
    const fields = statFields(readFileSync(`/proc/${pid}/stat`, 'utf8'));
    return (Number(fields[11]) + Number(fields[12])) / CLK_TCK;
  } catch {
    return null;
  }
}

/** CPU seconds of a process and its descendants. */
export function cpuSeconds(pid: number | undefined | null): number | null {
  if (pid === undefined || pid === null) return null;
  const each = processTree(pid).map(ownCpuSeconds);
  return each[0] === null ? null : each.reduce<number>((a, c) => a + (c ?? 0), 0);
}

export interface Sched {
  /** ns on a CPU */
  runNs: number;
  /** ns runnable but waiting for a CPU (the run delay) */
  waitNs: number;
}

/** /proc/<pid>/task/<tid>/schedstat of every live thread of the process and its descendants, by "pid/tid". */
export function threadStats(pid: number | undefined | null): Map<string, Sched> {
  const out = new Map<string, Sched>();
  if (pid === undefined || pid === null) return out;
  for (const p of processTree(pid)) {
    let tids: string[];
    try {
      tids = readdirSync(`/proc/${p}/task`);
    } catch {
      continue;
    }
    for (const tid of tids) {
      try {
        const [run, wait] = readFileSync(`/proc/${p}/task/${tid}/schedstat`, 'utf8').trim().split(' ').map(Number);
        out.set(`${p}/${tid}`, { runNs: run ?? 0, waitNs: wait ?? 0 });
      } catch {
        // the thread exited between the listing and the read
      }
    }
  }
  return out;
}

export interface MachineCpu {
  /** seconds of CPU time every core spent busy (not idle, not iowait), summed over cores */
  busy: number;
  /** the same, all states */
  total: number;
}

/** The first line of /proc/stat: the whole machine, every process, ours and others'. */
export function machineCpu(): MachineCpu | null {
  try {
    const line = readFileSync('/proc/stat', 'utf8').split('\n')[0]!;
    const v = line.trim().split(/\s+/).slice(1).map(Number);
    const total = v.slice(0, 8).reduce((a, x) => a + x, 0);
    const idle = (v[3] ?? 0) + (v[4] ?? 0);
    return { busy: (total - idle) / CLK_TCK, total: total / CLK_TCK };
  } catch {
    return null;
  }
}
