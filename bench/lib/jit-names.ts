/**
 * callgrind names machine code that V8 generated at run time by its address alone
 * (`???:0x…`). A node process started with `--perf-basic-prof` writes the address range and
 * name of every piece of code it generates to /tmp/perf-<pid>.map (V8's documented perf
 * integration); this module puts those names on callgrind's per-function figures, so the
 * JavaScript functions themselves can be ranked by instructions or cache misses per request.
 */
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';

interface CodeRange {
  start: number;
  end: number;
  name: string;
}

/** The perf map's ranges, sorted by start (a later line for the same start wins). */
function codeRanges(pid: number): CodeRange[] {
  const ranges: CodeRange[] = [];
  for (const line of readFileSync(`/tmp/perf-${pid}.map`, 'utf8').split('\n')) {
    const [start, size, ...name] = line.split(' ');
    if (!start || !size || name.length === 0) continue;
    const s = parseInt(start, 16);
    ranges.push({ start: s, end: s + parseInt(size, 16), name: name.join(' ') });
  }
  return ranges.sort((a, b) => a.start - b.start);
}

function nameAt(ranges: CodeRange[], addr: number): string | null {
  let lo = 0;
  let hi = ranges.length - 1;
  let found: CodeRange | null = null;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (ranges[mid]!.start <= addr) {
      found = ranges[mid]!;
      lo = mid + 1;
    } else hi = mid - 1;
  }
  return found && addr < found.end ? found.name : null;
}

export interface JsFunctionCounts {
  name: string;
  /** per request, in the order of callgrind's `events:` line */
  perRequest: Record<string, number>;
}

/**
 * Generated code's figures per request, by function name: callgrind_annotate's self
 * figures for each `???:0x…` entry of `outFile`, named from the perf map of `pid` (code the
 * map does not cover keeps its address), summed per name.
 */
export function jsFunctions(outFile: string, pid: number, requests: number): JsFunctionCounts[] {
  const r = spawnSync('callgrind_annotate', ['--inclusive=no', '--threshold=100', outFile], { encoding: 'utf8', maxBuffer: 256 << 20 });
  if (r.status !== 0) throw new Error(`callgrind_annotate: ${r.stderr}`);
  const events = /^Events shown:\s+(.+)$/m.exec(r.stdout)?.[1]?.trim().split(/\s+/) ?? [];
  const ranges = codeRanges(pid);
  const sums = new Map<string, number[]>();
  for (const line of r.stdout.split('\n')) {
    const m = /^(.*?)\?\?\?:0x([0-9a-f]+) /.exec(line);
    if (!m) continue;
    const figures = [...m[1]!.matchAll(/([\d,]+|\.)(?: \(\s*[\d.]+%\))?/g)].map((x) => (x[1] === '.' ? 0 : Number(x[1]!.replace(/,/g, ''))));
    if (figures.length < events.length) continue;
    const addr = parseInt(m[2]!, 16);
    const name = nameAt(ranges, addr) ?? `0x${m[2]}`;
    const sum = sums.get(name) ?? new Array<number>(events.length).fill(0);
    events.forEach((_, i) => (sum[i]! += figures[i]!));
    sums.set(name, sum);
  }
  return [...sums].map(([name, sum]) => ({ name, perRequest: Object.fromEntries(events.map((e, i) => [e, sum[i]! / requests])) }));
}
