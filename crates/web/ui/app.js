// daqflow web UI: vanilla JavaScript, no build step, nothing loaded from elsewhere.
// The API it uses is documented in docs/web.md.
'use strict';

(() => {
  // The transition buttons (#btn-NAME). Which ones the system's state allows is the server's to
  // say: the status's `web.transitions` (Transition::allowed_from); the operator refuses the rest.
  const TRANSITIONS = ['configure', 'start', 'pause', 'resume', 'stop', 'reset'];

  const $ = (id) => document.getElementById(id);

  // Who this page is: the server gives the browser a session cookie (HttpOnly: this script
  // never sees it) when the page loads, or at a login with the web token. The API names clients
  // only by labels ("client 3"); `me` is this page's own.
  const ui = {
    status: null,
    control: { controlled: false, holder: null, since_ms: null, you: false, me: null, may_control: null },
    events: null,
    busy: false,
    view: 'run',
    processes: [],
    listen: null,
    selectedRun: null,
    // The components' typed schemas (GET /api/schema), and when they were asked for.
    schemas: {},
    schemaNames: null,
    schemaAsked: 0,
    paramState: null,
  };

  // ---- helpers ------------------------------------------------------------------------------
  /** Creates an element: el('td', {className: 'num'}, 'text', child…). Text is never HTML. */
  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    if (props) {
      for (const [k, v] of Object.entries(props)) {
        if (k === 'dataset') Object.assign(node.dataset, v);
        else if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
        else node[k] = v;
      }
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      node.append(c instanceof Node ? c : String(c));
    }
    return node;
  }

  function replaceRows(tbody, rows) {
    tbody.replaceChildren(...rows);
  }

  async function api(method, path, body) {
    // Every POST carries X-Daqflow-Client: a header other sites' pages cannot send here.
    const options = { method, headers: method === 'GET' ? {} : { 'X-Daqflow-Client': 'ui' } };
    if (body !== undefined) {
      options.headers['Content-Type'] = 'application/json';
      options.body = JSON.stringify(body);
    }
    const response = await fetch(path, options);
    let data = null;
    try { data = await response.json(); } catch (_) { /* not JSON */ }
    if (!response.ok) {
      const error = new Error((data && data.error) || `${response.status} ${response.statusText}`);
      error.status = response.status;
      error.data = data;
      throw error;
    }
    return data;
  }

  let bannerTimer = null;
  function showError(message) {
    const banner = $('error-banner');
    banner.textContent = message;
    banner.hidden = false;
    clearTimeout(bannerTimer);
    bannerTimer = setTimeout(() => { banner.hidden = true; }, 8000);
  }

  // One number format everywhere on the page, axes included: counts and rates of 1,000 and
  // more with thousands separators (en-US: "23,353"); identifiers (run numbers, pids, ports,
  // event ids) as they are.
  const isNum = (x) => typeof x === 'number' && Number.isFinite(x);
  const grouped = new Intl.NumberFormat('en-US', { maximumFractionDigits: 0 });
  function fmtInt(x) { return isNum(x) ? grouped.format(Math.round(x)) : '–'; }
  /** A rate or a mean: whole from 100 on (separated from 1,000), else 1 or 2 decimals. */
  function fmtRate(x) {
    if (!isNum(x)) return '–';
    if (x === 0) return '0';
    const a = Math.abs(x);
    if (a >= 100) return fmtInt(x);
    if (a >= 10) return x.toFixed(1);
    return x.toFixed(2);
  }
  /** A value of unknown scale, to 4 significant digits at most ("499.1", "0.01235", "23,353"). */
  function fmtValue(x) {
    if (!isNum(x)) return '–';
    const a = Math.abs(x);
    if (a >= 1000 || Number.isInteger(x)) return fmtInt(x);
    if (a < 1e-4) return x.toExponential(3);
    return String(Number(x.toPrecision(4)));
  }
  /** Bytes in decimal units, as the alarm conditions take them: "82.7 GB", "512 B". */
  function fmtBytes(x) {
    if (!isNum(x)) return '–';
    for (const [unit, scale] of [['TB', 1e12], ['GB', 1e9], ['MB', 1e6], ['kB', 1e3]]) {
      if (Math.abs(x) >= scale) return `${(x / scale).toFixed(1)} ${unit}`;
    }
    return `${Math.round(x)} B`;
  }
  function fmtDuration(seconds) {
    if (!isNum(seconds)) return '–';
    const s = Math.max(0, Math.floor(seconds));
    const h = Math.floor(s / 3600);
    const m = Math.floor((s % 3600) / 60);
    const pad = (n) => String(n).padStart(2, '0');
    return `${h}:${pad(m)}:${pad(s % 60)}`;
  }
  function fmtTime(ms, withMs) {
    if (!isNum(ms)) return '–';
    const d = new Date(ms);
    const pad = (n, w = 2) => String(n).padStart(w, '0');
    const date = `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}`;
    const time = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
    return withMs ? `${date} ${time}.${pad(d.getMilliseconds(), 3)}` : `${date} ${time}`;
  }
  function clock(ms) {
    if (!isNum(ms)) return '';
    return fmtTime(ms).slice(11);
  }
  function stateBadge(state) {
    return el('span', { className: 'state', dataset: { state: state || '' } }, state || '–');
  }
  function visible(view) { return ui.view === view && !document.hidden; }

  // ---- tabs ---------------------------------------------------------------------------------
  const loaders = {};
  function showView(view) {
    if (!$('view-' + view)) view = 'run';
    ui.view = view;
    for (const b of document.querySelectorAll('#tabs button')) b.classList.toggle('active', b.dataset.view === view);
    for (const s of document.querySelectorAll('main .view')) s.classList.toggle('active', s.id === 'view-' + view);
    if (location.hash !== '#' + view) history.replaceState(null, '', '#' + view);
    if (loaders[view]) loaders[view]();
  }
  for (const b of document.querySelectorAll('#tabs button')) b.addEventListener('click', () => showView(b.dataset.view));

  // ---- live updates -------------------------------------------------------------------------
  function setConnected(up) {
    const c = $('conn-state');
    c.className = 'conn ' + (up ? 'up' : 'down');
    c.title = 'live updates: ' + (up ? 'connected' : 'disconnected, retrying');
  }

  function connectEvents() {
    if (ui.events) ui.events.close();
    const events = new EventSource('/api/events');
    ui.events = events;
    events.addEventListener('open', () => setConnected(true));
    events.addEventListener('error', () => setConnected(false));
    events.addEventListener('status', (e) => onStatus(JSON.parse(e.data)));
    events.addEventListener('control', (e) => onControl(JSON.parse(e.data)));
    events.addEventListener('transition', (e) => onTransition(JSON.parse(e.data)));
  }

  function onStatus(s) {
    ui.status = s;
    $('system-name').textContent = s.system || '';
    const state = s.state || '–';
    const badge = $('system-state');
    badge.textContent = state;
    badge.dataset.state = state;
    $('run-number').textContent = isNum(s.run) && s.run > 0 ? s.run : '–';
    $('stat-state').textContent = state;
    $('stat-run').textContent = isNum(s.run) && s.run > 0 ? s.run : '–';
    $('stat-duration').textContent = fmtDuration(s.duration_s);
    $('stat-events').textContent = fmtInt(s.events);
    $('stat-recorded').textContent = fmtInt(s.recorded);
    $('stat-eps').textContent = fmtRate(s.events_per_s);
    $('stat-mbps').textContent = fmtRate(s.mb_per_s);
    // Lost: while a run is open, the events the trigger's accounting gave up on so far (each
    // with its reason); after the stop, the run's whole accounting.
    $('stat-lost').textContent = fmtInt(s.lost);
    $('stat-lost-note').textContent = lostNote(s);
    $('last-error').hidden = !s.last_error;
    $('last-error').textContent = s.last_error ? 'Last error: ' + s.last_error : '';
    renderComponents(Array.isArray(s.components) ? s.components : [], s.degraded || {});
    renderSlowValues(Array.isArray(s.components) ? s.components : []);
    renderDegraded(s.degraded || {});
    renderParams(s);
    if (s.web && 'holder' in s.web) {
      const holder = s.web.holder ?? null;
      onControl({
        ...ui.control,
        controlled: !!s.web.controlled,
        holder,
        since_ms: s.web.control_since_ms ?? null,
        you: holder !== null && holder === ui.control.me,
      });
    }
    updateButtons();
    if (visible('rates')) drawRates();
  }

  /** What the Lost card's number is: so far in the open run, or the last run's accounting. */
  function lostNote(s) {
    if (!isNum(s.lost)) return s.running ? 'no trigger counts' : 'no run yet';
    if (s.running) return 'so far (trigger)';
    const last = s.last_summary;
    const bound = last && last.accounting_complete === false ? ', at least' : '';
    return `in run ${last ? last.run : (s.run ?? '')}${bound}`;
  }

  /** A component's row. Every kind reports the same counters in `stats` (events and bytes in
   * the sense of its role, and their rates); its own figures are in `stats.detail`. */
  function renderComponents(components, degraded) {
    const rows = components.map((c) => {
      const stats = c.stats || {};
      const restarts = c.restarts > 0 ? ` (restarted ${c.restarts}×)` : '';
      const out = c.name in degraded ? el('span', { className: 'out-of-run', title: degraded[c.name] }, 'out of the run') : null;
      const title = [`role: ${c.role}`, `policy: ${c.policy}`, `process ${c.alive ? 'runs' : 'ended'}`,
        ...(c.cpus ? [`CPUs: ${c.cpus}`] : []),
        `in ${c.state} since ${fmtTime(c.since_ms)}`, JSON.stringify(stats, null, 1)].join('\n');
      return el('tr', { className: c.error ? 'error' : '', title },
        el('td', null, c.name),
        el('td', null, c.kind),
        el('td', null, c.host),
        el('td', { className: 'num' }, c.pid ?? ''),
        el('td', null, stateBadge(c.state), throttleBadge(stats), restarts, out),
        el('td', { className: 'num' }, c.run ?? ''),
        el('td', { className: 'num' }, fmtInt(stats.events)),
        el('td', { className: 'num' }, fmtRate(stats.events_per_s)),
        el('td', { className: 'num' }, fmtRate(stats.mb_per_s)),
        el('td', { className: 'error-text' }, c.error || ''));
    });
    if (rows.length === 0) rows.push(el('tr', null, el('td', { colSpan: 10, className: 'hint' }, 'No components.')));
    replaceRows($('components'), rows);
  }

  const SEVERITIES = ['NO_ALARM', 'MINOR', 'MAJOR', 'INVALID'];

  /** Every component's slow values (`stats.slow`: an EPICS PV), one row each: its value in its
   * source's unit (none while disconnected: never a stale number), the source's severity and
   * status, and when the source took it. Hidden while no component has any. */
  function renderSlowValues(components) {
    const rows = [];
    for (const c of components) {
      const slow = (c.stats && c.stats.slow) || {};
      for (const name of Object.keys(slow).sort()) {
        const v = slow[name] || {};
        // Six significant digits: a high voltage of 1512.5 V is not 1,513.
        const number = isNum(v.value) ? (Number.isInteger(v.value) ? fmtInt(v.value) : String(Number(v.value.toPrecision(6)))) : '–';
        const value = isNum(v.value) && v.unit ? `${number} ${v.unit}` : number;
        const severity = isNum(v.severity)
          ? el('span', { className: 'severity', dataset: { severity: String(v.severity) } }, SEVERITIES[v.severity] || String(v.severity))
          : '';
        const age = isNum(v.at_ms) ? `${fmtTime(v.at_ms)} (${fmtValue(Math.max(0, (Date.now() - v.at_ms) / 1000))} s ago)` : '–';
        rows.push(el('tr', { dataset: { slow: `${c.name}.${name}` } },
          el('td', null, c.name),
          el('td', null, name),
          el('td', { className: 'num' }, value),
          el('td', null, severity),
          el('td', null, v.status || ''),
          el('td', null, age)));
      }
    }
    $('slow-box').hidden = rows.length === 0;
    replaceRows($('slow-values'), rows);
  }

  /** The components the run goes on without (degraded running), in a banner. */
  function renderDegraded(degraded) {
    const names = Object.keys(degraded);
    $('degraded').hidden = names.length === 0;
    $('degraded').textContent = names.length === 0 ? ''
      : 'Degraded: the run goes on without ' + names.map((n) => `${n} (${degraded[n]})`).join(', ');
  }

  /** The parameters form: the system's components, the keys of the one chosen that may be set
   * now (every key while Initial, the live ones in their states after configure: its kind's
   * schema, `GET /api/schema`), what the key typed takes, and the overrides in force. */
  function renderParams(s) {
    const select = $('param-component');
    const names = (s.components || []).map((c) => c.name);
    const have = Array.from(select.options).map((o) => o.value);
    if (names.join('\n') !== have.join('\n')) {
      const chosen = select.value;
      select.replaceChildren(...names.map((n) => el('option', { value: n }, n)));
      if (names.includes(chosen)) select.value = chosen;
    }
    // A component of a kind the operator does not know publishes its schema once it has
    // joined: asked again until every component has one (at most every 5 s).
    const missing = names.some((n) => !ui.schemas[n]);
    if (names.join('\n') !== ui.schemaNames || (missing && Date.now() - ui.schemaAsked > 5000)) {
      ui.schemaNames = names.join('\n');
      loadSchemas();
    }
    ui.paramState = s.state;
    renderParamKeys();
    const overrides = s.overrides || {};
    $('param-overrides').replaceChildren(...Object.keys(overrides).sort()
      .map((k) => el('li', null, `${k} = ${JSON.stringify(overrides[k])}`)));
  }

  async function loadSchemas() {
    ui.schemaAsked = Date.now();
    try {
      ui.schemas = await api('GET', '/api/schema') || {};
    } catch (_) { /* watching without a session where none may: the form stays free text */ }
    renderParamKeys();
  }

  /** A key's values as the docs' tables show them: "0 … 1,000,000,000 Hz", "`fixed`, `uniform`". */
  function keyValues(k) {
    const unit = k.unit ? ` ${k.unit}` : '';
    switch (k.type) {
      case 'integer': case 'float': return `${fmtValue(k.min)} … ${fmtValue(k.max)}${unit}`;
      case 'bool': return 'true or false';
      case 'choice': return (k.values || []).join(', ');
      case 'address': return 'HOST:PORT';
      case 'addresses': return 'HOST:PORT[,HOST:PORT…]';
      case 'list': return 'a list';
      case 'cpus': return 'CPUs [0, 1]';
      default: return k.type;
    }
  }

  /** The keys the chosen component takes now, in the key box's list, and what the key typed
   * takes. */
  function renderParamKeys() {
    const schema = ui.schemas[$('param-component').value];
    const state = ui.paramState;
    const initial = state === 'Initial';
    const keys = !schema ? [] : schema.keys.filter((k) => k.name !== 'system_digest'
      && (initial || (k.live || []).includes(state)));
    const list = keys.map((k) => k.name).join('\n');
    if ($('param-keys').dataset.keys !== list) {
      $('param-keys').dataset.keys = list;
      $('param-keys').replaceChildren(...keys.map((k) => el('option', { value: k.name }, keyValues(k))));
    }
    const key = $('param-key').value.trim();
    const k = schema && schema.keys.find((x) => x.name === key);
    let about = '';
    if (!schema) {
      about = '';
    } else if (!key) {
      about = keys.length ? `${keys.length} key(s) may be set now: ${keys.map((x) => x.name).join(', ')}`
        : `${schema.kind}: no parameter may change while ${state}`;
    } else if (!k) {
      about = `${schema.kind} has no key \`${key}\``;
    } else {
      const live = (k.live || []).length ? `live while ${k.live.join(', ')}` : 'not live: set it while Initial, for the next configure';
      const dflt = k.default !== undefined ? `; default ${JSON.stringify(k.default)}` : '';
      about = `${k.name}: ${keyValues(k)}${dflt}; ${live}. ${k.doc}`;
    }
    $('param-about').textContent = about;
  }

  $('param-component').addEventListener('change', renderParamKeys);
  $('param-key').addEventListener('input', renderParamKeys);

  /** A value typed in the form: JSON when it reads as JSON (500, true, "x", [1,2]), else text. */
  function paramValue(text) {
    try { return JSON.parse(text); } catch (_) { return text; }
  }

  $('param-form').addEventListener('submit', async (e) => {
    e.preventDefault();
    const component = $('param-component').value;
    const key = $('param-key').value.trim();
    const text = $('param-value').value.trim();
    if (!component || !key || !text) return;
    setResult('param-result', 'setting…', 'pending');
    try {
      await api('POST', '/api/set', { component, key, value: paramValue(text) });
      setResult('param-result', `${component}.${key} = ${text}`, 'ok');
    } catch (err) {
      setResult('param-result', err.message, 'error');
    }
  });

  // ---- disk throttling -----------------------------------------------------------------------
  /** "throttled (disk)" for a component whose disk is above its high water mark
   * (`stats.detail.throttled`, the recorder's and the BU's): it takes no events until its disk
   * is below the low mark. Nothing otherwise. */
  function throttleBadge(stats) {
    const d = (stats && stats.detail) || {};
    if (d.throttled !== true) return '';
    const free = isNum(d.disk_free_bytes) ? `${(d.disk_free_bytes / 1048576).toFixed(1)} MiB free` : 'disk above its high mark';
    const used = isNum(d.disk_used_pct) ? `, ${d.disk_used_pct.toFixed(1)} % used` : '';
    const times = isNum(d.throttle_count) ? `; throttled ${d.throttle_count}× in this run` : '';
    return el('span', { className: 'throttled', title: `Disk throttling: ${free}${used}${times}` }, 'throttled (disk)');
  }

  // ---- control ownership --------------------------------------------------------------------
  function iControl() { return !!ui.control.you; }

  const capital = (text) => text.charAt(0).toUpperCase() + text.slice(1);

  function onControl(c) {
    ui.control = {
      controlled: !!c.controlled,
      holder: c.holder ?? null,
      since_ms: c.since_ms ?? null,
      you: !!c.you,
      me: c.me ?? ui.control.me,
      may_control: c.may_control ?? ui.control.may_control,
    };
    const text = $('controller');
    if (!ui.control.controlled) text.textContent = 'Nobody controls';
    else if (iControl()) text.textContent = `You control (since ${clock(ui.control.since_ms)})`;
    else text.textContent = `${capital(String(ui.control.holder || 'a client'))} controls (since ${clock(ui.control.since_ms)})`;
    document.body.classList.toggle('controlling', iControl());
    if (ui.alarms) renderAlarms(ui.alarms);
    $('control-hint').hidden = iControl() || !ui.control.may_control;
    $('login-form').hidden = ui.control.may_control !== false;
    updateButtons();
  }

  function updateButtons() {
    const mine = iControl();
    const allowed = (ui.status && ui.status.web && ui.status.web.transitions) || [];
    for (const name of TRANSITIONS) $('btn-' + name).disabled = !mine || ui.busy || !allowed.includes(name);
    $('start-run').disabled = $('btn-start').disabled;
    $('btn-take').disabled = mine || !ui.control.may_control;
    $('btn-release').disabled = !mine;
    $('command-send').disabled = !mine;
    $('param-set').disabled = !mine || ui.busy;
  }

  async function takeControl(force) {
    try {
      onControl(await api('POST', '/api/control/take', { force: !!force }));
    } catch (e) {
      if (e.status === 409 && !force && e.data) {
        const question = `${capital(String(e.data.holder))} controls since ${fmtTime(e.data.since_ms)}.\n` +
          'Take control from it? It will only watch from then on.';
        if (window.confirm(question)) return takeControl(true);
        return undefined;
      }
      showError('Take control: ' + e.message);
    }
    return undefined;
  }

  async function releaseControl() {
    try {
      onControl(await api('POST', '/api/control/release', {}));
    } catch (e) {
      showError('Release control: ' + e.message);
    }
  }

  $('btn-take').addEventListener('click', () => takeControl(false));
  $('btn-release').addEventListener('click', releaseControl);

  // ---- login --------------------------------------------------------------------------------
  // With a web token configured, a page opened without it only watches (or, if the server
  // wants the token to watch too, sees nothing) until it logs in: the URL the operator prints
  // (/?token=…) does it, or this form.
  async function refreshControl() {
    try {
      onControl(await api('GET', '/api/control'));
      return true;
    } catch (e) {
      if (e.status === 403) {
        $('login-form').hidden = false;
        $('login-result').textContent = 'This server shows nothing without the web token.';
        setConnected(false);
      } else {
        showError('Control: ' + e.message);
      }
      return false;
    }
  }

  $('login-form').addEventListener('submit', async (e) => {
    e.preventDefault();
    const token = $('login-token').value.trim();
    $('login-result').textContent = 'logging in…';
    try {
      await api('POST', '/api/login', { token });
      connectEvents();
      await refreshControl();
      if (loaders[ui.view]) loaders[ui.view]();
      $('login-token').value = '';
      $('login-result').textContent = '';
    } catch (err) {
      $('login-result').textContent = err.message;
    }
  });

  /**
   * A page loaded with `?token=` still in its address was refused: the server sends a right
   * token's browser on to `/` (the token out of the address bar) and answers a wrong or stale
   * one (an earlier start's URL: the operator makes a new token at every start) with this page
   * and status 403. Say why, take the token out of the address, offer the form.
   */
  function refusedToken() {
    const params = new URLSearchParams(location.search);
    if (!params.has('token')) return null;
    history.replaceState(null, '', location.pathname + location.hash);
    return 'The token in the address was refused: it is not this server\'s web token (an operator ' +
      'makes a new one at every start). Use the URL it printed last, or the token in <data dir>/web-token.';
  }

  /** At start: the page's session, if it has one; without a web token, a new one if it lost it. */
  async function startSession() {
    const refused = refusedToken();
    const watching = await refreshControl();
    if (refused) {
      // Logged in already (a session of before) or not: the reason shows either way.
      if (ui.control.may_control) showError(refused);
      else {
        $('login-form').hidden = false;
        $('login-result').textContent = refused;
      }
    }
    if (watching && !ui.control.may_control) {
      // Without a web token the server gives a session to anyone who asks (a lost one, after
      // the server restarted): ask once, without a token; with one it answers 400 and the
      // form shows.
      try {
        await api('POST', '/api/login', {});
        await refreshControl();
      } catch (_) { /* a token is needed */ }
    }
    if (watching) connectEvents();
  }

  // ---- transitions --------------------------------------------------------------------------
  function setResult(id, text, kind) {
    const r = $(id);
    r.textContent = text;
    r.className = 'result ' + (kind || '');
  }

  /** What a transition's result (TransitionResult) says, in words. */
  function describeResult(result) {
    if (result && typeof result === 'object') {
      if ('started' in result) return `run ${result.started} started`;
      if ('stopped' in result) {
        const s = result.stopped || {};
        return `run ${s.run} ${s.state}: ${fmtInt(s.events)} events built, ${fmtInt(s.recorded)} recorded, ` +
          `${s.accounting_complete === false ? 'at least ' : ''}${fmtInt(s.lost)} lost`;
      }
      if ('configured' in result) return `${Object.keys(result.configured || {}).length} components configured`;
    }
    return 'done';
  }

  async function transition(verb) {
    let arg;
    if (verb === 'start' && $('start-run').value !== '') {
      const run = Number($('start-run').value);
      if (!Number.isInteger(run) || run < 1) {
        setResult('transition-result', 'The run number must be a positive integer.', 'error');
        return;
      }
      arg = { run };
    }
    // Reset is offered only where the state machine allows it (never while Running or
    // Paused); with a run still open (a system in Error or Mixed) it closes the run as failed.
    if (verb === 'reset' && ui.status && ui.status.running
      && !window.confirm(`Reset while run ${ui.status.run} is open? It is closed as failed, without a proper stop.`)) {
      return;
    }
    ui.busy = true;
    updateButtons();
    setResult('transition-result', `${verb}…`, 'pending');
    try {
      const answer = await api('POST', '/api/transition/' + verb, arg);
      setResult('transition-result', `${verb}: ${describeResult(answer.result)}`, 'ok');
      if (verb === 'start') $('start-run').value = '';
    } catch (e) {
      setResult('transition-result', `${verb}: ${e.message}`, 'error');
    } finally {
      ui.busy = false;
      updateButtons();
    }
  }

  function onTransition(t) {
    // Another client's transition: say what happened (ours is reported by its own request).
    if (t.client && t.client === ui.control.me) return;
    const who = t.client || 'another client';
    if (t.ok) setResult('transition-result', `${t.transition} (by ${who}): ${describeResult(t.result)}`, 'ok');
    else setResult('transition-result', `${t.transition} (by ${who}): ${t.error}`, 'error');
  }

  for (const name of TRANSITIONS) $('btn-' + name).addEventListener('click', () => transition(name));

  // ---- plots on canvas ----------------------------------------------------------------------
  function niceStep(range, target) {
    const raw = range / Math.max(1, target);
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const norm = raw / mag;
    const nice = norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10;
    return nice * mag;
  }
  /** A value axis from 0 over `max`: about `target` nice steps, `n` of them up to `top`. */
  function niceAxis(max, target) {
    if (!(max > 0)) return { top: 1, step: 1 / target, n: target };
    const step = niceStep(max, target);
    const n = Math.max(1, Math.ceil(max / step - 1e-9));
    return { top: n * step, step, n };
  }
  /**
   * The tick labels of one axis whose ticks go up to `top` (in absolute value): one style for
   * the whole axis, k from 10,000 on ("4k", "8k", "12k"), M from a million, G from a billion,
   * below that the page's number format ("500", "1,000", "1,500").
   */
  function axisLabels(top) {
    const a = Math.abs(top);
    const [scale, suffix] = a >= 1e9 ? [1e9, 'G'] : a >= 1e6 ? [1e6, 'M'] : a >= 1e4 ? [1e3, 'k'] : [1, ''];
    const format = new Intl.NumberFormat('en-US', { maximumFractionDigits: 2 });
    return (value) => {
      // Round away the floating-point noise of the tick arithmetic (0.9999999999999998).
      const v = Number((value / scale).toPrecision(12));
      if (v === 0) return '0';
      if (Math.abs(v) < 0.01) return v.toPrecision(2) + suffix;
      return format.format(v) + suffix;
    };
  }

  /** Sizes a canvas to its box and the screen's pixel ratio; returns its context or null. */
  function prepareCanvas(canvas) {
    const width = canvas.clientWidth;
    const height = canvas.clientHeight;
    if (width === 0 || height === 0) return null;
    const ratio = window.devicePixelRatio || 1;
    if (canvas.width !== Math.round(width * ratio) || canvas.height !== Math.round(height * ratio)) {
      canvas.width = Math.round(width * ratio);
      canvas.height = Math.round(height * ratio);
    }
    const ctx = canvas.getContext('2d');
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    ctx.font = '11px system-ui, sans-serif';
    return { ctx, width, height };
  }

  const cssVar = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim();

  /** A canvas ready to draw on (`prepareCanvas`) and its plot area inside `pad` (pixels on
   * each side): `{ctx, width, height, pad, w, h}`, or null while the canvas is not shown. */
  function plotArea(canvas, pad) {
    const c = prepareCanvas(canvas);
    if (!c) return null;
    return { ...c, pad, w: c.width - pad.left - pad.right, h: c.height - pad.top - pad.bottom };
  }
  const HISTOGRAM_PAD = { left: 52, right: 18, top: 8, bottom: 34 };

  function drawRates() {
    const canvas = $('rates-canvas');
    const rates = (ui.status && ui.status.rates) || [];
    $('rates-empty').hidden = rates.length > 0;
    const area = plotArea(canvas, { left: 64, right: 64, top: 14, bottom: 30 });
    if (!area) return;
    const { ctx, width, height, pad, w, h } = area;
    const points = rates.filter((r) => isNum(r.t_ms));
    const t1 = points.length ? points[points.length - 1].t_ms : Date.now();
    const t0 = points.length > 1 ? Math.min(points[0].t_ms, t1 - 10000) : t1 - 60000;
    // The left axis's nice steps; the right one has as many, of a nice size of its own.
    const axisE = niceAxis(Math.max(0, ...points.map((r) => r.events_per_s || 0)), 5);
    const rawM = Math.max(0, ...points.map((r) => r.mb_per_s || 0));
    const steps = axisE.n;
    const maxE = axisE.top;
    const maxM = rawM > 0 ? niceStep(rawM / steps, 1) * steps : 1;
    const x = (t) => pad.left + ((t - t0) / Math.max(1, t1 - t0)) * w;
    const yE = (v) => pad.top + h - (v / maxE) * h;
    const yM = (v) => pad.top + h - (v / maxM) * h;

    // grid and axes (their labels also in the canvas's data-y-ticks, data-y2-ticks)
    ctx.strokeStyle = '#e3e7eb';
    ctx.fillStyle = '#66727f';
    ctx.lineWidth = 1;
    const labelE = axisLabels(maxE);
    const labelM = axisLabels(maxM);
    const yTicks = []; const y2Ticks = [];
    for (let i = 0; i <= steps; i++) {
      const y = pad.top + (h * i) / steps;
      ctx.beginPath(); ctx.moveTo(pad.left, y); ctx.lineTo(pad.left + w, y); ctx.stroke();
      ctx.textAlign = 'right'; ctx.textBaseline = 'middle';
      yTicks.push(labelE(maxE * (1 - i / steps)));
      ctx.fillText(yTicks[i], pad.left - 6, y);
      ctx.textAlign = 'left';
      y2Ticks.push(labelM(maxM * (1 - i / steps)));
      ctx.fillText(y2Ticks[i], pad.left + w + 6, y);
    }
    canvas.dataset.yTicks = yTicks.reverse().join(' ');
    canvas.dataset.y2Ticks = y2Ticks.reverse().join(' ');
    ctx.textAlign = 'center'; ctx.textBaseline = 'top';
    const span = (t1 - t0) / 1000;
    const tStep = niceStep(span, 6);
    const labelT = axisLabels(span);
    for (let s = 0; s <= span + 1e-9; s += tStep) {
      const t = t1 - s * 1000;
      ctx.fillText(s === 0 ? 'now' : `−${labelT(s)} s`, x(t), pad.top + h + 8);
    }
    ctx.strokeStyle = '#9aa5b1';
    ctx.strokeRect(pad.left, pad.top, w, h);

    const line = (value, y, color) => {
      if (points.length === 0) return;
      ctx.strokeStyle = color; ctx.lineWidth = 2; ctx.beginPath();
      points.forEach((r, i) => {
        const px = x(r.t_ms); const py = y(value(r) || 0);
        if (i === 0) ctx.moveTo(px, py); else ctx.lineTo(px, py);
      });
      ctx.stroke();
    };
    line((r) => r.mb_per_s, yM, cssVar('--mbps') || '#d9822b');
    line((r) => r.events_per_s, yE, cssVar('--eps') || '#2563a8');
  }
  loaders.rates = drawRates;
  window.addEventListener('resize', () => { if (visible('rates')) drawRates(); });

  /**
   * The part of a distribution's range to draw: from `low` to the first tick at or above the
   * largest value filled (the monitor's `max`, else the last bin with entries), snapped to a
   * bin edge, so that events of 3 to 6 kB are not squeezed into the left third of a 0 … 16k
   * axis; the whole range when something overflowed or nothing is filled. `[high, bins]`.
   */
  function shownRange(hist, low, high, bins) {
    if (hist.series || bins.length === 0 || hist.overflow > 0) return [high, bins.length];
    const bw = (high - low) / bins.length;
    let last = bins.length - 1;
    while (last >= 0 && !(bins[last] > 0)) last--;
    if (last < 0) return [high, bins.length];
    const top = Math.max(isNum(hist.max) ? hist.max : low, low + (last + 1) * bw);
    const step = niceStep(top - low, 5);
    const edge = low + Math.ceil((Math.ceil((top - low) / step) * step) / bw - 1e-9) * bw;
    const n = Math.min(bins.length, Math.max(1, Math.round((edge - low) / bw)));
    return [low + n * bw, n];
  }

  function drawHistogram(canvas, hist, reference) {
    const area = plotArea(canvas, HISTOGRAM_PAD);
    if (!area) return;
    const { ctx, width, height, pad, w, h } = area;
    const all = Array.isArray(hist.bins) ? hist.bins.map(Number) : [];
    const low = Number(hist.low) || 0;
    const full = Number.isFinite(Number(hist.high)) && Number(hist.high) > low ? Number(hist.high) : low + Math.max(1, all.length);
    const [high, n] = shownRange(hist, low, full, all);
    const bins = all.slice(0, n);
    // The y axis: linear from 0 with nice steps, or (the view's "log y", a distribution only)
    // logarithmic from 1 to the first power of ten at or above the largest bin. `frac(v)` is a
    // count's height as a share of the plot's; the tick labels are also in data-y-ticks.
    const log = ui.logY && !hist.series;
    const axisY = niceAxis(Math.max(0, ...bins), 4);
    const decades = Math.max(1, Math.ceil(Math.log10(Math.max(1, ...bins)) - 1e-9));
    const maxY = log ? 10 ** decades : axisY.top;
    const frac = log ? (v) => (v >= 1 ? Math.log10(v) / decades : 0) : (v) => Math.max(0, v) / maxY;
    ctx.strokeStyle = '#e3e7eb'; ctx.fillStyle = '#66727f'; ctx.lineWidth = 1;
    const labelY = axisLabels(maxY);
    const ticksY = log ? Array.from({ length: decades + 1 }, (_, i) => 10 ** (decades - i))
      : Array.from({ length: axisY.n + 1 }, (_, i) => maxY * (1 - i / axisY.n));
    ticksY.forEach((t, i) => {
      const y = pad.top + (h * i) / (ticksY.length - 1);
      ctx.beginPath(); ctx.moveTo(pad.left, y); ctx.lineTo(pad.left + w, y); ctx.stroke();
      ctx.textAlign = 'right'; ctx.textBaseline = 'middle';
      ctx.fillText(labelY(t), pad.left - 6, y);
    });
    canvas.dataset.yTicks = ticksY.map(labelY).reverse().join(' ');
    canvas.dataset.scale = log ? 'log' : 'linear';
    if (bins.length > 0) {
      const bw = w / bins.length;
      ctx.fillStyle = cssVar('--eps') || '#2563a8';
      bins.forEach((v, i) => {
        const bh = frac(v) * h;
        ctx.fillRect(pad.left + i * bw + (bw > 3 ? 0.5 : 0), pad.top + h - bh, Math.max(1, bw - (bw > 3 ? 1 : 0)), bh);
      });
      // A reference run's histogram of the same binning, scaled to as many entries in the bins
      // as this one's, as a step line over the bars (its run and scale in data-reference).
      const ref = reference && sameBinning(reference.hist, hist) ? reference.hist.bins.map(Number).slice(0, n) : null;
      delete canvas.dataset.reference;
      if (ref) {
        const total = (v) => v.reduce((a, b) => a + Math.max(0, b), 0);
        const scale = total(ref) > 0 ? total(bins) / total(ref) : 0;
        canvas.dataset.reference = `run ${reference.run} ×${scale.toPrecision(3)}`;
        ctx.strokeStyle = cssVar('--reference') || '#c2410c'; ctx.lineWidth = 1.5; ctx.beginPath();
        ref.forEach((v, i) => {
          const y = pad.top + h - Math.min(1, frac(Math.max(0, v) * scale)) * h;
          if (i === 0) ctx.moveTo(pad.left, y); else ctx.lineTo(pad.left + i * bw, y);
          ctx.lineTo(pad.left + (i + 1) * bw, y);
        });
        ctx.stroke(); ctx.lineWidth = 1;
      }
    }
    // The x axis's ticks, also in the canvas's data-x-ticks (the tests read them).
    canvas.dataset.xTicks = drawXTicks(ctx, pad, w, h, low, high).join(' ');
    ctx.textAlign = 'center';
    if (hist.x_label) ctx.fillText(hist.x_label, pad.left + w / 2, pad.top + h + 19);
    ctx.strokeStyle = '#9aa5b1';
    ctx.strokeRect(pad.left, pad.top, w, h);
  }

  /** The x ticks of `low … high` drawn under a plot; returns their labels. */
  function drawXTicks(ctx, pad, w, h, low, high) {
    ctx.fillStyle = '#66727f'; ctx.textBaseline = 'top';
    const xStep = niceStep(high - low, 5);
    const labelX = axisLabels(Math.max(Math.abs(low), Math.abs(high)));
    const ticks = [];
    for (let v = Math.ceil(low / xStep - 1e-9) * xStep; v <= high + xStep * 1e-9; v += xStep) {
      const px = pad.left + ((v - low) / (high - low)) * w;
      ticks.push(labelX(v));
      ctx.textAlign = px > pad.left + w - 12 ? 'right' : 'center';
      ctx.fillText(ticks[ticks.length - 1], Math.min(px, pad.left + w + pad.right - 2), pad.top + h + 4);
    }
    return ticks;
  }

  /**
   * A two-dimensional histogram as a map: each bin a cell whose colour runs from white (0)
   * through the plot blue to dark (the largest count); the scale's top is in the canvas's
   * `data-max`, the axes' labels in `data-x-ticks` and `data-y-ticks`.
   */
  function drawHistogram2D(canvas, hist) {
    const area = plotArea(canvas, HISTOGRAM_PAD);
    if (!area) return;
    const { ctx, width, height, pad, w, h } = area;
    const ax = hist.x || {}; const ay = hist.y || {};
    const nx = Math.max(1, Number(ax.bins) || 1); const ny = Math.max(1, Number(ay.bins) || 1);
    const bins = Array.isArray(hist.bins) ? hist.bins.map(Number) : [];
    const top = Math.max(0, ...bins);
    canvas.dataset.max = String(top);
    const cw = w / nx; const ch = h / ny;
    // The colour of a count on a logarithmic scale (ROOT's COLZ with log z): a pedestal a
    // hundred times higher than the signal does not wash the signal out.
    const span = Math.log(1 + top);
    for (let iy = 0; iy < ny; iy++) {
      for (let ix = 0; ix < nx; ix++) {
        const v = bins[iy * nx + ix] || 0;
        if (v <= 0) continue;
        const f = span > 0 ? Math.min(1, Math.log(1 + v) / span) : 1;
        // white → #2563a8 → #0b1f3a
        const mix = (a, b, t) => Math.round(a + (b - a) * t);
        const [r, g, b] = f < 0.5
          ? [mix(235, 37, f * 2), mix(242, 99, f * 2), mix(250, 168, f * 2)]
          : [mix(37, 11, (f - 0.5) * 2), mix(99, 31, (f - 0.5) * 2), mix(168, 58, (f - 0.5) * 2)];
        ctx.fillStyle = `rgb(${r},${g},${b})`;
        ctx.fillRect(pad.left + ix * cw, pad.top + h - (iy + 1) * ch, Math.ceil(cw), Math.ceil(ch));
      }
    }
    const xLow = Number(ax.low) || 0; const xHigh = Number(ax.high) > xLow ? Number(ax.high) : xLow + nx;
    const yLow = Number(ay.low) || 0; const yHigh = Number(ay.high) > yLow ? Number(ay.high) : yLow + ny;
    canvas.dataset.xTicks = drawXTicks(ctx, pad, w, h, xLow, xHigh).join(' ');
    const yStep = niceStep(yHigh - yLow, 4);
    const labelY = axisLabels(Math.max(Math.abs(yLow), Math.abs(yHigh)));
    const yTicks = [];
    ctx.textAlign = 'right'; ctx.textBaseline = 'middle';
    for (let v = Math.ceil(yLow / yStep - 1e-9) * yStep; v <= yHigh + yStep * 1e-9; v += yStep) {
      const py = pad.top + h - ((v - yLow) / (yHigh - yLow)) * h;
      yTicks.push(labelY(v));
      ctx.fillText(yTicks[yTicks.length - 1], pad.left - 6, py);
    }
    canvas.dataset.yTicks = yTicks.join(' ');
    ctx.textAlign = 'center'; ctx.textBaseline = 'top';
    const labels = [ax.label, ay.label].filter(Boolean).join(' × ');
    if (labels) ctx.fillText(labels, pad.left + w / 2, pad.top + h + 19);
    ctx.strokeStyle = '#9aa5b1';
    ctx.strokeRect(pad.left, pad.top, w, h);
  }

  /**
   * What a histogram says in words. A distribution: its entries, under- and overflow, and the
   * mean, lowest and highest of the values filled (the monitor's true sums, not the bins'
   * centres). A series (`rate`): the events of the seconds shown and their mean per second.
   */
  function histogramFacts(hist) {
    const members = Array.isArray(hist.members) ? ` · sum of ${hist.members.join(', ')}` : '';
    if (hist.kind === 'counter') return `${hist.unit || 'count'}${members}`;
    if (hist.kind === 'h2') {
      return `entries ${fmtInt(hist.entries)} · outside ${fmtInt(hist.outside)} · largest bin ${fmtInt(Math.max(0, ...(hist.bins || []).map(Number)))}${members}`;
    }
    return histogramFacts1(hist) + members;
  }

  function histogramFacts1(hist) {
    const unit = hist.unit ? ` ${hist.unit}` : '';
    const spread = isNum(hist.min) && isNum(hist.max) ? ` (lowest ${fmtRate(hist.min)}, highest ${fmtRate(hist.max)})` : '';
    const mean = isNum(hist.mean) ? ` · mean ${fmtRate(hist.mean)}${unit}${spread}` : '';
    if (hist.series) {
      const seconds = Array.isArray(hist.bins) ? hist.bins.length : 0;
      if (seconds === 0) return 'no whole second yet';
      return `${fmtInt(hist.entries)} events in the last ${fmtInt(seconds)} s${mean}`;
    }
    return `entries ${fmtInt(hist.entries)} · underflow ${fmtInt(hist.underflow)} · overflow ${fmtInt(hist.overflow)}${mean}`;
  }

  /** Whether two published one-dimensional histograms have the same bins. */
  function sameBinning(a, b) {
    return a && b && Number(a.low) === Number(b.low) && Number(a.high) === Number(b.high) &&
      Array.isArray(a.bins) && Array.isArray(b.bins) && a.bins.length === b.bins.length;
  }

  /**
   * The cards of the histograms `list` (as `/api/histograms` gives them) into `container`:
   * bars for a distribution, a map for a two-dimensional histogram, the number for a counter;
   * with `reference` (`{run, list}`: a run's saved histograms), each one-dimensional histogram
   * of the same component, name and binning is overlaid with the reference's, and each counter
   * says the reference's value.
   */
  function showHistogramCards(container, list, reference) {
    const refOf = (hist) => {
      if (!reference) return null;
      const r = reference.list.find((x) => x.component === hist.component && x.name === hist.name);
      return r ? { run: reference.run, hist: r } : null;
    };
    const cards = list.map((hist) => {
      const kind = hist.kind === 'h2' || hist.kind === 'counter' ? hist.kind : 'h1';
      const title = `${hist.component || ''} / ${hist.title || hist.name || ''}`;
      const canvas = kind === 'counter'
        ? el('div', { className: 'counter-value' }, fmtInt(hist.value))
        : el('canvas', { className: 'histogram-plot' });
      const ref = refOf(hist);
      let facts = histogramFacts(hist);
      if (ref && kind === 'counter') facts += ` · run ${ref.run}: ${fmtInt(ref.hist.value)}`;
      if (ref && kind === 'h1' && !sameBinning(ref.hist, hist)) facts += ` · run ${ref.run} has other bins: not drawn`;
      const card = el('div', { className: `histogram ${kind}`, dataset: { name: `${hist.component}/${hist.name}`, kind } },
        el('h3', null, title),
        canvas,
        el('div', { className: 'facts' }, facts));
      return { card, canvas, hist, kind, ref };
    });
    container.replaceChildren(...cards.map((c) => c.card));
    for (const c of cards) {
      if (c.kind === 'h2') drawHistogram2D(c.canvas, c.hist);
      else if (c.kind === 'h1') drawHistogram(c.canvas, c.hist, c.ref);
    }
  }

  async function loadHistograms() {
    let list;
    try { list = await api('GET', '/api/histograms'); } catch (e) { showError('Histograms: ' + e.message); return; }
    if (!Array.isArray(list)) list = [];
    $('histograms-empty').hidden = list.length > 0;
    showHistogramCards($('histograms'), list, ui.reference);
  }
  loaders.histograms = loadHistograms;

  // A reference run: its saved histograms (the run record's `summary.histograms`) drawn over
  // the live ones of the same component, name and binning.
  ui.reference = null;
  ui.logY = false;
  $('hist-log').addEventListener('change', () => { ui.logY = $('hist-log').checked; loadHistograms(); });
  async function setReference() {
    const text = $('hist-ref-run').value.trim();
    if (text === '') { clearReference(); return; }
    const run = Number(text);
    if (!Number.isInteger(run) || run < 0) { $('hist-ref-info').textContent = `${text}: not a run number`; return; }
    try {
      const d = await api('GET', '/api/runs/' + run);
      const list = (d.summary && d.summary.histograms) || [];
      ui.reference = { run, list };
      $('hist-ref-info').textContent = list.length
        ? `overlaid: run ${run}'s ${fmtInt(list.length)} histograms at its end, scaled to the live entries`
        : `run ${run} saved no histogram`;
    } catch (e) {
      ui.reference = null;
      $('hist-ref-info').textContent = e.message;
    }
    loadHistograms();
  }
  function clearReference() {
    ui.reference = null;
    $('hist-ref-run').value = '';
    $('hist-ref-info').textContent = '';
    loadHistograms();
  }
  // The run's histograms are drawn when their box opens (a closed box has no size to draw in).
  $('run-histograms-box').addEventListener('toggle', () => {
    if ($('run-histograms-box').open) showHistogramCards($('run-histograms'), ui.runHistograms || [], null);
  });
  $('hist-ref-go').addEventListener('click', setReference);
  $('hist-ref-clear').addEventListener('click', clearReference);
  $('hist-ref-run').addEventListener('keydown', (e) => { if (e.key === 'Enter') setReference(); });

  // ---- ET -----------------------------------------------------------------------------------
  function stationConfig(config, closure) {
    if (!config || typeof config !== 'object') return '';
    const parts = [];
    parts.push(config.blocking === false ? `non-blocking (cue ${config.cue})` : 'blocking');
    if (isNum(config.prescale) && config.prescale !== 1) parts.push(`prescale ${config.prescale}`);
    const sel = config.selection;
    if (closure) parts.push('select: closure');
    else if (sel !== undefined && sel !== 'All') parts.push('select: ' + (typeof sel === 'string' ? sel : JSON.stringify(sel)));
    if (config.single_user) parts.push('single user');
    if (config.restore && config.restore !== 'Output') parts.push(`restore to ${config.restore}`);
    return parts.join(', ');
  }

  async function loadEt() {
    let systems;
    try { systems = await api('GET', '/api/et'); } catch (e) { showError('ET: ' + e.message); return; }
    if (!Array.isArray(systems)) systems = [];
    $('et-empty').hidden = systems.length > 0;
    const blocks = systems.map((sys) => {
      const snap = sys.snapshot || {};
      const stations = Array.isArray(snap.stations) ? snap.stations : [];
      const attachments = Array.isArray(snap.attachments) ? snap.attachments : [];
      const maxQueue = Math.max(1, ...stations.map((s) => s.queued || 0));
      const stationRows = stations.map((s) => el('tr', null,
        el('td', null, s.name, s.group !== null && s.group !== undefined ? ` (group ${s.group})` : ''),
        el('td', null, stationConfig(s.config, s.closure)),
        el('td', { className: 'num' }, fmtInt(s.queued),
          (() => { const b = el('span', { className: 'bar' }); b.style.width = `${Math.round(60 * (s.queued || 0) / maxQueue)}px`; return b; })()),
        el('td', { className: 'num' }, fmtInt(s.events_in)),
        el('td', { className: 'num' }, fmtInt(s.events_out)),
        el('td', { className: 'num' }, fmtInt(s.attachments))));
      const attachmentRows = attachments.map((a) => el('tr', null,
        el('td', { className: 'num' }, a.id), el('td', null, a.station), el('td', { className: 'num' }, a.pid),
        el('td', null, a.remote ? 'remote' : 'local'), el('td', { className: 'num' }, fmtInt(a.held)),
        el('td', { className: 'num' }, fmtInt(a.got)), el('td', { className: 'num' }, fmtInt(a.put)),
        el('td', { className: 'num' }, fmtInt(a.dumped))));
      const head = (...names) => el('thead', null, el('tr', null, ...names.map((n) => el('th', null, n))));
      return el('div', { className: 'et-system' },
        el('h2', null, `${sys.component || ''}: ${snap.name || ''}`),
        el('p', { className: 'facts' },
          `pid ${snap.pid ?? '–'} · ${fmtInt(snap.events)} events of ${fmtInt(snap.event_size)} bytes · ` +
          `${fmtInt(snap.free_events)} free · ${fmtInt(snap.in_transit)} in transit · ${fmtInt(snap.temp_events)} temporary` +
          (snap.remote ? ` · remote access on ${snap.remote}` : '')),
        el('table', { className: 'data et-stations' },
          head('station', 'configuration', 'queued', 'events in', 'events out', 'attachments'),
          el('tbody', null, ...stationRows)),
        el('h3', { className: 'spaced' }, 'Attachments'),
        el('table', { className: 'data et-attachments' },
          head('id', 'station', 'pid', 'where', 'held', 'got', 'put', 'dumped'),
          el('tbody', null, ...attachmentRows)));
    });
    $('et-systems').replaceChildren(...blocks);
  }
  loaders.et = loadEt;

  // ---- processes (DIALOG view) --------------------------------------------------------------
  const list = (x) => (Array.isArray(x) ? x : []);

  function renderProcesses() {
    const filter = $('process-filter').value.trim().toLowerCase();
    const matches = (p) => {
      if (!filter) return true;
      const words = [p.name, p.host, String(p.port ?? ''), String(p.pid ?? ''), ...list(p.provides), ...list(p.subscribes), ...list(p.commands)];
      return words.some((w) => String(w ?? '').toLowerCase().includes(filter));
    };
    const shown = ui.processes.filter(matches);
    const serviceChip = (s) => el('button', { type: 'button', className: 'chip service', title: 'listen', dataset: { service: s }, onclick: () => startListening(s) }, s);
    const commandChip = (c) => el('button', { type: 'button', className: 'chip command', title: 'put in the command form', dataset: { command: c }, onclick: () => { $('command-name').value = c; $('command-data').focus(); } }, c);
    const rows = shown.map((p) => el('tr', null,
      el('td', null, p.name ?? ''), el('td', null, p.host ?? ''), el('td', { className: 'num' }, p.port ?? ''),
      el('td', { className: 'num' }, p.pid ?? ''),
      el('td', null, ...list(p.provides).map(serviceChip)),
      el('td', null, ...list(p.subscribes).map(serviceChip)),
      el('td', null, ...list(p.commands).map(commandChip))));
    if (rows.length === 0) rows.push(el('tr', null, el('td', { colSpan: 7, className: 'hint' }, ui.processes.length ? 'No process matches the filter.' : 'No processes.')));
    replaceRows($('processes'), rows);
    $('process-count').textContent = `${shown.length} of ${ui.processes.length} processes`;
  }

  async function loadProcesses() {
    try {
      const p = await api('GET', '/api/processes');
      ui.processes = Array.isArray(p) ? p : [];
    } catch (e) {
      showError('Processes: ' + e.message);
      return;
    }
    renderProcesses();
    const commands = new Set();
    for (const p of ui.processes) for (const c of list(p.commands)) commands.add(c);
    $('command-list').replaceChildren(...[...commands].sort().map((c) => el('option', { value: c })));
    $('process-list').replaceChildren(...ui.processes.map((p) => el('option', { value: p.name ?? '' })));
  }
  loaders.processes = loadProcesses;
  $('process-filter').addEventListener('input', renderProcesses);
  $('process-refresh').addEventListener('click', loadProcesses);

  function startListening(service) {
    stopListening();
    $('listen-panel').hidden = false;
    $('listen-service').textContent = service;
    $('listen-values').replaceChildren();
    if (ui.control.may_control === false) {
      // The server would refuse (403): a service's values are for logged-in sessions.
      $('listen-state').textContent = 'listening to a service needs a session logged in with the web token: log in above';
      return;
    }
    $('listen-state').textContent = 'connecting…';
    const source = new EventSource(`/api/listen?service=${encodeURIComponent(service)}`);
    ui.listen = source;
    source.addEventListener('subscribed', () => { $('listen-state').textContent = 'live'; });
    source.addEventListener('value', (e) => {
      let text = e.data;
      try { text = JSON.stringify(JSON.parse(e.data), null, 2); } catch (_) { /* plain text */ }
      const values = $('listen-values');
      values.prepend(el('li', null, el('time', null, fmtTime(Date.now(), true).slice(11)), el('pre', null, text)));
      while (values.children.length > 50) values.lastChild.remove();
    });
    source.addEventListener('end', () => { $('listen-state').textContent = 'the service ended'; source.close(); });
    source.addEventListener('error', () => {
      $('listen-state').textContent = source.readyState === EventSource.CLOSED
        ? 'cannot listen (no such service?)' : 'reconnecting…';
    });
  }

  function stopListening() {
    if (ui.listen) ui.listen.close();
    ui.listen = null;
    $('listen-panel').hidden = true;
  }
  $('listen-stop').addEventListener('click', stopListening);

  $('command-form').addEventListener('submit', async (e) => {
    e.preventDefault();
    const name = $('command-name').value.trim();
    if (!name) return;
    setResult('command-result', 'sending…', 'pending');
    try {
      const r = await api('POST', '/api/command', { name, data: $('command-data').value });
      setResult('command-result', `received by ${r.received} process${r.received === 1 ? '' : 'es'}`, 'ok');
    } catch (err) {
      setResult('command-result', err.message, 'error');
    }
  });

  // ---- messages -----------------------------------------------------------------------------
  function localMs(input) {
    if (!input.value) return null;
    const t = new Date(input.value).getTime();
    return Number.isFinite(t) ? t : null;
  }

  let logsLoading = false;
  async function loadLogs() {
    if (logsLoading) return;
    logsLoading = true;
    const q = new URLSearchParams();
    const since = localMs($('log-since'));
    const until = localMs($('log-until'));
    if (since !== null) q.set('since_ms', since);
    if (until !== null) q.set('until_ms', until);
    if ($('log-process').value.trim()) q.set('process', $('log-process').value.trim());
    if ($('log-severity').value) q.set('min_severity', $('log-severity').value);
    if ($('log-text').value) q.set('text', $('log-text').value);
    if ($('log-limit').value) q.set('limit', $('log-limit').value);
    try {
      const records = await api('GET', '/api/logs?' + q.toString());
      const rows = (Array.isArray(records) ? records : []).map((r) => el('tr', null,
        el('td', null, fmtTime(r.t_ms, true)),
        el('td', null, el('span', { className: 'sev sev-' + r.severity }, r.severity)),
        el('td', null, r.process),
        el('td', { className: 'hint' }, r.target),
        el('td', null, r.message)));
      if (rows.length === 0) rows.push(el('tr', null, el('td', { colSpan: 5, className: 'hint' }, 'No messages match.')));
      replaceRows($('logs'), rows);
      $('logs-info').textContent = `${Array.isArray(records) ? records.length : 0} shown, newest first · ${clock(Date.now())}`;
    } catch (e) {
      $('logs-info').textContent = e.message;
    } finally {
      logsLoading = false;
    }
  }
  loaders.messages = loadLogs;
  $('log-filters').addEventListener('submit', (e) => { e.preventDefault(); loadLogs(); });
  for (const id of ['log-since', 'log-until', 'log-severity', 'log-limit']) $(id).addEventListener('change', loadLogs);
  let textTimer = null;
  for (const id of ['log-process', 'log-text']) {
    $(id).addEventListener('input', () => { clearTimeout(textTimer); textTimer = setTimeout(loadLogs, 300); });
  }

  // ---- runs ---------------------------------------------------------------------------------
  // The run database's records (RunRecord): `state` is running, stopped, failed or abandoned;
  // the counts are null until the run is stopped.
  async function loadRuns() {
    let runs;
    try { runs = await api('GET', '/api/runs?limit=100'); } catch (e) { showError('Runs: ' + e.message); return; }
    const rows = (Array.isArray(runs) ? runs : []).map((r) => {
      const duration = isNum(r.stopped_ms) ? (r.stopped_ms - r.started_ms) / 1000 : null;
      const classes = [r.run === ui.selectedRun ? 'selected' : '', r.error ? 'error' : ''].join(' ').trim();
      return el('tr', { className: classes, dataset: { run: r.run }, onclick: () => showRun(r.run) },
        el('td', { className: 'num' }, r.run),
        el('td', null, fmtTime(r.started_ms)),
        el('td', null, isNum(r.stopped_ms) ? fmtTime(r.stopped_ms) : ''),
        el('td', { className: 'num' }, duration === null ? '' : fmtDuration(duration)),
        el('td', null, r.state),
        el('td', { className: 'num' }, fmtInt(r.events)),
        el('td', { className: 'num' }, fmtInt(r.recorded)),
        el('td', { className: 'num' }, fmtInt(r.lost)),
        el('td', { className: 'error-text' }, r.error || ''));
    });
    if (rows.length === 0) rows.push(el('tr', null, el('td', { colSpan: 9, className: 'hint' }, 'No runs yet.')));
    replaceRows($('runs'), rows);
  }

  /** A run's whole record (RunDetail): its row's fields, `config` (the system file) and `summary`. */
  function renderRun(d) {
    const s = d.summary;
    $('run-detail-state').textContent = d.state + (d.error ? `: ${d.error}` : '');
    if (s) {
      const lost = `${s.accounting_complete ? '' : 'at least '}${fmtInt(s.lost)} lost`;
      $('run-facts').textContent = `${fmtDuration(s.seconds)} · triggered ${fmtInt(s.triggered)} · ` +
        `rejected ${fmtInt(s.rejected)} · built ${fmtInt(s.events)} · recorded ${fmtInt(s.recorded)} ` +
        `(${fmtInt(s.bytes)} bytes) · ${lost} · duplicates ${fmtInt(s.duplicates)}`;
    } else {
      $('run-facts').textContent = d.state === 'abandoned'
        ? 'Abandoned: the operator ended without stopping it; there is no summary.' : 'No summary yet.';
    }
    const problems = s ? [
      ...s.lost_reasons.map((l) => `${fmtInt(l.events)} lost: ${l.reason}`),
      ...s.unknown.map((u) => `unknown: ${u}`),
      ...s.died.map((x) => `${x.component} (${x.kind}) died: ${x.why}`),
      ...s.file_problems,
      ...s.errors,
    ] : [];
    $('run-problems').replaceChildren(...problems.map((p) => el('li', null, p)));
    $('run-degraded').replaceChildren(...((s && s.degraded) || []).map((d) => el('li', null, 'went on without ' + d)));
    const changes = (s && s.changes) || [];
    const changeRows = changes.map((c) => el('tr', null, el('td', null, fmtTime(c.t_ms)), el('td', null, c.component),
      el('td', { className: 'mono' }, c.key), el('td', { className: 'mono' }, JSON.stringify(c.value))));
    if (changeRows.length === 0) changeRows.push(el('tr', null, el('td', { colSpan: 4, className: 'hint' }, 'No live changes in this run.')));
    replaceRows($('run-changes'), changeRows);
    const files = s ? s.files : [];
    const fileRows = files.map((f) => el('tr', null,
      el('td', null, f.component), el('td', { className: 'mono' }, f.path),
      el('td', { className: 'num' }, fmtInt(f.events)), el('td', { className: 'num' }, fmtInt(f.bytes)),
      el('td', { className: 'num' }, isNum(f.first_event) ? `${f.first_event}–${f.last_event}` : ''),
      el('td', null, f.complete ? 'yes' : 'no (left open)')));
    if (fileRows.length === 0) fileRows.push(el('tr', null, el('td', { colSpan: 6, className: 'hint' }, 'No data files.')));
    replaceRows($('run-files'), fileRows);
    const hists = (s && s.histograms) || [];
    $('run-histograms-empty').hidden = hists.length > 0;
    ui.runHistograms = hists;
    showHistogramCards($('run-histograms'), hists, null);
    $('run-config').textContent = d.config;
    $('run-record').textContent = JSON.stringify(d, null, 2);
    renderProvenance(d);
  }

  async function showRun(run) {
    ui.selectedRun = run;
    for (const tr of $('runs').children) tr.classList.toggle('selected', tr.dataset.run === String(run));
    $('run-detail').hidden = false;
    $('run-detail-number').textContent = run;
    for (const id of ['run-detail-state', 'run-facts', 'run-config', 'run-record']) $(id).textContent = '';
    $('run-facts').textContent = 'loading…';
    $('run-problems').replaceChildren();
    $('run-degraded').replaceChildren();
    replaceRows($('run-files'), []);
    replaceRows($('run-changes'), []);
    $('run-histograms').replaceChildren();
    try {
      renderRun(await api('GET', '/api/runs/' + encodeURIComponent(run)));
    } catch (e) {
      $('run-facts').textContent = e.message;
    }
  }
  loaders.runs = loadRuns;

  // ---- run provenance -----------------------------------------------------------------------
  // A run's configuration (RunDetail's `config`, `provenance` and `changes`) and a line diff of
  // it against another run's, computed here from the two records (docs/web.md, "Runs").
  ui.shownRun = null;

  /** `COMPONENT.KEY = VALUE` lines of every component's parameters (nested tables dotted). */
  function paramLines(params) {
    const lines = [];
    const walk = (prefix, v) => {
      if (v !== null && typeof v === 'object' && !Array.isArray(v)) {
        for (const k of Object.keys(v).sort()) walk(`${prefix}.${k}`, v[k]);
      } else {
        lines.push(`${prefix} = ${JSON.stringify(v)}`);
      }
    };
    for (const name of Object.keys(params || {}).sort()) walk(name, params[name]);
    return lines;
  }

  /**
   * The configuration of a run as lines: the effective configuration (the system file, then one
   * `# set COMPONENT.KEY = VALUE` line per override, as the operator digests it), then every
   * component's parameters as configured, then the live changes during the run.
   */
  function configurationLines(d) {
    const p = d.provenance || {};
    const overrides = p.overrides || (d.summary && d.summary.overrides) || {};
    const lines = String(d.config || '').split('\n');
    if (lines.length > 0 && lines[lines.length - 1] === '') lines.pop();
    const keys = Object.keys(overrides).sort();
    if (keys.length > 0) {
      lines.push('', '# parameters set over the system file (daqflow `set`), applied at configure:');
      for (const k of keys) lines.push(`# set ${k} = ${JSON.stringify(overrides[k])}`);
    }
    const params = paramLines(p.params);
    if (params.length > 0) lines.push('', '# every component\'s parameters, as configured:', ...params);
    // The live changes (the table `run_changes`; the summary's for a run recorded without it),
    // shown in the run's record above (#run-changes).
    const changes = (d.changes && d.changes.length > 0) ? d.changes : ((d.summary && d.summary.changes) || []);
    if (changes.length > 0) {
      lines.push('', '# changed during the run:');
      for (const c of changes) lines.push(`# ${fmtTime(c.t_ms)} ${c.component}.${c.key} = ${JSON.stringify(c.value)}`);
    }
    return lines;
  }

  /** A line diff (longest common subsequence): [{op: ' ' | '-' | '+', line}]; null if too large. */
  function lineDiff(a, b) {
    const n = a.length, m = b.length;
    if ((n + 1) * (m + 1) > 16e6) return null;
    const w = m + 1;
    const lcs = new Uint32Array((n + 1) * w);
    for (let i = n - 1; i >= 0; i--) {
      for (let j = m - 1; j >= 0; j--) {
        lcs[i * w + j] = a[i] === b[j] ? lcs[(i + 1) * w + j + 1] + 1
          : Math.max(lcs[(i + 1) * w + j], lcs[i * w + j + 1]);
      }
    }
    const out = [];
    let i = 0, j = 0;
    while (i < n && j < m) {
      if (a[i] === b[j]) { out.push({ op: ' ', line: a[i] }); i++; j++; }
      else if (lcs[(i + 1) * w + j] >= lcs[i * w + j + 1]) out.push({ op: '-', line: a[i++] });
      else out.push({ op: '+', line: b[j++] });
    }
    while (i < n) out.push({ op: '-', line: a[i++] });
    while (j < m) out.push({ op: '+', line: b[j++] });
    return out;
  }

  function renderProvenance(d) {
    ui.shownRun = d;
    const p = d.provenance;
    const facts = [];
    if (p) {
      facts.push(`system file SHA-256 ${p.system_digest} (in every data file's header)`);
      if (p.effective_digest !== p.system_digest) facts.push(`with the parameters set: ${p.effective_digest}`);
      if (isNum(p.repeat_of)) facts.push(`repeats run ${p.repeat_of}`);
    } else {
      facts.push('No provenance recorded for this run (recorded by an older version).');
    }
    $('prov-facts').textContent = facts.join(' · ');
    const overrides = (p && p.overrides) || (d.summary && d.summary.overrides) || {};
    const rows = Object.keys(overrides).sort().map((k) => el('tr', null,
      el('td', { className: 'mono' }, k), el('td', { className: 'mono' }, JSON.stringify(overrides[k]))));
    if (rows.length === 0) rows.push(el('tr', null, el('td', { colSpan: 2, className: 'hint' }, 'None: the system file as it is.')));
    replaceRows($('prov-overrides'), rows);
    $('prov-params').textContent = p ? paramLines(p.params).join('\n') : '';
    $('prov-diff').hidden = true;
    $('prov-diff').replaceChildren();
    $('prov-diff-summary').textContent = '';
  }

  async function diffAgainst(event) {
    event.preventDefault();
    const d = ui.shownRun;
    const other = Number($('prov-diff-run').value);
    if (!d) return;
    if (!Number.isInteger(other) || other < 1) {
      $('prov-diff-summary').textContent = 'The run number must be a positive integer.';
      return;
    }
    $('prov-diff-summary').textContent = 'loading…';
    let base;
    try {
      base = await api('GET', '/api/runs/' + encodeURIComponent(other));
    } catch (e) {
      $('prov-diff-summary').textContent = `run ${other}: ${e.message}`;
      $('prov-diff').hidden = true;
      return;
    }
    const diff = lineDiff(configurationLines(base), configurationLines(d));
    if (diff === null) {
      $('prov-diff-summary').textContent = 'The configurations are too long to compare here.';
      return;
    }
    const removed = diff.filter((x) => x.op === '-').length;
    const added = diff.filter((x) => x.op === '+').length;
    $('prov-diff-summary').textContent = removed + added === 0
      ? `the same configuration as run ${other}`
      : `run ${other} → run ${d.run}: ${removed} line(s) removed, ${added} added`;
    const cls = { ' ': 'diff-same', '-': 'diff-del', '+': 'diff-add' };
    $('prov-diff').replaceChildren(...diff.map((x) => el('span', { className: cls[x.op] }, `${x.op} ${x.line}`)));
    $('prov-diff').hidden = false;
  }
  $('prov-diff-form').addEventListener('submit', diffAgainst);
  // ---- history of slow values (GET /api/history, /api/history/names) ------------------------
  // Not `history`: that name is the window's (showView uses history.replaceState).
  const slow = { names: [], loading: false, again: false, series: null };

  /** The value the view opens with: the system's event rate, else its events, else the first. */
  const HISTORY_DEFAULTS = ['system.events_per_s', 'system.events'];

  async function loadHistoryNames() {
    try {
      slow.names = await api('GET', '/api/history/names');
      $('history-names').replaceChildren(...slow.names.map((n) => el('option', { value: n })));
      $('history-name').placeholder = `type to search ${fmtInt(slow.names.length)} values, e.g. evm.events_per_s`;
      if (!$('history-name').value && slow.names.length) {
        $('history-name').value = HISTORY_DEFAULTS.find((n) => slow.names.includes(n)) || slow.names[0];
        return true;
      }
    } catch (e) {
      $('history-info').textContent = e.message;
    }
    return false;
  }

  /** The time range the form asks for: [from, to] in Unix ms. */
  function historyRange() {
    const choice = $('history-range').value;
    if (choice === 'custom') {
      const to = localMs($('history-to')) ?? Date.now();
      const from = localMs($('history-from')) ?? to - 3600000;
      return [Math.max(0, Math.min(from, to)), Math.max(from, to)];
    }
    const to = Date.now();
    return [Math.max(0, to - Number(choice)), to];
  }

  async function loadHistory() {
    const name = $('history-name').value.trim();
    if (!name) return;
    if (slow.loading) {
      // One under way: this one (a value chosen, Plot clicked) follows it, never dropped.
      slow.again = true;
      return;
    }
    const canvas = $('history-canvas');
    const [from, to] = historyRange();
    const points = Math.max(50, Math.min(2000, Math.round(canvas.clientWidth || 1000)));
    const query = new URLSearchParams({ name, from: String(from), to: String(to), points: String(points) });
    slow.loading = true;
    try {
      slow.series = await api('GET', '/api/history?' + query.toString());
      const s = slow.series;
      const samples = s.points.reduce((n, p) => n + p.count, 0);
      $('history-info').textContent = samples === 0 ? `no samples of ${s.name} in this range`
        : s.bucket_ms > 0
          ? `${fmtInt(samples)} samples in ${fmtInt(s.points.length)} buckets of ${fmtDuration(s.bucket_ms / 1000)}`
          : `${fmtInt(samples)} samples`;
      drawHistory();
    } catch (e) {
      slow.series = null;
      $('history-info').textContent = e.message;
      drawHistory();
    } finally {
      slow.loading = false;
      if (slow.again) {
        slow.again = false;
        loadHistory();
      }
    }
  }

  function historyTimeLabel(t, span) {
    const text = fmtTime(t);
    return span > 86400000 ? text.slice(5, 16) : text.slice(11);
  }

  /**
   * The time axis: the range asked for, but from the first sample in it when that comes later
   * (a run begun 3 minutes ago fills the plot of "last hour", not its right 5 %). [t0, t1].
   */
  function historyAxis(s, points) {
    const t1 = s.to_ms;
    let t0 = s.from_ms;
    if (points.length > 0 && points[0].t_ms > t0) {
      // A little room before the first sample, a nice amount of it.
      const span = Math.max(t1 - points[0].t_ms, 10000);
      t0 = Math.max(s.from_ms, points[0].t_ms - span * 0.02);
    }
    return [t0, t1];
  }

  function drawHistory() {
    const canvas = $('history-canvas');
    const s = slow.series;
    const points = s ? s.points.filter((p) => isNum(p.t_ms) && isNum(p.value)) : [];
    $('history-empty').hidden = !!s;
    $('history-legend').hidden = !s;
    $('history-band-legend').hidden = !(s && s.bucket_ms > 0);
    canvas.dataset.points = String(points.length);
    canvas.dataset.name = s ? s.name : '';
    canvas.hidden = !s; // nothing chosen yet: no empty 0 … 1 plot
    if (!s) return;
    const area = plotArea(canvas, { left: 70, right: 20, top: 14, bottom: 30 });
    if (!area) return;
    const { ctx, width, height, pad, w, h } = area;
    const [t0, t1] = historyAxis(s, points);
    canvas.dataset.from = String(t0);
    canvas.dataset.to = String(t1);
    let lo = Math.min(...points.map((p) => (isNum(p.min) ? p.min : p.value)));
    let hi = Math.max(...points.map((p) => (isNum(p.max) ? p.max : p.value)));
    if (!points.length) { lo = 0; hi = 1; }
    if (hi === lo) { hi += Math.abs(hi) * 0.05 || 1; lo -= Math.abs(lo) * 0.05 || 1; }
    const step = niceStep(hi - lo, 5);
    lo = Math.floor(lo / step) * step;
    hi = Math.ceil(hi / step) * step;
    const x = (t) => pad.left + ((t - t0) / Math.max(1, t1 - t0)) * w;
    const y = (v) => pad.top + h - ((v - lo) / (hi - lo)) * h;

    ctx.strokeStyle = '#e3e7eb';
    ctx.fillStyle = '#66727f';
    ctx.lineWidth = 1;
    ctx.textAlign = 'right'; ctx.textBaseline = 'middle';
    const labelY = axisLabels(Math.max(Math.abs(lo), Math.abs(hi)));
    const yTicks = [];
    for (let v = lo; v <= hi + step / 2; v += step) {
      ctx.beginPath(); ctx.moveTo(pad.left, y(v)); ctx.lineTo(pad.left + w, y(v)); ctx.stroke();
      yTicks.push(labelY(v));
      ctx.fillText(yTicks[yTicks.length - 1], pad.left - 6, y(v));
    }
    canvas.dataset.yTicks = yTicks.join(' ');
    // The time labels, the first left-aligned and the last right-aligned so that neither is cut
    // at the canvas's edge (also in data-x-ticks).
    ctx.textBaseline = 'top';
    const ticks = Math.max(1, Math.min(6, Math.floor(w / 110)));
    const xTicks = [];
    let right = 0;
    for (let i = 0; i <= ticks; i++) {
      const t = t0 + ((t1 - t0) * i) / ticks;
      ctx.textAlign = i === 0 ? 'left' : i === ticks ? 'right' : 'center';
      xTicks.push(historyTimeLabel(t, t1 - t0));
      const at = i === ticks ? pad.left + w : x(t);
      ctx.fillText(xTicks[i], at, pad.top + h + 8);
      const textWidth = ctx.measureText(xTicks[i]).width;
      right = Math.max(right, at + (i === ticks ? 0 : i === 0 ? textWidth : textWidth / 2));
    }
    canvas.dataset.xTicks = xTicks.join(' ');
    // Where the rightmost label ends, in CSS pixels (the tests check it is inside the canvas).
    canvas.dataset.labelsRight = String(Math.ceil(right));
    ctx.strokeStyle = '#9aa5b1';
    ctx.strokeRect(pad.left, pad.top, w, h);
    if (!points.length) return;

    const color = cssVar('--eps') || '#2563a8';
    if (s.bucket_ms > 0) {
      // Each bucket's minimum … maximum as a band behind the mean.
      ctx.fillStyle = 'rgba(37, 99, 168, 0.18)';
      ctx.beginPath();
      points.forEach((p, i) => { if (i === 0) ctx.moveTo(x(p.t_ms), y(p.max)); else ctx.lineTo(x(p.t_ms), y(p.max)); });
      for (let i = points.length - 1; i >= 0; i--) ctx.lineTo(x(points[i].t_ms), y(points[i].min));
      ctx.closePath();
      ctx.fill();
    }
    ctx.strokeStyle = color; ctx.lineWidth = 2; ctx.beginPath();
    points.forEach((p, i) => { if (i === 0) ctx.moveTo(x(p.t_ms), y(p.value)); else ctx.lineTo(x(p.t_ms), y(p.value)); });
    ctx.stroke();
    if (points.length < 60) {
      ctx.fillStyle = color;
      for (const p of points) { ctx.beginPath(); ctx.arc(x(p.t_ms), y(p.value), 2.5, 0, 2 * Math.PI); ctx.fill(); }
    }
  }

  $('history-form').addEventListener('submit', (e) => { e.preventDefault(); loadHistory(); });
  $('history-name').addEventListener('change', loadHistory);
  $('history-range').addEventListener('change', () => {
    $('history-custom').hidden = $('history-range').value !== 'custom';
    loadHistory();
  });
  for (const id of ['history-from', 'history-to']) $(id).addEventListener('change', loadHistory);
  loaders.history = async () => {
    if (slow.series) drawHistory();
    await loadHistoryNames();
    loadHistory();
  };
  window.addEventListener('resize', () => { if (visible('history')) drawHistory(); });
  setInterval(() => {
    if (!visible('history')) return;
    loadHistoryNames();
    if ($('history-auto').checked && $('history-range').value !== 'custom') loadHistory();
  }, 5000);

  // ---- periodic refresh of the visible view --------------------------------------------------
  setInterval(() => {
    if (document.hidden) return;
    if (ui.view === 'histograms') loadHistograms();
    else if (ui.view === 'et') loadEt();
    else if (ui.view === 'messages' && $('log-auto').checked) loadLogs();
  }, 2000);
  setInterval(() => {
    if (document.hidden) return;
    if (ui.view === 'processes') loadProcesses();
    else if (ui.view === 'runs') loadRuns();
  }, 5000);

  // ---- alarms -------------------------------------------------------------------------------
  // GET /api/alarms every 2 s on every view: the banner shows the alarms waiting for a person
  // (raised, or cleared before anybody acknowledged them) and the acknowledged ones still on;
  // the controller acknowledges (POST /api/alarms/ack).
  ui.alarms = null;
  async function acknowledgeAlarm(name) {
    try {
      await api('POST', '/api/alarms/ack', { name });
      await loadAlarms();
    } catch (e) {
      showError(`Acknowledge ${name}: ${e.message}`);
    }
  }
  function ackButton(a) {
    if (!(a.state === 'raised' || a.state === 'cleared')) return null;
    return el('button', {
      type: 'button', className: 'alarm-ack', disabled: !iControl(),
      title: iControl() ? 'acknowledge this alarm' : 'take control to acknowledge',
      onclick: () => acknowledgeAlarm(a.name),
    }, 'Acknowledge');
  }
  /** The value an alarm's condition compared last, in its unit ("82.7 GB free", "499.1"). */
  function alarmValue(a) {
    if (!isNum(a.value)) return '–';
    return a.unit === 'bytes' ? `${fmtBytes(a.value)} free` : fmtValue(a.value);
  }
  function renderAlarms(data) {
    const alarms = Array.isArray(data && data.alarms) ? data.alarms : [];
    const events = Array.isArray(data && data.events) ? data.events : [];
    const shown = alarms.filter((a) => a.state !== 'ok');
    const banner = $('alarm-banner');
    banner.replaceChildren(...shown.map((a) => el('div', {
      className: 'alarm', dataset: { severity: a.severity, state: a.state, name: a.name },
    },
    el('span', { className: 'alarm-text' },
      `${a.state === 'cleared' ? 'Cleared, unacknowledged' : capital(a.state)} ${a.severity}: ${a.name}: ${a.message}`,
      a.acknowledged_by ? ` (acknowledged by ${a.acknowledged_by})` : ''),
    ackButton(a))));
    banner.hidden = shown.length === 0;
    const waiting = alarms.filter((a) => a.state === 'raised' || a.state === 'cleared').length;
    $('alarm-count').hidden = waiting === 0;
    $('alarm-count').textContent = waiting;
    const rows = alarms.map((a) => el('tr', { dataset: { alarmState: a.state, name: a.name } },
      el('td', null, a.name), el('td', null, a.severity), el('td', null, a.state), el('td', null, fmtTime(a.since_ms)),
      el('td', null, a.message), el('td', { className: 'mono' }, a.condition),
      el('td', { className: 'num' }, alarmValue(a)),
      el('td', null, a.acknowledged_by || ''), el('td', null, ackButton(a))));
    if (rows.length === 0) {
      rows.push(el('tr', null, el('td', { colSpan: 9, className: 'hint' },
        'No alarms: the system file has no [[alarm]] table (docs/operator-guide.md, "Alarms").')));
    }
    replaceRows($('alarms'), rows);
    const eventRows = events.map((e) => el('tr', { dataset: { kind: e.kind } },
      el('td', null, fmtTime(e.t_ms)), el('td', null, e.name), el('td', null, e.kind), el('td', null, e.severity),
      el('td', null, e.message), el('td', null, e.who || '')));
    if (eventRows.length === 0) {
      eventRows.push(el('tr', null, el('td', { colSpan: 6, className: 'hint' }, alarms.length === 0
        ? 'No alarm events.'
        : 'No alarm has been raised yet: each raise, acknowledgement and clearing is listed here (and kept in the run database).')));
    }
    replaceRows($('alarm-events'), eventRows);
  }
  async function loadAlarms() {
    try {
      ui.alarms = await api('GET', '/api/alarms');
      renderAlarms(ui.alarms);
    } catch (_) { /* the next refresh tries again */ }
  }
  loaders.alarms = loadAlarms;
  setInterval(() => { if (!document.hidden) loadAlarms(); }, 2000);
  loadAlarms();

  // ---- start --------------------------------------------------------------------------------
  // For tests and the console: what this page knows of control (never a credential).
  window.daqflow = { control: () => ({ ...ui.control }) };
  onControl(ui.control);
  startSession();
  showView((location.hash || '#run').slice(1));
})();
