// The homing dashboard: reads and steers everything through the public API (/v1), the same
// calls a script would make, so the page can never do what the API does not allow. It refreshes
// itself every 2 s. With an API token configured, it asks for the token once and keeps it in
// sessionStorage (this tab only). A read token sees everything and no write button (the API
// refuses its writes anyway: the buttons are hidden so nobody is offered what will fail).
'use strict';

const TOKEN_KEY = 'homing.token';
const REFRESH_MS = 2000;
let filters = { state: '', queue: '', task: '' };
let cursor = null;      // the page of jobs shown; null = newest
let nextCursor = null;
let timer = null;
let canWrite = false;   // the token's role is admin (GET /v1/whoami)
// Bumped by every refresh and every showing of the token form: a refresh answered after a
// newer refresh, a logout or a refused token draws nothing, so a page logged out mid-refresh is
// not shown again with the old token's data, and an old refresh's 401 does not undo a login.
let generation = 0;

const $ = (sel) => document.querySelector(sel);

class Unauthorized extends Error {}

async function api(path, options = {}) {
  const headers = Object.assign({}, options.headers || {});
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers['Authorization'] = 'Bearer ' + token;
  const resp = await fetch(path, Object.assign({}, options, { headers }));
  if (resp.status === 401) throw new Unauthorized();
  const body = await resp.json().catch(() => ({}));
  if (!resp.ok) {
    const msg = (body.error && body.error.message) || resp.statusText;
    throw new Error(msg);
  }
  return body;
}

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') e.className = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (k === 'dataset') Object.assign(e.dataset, v);
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c == null ? '' : String(c)));
  return e;
}

function ago(iso) {
  if (!iso) return '';
  const s = (Date.now() - Date.parse(iso)) / 1000;
  return secs(s) + ' ago';
}

function secs(s) {
  if (s < 1) return Math.max(0, Math.round(s * 1000)) + ' ms';
  if (s < 120) return s.toFixed(1) + ' s';
  if (s < 7200) return (s / 60).toFixed(1) + ' min';
  return (s / 3600).toFixed(1) + ' h';
}

function duration(job) {
  if (!job.started_at) return '';
  const end = job.finished_at ? Date.parse(job.finished_at) : Date.now();
  return secs((end - Date.parse(job.started_at)) / 1000);
}

function stateBadge(state) {
  return el('span', { class: 'badge ' + state }, state);
}

function fill(id, rows, empty) {
  const body = document.querySelector('#' + id + ' tbody');
  if (rows.length === 0) {
    const cols = document.querySelectorAll('#' + id + ' thead th').length;
    rows = [el('tr', { class: 'empty' }, el('td', { colspan: cols }, empty))];
  }
  body.replaceChildren(...rows);
}

function actions(job) {
  const out = [];
  if (!canWrite) return out;
  if (['failed', 'dead', 'cancelled'].includes(job.state)) {
    out.push(el('button', { class: 'retry', dataset: { id: job.id }, onclick: () => act(job.id, 'retry') }, 'Retry'));
  }
  if (['queued', 'scheduled', 'running'].includes(job.state) && !job.cancel_requested) {
    out.push(el('button', { class: 'cancel', dataset: { id: job.id }, onclick: () => act(job.id, 'cancel') }, 'Cancel'));
  }
  return out;
}

async function act(id, verb) {
  try {
    await api('/v1/jobs/' + id + '/' + verb, { method: 'POST' });
    flash('');
  } catch (e) {
    if (e instanceof Unauthorized) return showLogin();
    flash(verb + ' failed: ' + e.message);
  }
  refresh();
}

// A message under the page: an error, or (done = true) what an action did.
function flash(msg, done) {
  const m = $('#message');
  m.textContent = msg;
  m.className = done ? 'done' : 'error';
  m.hidden = !msg;
}

function renderQueues(queues) {
  fill('queues', queues.map((q) => el('tr', { dataset: { queue: q.queue } },
    el('td', {}, q.queue),
    el('td', { class: 'num' }, q.queued),
    el('td', { class: 'num' }, q.waiting),
    el('td', { class: 'num' }, q.scheduled),
    el('td', { class: 'num' }, q.running),
    el('td', { class: 'num ok' }, q.last_hour.succeeded),
    el('td', { class: 'num' + (q.last_hour.failed ? ' bad' : '') }, q.last_hour.failed),
    el('td', { class: 'num' + (q.last_hour.dead ? ' bad' : '') }, q.last_hour.dead),
    el('td', { class: 'num' }, q.throughput_per_s.toFixed(2) + '/s'),
    el('td', { class: 'num' }, q.broker.dead_letters),
    el('td', { class: 'limits' }, limitsText(q.limits || {})),
    el('td', {}, queueButton(q)),
  )), 'no queues yet');
}

// A queue's cluster-wide limits in words, as `homing queues` prints them.
function limitsText(l) {
  const parts = [];
  if (l.concurrency) parts.push('concurrency ' + l.concurrency);
  if (l.rate) parts.push('rate ' + l.rate);
  if (l.key_arg && parts.length) parts.push('per ' + l.key_arg);
  return parts.join(', ');
}

// Pause holds a queue's jobs back (it still accepts them); resume lets them run.
function queueButton(q) {
  if (!canWrite) return '';
  const verb = q.paused ? 'resume' : 'pause';
  return el('button', { class: verb, dataset: { queue: q.queue },
    onclick: () => queueAct(q.queue, verb) }, q.paused ? 'Resume' : 'Pause');
}

async function queueAct(queue, verb) {
  try {
    await api('/v1/queues/' + encodeURIComponent(queue) + '/' + verb, { method: 'POST' });
    flash('');
  } catch (e) {
    if (e instanceof Unauthorized) return showLogin();
    flash(verb + ' failed: ' + e.message);
  }
  refresh();
}

function workerStatus(w) {
  if (w.alive) return 'live';
  if (w.status === 'live') return 'unresponsive';
  return w.status;
}

// The broker's heartbeat, which decides liveness: a healthy worker's expiry stays between
// TTL − interval and TTL. (The worker row's last_seen is written only every few beats.)
function heartbeatCell(w) {
  const left = w.heartbeat_expires_in_s;
  const text = left == null ? el('span', { class: 'muted' }, w.status === 'live' ? 'expired' : '—')
    : 'in ' + secs(left);
  return el('td', { class: 'heartbeat', dataset: { expiresIn: left == null ? '' : left },
    title: 'store record updated ' + secs(w.last_seen_age_s) + ' ago' }, text);
}

function renderWorkers(workers) {
  fill('workers', workers.map((w) => {
    const st = workerStatus(w);
    const running = w.running_jobs.length === 0 ? el('span', { class: 'muted' }, 'idle')
      : el('ul', { class: 'running' }, ...w.running_jobs.map((r) => el('li', {},
        el('a', { href: '#/jobs/' + r.id }, r.task), ' for ' + secs(r.running_for_s))));
    return el('tr', { dataset: { worker: w.id } },
      el('td', { class: 'mono' }, w.id),
      el('td', {}, el('span', { class: 'badge w-' + st }, st)),
      el('td', {}, w.queues.join(', ')),
      heartbeatCell(w),
      el('td', {}, running));
  }), 'no workers in the last hour');
}

function when(spec) {
  return spec.kind === 'cron' ? spec.expr + ' (' + spec.timezone + ')' : 'every ' + spec.interval;
}

function inOrAgo(iso) {
  if (!iso) return '';
  const s = (Date.parse(iso) - Date.now()) / 1000;
  return s >= 0 ? 'in ' + secs(s) : secs(-s) + ' ago';
}

function renderSchedules(schedules, next) {
  const rows = schedules.map((s) => el('tr', { dataset: { schedule: s.name } },
    el('td', {}, s.name),
    el('td', {}, s.task),
    el('td', {}, s.queue),
    el('td', { class: 'mono' }, when(s.spec)),
    el('td', { class: 'next', title: s.next_tick || '' },
      s.paused ? el('span', { class: 'badge w-stopped' }, 'paused') : inOrAgo(s.next_tick)),
    el('td', { class: 'last', title: s.last_tick || '' }, ago(s.last_tick)),
    el('td', { class: 'mono' }, s.last_job
      ? el('a', { href: '#/jobs/' + s.last_job }, s.last_job.slice(0, 8) + '…' + s.last_job.slice(-4))
      : el('span', { class: 'muted' }, '—')),
  ));
  // The API answers a page (a schedule may carry 1 MiB of args); the rest are a command away.
  if (next) {
    rows.push(el('tr', { class: 'empty' }, el('td', { colspan: 7 },
      'more schedules after ' + next + ': homing schedules list, or GET /v1/schedules?after=' + encodeURIComponent(next))));
  }
  fill('schedules', rows, 'no schedules');
}

function renderJobs(page) {
  nextCursor = page.next_cursor;
  $('#next-page').hidden = !nextCursor;
  $('#first-page').hidden = !cursor;
  fill('jobs', page.jobs.map((j) => el('tr', { dataset: { id: j.id, state: j.state } },
    el('td', { class: 'mono' }, el('a', { href: '#/jobs/' + j.id }, j.id.slice(0, 8) + '…' + j.id.slice(-4))),
    el('td', {}, j.task),
    el('td', {}, j.queue),
    el('td', { class: 'state' }, stateBadge(j.state)),
    el('td', { class: 'num' }, j.attempts),
    el('td', { class: 'num' }, j.crashes),
    el('td', {}, ago(j.created_at)),
    el('td', {}, duration(j)),
    el('td', { class: 'actions' }, ...actions(j)),
  )), 'no jobs match');
}

function kv(label, value) {
  return [el('dt', {}, label), el('dd', {}, value)];
}

function pre(v) {
  return el('pre', {}, v === undefined || v === null ? 'null' : JSON.stringify(v, null, 2));
}

function renderDetail(job) {
  const d = $('#job-detail');
  if (!job) { d.hidden = true; d.replaceChildren(); return; }
  const timeline = [
    ['created', job.created_at], ['scheduled for', job.scheduled_at],
    ['started', job.started_at], ['finished', job.finished_at],
  ].filter(([, t]) => t).sort((a, b) => Date.parse(a[1]) - Date.parse(b[1]));
  const progress = job.progress && typeof job.progress.fraction === 'number'
    ? el('div', { class: 'progress' },
      el('div', { class: 'bar', style: 'width:' + Math.round(job.progress.fraction * 100) + '%' }),
      el('span', {}, Math.round(job.progress.fraction * 100) + '% ' + (job.progress.message || '')))
    : (job.progress ? pre(job.progress) : el('span', { class: 'muted' }, 'none reported'));
  d.replaceChildren(
    el('div', { class: 'detail-head' },
      el('h2', {}, 'Job ', el('span', { class: 'mono' }, job.id)),
      stateBadge(job.state),
      el('span', { class: 'actions' }, ...actions(job)),
      el('a', { href: '#/', class: 'close' }, 'close ✕')),
    el('dl', {},
      ...kv('task', job.task), ...kv('queue', job.queue),
      ...kv('attempts', job.attempts + (job.max_retries != null ? ' (max retries ' + job.max_retries + ')' : '')),
      ...kv('crashes', job.crashes + ' (max ' + job.max_crashes + ')'),
      ...kv('epoch', job.epoch), ...kv('worker', job.worker || '—'),
      ...kv('idempotency key', job.idempotency_key || '—'),
      ...kv('callback', job.callback_url || '—'),
      ...kv('cancel requested', job.cancel_requested ? 'yes' : 'no'),
      ...(job.workflow ? kv('workflow', el('a', { href: '#/workflows/' + job.workflow.id },
        'step ' + job.workflow.step + ' of ' + shortId(job.workflow.id))) : [])),
    el('h3', {}, 'Progress'), progress,
    el('h3', {}, 'Timeline'),
    el('ol', { class: 'timeline' }, ...timeline.map(([what, t]) => el('li', {}, el('b', {}, what), ' ' + t + ' (' + ago(t) + ')'))),
    el('h3', {}, 'Args'), pre(job.args),
    el('h3', {}, job.error ? 'Error' : 'Result'),
    job.error ? el('pre', { class: 'error' }, job.error) : pre(job.result),
  );
  d.hidden = false;
}

function shortId(id) {
  return id.slice(0, 8) + '…' + id.slice(-4);
}

function renderWorkflows(page) {
  fill('workflows', (page.workflows || []).map((w) => el('tr', { dataset: { workflow: w.id, state: w.state } },
    el('td', { class: 'mono' }, el('a', { href: '#/workflows/' + w.id }, shortId(w.id))),
    el('td', {}, w.name),
    el('td', { class: 'state' }, stateBadge(w.state)),
    el('td', { class: 'num' }, Object.keys(w.steps).length),
    el('td', {}, ago(w.created_at)),
  )), 'no workflows yet');
}

// A workflow's steps as a table: each step's state, its parents, and a link to its job.
function renderWorkflow(w) {
  const d = $('#workflow-detail');
  if (!w) { d.hidden = true; d.replaceChildren(); return; }
  const rows = Object.entries(w.steps).map(([name, s]) => el('tr', { dataset: { step: name, state: s.state } },
    el('td', {}, name),
    el('td', { class: 'mono' }, el('a', { href: '#/jobs/' + s.job }, shortId(s.job))),
    el('td', {}, s.task),
    el('td', { class: 'state' }, stateBadge(s.state)),
    el('td', {}, s.after.length ? s.after.join(', ') : '—'),
    el('td', {}, s.run_on),
    el('td', {}, s.error || ''),
  ));
  const cancel = w.state === 'running' && canWrite
    ? el('button', { onclick: () => actWorkflow(w.id) }, 'cancel workflow') : '';
  d.replaceChildren(
    el('div', { class: 'detail-head' },
      el('h2', {}, 'Workflow ', el('span', {}, w.name), ' ', el('span', { class: 'mono' }, w.id)),
      stateBadge(w.state),
      el('span', { class: 'actions' }, cancel),
      el('a', { href: '#/', class: 'close' }, 'close ✕')),
    el('table', { id: 'workflow-steps' },
      el('thead', {}, el('tr', {}, ...['step', 'job', 'task', 'state', 'after', 'run on', 'error'].map((h) => el('th', {}, h)))),
      el('tbody', {}, ...rows)),
  );
  d.hidden = false;
}

async function actWorkflow(id) {
  try {
    await api('/v1/workflows/' + id + '/cancel', { method: 'POST' });
    flash('workflow cancelled');
  } catch (e) {
    if (e instanceof Unauthorized) return showLogin();
    flash('cancel failed: ' + e.message);
  }
  refresh();
}

function routeWorkflow() {
  const m = location.hash.match(/^#\/workflows\/([0-9a-f-]{36})$/);
  return m ? m[1] : null;
}

// The states each bulk action takes (the server checks the same: crates/homing/src/transition.rs).
const BULK = {
  retry: ['failed', 'dead', 'cancelled'],
  cancel: ['scheduled', 'waiting', 'queued', 'running'],
  delete: ['succeeded', 'failed', 'dead', 'cancelled'],
};

function filterQuery() {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(filters)) if (v) p.set(k, v);
  return p.toString();
}

function renderBulk() {
  let any = false;
  for (const [verb, states] of Object.entries(BULK)) {
    const show = canWrite && states.includes(filters.state);
    $('#bulk-' + verb).hidden = !show;
    any = any || show;
  }
  $('#bulk').hidden = !any;
}

// Shows how many jobs the filter matches and runs the action only once that is confirmed.
async function bulkAct(verb) {
  const q = filterQuery();
  const r = { count: 0, skipped: 0 };
  try {
    const { count } = await api('/v1/jobs/count?' + q);
    const what = Object.entries(filters).filter(([, v]) => v).map(([k, v]) => k + '=' + v).join(', ');
    if (!window.confirm(verb + ' ' + count + ' job' + (count === 1 ? '' : 's') + ' (' + what + ')?')) return;
    // A large action answers in parts (docs/bulk.md): each call counts what it did and says
    // where to go on, so the total shown is what happened even if a later call fails.
    for (let next = null, done = false; !done;) {
      const part = await api('/v1/jobs/' + verb + '?' + q + (next ? '&cursor=' + encodeURIComponent(next) : ''), { method: 'POST' });
      r.count += part.count; r.skipped += part.skipped; done = part.done !== false; next = part.next_cursor;
      if (!done) flash(verb + ': ' + r.count + ' jobs so far…', true);
    }
    flash(verb + ': ' + r.count + ' job' + (r.count === 1 ? '' : 's') + (r.skipped ? ', ' + r.skipped + ' skipped' : ''), true);
  } catch (e) {
    if (e instanceof Unauthorized) return showLogin();
    flash(verb + ' failed: ' + e.message + (r.count ? ' (' + r.count + ' done before it; run it again to finish)' : ''));
  }
  refresh();
}

function renderAudit(page) {
  fill('audit', (page.entries || []).map((e) => el('tr', { dataset: { actor: e.actor, status: e.status } },
    el('td', { title: new Date(e.at / 1000).toISOString() }, ago(new Date(e.at / 1000).toISOString())),
    el('td', {}, e.actor),
    el('td', {}, e.role),
    el('td', { class: 'mono' }, e.action),
    el('td', { class: 'mono' }, e.target),
    el('td', { class: 'num' + (e.status >= 400 ? ' bad' : '') }, e.status),
    el('td', { class: 'num' }, e.count == null ? '' : e.count),
  )), 'nothing recorded yet');
}

function jobsQuery() {
  const p = new URLSearchParams({ limit: '25' });
  for (const [k, v] of Object.entries(filters)) if (v) p.set(k, v);
  if (cursor) p.set('cursor', cursor);
  return '/v1/jobs?' + p.toString();
}

function routeJob() {
  const m = location.hash.match(/^#\/jobs\/([0-9a-f-]{36})$/);
  return m ? m[1] : null;
}

async function refresh() {
  clearTimeout(timer);
  const mine = ++generation;
  const stale = () => mine !== generation;
  try {
    const detailId = routeJob();
    const workflowId = routeWorkflow();
    // Who is calling first: the role decides which buttons are drawn.
    const me = await api('/v1/whoami');
    if (stale()) return;
    canWrite = me.role === 'admin';
    $('#whoami').textContent = me.auth ? me.name + ' (' + me.role + ')' : '';
    const [q, w, j, d, sch, wfs, wf, au] = await Promise.all([
      api('/v1/queues'), api('/v1/workers'), api(jobsQuery()),
      detailId ? api('/v1/jobs/' + detailId) : Promise.resolve(null),
      api('/v1/schedules'),
      api('/v1/workflows?limit=10'),
      workflowId ? api('/v1/workflows/' + workflowId) : Promise.resolve(null),
      api('/v1/audit?limit=20'),
    ]);
    if (stale()) return;
    $('#login').hidden = true;
    $('#app').hidden = false;
    $('#logout').hidden = !sessionStorage.getItem(TOKEN_KEY);
    renderQueues(q.queues || []);
    renderWorkers(w.workers || []);
    renderSchedules(sch.schedules || [], sch.next);
    renderJobs(j);
    renderDetail(d);
    renderWorkflows(wfs);
    renderWorkflow(wf);
    renderAudit(au);
    renderBulk();
    const s = $('#status');
    s.textContent = 'updated ' + new Date().toLocaleTimeString();
    s.className = 'status ok';
  } catch (e) {
    if (stale()) return;
    if (e instanceof Unauthorized) return showLogin();
    const s = $('#status');
    s.textContent = 'cannot reach the API: ' + e.message;
    s.className = 'status bad';
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

function showLogin(msg) {
  clearTimeout(timer);
  generation++;
  $('#app').hidden = true;
  $('#login').hidden = false;
  $('#login-error').textContent = msg || (sessionStorage.getItem(TOKEN_KEY) ? 'That token was refused.' : '');
  $('#status').textContent = 'token required';
  $('#status').className = 'status bad';
  $('#token-input').focus();
}

$('#token-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $('#token-input').value.trim());
  $('#token-input').value = '';
  refresh();
});
$('#logout').addEventListener('click', () => { sessionStorage.removeItem(TOKEN_KEY); showLogin(' '); });
$('#filters').addEventListener('submit', (ev) => {
  ev.preventDefault();
  filters = { state: $('#f-state').value, queue: $('#f-queue').value.trim(), task: $('#f-task').value.trim() };
  cursor = null;
  refresh();
});
for (const verb of Object.keys(BULK)) $('#bulk-' + verb).addEventListener('click', () => bulkAct(verb));
$('#next-page').addEventListener('click', () => { cursor = nextCursor; refresh(); });
$('#first-page').addEventListener('click', () => { cursor = null; refresh(); });
window.addEventListener('hashchange', () => { refresh(); window.scrollTo(0, 0); });
refresh();
