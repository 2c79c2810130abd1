/**
 * How the admin CLI shows things to people: aligned tables and short summaries.
 * Scripts use `--json` instead, which prints the API's answer as is.
 */
import type { KeyView, ProjectView, WalletView } from './db.js';

/** Control characters shown as `\xNN`: a terminal would act on them (clear a line, set a title). */
const CONTROL = /[\x00-\x1f\x7f-\x9f]/g; // eslint-disable-line no-control-regex
const printable = (c: string | number | null): string =>
  c === null ? '-' : String(c).replace(CONTROL, (ch) => `\\x${ch.charCodeAt(0).toString(16).padStart(2, '0')}`);

export function table(headers: string[], rows: (string | number | null)[][]): string {
  const cells = rows.map((r) => r.map(printable));
  const widths = headers.map((h, i) => Math.max(h.length, ...cells.map((r) => r[i]!.length)));
  const line = (r: string[]) => r.map((c, i) => (i === r.length - 1 ? c : c.padEnd(widths[i]!))).join('  ');
  return [line(headers), ...cells.map(line)].join('\n') + '\n';
}

const amount = (n: number | null) => (n === null ? null : String(Math.round(n * 1e6) / 1e6));
const when = (iso: string | null) => (iso === null ? 'never' : iso.replace('T', ' ').replace(/\.\d+Z$/, 'Z'));
const owner = (k: KeyView) => (k.kind === 'personal' ? `user:${k.user}` : `project:${k.project}`);

const limitText = (l: { models: string; rpm: number | null; tpm: number | null }) =>
  `${l.models}:${[l.rpm !== null ? `rpm=${l.rpm}` : '', l.tpm !== null ? `tpm=${l.tpm}` : ''].filter(Boolean).join(',') || 'none'}`;
const ipsText = (k: KeyView) => (k.ips === null ? 'any' : k.ips.join(','));
const shadowText = (k: KeyView) => (k.shadow.length === 0 ? 'none' : k.shadow.join(','));
const periodText = (p: { period: string | null; resetsAt: string | null }) => (p.period === null ? 'none' : `${p.period} (restarts ${when(p.resetsAt)})`);

export function keysTable(keys: KeyView[]): string {
  if (keys.length === 0) return 'no keys\n';
  return table(
    ['ID', 'KIND', 'OWNER', 'STATUS', 'MODELS', 'ROUTING', 'RPM', 'TPM', 'CONC', 'BUDGET', 'PERIOD', 'SPENT', 'IPS', 'BROWSER', 'MODEL LIMITS', 'SHADOW', 'LAST USED', 'NAME'],
    keys.map((k) => [
      k.id, k.kind, owner(k), k.status, k.models === null ? 'all' : k.models.join(','), k.routing, k.rpm, k.tpm, k.concurrency,
      amount(k.budget), k.period, amount(k.spent), ipsText(k), k.allowBrowser ? 'yes' : 'no',
      k.modelLimits === null ? null : k.modelLimits.map(limitText).join(' '), k.shadow.length === 0 ? null : k.shadow.join(','), when(k.lastUsedAt), k.name,
    ]),
  );
}

export function keyDetails(k: KeyView): string {
  const rows: [string, string | number | null][] = [
    ['id', k.id], ['name', k.name], ['kind', k.kind], ['owner', owner(k)], ['status', k.status],
    ['models', k.models === null ? 'all' : k.models.join(', ')], ['routing', k.routing],
    ['rpm', k.rpm], ['tpm', k.tpm], ['concurrency', k.concurrency],
    ['budget', k.kind === 'personal' ? 'wallet' : (amount(k.budget) ?? 'none')], ['budget period', periodText(k)], ['spent', amount(k.spent)],
    ['ips', ipsText(k)], ['allow browser', k.allowBrowser ? 'yes' : 'no'],
    ['model limits', k.modelLimits === null ? 'none' : k.modelLimits.map(limitText).join(' ')], ['shadow', shadowText(k)], ['epoch', k.epoch],
    ['created', when(k.createdAt)], ['last used', when(k.lastUsedAt)],
  ];
  if (k.deletedAt) rows.push(['deleted', when(k.deletedAt)]);
  const w = Math.max(...rows.map((r) => r[0].length));
  return rows.map(([n, v]) => `${n.padEnd(w)}  ${printable(v)}`).join('\n') + '\n';
}

export function projectsTable(projects: ProjectView[]): string {
  if (projects.length === 0) return 'no projects\n';
  return table(
    ['ID', 'STATUS', 'BUDGET', 'PERIOD', 'SPENT', 'EPOCH', 'MEMBERS'],
    projects.map((p) => [p.id, p.status, amount(p.budget) ?? 'none', periodText(p), amount(p.spent), p.epoch, p.members.join(',') || '-']),
  );
}

export function walletsTable(wallets: WalletView[]): string {
  if (wallets.length === 0) return 'no wallets\n';
  return table(['USER', 'BALANCE', 'EPOCH', 'UPDATED'], wallets.map((w) => [w.user, amount(w.balance), w.epoch, when(w.updatedAt)]));
}

export function lastUsed(k: KeyView): string {
  return when(k.lastUsedAt);
}
