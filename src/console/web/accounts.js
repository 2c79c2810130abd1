// The Projects and Wallets tabs. Users see their own projects and wallet; admins see all,
// and may create projects, enable or disable them, set budgets and top up wallets.
import { api, ApiError, seg } from './api.js';
import { busy, field, fill, h, money, spentMeter, toast, when } from './dom.js';

export async function renderProjects(panel, ctx) {
  const { projects } = await api('GET', '/admin/v1/projects');
  const admin = ctx.who.role === 'admin';
  const redraw = () => renderProjects(panel, ctx).catch(ctx.fail);
  const rows = projects.map((p) => {
    const budgetInput = h('input.inline', { type: 'number', min: 0, step: 'any', value: p.budget ?? '', 'aria-label': `Budget of ${p.id}`, placeholder: 'none' });
    return h('tr', { 'data-project-id': p.id },
      h('td.strong', {}, p.id),
      h('td', {}, h(`span.status.${p.status}`, {}, p.status)),
      h('td', {}, p.budget === null ? [`${money(p.spent)} spent`, h('div.small.muted', {}, 'no budget')] : [`${money(p.spent)} of ${money(p.budget)}${p.period ? ` per ${p.period}` : ''}`, spentMeter(p.spent, p.budget)]),
      h('td', {}, p.members.length ? p.members.join(', ') : h('span.muted', {}, 'none')),
      h('td', {}, admin ? h('div.row-actions', {},
        h('button', { type: 'button', onclick: (e) => busy(e.currentTarget, async () => {
          await api('PATCH', `/admin/v1/projects/${seg(p.id)}`, { status: p.status === 'enabled' ? 'disabled' : 'enabled' });
          toast(`${p.id} ${p.status === 'enabled' ? 'disabled' : 'enabled'}`);
          await redraw();
        }) }, p.status === 'enabled' ? 'Disable' : 'Enable'),
        budgetInput,
        h('button', { type: 'button', onclick: (e) => busy(e.currentTarget, async () => {
          const v = budgetInput.value.trim();
          await api('PATCH', `/admin/v1/projects/${seg(p.id)}`, { budget: v === '' ? null : Number(v) });
          toast(`Budget of ${p.id} saved`);
          await redraw();
        }) }, 'Set budget')) : null));
  });
  fill(panel,
    h('div.toolbar', {}, h('h2', {}, 'Projects'), h('span.muted', {}, `${projects.length} shown`), h('span.spacer'),
      h('button.ghost', { type: 'button', onclick: redraw }, 'Refresh')),
    admin ? projectForm(redraw) : null,
    projects.length === 0
      ? h('p.empty', {}, admin ? 'No projects yet.' : 'This token belongs to no project.')
      : h('div.table-wrap', {}, h('table', {},
        h('thead', {}, h('tr', {}, ['Project', 'Status', 'Budget', 'Members', ''].map((t) => h('th', { scope: 'col' }, t)))),
        h('tbody', {}, rows))));
}

function projectForm(redraw) {
  const id = h('input', { required: true, placeholder: 'research', spellcheck: 'false' });
  const budget = h('input', { type: 'number', min: 0, step: 'any', placeholder: 'none' });
  const members = h('input', { placeholder: 'alice, bob', spellcheck: 'false' });
  const form = h('form.card.inline-form', { method: 'post' },
    field('New project', id), field('Budget', budget), field('Members', members),
    h('button.primary', { type: 'submit' }, 'Create project'));
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    busy(form.querySelector('button'), async () => {
      const list = members.value.split(',').map((m) => m.trim()).filter(Boolean);
      await api('POST', '/admin/v1/projects', { id: id.value.trim(), budget: budget.value.trim() === '' ? null : Number(budget.value), members: list });
      toast(`Project ${id.value.trim()} created`);
      await redraw();
    });
  });
  return form;
}

export async function renderWallets(panel, ctx) {
  const admin = ctx.who.role === 'admin';
  const redraw = () => renderWallets(panel, ctx).catch(ctx.fail);
  let wallets;
  if (admin) {
    wallets = (await api('GET', '/admin/v1/wallets')).wallets;
  } else {
    try {
      wallets = [(await api('GET', `/admin/v1/wallets/${seg(ctx.who.user)}`)).wallet];
    } catch (err) {
      if (!(err instanceof ApiError && err.status === 404)) throw err;
      wallets = [];
    }
  }
  const topUp = (user, amountInput, button) => busy(button, async () => {
    const amount = Number(amountInput.value);
    if (!(amount > 0)) throw new Error('Enter a positive amount');
    await api('POST', `/admin/v1/wallets/${seg(user)}/credit`, { amount });
    toast(`Added ${money(amount)} to ${user}`);
    await redraw();
  });
  const rows = wallets.map((w) => {
    const amount = h('input.inline', { type: 'number', min: 0, step: 'any', placeholder: 'amount', 'aria-label': `Top-up amount for ${w.user}` });
    return h('tr', { 'data-wallet-user': w.user },
      h('td.strong', {}, w.user),
      h('td.num', {}, h(w.balance <= 0 ? 'span.status.deleted' : 'span', {}, money(w.balance))),
      h('td', {}, when(w.updatedAt)),
      h('td', {}, admin ? h('div.row-actions', {}, amount, h('button', { type: 'button', onclick: (e) => topUp(w.user, amount, e.currentTarget) }, 'Top up')) : null));
  });
  let form = null;
  if (admin) {
    const user = h('input', { required: true, placeholder: 'alice', spellcheck: 'false' });
    const amount = h('input', { type: 'number', min: 0, step: 'any', required: true });
    form = h('form.card.inline-form', { method: 'post' }, field('User', user), field('Amount', amount), h('button.primary', { type: 'submit' }, 'Top up wallet'));
    form.addEventListener('submit', (event) => {
      event.preventDefault();
      topUp(user.value.trim(), amount, form.querySelector('button'));
    });
  }
  fill(panel,
    h('div.toolbar', {}, h('h2', {}, 'Wallets'), h('span.muted', {}, 'personal keys spend from their user\'s wallet'), h('span.spacer'),
      h('button.ghost', { type: 'button', onclick: redraw }, 'Refresh')),
    form,
    wallets.length === 0
      ? h('p.empty', {}, 'No wallets yet.')
      : h('div.table-wrap', {}, h('table', {},
        h('thead', {}, h('tr', {}, ['User', 'Balance', 'Updated', ''].map((t) => h('th', { scope: 'col' }, t)))),
        h('tbody', {}, rows))));
}
