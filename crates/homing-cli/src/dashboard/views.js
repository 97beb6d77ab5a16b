// Search and the worker view (docs/operate.md), loaded after app.js. It extends app.js by
// wrapping a few of its global functions instead of editing them, so the two files change
// independently: jobsQuery gains the search fields, renderBulk hides bulk actions while a search
// narrows the list further than the bulk filter can (a bulk action must never reach jobs the
// page does not show), api turns a refused search into a message instead of a dead page, and
// renderWorkers links each worker to its own view.
'use strict';

const SEARCH_FIELDS = [
  ['id', 'id or prefix', 'f-id'],
  ['created_from', 'created from (RFC 3339)', 'f-from'],
  ['created_to', 'created before', 'f-to'],
  ['args_path', 'args path, e.g. customer.id', 'f-path'],
  ['args_value', 'value at path', 'f-value'],
  ['args_contains', 'args contain text', 'f-contains'],
];
let search = {};

function searchActive() {
  return Object.values(search).some((v) => v);
}

(function addSearchFields() {
  const form = $('#filters');
  const row = el('div', { class: 'search-row', id: 'search-fields' },
    ...SEARCH_FIELDS.map(([name, hint, id]) => el('label', {}, name.replace('_', ' ') + ' ',
      el('input', { id, name, placeholder: hint, maxlength: name === 'id' ? '36' : '1024' }))));
  form.after(row);
  row.after(el('p', { id: 'search-error', class: 'error', hidden: '' }));
  // Read before app.js's own submit handler runs its refresh (capture on the document).
  document.addEventListener('submit', (ev) => {
    if (ev.target !== form) return;
    search = {};
    for (const [name, , id] of SEARCH_FIELDS) search[name] = $('#' + id).value.trim();
  }, true);
  row.addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter') { ev.preventDefault(); form.requestSubmit(); }
  });
})();

const baseJobsQuery = jobsQuery;
// eslint-disable-next-line no-global-assign
jobsQuery = function () {
  const url = new URL(baseJobsQuery(), location.origin);
  for (const [k, v] of Object.entries(search)) if (v) url.searchParams.set(k, v);
  return url.pathname + url.search;
};

const baseRenderBulk = renderBulk;
renderBulk = function () {
  baseRenderBulk();
  if (searchActive()) $('#bulk').hidden = true;
};

const baseApi = api;
api = async function (path, options) {
  const isSearch = path.startsWith('/v1/jobs?');
  try {
    const r = await baseApi(path, options);
    if (isSearch) $('#search-error').hidden = true;
    return r;
  } catch (e) {
    if (e instanceof Unauthorized || !isSearch) throw e;
    const m = $('#search-error');
    m.textContent = 'search refused: ' + e.message;
    m.hidden = false;
    return { jobs: [], next_cursor: null, refused: true };
  }
};

function routeWorker() {
  const m = location.hash.match(/^#\/workers\/(.+)$/);
  return m ? decodeURIComponent(m[1]) : null;
}

const baseRenderWorkers = renderWorkers;
renderWorkers = function (workers) {
  baseRenderWorkers(workers);
  for (const tr of document.querySelectorAll('#workers tbody tr[data-worker]')) {
    const td = tr.firstElementChild;
    td.replaceChildren(el('a', { href: '#/workers/' + encodeURIComponent(tr.dataset.worker) }, tr.dataset.worker));
  }
  renderWorker(workers.find((w) => w.id === routeWorker()), routeWorker());
};

// One worker: what liveness uses (the broker heartbeat's time left against the interval it is
// refreshed at), the store record's age, where it runs, and its jobs.
function renderWorker(w, wanted) {
  let d = $('#worker-detail');
  if (!d) {
    d = el('section', { id: 'worker-detail', hidden: '' });
    $('#job-detail').before(d);
  }
  if (!wanted) { d.hidden = true; d.replaceChildren(); return; }
  if (!w) {
    d.replaceChildren(el('div', { class: 'detail-head' }, el('h2', {}, 'Worker ', el('span', { class: 'mono' }, wanted)),
      el('a', { href: '#/', class: 'close' }, 'close ✕')),
    el('p', { class: 'muted' }, 'not seen in the last hour (workers are listed for an hour after their last record)'));
    d.hidden = false;
    return;
  }
  const st = workerStatus(w);
  const liveness = w.heartbeat_expires_in_s == null
    ? (w.status === 'live' ? 'heartbeat expired: the rescuer will declare it lost and put its jobs back' : 'no heartbeat (' + w.status + ')')
    : 'heartbeat expires in ' + secs(w.heartbeat_expires_in_s) + ' unless refreshed';
  const running = w.running_jobs.length === 0 ? el('span', { class: 'muted' }, 'none')
    : el('table', { class: 'worker-jobs' },
      el('thead', {}, el('tr', {}, el('th', {}, 'job'), el('th', {}, 'task'), el('th', {}, 'queue'), el('th', {}, 'running for'))),
      el('tbody', {}, ...w.running_jobs.map((r) => el('tr', {},
        el('td', { class: 'mono' }, el('a', { href: '#/jobs/' + r.id }, shortId(r.id))),
        el('td', {}, r.task), el('td', {}, r.queue), el('td', {}, secs(r.running_for_s))))));
  d.replaceChildren(
    el('div', { class: 'detail-head' },
      el('h2', {}, 'Worker ', el('span', { class: 'mono' }, w.id)),
      el('span', { class: 'badge w-' + st }, st),
      el('a', { href: '#/', class: 'close' }, 'close ✕')),
    el('dl', {},
      ...kv('liveness', liveness),
      ...kv('store record', 'updated ' + secs(w.last_seen_age_s) + ' ago (written every few heartbeats; not the liveness signal)'),
      ...kv('status', w.status + (w.status === 'lost' ? ' — declared lost at about ' + new Date(Date.now() - w.last_seen_age_s * 1000).toISOString() + ' or later' : '')),
      ...kv('host', w.hostname), ...kv('pid', String(w.pid)),
      ...kv('started', w.started_at + ' (' + ago(w.started_at) + ')'),
      ...kv('queues', w.queues.join(', ')), ...kv('concurrency', String(w.concurrency)),
      ...kv('tasks', (w.tasks || []).join(', ') || '—'),
      ...(w.remote ? kv('remote', 'yes (a remote worker session)') : [])),
    el('h3', {}, 'Running jobs'), running);
  d.hidden = false;
}

// The job view's links: the schedule that enqueued it, the workflow parents it ran after, the
// job it follows (a follow-up's args carry `parent`), and its follow-ups, found by searching
// for jobs whose args.parent.id is this job.
const baseRenderDetail = renderDetail;
renderDetail = function (job) {
  baseRenderDetail(job);
  if (!job) return;
  const links = [];
  if (job.schedule) {
    links.push(...kv('schedule', el('span', {}, el('a', { href: '#/schedules/' + encodeURIComponent(job.schedule) }, job.schedule),
      job.scheduled_tick ? ' (tick ' + job.scheduled_tick + ')' : '')));
  }
  if (job.parents) {
    links.push(...kv('after steps', el('span', {}, ...Object.entries(job.parents).map(([name, p]) =>
      el('span', { class: 'link-item' }, name + ': ', el('a', { href: '#/jobs/' + p.id }, shortId(p.id)), ' ', stateBadge(p.state))))));
  }
  const parent = job.args && job.args.parent;
  if (parent && typeof parent.id === 'string' && /^[0-9a-f-]{36}$/.test(parent.id)) {
    links.push(...kv('follows', el('span', {}, el('a', { href: '#/jobs/' + parent.id }, shortId(parent.id)),
      ' (' + (parent.task || '') + ', ' + (parent.state || '') + ')')));
  }
  const follow = el('dd', { id: 'follow-ups' }, el('span', { class: 'muted' }, job.on_success || job.on_failure ? 'looking…' : 'none'));
  links.push(el('dt', {}, 'follow-ups'), follow);
  const d = $('#job-detail');
  d.append(el('h3', {}, 'Links'), el('dl', { class: 'job-links' }, ...links));
  if (job.on_success || job.on_failure) {
    const q = new URLSearchParams({ args_path: 'parent.id', args_value: job.id, limit: '20' });
    baseApi('/v1/jobs?' + q.toString()).then((page) => {
      follow.replaceChildren(page.jobs.length === 0
        ? el('span', { class: 'muted' }, 'none yet (' + [job.on_success && 'on success: ' + job.on_success.task,
          job.on_failure && 'on failure: ' + job.on_failure.task].filter(Boolean).join(', ') + ')')
        : el('span', {}, ...page.jobs.map((f) => el('span', { class: 'link-item' },
          el('a', { href: '#/jobs/' + f.id }, f.task + ' ' + shortId(f.id)), ' ', stateBadge(f.state)))));
    }).catch(() => {});
  }
};

// A schedule's link (#/schedules/<name>) lands on its row of the schedules table, marked and
// scrolled into view once per visit (the table refreshes every 2 s; scrolling each time would
// fight the reader).
let scheduleShown = null;
window.addEventListener('hashchange', () => { scheduleShown = null; });
const baseRenderSchedules = renderSchedules;
renderSchedules = function (schedules, next) {
  baseRenderSchedules(schedules, next);
  const m = location.hash.match(/^#\/schedules\/(.+)$/);
  const name = m ? decodeURIComponent(m[1]) : null;
  const row = name && [...document.querySelectorAll('#schedules tbody tr[data-schedule]')].find((r) => r.dataset.schedule === name);
  if (!row) return;
  row.classList.add('selected');
  if (scheduleShown !== name) { scheduleShown = name; row.scrollIntoView({ block: 'center' }); }
};
