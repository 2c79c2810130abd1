// The Keys tab: every key the token may see, with its owner, scope, limits, budget and
// last use; Reveal (hidden again on request), recent usage, and for admins create, rotate
// and delete (with a confirmation).
import { api, seg } from './api.js';
import { busy, confirmDialog, count, field, fill, h, money, numberOrNull, secretBox, spentMeter, toast, when } from './dom.js';

// Revealed secrets, by key id. Page memory only: a reload or Hide forgets them.
const revealed = new Map();
const usageOpen = new Set();
let showDeleted = false;

const owner = (k) => (k.kind === 'personal'
  ? [h('span.tag', {}, 'personal'), ' ', k.user]
  : [h('span.tag.team', {}, 'team'), ' ', k.project]);

const scope = (k) => (k.models && k.models.length ? k.models.map((m) => h('code.glob', {}, m)) : h('span.muted', {}, 'all models'));

function limits(k) {
  const parts = [];
  if (k.rpm) parts.push(`${count(k.rpm)} rpm`);
  if (k.tpm) parts.push(`${count(k.tpm)} tpm`);
  if (k.concurrency) parts.push(`${count(k.concurrency)} at once`);
  return parts.length ? parts.join(' · ') : h('span.muted', {}, 'none');
}

/** Checks the key evaluates without enforcing (sidecars add the config's `limits.shadow`). */
const shadowNote = (k) => (k.shadow && k.shadow.length
  ? h('div.small.shadow', { title: 'evaluated but not enforced' }, `shadow: ${k.shadow.join(', ')}`)
  : null);

/** Team keys: spent of budget (per period when the console sends one); personal keys draw on the wallet. */
function budget(k) {
  const period = k.period ? ` per ${k.period}` : '';
  if (k.kind === 'personal' && k.budget === null) return [h('span.muted', {}, 'wallet'), h('div.small.muted', {}, `spent ${money(k.spent)}`)];
  if (k.budget === null) return [`${money(k.spent)} spent`, h('div.small.muted', {}, 'no budget')];
  return [`${money(k.spent)} of ${money(k.budget)}${period}`, spentMeter(k.spent, k.budget)];
}

/** Signing out forgets every revealed secret. */
export function forgetKeys() {
  revealed.clear();
  usageOpen.clear();
}

// Every page of the listing (the console answers at most 1,000 keys a call).
async function load() {
  const keys = [];
  const query = (after) => [showDeleted ? 'all=1' : '', after ? `after=${encodeURIComponent(after)}` : ''].filter(Boolean).join('&');
  for (let after = null; ;) {
    const q = query(after);
    const page = await api('GET', `/admin/v1/keys${q ? `?${q}` : ''}`);
    keys.push(...page.keys);
    if (typeof page.next !== 'string') return keys;
    after = page.next;
  }
}

export async function renderKeys(panel, ctx) {
  const keys = await load();
  const admin = ctx.who.role === 'admin';
  const redraw = () => renderKeys(panel, ctx).catch(ctx.fail);

  const rows = [];
  for (const k of keys) {
    const active = k.status === 'active';
    const actions = h('div.row-actions', {},
      active ? h('button', { type: 'button', onclick: (e) => busy(e.currentTarget, async () => {
        const { secret } = await api('POST', `/admin/v1/keys/${seg(k.id)}/reveal`);
        revealed.set(k.id, secret);
        await redraw();
      }) }, 'Reveal') : null,
      h('button', { type: 'button', 'aria-expanded': String(usageOpen.has(k.id)), onclick: () => {
        if (usageOpen.has(k.id)) usageOpen.delete(k.id);
        else usageOpen.add(k.id);
        redraw();
      } }, 'Usage'),
      admin && active ? h('button', { type: 'button', onclick: (e) => rotate(e.currentTarget, k, ctx, redraw) }, 'Rotate') : null,
      admin && active ? h('button.danger', { type: 'button', onclick: (e) => remove(e.currentTarget, k, redraw) }, 'Delete') : null);
    rows.push(h(`tr${active ? '' : '.deleted'}`, { 'data-key-id': k.id },
      h('td', {}, h('div.strong', {}, k.name ?? h('span.muted', {}, 'unnamed')), h('code.small.muted', {}, k.id)),
      h('td', {}, owner(k)),
      h('td.scope', {}, scope(k)),
      h('td', {}, limits(k), k.routing ? h('div.small.muted', {}, `routing ${k.routing}`) : null, shadowNote(k)),
      h('td', {}, budget(k)),
      h('td', {}, when(k.lastUsedAt)),
      h('td', {}, h(`span.status.${k.status}`, {}, k.status)),
      h('td', {}, actions)));
    if (revealed.has(k.id)) {
      rows.push(h('tr.detail', {}, h('td', { colspan: 8 }, secretBox(`Secret of ${k.name ?? k.id}`, revealed.get(k.id), () => {
        revealed.delete(k.id);
        redraw();
      }))));
    }
    if (usageOpen.has(k.id)) rows.push(h('tr.detail', {}, h('td', { colspan: 8 }, await usageTable(k))));
  }

  const toolbar = h('div.toolbar', {},
    h('h2', {}, 'Keys'),
    h('span.muted', {}, `${keys.length} shown`),
    h('span.spacer'),
    h('label.check', {}, h('input', { type: 'checkbox', checked: showDeleted, onchange: (e) => { showDeleted = e.target.checked; redraw(); } }), ' Show deleted'),
    h('button.ghost', { type: 'button', onclick: redraw }, 'Refresh'),
    admin ? h('button.primary', { type: 'button', onclick: () => panel.querySelector('.create').toggleAttribute('hidden') }, 'New key') : null);

  fill(panel,
    toolbar,
    admin ? createForm(ctx, redraw) : null,
    keys.length === 0
      ? h('p.empty', {}, admin ? 'No keys yet. Create one with New key.' : 'No keys are visible to this token.')
      : h('div.table-wrap', {}, h('table.keys', {},
        h('thead', {}, h('tr', {}, ['Key', 'Owner', 'Scope', 'Limits', 'Budget', 'Last used', 'Status', ''].map((t) => h('th', { scope: 'col' }, t)))),
        h('tbody', {}, rows))),
  );
}

async function usageTable(k) {
  const { usage } = await api('GET', `/admin/v1/keys/${seg(k.id)}/usage?limit=20`);
  if (usage.length === 0) return h('p.muted', {}, 'No usage recorded for this key yet.');
  return h('table.usage', { 'aria-label': `Recent usage of ${k.name ?? k.id}` },
    h('thead', {}, h('tr', {}, ['When', 'Model', 'Input tokens', 'Output tokens', 'Status', 'Cost'].map((t) => h('th', { scope: 'col' }, t)))),
    h('tbody', {}, usage.map((u) => h('tr', {},
      h('td', {}, when(u.at)), h('td', {}, u.model ?? '—'), h('td.num', {}, count(u.inputTokens)), h('td.num', {}, count(u.outputTokens)),
      h('td', {}, String(u.status)), h('td.num', {}, money(u.cost))))));
}

/** Asks first; once confirmed, does `work` with the button shown busy. */
async function confirmThen(button, dialog, work) {
  if (!(await confirmDialog(dialog))) return;
  await busy(button, work);
}

function remove(button, k, redraw) {
  return confirmThen(button, {
    title: `Delete ${k.name ?? k.id}?`,
    message: 'Every synced sidecar refuses this key within a second, and its secret is destroyed. This cannot be undone.',
    confirm: 'Delete key',
  }, async () => {
    await api('DELETE', `/admin/v1/keys/${seg(k.id)}`);
    revealed.delete(k.id);
    toast(`Deleted ${k.name ?? k.id}`);
    await redraw();
  });
}

function rotate(button, k, ctx, redraw) {
  return confirmThen(button, {
    title: `Rotate ${k.name ?? k.id}?`,
    message: 'A new key with the same settings is created. The old key keeps working until you delete it: move traffic, check its last use, then delete it.',
    confirm: 'Create replacement',
  }, async () => {
    const out = await api('POST', `/admin/v1/keys/${seg(k.id)}/rotate`);
    ctx.notice(h('div.notice', {},
      h('p', {}, `Replacement for ${k.name ?? k.id} created as ${out.key.id}. Delete the old key once its last use shows traffic has moved.`),
      secretBox('New secret', out.secret, () => ctx.notice(null))));
    await redraw();
  });
}

function createForm(ctx, redraw) {
  const kind = h('select', {}, h('option', { value: 'personal' }, 'personal (wallet)'), h('option', { value: 'team' }, 'team (project)'));
  const ownerInput = h('input', { required: true, placeholder: 'alice', spellcheck: 'false' });
  const ownerField = field('User', ownerInput);
  const name = h('input', { placeholder: 'laptop, ci bot, …' });
  const models = h('input', { placeholder: 'gpt-4o*, claude-*', spellcheck: 'false' });
  const rpm = h('input', { type: 'number', min: 0, step: 1 });
  const tpm = h('input', { type: 'number', min: 0, step: 1 });
  const conc = h('input', { type: 'number', min: 0, step: 1 });
  const budgetInput = h('input', { type: 'number', min: 0, step: 'any', disabled: true });
  kind.addEventListener('change', () => {
    const team = kind.value === 'team';
    ownerField.querySelector('label').textContent = team ? 'Project' : 'User';
    ownerInput.placeholder = team ? 'demo-team' : 'alice';
    budgetInput.disabled = !team;
  });
  const form = h('form.card.create', { hidden: true, method: 'post' },
    h('h3', {}, 'New key'),
    h('div.grid', {},
      field('Kind', kind), ownerField, field('Name', name),
      field('Models', models, 'comma-separated globs; empty = all models'),
      field('RPM', rpm, 'empty = no limit'), field('TPM', tpm, 'empty = no limit'), field('Concurrency', conc, 'empty = no limit'),
      field('Budget', budgetInput, 'team keys; empty = none')),
    h('div.actions', {}, h('button.primary', { type: 'submit' }, 'Create key')));
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    busy(form.querySelector('button[type=submit]'), async () => {
      const list = models.value.split(',').map((m) => m.trim()).filter(Boolean);
      const body = {
        kind: kind.value, [kind.value === 'team' ? 'project' : 'user']: ownerInput.value.trim(),
        ...(name.value.trim() ? { name: name.value.trim() } : {}),
        ...(list.length ? { models: list } : {}),
        rpm: numberOrNull(rpm), tpm: numberOrNull(tpm), concurrency: numberOrNull(conc),
        ...(kind.value === 'team' ? { budget: numberOrNull(budgetInput) } : {}),
      };
      const out = await api('POST', '/admin/v1/keys', body);
      form.reset();
      ctx.notice(h('div.notice', {},
        h('p', {}, `Key ${out.key.name ?? out.key.id} created. You can reveal it again later from its row.`),
        secretBox('New secret', out.secret, () => ctx.notice(null))));
      await redraw();
    });
  });
  return form;
}
