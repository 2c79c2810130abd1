// The console page: sign-in, tabs, and who is signed in. Each tab renders itself from the
// admin API (keys.js, accounts.js) with the same permissions as the token.
import { api, ApiError, session } from './api.js';
import { toast } from './dom.js';
import { forgetKeys, renderKeys } from './keys.js';
import { renderProjects, renderWallets } from './accounts.js';

const $ = (id) => document.getElementById(id);
const tabs = { keys: renderKeys, projects: renderProjects, wallets: renderWallets };
let current = 'keys';
let who = null;

function showSignedOut(message) {
  session.clear();
  forgetKeys();
  who = null;
  $('app').hidden = true;
  $('who').hidden = true;
  $('signout').hidden = true;
  $('notice').replaceChildren();
  for (const name of Object.keys(tabs)) $(`panel-${name}`).replaceChildren();
  $('signin').hidden = false;
  const err = $('signin-error');
  err.hidden = !message;
  err.textContent = message ?? '';
  $('token').focus();
}

/** Context handed to each tab: who is signed in, and how to report or redraw. */
const ctx = {
  get who() {
    return who;
  },
  refresh: () => show(current),
  notice: (node) => $('notice').replaceChildren(...(node ? [node] : [])),
  /** An API failure: a rejected token signs out, anything else is a message. */
  fail(err) {
    if (err instanceof ApiError && err.status === 401) return showSignedOut('The console no longer accepts this token.');
    toast(err.message || String(err), 'error');
  },
};

async function show(name) {
  current = name;
  for (const tab of Object.keys(tabs)) {
    $(`tab-${tab}`).setAttribute('aria-selected', String(tab === name));
    $(`panel-${tab}`).hidden = tab !== name;
  }
  try {
    await tabs[name]($(`panel-${name}`), ctx);
  } catch (err) {
    ctx.fail(err);
  }
}

async function signIn(token) {
  session.set(token);
  try {
    who = await api('GET', '/admin/v1/whoami');
  } catch (err) {
    showSignedOut(err instanceof ApiError && err.status === 401 ? 'That token is not valid for this console.' : err.message);
    return;
  }
  $('token').value = '';
  $('signin').hidden = true;
  $('app').hidden = false;
  $('who').hidden = false;
  $('who').textContent = who.role === 'admin' ? 'admin' : `user ${who.user}`;
  $('signout').hidden = false;
  await show('keys');
}

$('signin-form').addEventListener('submit', (event) => {
  event.preventDefault();
  const token = $('token').value.trim();
  if (token) signIn(token);
});
$('signout').addEventListener('click', () => showSignedOut());
for (const name of Object.keys(tabs)) $(`tab-${name}`).addEventListener('click', () => show(name));

// A reload in the same tab keeps the session; a new tab starts signed out.
const saved = session.token();
if (saved) signIn(saved);
else showSignedOut();
