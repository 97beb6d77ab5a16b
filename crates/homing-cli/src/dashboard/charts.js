// The dashboard's charts (docs/charts.md): jobs finished per minute or hour by outcome, queue
// depth, and enqueue→start and run-time percentiles, for one queue or all, over the last hour,
// day or week. They read GET /v1/stats/series, which the server answers from the rollups it
// keeps in the store, so they need no Prometheus and survive restarts. Drawn with uPlot
// (vendor/, served from the binary). Also owns the page's theme: it follows the system's
// prefers-color-scheme unless the toggle in the header pins light or dark (kept in
// localStorage), and charts are redrawn in the theme's colours when it changes.
'use strict';

(function () {
  const THEME_KEY = 'homing.theme';
  const CHART_REFRESH_MS = 15000;
  const THEMES = ['auto', 'light', 'dark'];
  const state = { range: 'hour', queue: '', loaded: 0, plots: [], data: null, busy: false };
  const media = window.matchMedia('(prefers-color-scheme: dark)');

  // ---- theme -----------------------------------------------------------------------------
  function chosenTheme() {
    const t = localStorage.getItem(THEME_KEY);
    return THEMES.includes(t) ? t : 'auto';
  }
  // The theme in effect: the pinned one, or the system's.
  function effectiveTheme() {
    const t = chosenTheme();
    if (t !== 'auto') return t;
    return media.matches ? 'dark' : 'light';
  }
  function applyTheme() {
    const root = document.documentElement;
    root.dataset.theme = effectiveTheme();
    root.dataset.themeChoice = chosenTheme();
    const b = document.getElementById('theme-toggle');
    if (b) b.textContent = 'theme: ' + chosenTheme();
    redraw();
  }
  function cycleTheme() {
    const next = THEMES[(THEMES.indexOf(chosenTheme()) + 1) % THEMES.length];
    localStorage.setItem(THEME_KEY, next);
    applyTheme();
  }

  // ---- layout ----------------------------------------------------------------------------
  const CHARTS = [
    { id: 'outcomes', title: 'Jobs finished', unit: 'jobs', series: [
      ['succeeded', '--ok'], ['failed', '--bad'], ['dead', '--dead'], ['retried', '--warn']] },
    { id: 'depth', title: 'Queue depth (most queued)', unit: 'jobs', series: [['depth', '--run']] },
    { id: 'wait', title: 'Enqueue → start', unit: 'ms', log: true, series: [
      ['wait_p50_ms', '--ok', 'p50'], ['wait_p95_ms', '--warn', 'p95'], ['wait_p99_ms', '--bad', 'p99']] },
    { id: 'run', title: 'Run time', unit: 'ms', log: true, series: [
      ['run_p50_ms', '--ok', 'p50'], ['run_p95_ms', '--warn', 'p95'], ['run_p99_ms', '--bad', 'p99']] },
  ];

  function build() {
    const main = document.getElementById('app');
    if (!main || document.getElementById('charts')) return;
    const sec = document.createElement('section');
    sec.id = 'charts';
    sec.innerHTML =
      '<h2>Charts</h2>' +
      '<div class="chart-controls">' +
      '<label>queue <select id="chart-queue"><option value="">all queues</option></select></label>' +
      '<span class="chart-ranges">' +
      ['hour', 'day', 'week'].map((r) => '<button type="button" class="link" data-range="' + r + '">last ' + r + '</button>').join('') +
      '</span><span id="chart-note" class="muted"></span></div>' +
      '<div class="chart-grid">' +
      CHARTS.map((c) => '<figure class="chart" id="chart-' + c.id + '"><figcaption></figcaption><div class="plot"></div></figure>').join('') +
      '</div>';
    main.insertBefore(sec, main.querySelector('section:not([hidden])') || main.firstChild);
    sec.querySelector('#chart-queue').addEventListener('change', (e) => { state.queue = e.target.value; load(); });
    for (const b of sec.querySelectorAll('[data-range]')) {
      b.addEventListener('click', () => { state.range = b.dataset.range; load(); });
    }
    const header = document.querySelector('header');
    const toggle = document.createElement('button');
    toggle.id = 'theme-toggle';
    toggle.className = 'link theme-toggle';
    toggle.title = 'auto follows the system setting';
    toggle.addEventListener('click', cycleTheme);
    header.appendChild(toggle);
  }

  // ---- data ------------------------------------------------------------------------------
  function token() { return sessionStorage.getItem('homing.token'); }

  async function load() {
    if (state.busy) return;
    state.busy = true;
    try {
      const q = new URLSearchParams({ range: state.range });
      if (state.queue) q.set('queue', state.queue);
      const headers = {};
      if (token()) headers['Authorization'] = 'Bearer ' + token();
      const resp = await fetch('/v1/stats/series?' + q, { headers });
      const body = await resp.json().catch(() => ({}));
      if (!resp.ok) throw new Error((body.error && body.error.message) || resp.statusText);
      state.data = body;
      state.loaded = Date.now();
      fillQueues(body.queues || []);
      note('per ' + (body.step_seconds === 60 ? 'minute' : 'hour') + ', updated ' + new Date().toLocaleTimeString());
      redraw();
    } catch (e) {
      note('charts unavailable: ' + e.message);
    } finally {
      state.busy = false;
    }
  }

  function note(text) {
    const n = document.getElementById('chart-note');
    if (n) n.textContent = text;
  }

  function fillQueues(queues) {
    const sel = document.getElementById('chart-queue');
    const have = new Set([...sel.options].map((o) => o.value));
    for (const q of queues) {
      if (!have.has(q)) sel.appendChild(new Option(q, q));
    }
    sel.value = state.queue;
    for (const b of document.querySelectorAll('#charts [data-range]')) {
      b.classList.toggle('active', b.dataset.range === state.range);
    }
  }

  // ---- drawing ---------------------------------------------------------------------------
  function css(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }

  function redraw() {
    for (const p of state.plots) p.destroy();
    state.plots = [];
    const d = state.data;
    if (!d || typeof uPlot === 'undefined') return;
    const fg = css('--fg'), muted = css('--muted'), line = css('--line');
    const axis = (label) => ({
      stroke: muted, label, labelFont: '12px system-ui', font: '11px system-ui',
      grid: { stroke: line, width: 1 }, ticks: { stroke: line, width: 1 },
    });
    for (const c of CHARTS) {
      const fig = document.getElementById('chart-' + c.id);
      const host = fig.querySelector('.plot');
      host.textContent = '';
      // Percentiles are null where nothing finished; the log scale needs positive values.
      const cols = c.series.map(([key]) => (d[key] || []).map((v) => (v === null ? null : (c.log ? Math.max(v, 0.1) : v))));
      const any = cols.some((col) => col.some((v) => v !== null && v > 0));
      fig.querySelector('figcaption').textContent = c.title + (c.unit === 'ms' ? ' (ms, log scale)' : '') + (any ? '' : ' — nothing yet');
      fig.dataset.points = String(d.t.length);
      fig.dataset.nonzero = any ? '1' : '0';
      const opts = {
        width: Math.max(280, host.clientWidth || 600),
        height: 190,
        cursor: { drag: { x: false, y: false } },
        legend: { live: true },
        scales: { x: { time: true }, y: c.log ? { distr: 3, log: 10 } : { range: (u, min, max) => [0, Math.max(1, max)] } },
        axes: [axis(''), Object.assign(axis(c.unit), { size: 56 })],
        series: [{ label: 'time' }].concat(c.series.map(([key, color, label]) => ({
          label: label || key,
          stroke: css(color) || fg,
          width: 2,
          // Percentiles exist only where something finished: draw each as a point, so a lone
          // period is visible, and never join points across periods with no data.
          points: c.log ? { show: true, size: 5 } : { show: d.t.length <= 60 },
          fill: c.id === 'depth' ? css(color) + '22' : undefined,
          value: (u, v) => (v === null ? '–' : c.unit === 'ms' ? fmtMs(v) : String(v)),
        }))),
      };
      state.plots.push(new uPlot(opts, [d.t].concat(cols), host));
    }
    document.documentElement.dataset.chartsDrawn = String(Date.now());
  }

  function fmtMs(v) {
    if (v >= 60000) return (v / 60000).toFixed(1) + ' min';
    if (v >= 1000) return (v / 1000).toFixed(2) + ' s';
    return v.toFixed(v < 10 ? 1 : 0) + ' ms';
  }

  // ---- wiring ----------------------------------------------------------------------------
  // The app shows itself once a token is accepted; the charts load then, and every
  // CHART_REFRESH_MS after (the rollups move at about that pace anyway).
  function tick() {
    const app = document.getElementById('app');
    if (!app || app.hidden) return;
    build();
    if (Date.now() - state.loaded > CHART_REFRESH_MS) load();
  }
  media.addEventListener('change', () => { if (chosenTheme() === 'auto') applyTheme(); });
  let width = window.innerWidth;
  window.addEventListener('resize', () => { if (Math.abs(window.innerWidth - width) > 40) { width = window.innerWidth; redraw(); } });
  build();
  applyTheme();
  setInterval(tick, 1000);
  tick();
})();
