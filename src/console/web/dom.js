// DOM helpers. Everything is built with createElement and text nodes, never parsed as HTML,
// so a key name or a model glob can never become markup.

/** h('tag.class', { attr, onclick }, ...children): children are nodes, strings or arrays. */
export function h(spec, attrs = {}, ...children) {
  const [tag, ...classes] = spec.split('.');
  const el = document.createElement(tag || 'div');
  if (classes.length) el.className = classes.join(' ');
  for (const [name, value] of Object.entries(attrs ?? {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith('on')) el.addEventListener(name.slice(2), value);
    else if (name === 'dataset') Object.assign(el.dataset, value);
    else el.setAttribute(name, value === true ? '' : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

export const money = (n) => (n === null || n === undefined ? '—' : Number(n).toLocaleString('en-US', { maximumFractionDigits: 4 }));
export const count = (n) => Number(n).toLocaleString('en-US');

/** "3 min ago" with the exact UTC time as a tooltip; "never" for null. */
export function when(iso) {
  if (!iso) return h('span.muted', {}, 'never');
  const t = Date.parse(iso);
  const s = Math.max(0, Math.round((Date.now() - t) / 1000));
  const text = s < 60 ? `${s}s ago` : s < 3600 ? `${Math.floor(s / 60)} min ago` : s < 86400 ? `${Math.floor(s / 3600)} h ago` : `${Math.floor(s / 86400)} d ago`;
  return h('time', { datetime: iso, title: new Date(t).toISOString().replace('T', ' ').replace(/\.\d+Z$/, ' UTC') }, text);
}

let toastTimer;
/** A short message in the corner; errors stay until the next message. */
export function toast(message, kind = 'ok') {
  const el = document.getElementById('toast');
  el.textContent = message;
  el.className = `show ${kind}`;
  clearTimeout(toastTimer);
  if (kind !== 'error') toastTimer = setTimeout(() => (el.className = ''), 3500);
}

/** Asks in a modal dialog; resolves true only when the confirming button was pressed. */
export function confirmDialog({ title, message, confirm }) {
  const dialog = document.getElementById('confirm');
  document.getElementById('confirm-title').textContent = title;
  document.getElementById('confirm-message').textContent = message;
  document.getElementById('confirm-ok').textContent = confirm;
  dialog.returnValue = '';
  dialog.showModal();
  return new Promise((resolve) => dialog.addEventListener('close', () => resolve(dialog.returnValue === 'ok'), { once: true }));
}

/** A labelled form field. */
export function field(label, input, hint) {
  const id = `f-${Math.random().toString(36).slice(2, 9)}`;
  input.id = id;
  return h('div.field', {}, h('label', { for: id }, label), input, hint ? h('small.muted', {}, hint) : null);
}

/** Number input value: '' is null (no limit), otherwise a number. */
export const numberOrNull = (input) => (input.value.trim() === '' ? null : Number(input.value));

/** Runs an async action with its button disabled; failures become an error toast. */
export async function busy(button, fn) {
  if (button) button.disabled = true;
  try {
    await fn();
  } catch (err) {
    toast(err.message || String(err), 'error');
  } finally {
    if (button) button.disabled = false;
  }
}

/** A secret on screen, with Copy and Hide; `onHide` removes it from the page's state. */
export function secretBox(label, secret, onHide) {
  const box = h('div.secret', { role: 'group', 'aria-label': label },
    h('span.secret-label', {}, label),
    h('code.secret-value', { 'data-secret': '' }, secret),
    h('button.ghost', { type: 'button', onclick: () => navigator.clipboard?.writeText(secret).then(() => toast('Copied'), () => toast('Copy failed', 'error')) }, 'Copy'),
    h('button.ghost', { type: 'button', onclick: onHide }, 'Hide'));
  return box;
}

/** How much of a budget is spent, as a native meter (no inline style under the CSP). */
export const spentMeter = (spent, budget) =>
  h('meter', { min: 0, max: budget || 1, value: Math.min(spent, budget || 1), low: (budget || 1) * 0.7, high: (budget || 1) * 0.9, optimum: 0, title: `${money(spent)} of ${money(budget)}` });

/** Replaces an element's content; null entries (a form only admins get) are skipped. */
export const fill = (el, ...children) => el.replaceChildren(...children.filter((c) => c !== null && c !== undefined));
