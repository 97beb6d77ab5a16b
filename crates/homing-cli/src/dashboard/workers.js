// The worker view, complete (docs/workers.md), loaded after views.js: replaces its
// renderWorker. It shows what liveness really uses (the heartbeat's age against the TTL the
// worker registered with), its version, and for a lost worker when it was declared lost and
// the jobs reclaimed from it, each a link to the job view. A worker that left the hour the list
// covers is fetched on its own (GET /v1/workers/{id}) until retention deletes its record.

let workerFetched = { id: null, w: null, at: 0 };

// The detail for a worker the list no longer holds: fetched at most every 5 s, then rendered.
function fetchWorker(wanted) {
  if (workerFetched.id === wanted && Date.now() - workerFetched.at < 5000) return workerFetched.w;
  workerFetched = { id: wanted, w: workerFetched.id === wanted ? workerFetched.w : null, at: Date.now() };
  api('/v1/workers/' + encodeURIComponent(wanted)).then((w) => {
    workerFetched = { id: wanted, w, at: Date.now() };
    if (routeWorker() === wanted) renderWorker(w, wanted);
  }).catch(() => {
    workerFetched = { id: wanted, w: null, at: Date.now() };
    if (routeWorker() === wanted) renderWorker(undefined, wanted, true);
  });
  return workerFetched.w;
}

// Liveness as the rescuer sees it: the heartbeat's age against the TTL, as a bar.
function livenessOf(w) {
  const ttl = w.heartbeat_ttl_s;
  if (w.heartbeat_expires_in_s == null) {
    if (w.status === 'live') return 'heartbeat expired: the rescuer will declare it lost and put its jobs back';
    return 'no heartbeat (' + w.status + ')';
  }
  if (ttl == null) return 'heartbeat expires in ' + secs(w.heartbeat_expires_in_s) + ' unless refreshed';
  const age = w.heartbeat_age_s == null ? Math.max(0, ttl - w.heartbeat_expires_in_s) : w.heartbeat_age_s;
  const pct = Math.min(100, Math.round((age / ttl) * 100));
  return el('span', { class: 'liveness' },
    el('span', { class: 'hb-bar', title: 'heartbeat age / TTL' },
      el('span', { class: 'hb-fill' + (pct > 66 ? ' late' : ''), style: 'width:' + pct + '%' })),
    ' heartbeat expires in ' + secs(w.heartbeat_expires_in_s) + ' unless refreshed: ' + secs(age) + ' old of a ' + secs(ttl) + ' TTL');
}

function reclaimedTable(w) {
  const rs = w.reclaimed || [];
  if (rs.length === 0) return el('span', { class: 'muted' }, w.status === 'lost' ? 'none (it held no running job)' : 'none');
  return el('table', { class: 'worker-reclaims' },
    el('thead', {}, el('tr', {}, el('th', {}, 'job'), el('th', {}, 'epoch'), el('th', {}, 'became'), el('th', {}, 'at'))),
    el('tbody', {}, ...rs.map((r) => el('tr', { dataset: { job: r.job } },
      el('td', { class: 'mono' }, el('a', { href: '#/jobs/' + r.job }, shortId(r.job))),
      el('td', {}, String(r.epoch)),
      el('td', {}, el('span', { class: 'badge ' + (r.outcome === 'requeued' ? 'queued' : r.outcome) }, r.outcome)),
      el('td', {}, r.at + ' (' + ago(r.at) + ')')))));
}

renderWorker = function (w, wanted, missing) {
  let d = $('#worker-detail');
  if (!d) {
    d = el('section', { id: 'worker-detail', hidden: '' });
    $('#job-detail').before(d);
  }
  if (!wanted) { d.hidden = true; d.replaceChildren(); return; }
  if (!w && !missing) w = fetchWorker(wanted);
  if (!w) {
    d.replaceChildren(el('div', { class: 'detail-head' }, el('h2', {}, 'Worker ', el('span', { class: 'mono' }, wanted)),
      el('a', { href: '#/', class: 'close' }, 'close ✕')),
    el('p', { class: 'muted' }, missing ? 'no such worker (departed workers are kept for the retention period)' : 'looking…'));
    d.hidden = false;
    return;
  }
  const st = workerStatus(w);
  const running = w.running_jobs.length === 0 ? el('span', { class: 'muted' }, 'none')
    : el('table', { class: 'worker-jobs' },
      el('thead', {}, el('tr', {}, el('th', {}, 'job'), el('th', {}, 'task'), el('th', {}, 'queue'), el('th', {}, 'running for'))),
      el('tbody', {}, ...w.running_jobs.map((r) => el('tr', {},
        el('td', { class: 'mono' }, el('a', { href: '#/jobs/' + r.id }, shortId(r.id))),
        el('td', {}, r.task), el('td', {}, r.queue), el('td', {}, secs(r.running_for_s))))));
  const ended = w.lost_at ? kv('lost at', w.lost_at + ' (' + ago(w.lost_at) + '): its heartbeat expired and a rescuer took its jobs back')
    : w.ended_at ? kv('stopped at', w.ended_at + ' (' + ago(w.ended_at) + '): it shut down cleanly') : [];
  d.replaceChildren(
    el('div', { class: 'detail-head' },
      el('h2', {}, 'Worker ', el('span', { class: 'mono' }, w.id)),
      el('span', { class: 'badge w-' + st }, st),
      el('a', { href: '#/', class: 'close' }, 'close ✕')),
    el('dl', {},
      ...kv('liveness', livenessOf(w)),
      ...kv('heartbeat TTL', w.heartbeat_ttl_s == null ? 'not recorded (registered by an older version)' : secs(w.heartbeat_ttl_s)),
      ...kv('store record', 'updated ' + secs(w.last_seen_age_s) + ' ago (written every few heartbeats; not the liveness signal)'),
      ...kv('status', w.status),
      ...(w.presumed_dead_at ? kv('presumed dead', w.presumed_dead_at + ' (' + ago(w.presumed_dead_at) + '): first found without a heartbeat; runs it began after this count no crash') : []),
      ...ended,
      ...kv('version', w.version || '—'),
      ...kv('host', w.hostname), ...kv('pid', String(w.pid)),
      ...kv('started', w.started_at + ' (' + ago(w.started_at) + ')'),
      ...kv('queues', w.queues.join(', ')), ...kv('concurrency', String(w.concurrency)),
      ...kv('tasks', (w.tasks || []).join(', ') || '—'),
      ...(w.remote ? kv('remote', 'yes (a remote worker session)') : [])),
    el('h3', {}, 'Running jobs'), running,
    el('h3', {}, 'Reclaimed jobs'), reclaimedTable(w));
  d.hidden = false;
};
