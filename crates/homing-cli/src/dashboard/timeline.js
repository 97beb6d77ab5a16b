// The job view's full timeline (docs/timeline.md): every run with its epoch and worker, every
// crash with the worker presumed dead, every error with its traceback, every progress report,
// read from GET /v1/jobs/{id}/history. Loaded after app.js (and views.js); it wraps the job
// view's renderDetail like views.js does, so app.js keeps only its script tag for it.
'use strict';

// Each kind's label and badge class (the same colours as the states').
const TIMELINE_KINDS = {
  enqueued: ['enqueued', 'queued'],
  started: ['started', 'running'],
  succeeded: ['succeeded', 'succeeded'],
  retry_scheduled: ['failed, retry scheduled', 'failed'],
  failed: ['failed', 'failed'],
  snoozed: ['snoozed', 'scheduled'],
  released: ['released', 'queued'],
  crashed: ['crashed (worker lost)', 'dead'],
  dead: ['dead', 'dead'],
  cancelled: ['cancelled', 'cancelled'],
  cancel_requested: ['cancel requested', 'cancelled'],
  retried: ['retried by an operator', 'queued'],
  parked: ['parked (queue paused or full)', 'scheduled'],
  ready: ['ready (workflow parents done)', 'queued'],
  due: ['due', 'queued'],
  progress: ['progress', ''],
};

function timelineWhen(iso) {
  return String(iso).replace('T', ' ').replace('Z', '');
}

function timelineDetail(e) {
  const parts = [];
  if (e.kind === 'crashed' && e.worker) parts.push(el('span', {}, 'worker ' + e.worker + ' presumed dead'));
  if (e.data && typeof e.data === 'object' && !Array.isArray(e.data) && typeof e.data.at === 'string'
      && Object.keys(e.data).length === 1) {
    parts.push(el('span', {}, 'at ' + timelineWhen(e.data.at)));
  } else if (e.kind === 'progress' && e.data && typeof e.data.fraction === 'number') {
    parts.push(el('span', {}, Math.round(e.data.fraction * 100) + '% ' + (e.data.message || '')));
  } else if (e.data !== null && e.data !== undefined) {
    parts.push(el('code', { class: 'mono' }, JSON.stringify(e.data)));
  }
  if (e.message) parts.push(el('pre', { class: 'error' }, e.message));
  return parts;
}

function renderTimeline(target, h) {
  const rows = h.entries.map((e) => {
    const [label, cls] = TIMELINE_KINDS[e.kind] || [e.kind, ''];
    return el('tr', { dataset: { kind: e.kind, epoch: e.epoch == null ? '' : String(e.epoch) } },
      el('td', { class: 'mono' }, timelineWhen(e.at)),
      el('td', {}, el('span', { class: 'badge ' + cls }, label)),
      el('td', {}, e.state),
      el('td', { class: 'num' }, e.epoch == null ? '—' : e.epoch),
      el('td', { class: 'mono' }, e.worker || '—'),
      el('td', { class: 'num' }, e.attempts + ' / ' + e.crashes),
      el('td', { class: 'timeline-detail' }, ...timelineDetail(e)));
  });
  if (rows.length === 0) {
    rows.push(el('tr', { class: 'empty' }, el('td', { colspan: '7' }, 'no entries (written since version 15)')));
  }
  target.replaceChildren(
    h.truncated ? el('p', { class: 'muted' }, 'Showing the first entry and the latest ones; older entries were dropped.') : '',
    el('table', { id: 'job-timeline' },
      el('thead', {}, el('tr', {}, ...['when', 'what', 'state', 'epoch', 'worker', 'errors / crashes', 'detail']
        .map((t) => el('th', {}, t)))),
      el('tbody', {}, ...rows)));
}

const timelineBaseRenderDetail = renderDetail;
renderDetail = function (job) {
  timelineBaseRenderDetail(job);
  if (!job) return;
  const box = el('div', { id: 'job-history' }, el('span', { class: 'muted' }, 'loading…'));
  $('#job-detail').append(el('h3', {}, 'Full timeline'), box);
  api('/v1/jobs/' + job.id + '/history')
    .then((h) => renderTimeline(box, h))
    .catch((e) => box.replaceChildren(el('span', { class: 'error' }, 'timeline unavailable: ' + e.message)));
};
