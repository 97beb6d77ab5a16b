//! The dashboard in a real browser: headless Chromium, driven over WebDriver by Debian's
//! `chromedriver`, opens the dashboard of a running `homing up` that requires a token, logs in
//! through the page's own form, sees a job enqueued through the API appear and finish, and
//! retries a failed job with its button. Screenshots are kept in `target/test-artifacts/`.

mod support;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;
use support::*;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// A chromedriver process and one browser session.
struct Browser {
    driver: Proc,
    http: reqwest::Client,
    base: String,
    session: String,
    _profile: tempfile::TempDir,
}

/// Whether a value a page script returned counts as true, as JavaScript would take it.
fn truthy(v: &serde_json::Value) -> bool {
    !(v.is_null() || v == false || v == "" || v == 0)
}

impl Browser {
    async fn start(env: &Env) -> Browser {
        assert!(
            std::path::Path::new(CHROMIUM).exists(),
            "{CHROMIUM} is missing: install the Debian package `chromium`"
        );
        assert!(
            std::path::Path::new(CHROMEDRIVER).exists(),
            "{CHROMEDRIVER} is missing: install the Debian package `chromium-driver`"
        );
        let port = free_port();
        let log = env.path().join("chromedriver.log");
        let child = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let driver = Proc::adopt(child, log, "chromedriver");
        let base = format!("http://127.0.0.1:{port}");
        let http = http_client();
        eventually(
            Duration::from_secs(20),
            "chromedriver to answer",
            || async { http.get(format!("{base}/status")).send().await.ok() },
        )
        .await;
        let profile = tempfile::tempdir().unwrap();
        let args = vec![
            "--headless".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-dev-shm-usage".into(),
            "--window-size=1400,1000".into(),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        let caps = serde_json::json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": args},
        }}});
        let resp: serde_json::Value = http
            .post(format!("{base}/session"))
            .json(&caps)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let session = resp["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no browser session: {resp}"))
            .to_string();
        Browser {
            driver,
            http,
            base,
            session,
            _profile: profile,
        }
    }

    /// One WebDriver command of this session, answered as it came (errors included).
    async fn send(&self, method: &str, path: &str, body: serde_json::Value) -> serde_json::Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let req = match method {
            "GET" => self.http.get(url),
            _ => self.http.post(url).json(&body),
        };
        req.send().await.unwrap().json().await.unwrap()
    }

    /// One WebDriver command, which must succeed; its value.
    async fn call(&self, method: &str, path: &str, body: serde_json::Value) -> serde_json::Value {
        let v = self.send(method, path, body).await;
        if v["value"]["error"].is_string() {
            panic!("webdriver {method} {path}: {v}");
        }
        v["value"].clone()
    }

    async fn goto(&self, url: &str) {
        self.call("POST", "/url", serde_json::json!({ "url": url }))
            .await;
    }

    /// Runs `script` in the page and returns its value.
    async fn eval(&self, script: &str) -> serde_json::Value {
        self.call(
            "POST",
            "/execute/sync",
            serde_json::json!({ "script": script, "args": [] }),
        )
        .await
    }

    async fn element(&self, css: &str) -> String {
        self.find(css)
            .await
            .unwrap_or_else(|| panic!("no element {css}"))
    }

    /// The WebDriver id of the element `css` selects, if there is one.
    async fn find(&self, css: &str) -> Option<String> {
        let query = serde_json::json!({"using": "css selector", "value": css});
        let v = self.send("POST", "/element", query).await;
        match v["value"]["error"].as_str() {
            None => {}
            Some("no such element") => return None,
            Some(_) => panic!("webdriver find {css}: {v}"),
        }
        let id = v["value"].as_object().and_then(|o| o.values().next());
        Some(
            id.and_then(|x| x.as_str())
                .unwrap_or_else(|| panic!("no element {css}: {v}"))
                .to_string(),
        )
    }

    /// Clicks the element `css` selects. The page redraws its tables every 2 s, so an element
    /// found may be replaced before the click lands ("stale element reference"): then it is
    /// found again.
    async fn click(&self, css: &str) {
        for _ in 0..20 {
            let id = self.element(css).await;
            if self.click_element(css, &id).await {
                return;
            }
        }
        panic!("webdriver click {css}: the element kept going stale");
    }

    /// Clicks element `id` (found with `css`); false if it went stale first.
    async fn click_element(&self, css: &str, id: &str) -> bool {
        let path = format!("/element/{id}/click");
        let v = self.send("POST", &path, serde_json::json!({})).await;
        match v["value"]["error"].as_str() {
            None => true,
            Some("stale element reference") => false,
            Some(_) => panic!("webdriver click {css}: {v}"),
        }
    }

    /// Clicks `css` until `done` holds in the page. WebDriver clicks where it found the element,
    /// and a redraw in between can move it: the queue table's columns widen and narrow with
    /// their figures, and then the click lands beside the button and does nothing. Only for
    /// buttons that do the same when pressed twice (Pause and Resume name their verb).
    async fn click_until(&self, css: &str, what: &str, done: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            if let Some(id) = self.find(css).await {
                self.click_element(css, &id).await;
            }
            for _ in 0..30 {
                if truthy(&self.eval(done).await) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        panic!("timed out after 30s waiting for: {what}");
    }

    async fn type_into(&self, css: &str, text: &str) {
        let id = self.element(css).await;
        self.call(
            "POST",
            &format!("/element/{id}/value"),
            serde_json::json!({ "text": text }),
        )
        .await;
    }

    /// Waits until `script` returns a truthy value in the page, and returns it. A script that
    /// throws counts as not yet: while a page loads, the element it reads may not exist (a
    /// wait for the login form failed once on `null.hidden`).
    async fn wait_for(&self, what: &str, script: &str) -> serde_json::Value {
        let guarded = format!("try {{\n{script}\n}} catch (e) {{ return null; }}");
        eventually(Duration::from_secs(30), what, || async {
            let v = self.eval(&guarded).await;
            truthy(&v).then_some(v)
        })
        .await
    }

    async fn screenshot(&self, name: &str) -> PathBuf {
        let b64 = self.call("GET", "/screenshot", serde_json::json!({})).await;
        let png = base64_decode(b64.as_str().expect("base64 screenshot"));
        assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
        let dir = repo_root().join("target/test-artifacts");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, png).unwrap();
        path
    }

    async fn quit(mut self) {
        let _ = self
            .http
            .delete(format!("{}/session/{}", self.base, self.session))
            .send()
            .await;
        self.driver.kill9();
    }
}

fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a' + 26) as u32,
            b'0'..=b'9' => (c - b'0' + 52) as u32,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let bytes: Vec<u8> = s
        .bytes()
        .filter(|c| *c != b'=' && !c.is_ascii_whitespace())
        .collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            n |= val(*c) << (18 - 6 * i);
        }
        out.push((n >> 16) as u8);
        if chunk.len() > 2 {
            out.push((n >> 8) as u8);
        }
        if chunk.len() > 3 {
            out.push(n as u8);
        }
    }
    out
}

async fn enqueue(base: &str, token: &str, body: serde_json::Value) -> String {
    let r = http_client()
        .post(format!("{base}/v1/jobs"))
        .header("authorization", format!("Bearer {token}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    r.json::<serde_json::Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// A script that is true when job `id`'s row shows `state`.
fn row_is(id: &str, state: &str) -> String {
    format!("const r = document.querySelector('#jobs tr[data-id=\"{id}\"]'); return r !== null && r.dataset.state === '{state}';")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dashboard_shows_jobs_and_retries_a_failed_one() {
    let env = Env::sqlite();
    let token = "dashboard-token-42";
    let (_up, base) = start_up(&env, &[("HOMING_API_TOKEN", token)]).await;
    let counter = Counter::start().await;
    let browser = Browser::start(&env).await;

    // The page asks for the token once, then shows the data.
    browser.goto(&format!("{base}/")).await;
    browser
        .wait_for(
            "the token form",
            "return !document.querySelector('#login').hidden;",
        )
        .await;
    browser.type_into("#token-input", token).await;
    browser.click("#token-submit").await;
    browser
        .wait_for(
            "the dashboard after login",
            "return !document.querySelector('#app').hidden && document.querySelectorAll('#workers tbody tr[data-worker]').length > 0;",
        )
        .await;
    let stored = browser
        .eval("return sessionStorage.getItem('homing.token');")
        .await;
    assert_eq!(stored, token, "the token is kept in sessionStorage");

    // The workers' heartbeat column shows the broker's heartbeat expiry, which decides
    // liveness: for a live worker it is within the TTL (3 × 200 ms), never the store's
    // last_seen (written every fifth beat, so often older than the TTL).
    let header = browser
        .eval("return document.querySelector('#workers thead').textContent;")
        .await;
    assert!(
        header.as_str().unwrap_or("").contains("heartbeat expires"),
        "{header}"
    );
    let cells = browser
        .wait_for(
            "live workers' heartbeat expiries",
            "const c = [...document.querySelectorAll('#workers tbody tr[data-worker]')].filter((r) => r.querySelector('.badge.w-live')).map((r) => r.querySelector('td.heartbeat').dataset.expiresIn); return c.length > 0 ? c : null;",
        )
        .await;
    for c in cells.as_array().unwrap() {
        let left: f64 = c
            .as_str()
            .unwrap()
            .parse()
            .unwrap_or_else(|_| panic!("{cells}"));
        assert!(left > 0.0 && left <= 0.6, "{cells}");
    }

    // A job enqueued through the API appears, runs and finishes on the page.
    let slow = enqueue(
        &base,
        token,
        serde_json::json!({"task": "builtin.sleep", "args": {"ms": 3000}}),
    )
    .await;
    browser
        .wait_for("the new job to show as running", &row_is(&slow, "running"))
        .await;
    browser
        .wait_for(
            "a worker to show what it runs",
            &format!(
                "return document.querySelector('#workers a[href=\"#/jobs/{slow}\"]') !== null;"
            ),
        )
        .await;
    browser
        .wait_for("the job to show as succeeded", &row_is(&slow, "succeeded"))
        .await;

    // A job that fails (its endpoint answers 500 once, no retries left) gets a Retry button;
    // clicking it runs the job again, and this time the endpoint answers 200.
    let url = counter.url("fail=1");
    let failing = enqueue(
        &base,
        token,
        serde_json::json!({"task": "builtin.http", "args": {"url": url}, "max_retries": 0, "queue": "default"}),
    )
    .await;
    browser
        .wait_for(
            "the failed job's retry button",
            &format!("return document.querySelector('#jobs tr[data-id=\"{failing}\"][data-state=\"failed\"] button.retry') !== null;"),
        )
        .await;
    assert_eq!(counter.count(&failing), 1);
    browser
        .click(&format!("#jobs tr[data-id=\"{failing}\"] button.retry"))
        .await;
    browser
        .wait_for("the retried job to succeed", &row_is(&failing, "succeeded"))
        .await;
    assert_eq!(
        counter.count(&failing),
        2,
        "the retry ran the job once more"
    );
    let client = env.client().await;
    let job = client.get(failing.parse().unwrap()).await.unwrap();
    assert_eq!(job.state, homing::JobState::Succeeded);
    assert_eq!(job.epoch, 2);

    // The queue table counts what happened in the last hour.
    // Columns: queue, queued, waiting (workflow steps), scheduled, running, succeeded 1h, …
    let header = browser
        .eval("return [...document.querySelectorAll('#queues thead th')].map((h) => h.textContent).slice(0, 6).join(',');")
        .await;
    assert_eq!(
        header,
        "queue,queued,waiting,scheduled,running,succeeded 1h"
    );
    let succeeded_1h = browser
        .eval("const r = document.querySelector('#queues tr[data-queue=\"default\"]'); return r ? r.children[5].textContent : null;")
        .await;
    assert_eq!(succeeded_1h, "2");
    let overview = browser.screenshot("dashboard.png").await;

    // The job's own page: args, result, attempts, epochs, timeline.
    browser.goto(&format!("{base}/#/jobs/{failing}")).await;
    let detail = browser
        .wait_for(
            "the job page",
            "const d = document.querySelector('#job-detail'); return d && !d.hidden ? d.textContent : null;",
        )
        .await;
    let detail = detail.as_str().unwrap();
    for needle in [
        failing.as_str(),
        "builtin.http",
        "epoch",
        "Timeline",
        "Result",
        "fail=1",
    ] {
        assert!(detail.contains(needle), "job page shows {needle}: {detail}");
    }
    let job_page = browser.screenshot("dashboard-job.png").await;

    // A workflow's page: its steps as a table with states, each linking to its job.
    let r = http_client()
        .post(format!("{base}/v1/workflows"))
        .header("authorization", format!("Bearer {token}"))
        .json(&serde_json::json!({"name": "shown", "steps": {
            "first": {"task": "builtin.noop"},
            "second": {"task": "builtin.noop", "after": ["first"]}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let created: serde_json::Value = r.json().await.unwrap();
    let wf = created["id"].as_str().unwrap().to_string();
    let second = created["steps"]["second"].as_str().unwrap().to_string();
    browser.goto(&format!("{base}/#/workflows/{wf}")).await;
    browser
        .wait_for(
            "the workflow page with both steps succeeded",
            "const rows = document.querySelectorAll('#workflow-steps tbody tr'); \
             return rows.length === 2 && [...rows].every((r) => r.dataset.state === 'succeeded');",
        )
        .await;
    let link = browser
        .eval("const a = document.querySelector('#workflow-steps tr[data-step=\"second\"] a'); return a ? a.getAttribute('href') : null;")
        .await;
    assert_eq!(link, serde_json::json!(format!("#/jobs/{second}")));
    assert!(browser
        .eval("return document.querySelector('#workflows tbody').textContent;")
        .await
        .as_str()
        .unwrap()
        .contains("shown"));
    let workflow_page = browser.screenshot("dashboard-workflow.png").await;
    eprintln!(
        "screenshots: {} {} {}",
        overview.display(),
        job_page.display(),
        workflow_page.display()
    );
    browser.quit().await;
}

/// The schedules table: each schedule with its next tick, last tick and a link to its last job;
/// a paused one says so. And the queue table shows a queue's limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dashboard_lists_schedules() {
    let env = Env::sqlite();
    let token = "dashboard-token-sched";
    let (_up, base) = start_up(&env, &[("HOMING_API_TOKEN", token)]).await;
    let http = http_client();
    for (name, body) in [
        (
            "heartbeat",
            serde_json::json!({"task": "builtin.noop", "every": "1s"}),
        ),
        (
            "nightly",
            serde_json::json!({"task": "builtin.noop", "cron": "0 3 * * *", "timezone": "Europe/Paris"}),
        ),
    ] {
        let r = http
            .put(format!("{base}/v1/schedules/{name}"))
            .header("authorization", format!("Bearer {token}"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let r = http
        .post(format!("{base}/v1/schedules/nightly/pause"))
        .header("authorization", format!("Bearer {token}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    let browser = Browser::start(&env).await;
    browser.goto(&format!("{base}/")).await;
    browser
        .wait_for(
            "the token form",
            "return !document.querySelector('#login').hidden;",
        )
        .await;
    browser.type_into("#token-input", token).await;
    browser.click("#token-submit").await;
    let last_job = browser
        .wait_for(
            "the heartbeat schedule's last job",
            "const a = document.querySelector('#schedules tr[data-schedule=\"heartbeat\"] a[href^=\"#/jobs/\"]'); return a ? a.getAttribute('href').slice(7) : null;",
        )
        .await;
    let last_job: homing::JobId = last_job.as_str().unwrap().parse().unwrap();
    let job = env.client().await.get(last_job).await.unwrap();
    assert_eq!(job.schedule.as_deref(), Some("heartbeat"));
    let row = browser
        .eval("return document.querySelector('#schedules tr[data-schedule=\"heartbeat\"]').textContent;")
        .await;
    let row = row.as_str().unwrap();
    assert!(row.contains("every 1s") && row.contains("ago"), "{row}");
    let nightly = browser
        .eval("return document.querySelector('#schedules tr[data-schedule=\"nightly\"]').textContent;")
        .await;
    let nightly = nightly.as_str().unwrap();
    assert!(
        nightly.contains("0 3 * * * (Europe/Paris)") && nightly.contains("paused"),
        "{nightly}"
    );
    // A limited queue shows its limits in the queue table.
    let r = http
        .put(format!("{base}/v1/queues/bgm"))
        .header("authorization", format!("Bearer {token}"))
        .json(&serde_json::json!({"concurrency": 1, "rate": "10/1s", "key_arg": "track"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    browser
        .wait_for(
            "the bgm queue's limits",
            "const r = document.querySelector('#queues tr[data-queue=\"bgm\"] td.limits'); return r && r.textContent === 'concurrency 1, rate 10/1s, per track' ? true : null;",
        )
        .await;
    // Schedules past a page's 4 MiB of definitions: the page shows what it holds and says
    // where the rest are.
    let pad = "x".repeat(1_000_000);
    for i in 0..5 {
        let r = http
            .put(format!("{base}/v1/schedules/zbig{i}"))
            .header("authorization", format!("Bearer {token}"))
            .json(&serde_json::json!({"task": "builtin.noop", "every": "1h", "args": {"pad": pad}}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let more = browser
        .wait_for(
            "the note that more schedules follow",
            "const r = [...document.querySelectorAll('#schedules tr.empty td')].find((td) => td.textContent.startsWith('more schedules')); return r ? r.textContent : null;",
        )
        .await;
    assert_eq!(
        more.as_str().unwrap(),
        "more schedules after zbig3: homing schedules list, or GET /v1/schedules?after=zbig3"
    );
    assert!(browser
        .eval("return document.querySelector('#schedules tr[data-schedule=\"zbig3\"]') !== null && document.querySelector('#schedules tr[data-schedule=\"zbig4\"]') === null;")
        .await
        .as_bool()
        .unwrap());
    let shot = browser.screenshot("dashboard-schedules.png").await;
    eprintln!("screenshot: {}", shot.display());
    browser.quit().await;
}

/// Roles in the page (docs/access.md): a read token sees the jobs and the audit log but no
/// write button (the API would refuse it anyway); a logout while a refresh is out stays logged
/// out; an admin token gets the bulk actions, which show the count and run only once it is
/// confirmed, and land in the audit log.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dashboard_hides_writes_from_a_read_token_and_confirms_bulk_actions() {
    let env = Env::sqlite();
    let config = env.path().join("config.json");
    std::fs::write(
        &config,
        r#"{"api_tokens": [{"token": "dash-read-7", "role": "read", "name": "ops-bob"}, {"token": "dash-admin-7", "role": "admin", "name": "ops-alice"}]}"#,
    )
    .unwrap();
    let (_up, base) = start_up(&env, &[("HOMING_CONFIG", config.to_str().unwrap())]).await;
    let browser = Browser::start(&env).await;
    // A queue nobody serves: its jobs wait, cancellable.
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(
            enqueue(
                &base,
                "dash-admin-7",
                serde_json::json!({"task": "builtin.noop", "queue": "parked"}),
            )
            .await,
        );
    }

    let login = |token: &'static str| {
        let browser = &browser;
        async move {
            browser
                .wait_for(
                    "the token form",
                    "return !document.querySelector('#login').hidden;",
                )
                .await;
            browser.type_into("#token-input", token).await;
            browser.click("#token-submit").await;
        }
    };
    let filter_queued = || async {
        browser
            .eval("document.querySelector('#f-state').value = 'queued'; document.querySelector('#f-queue').value = 'parked'; document.querySelector('#filters button[type=submit]').click(); return true;")
            .await;
    };

    browser.goto(&format!("{base}/")).await;
    login("dash-read-7").await;
    browser
        .wait_for(
            "the read token's name",
            "return document.querySelector('#whoami').textContent === 'ops-bob (read)';",
        )
        .await;
    filter_queued().await;
    browser
        .wait_for("the queued jobs", &row_is(&ids[0], "queued"))
        .await;
    browser
        .wait_for(
            "the queues table",
            "return document.querySelectorAll('#queues tbody tr[data-queue]').length > 0;",
        )
        .await;
    let buttons = browser
        .eval("return document.querySelectorAll('#jobs button, #queues button, #workflow-detail button').length + (getComputedStyle(document.querySelector('#bulk')).display === 'none' ? 0 : 100);")
        .await;
    assert_eq!(buttons, 0, "no write button for a read token");
    browser.screenshot("dashboard-read-token.png").await;

    // A logout while a refresh is out (its answers after the role's held back until after the
    // click): the refresh, answered for the old token, must not draw the page over the form.
    browser
        .eval(
            "const real = window.fetch; window.__real = real; window.__paths = []; \
             const gate = new Promise((r) => { window.__open = r; }); \
             window.fetch = (...a) => { const p = String(a[0]); window.__paths.push(p); \
               return p.startsWith('/v1/whoami') ? real(...a) : real(...a).then((r) => gate.then(() => r)); }; \
             window.__hidden = false; \
             new MutationObserver(() => { if (document.querySelector('#login').hidden) window.__hidden = true; }) \
               .observe(document.querySelector('#login'), { attributes: true }); \
             window.__done = false; refresh().then(() => { window.__done = true; }); return true;",
        )
        .await;
    browser
        .wait_for(
            "the refresh's requests sent with the read token",
            "return window.__paths.some((p) => p.startsWith('/v1/audit'));",
        )
        .await;
    browser.click("#logout").await;
    browser
        .wait_for(
            "the token form",
            "return !document.querySelector('#login').hidden;",
        )
        .await;
    browser
        .eval("window.fetch = window.__real; window.__open(); return true;")
        .await;
    browser
        .wait_for("the held refresh to finish", "return window.__done;")
        .await;
    let after = browser
        .eval("return [window.__hidden, document.querySelector('#login').hidden, document.querySelector('#app').hidden];")
        .await;
    assert_eq!(
        after,
        serde_json::json!([false, false, true]),
        "[token form hidden since the logout, token form hidden now, app hidden now]"
    );
    login("dash-admin-7").await;
    browser
        .wait_for(
            "the admin token's name",
            "return document.querySelector('#whoami').textContent === 'ops-alice (admin)';",
        )
        .await;
    filter_queued().await;
    browser
        .wait_for("the bulk cancel button", "return getComputedStyle(document.querySelector('#bulk')).display !== 'none' && !document.querySelector('#bulk-cancel').hidden && document.querySelector('#bulk-retry').hidden;")
        .await;
    // First declined: nothing happens. Then confirmed.
    browser
        .eval("window.__asked = []; window.confirm = (m) => { window.__asked.push(m); return window.__asked.length > 1; }; return true;")
        .await;
    browser.click("#bulk-cancel").await;
    browser
        .wait_for("the first question", "return window.__asked.length === 1;")
        .await;
    browser
        .wait_for("the jobs still queued", &row_is(&ids[2], "queued"))
        .await;
    browser.click("#bulk-cancel").await;
    let asked = browser
        .wait_for(
            "the second question",
            "return window.__asked.length === 2 ? window.__asked : null;",
        )
        .await;
    assert!(
        asked[0]
            .as_str()
            .unwrap()
            .contains("cancel 3 jobs (state=queued, queue=parked)"),
        "{asked}"
    );
    browser
        .wait_for(
            "the result",
            "return document.querySelector('#message').textContent.includes('cancel: 3 jobs');",
        )
        .await;
    browser
        .wait_for(
            "the audit entry",
            "return [...document.querySelectorAll('#audit tbody tr')].some((r) => r.textContent.includes('POST /v1/jobs/cancel') && r.dataset.actor === 'ops-alice');",
        )
        .await;
    browser.screenshot("dashboard-bulk-cancel.png").await;
    browser
        .eval("document.querySelector('#audit').scrollIntoView(); return true;")
        .await;
    browser.screenshot("dashboard-audit-log.png").await;
    for id in &ids {
        let j: serde_json::Value = http_client()
            .get(format!("{base}/v1/jobs/{id}"))
            .header("authorization", "Bearer dash-read-7")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(j["state"], "cancelled");
    }
    browser.quit().await;
}

/// The queue table's Pause and Resume buttons: after Pause, the row offers Resume and a job
/// enqueued to the queue stays queued (not started, no attempt); after Resume it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dashboard_pauses_and_resumes_a_queue() {
    let env = Env::sqlite();
    let token = "dashboard-token-pause";
    let (_up, base) = start_up(&env, &[("HOMING_API_TOKEN", token)]).await;
    let client = env.client().await;
    // A first job makes the queue appear in the table.
    let first = enqueue(
        &base,
        token,
        serde_json::json!({"task": "builtin.noop", "queue": "default"}),
    )
    .await;
    let browser = Browser::start(&env).await;
    browser.goto(&format!("{base}/")).await;
    browser
        .wait_for(
            "the token form",
            "return !document.querySelector('#login').hidden;",
        )
        .await;
    browser.type_into("#token-input", token).await;
    browser.click("#token-submit").await;
    browser
        .wait_for("the first job to succeed", &row_is(&first, "succeeded"))
        .await;
    let row = "#queues tr[data-queue=\"default\"]";
    browser
        .wait_for(
            "the queue's Pause button",
            &format!("return document.querySelector('{row} button.pause') !== null;"),
        )
        .await;
    browser
        .click_until(
            &format!("{row} button.pause"),
            "the row to offer Resume",
            &format!("const b = document.querySelector('{row} button.resume'); return b !== null && b.textContent === 'Resume';"),
        )
        .await;
    let (code, out, _) = env.run(&["queues", "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(
        v["queues"]
            .as_array()
            .unwrap()
            .iter()
            .any(|q| q["queue"] == "default" && q["paused"] == true),
        "{out}"
    );

    let held = enqueue(
        &base,
        token,
        serde_json::json!({"task": "builtin.noop", "queue": "default"}),
    )
    .await;
    browser
        .wait_for("the held job to show as queued", &row_is(&held, "queued"))
        .await;
    // The worker has had every chance to start it: it is parked, not run.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let j = client.get(held.parse().unwrap()).await.unwrap();
    assert_eq!(
        (j.state, j.started_at, j.attempts),
        (homing::JobState::Queued, None, 0),
        "{j:?}"
    );
    let shot = browser.screenshot("dashboard-paused-queue.png").await;

    browser
        .click_until(
            &format!("{row} button.resume"),
            "the row to offer Pause again",
            &format!("return document.querySelector('{row} button.pause') !== null;"),
        )
        .await;
    browser
        .wait_for("the held job to succeed", &row_is(&held, "succeeded"))
        .await;
    eprintln!("screenshot: {}", shot.display());
    browser.quit().await;
}

/// `GET /v1/stats/series` for `queue` over the last hour, with the totals of its counts.
async fn series(base: &str, token: &str, queue: &str) -> (serde_json::Value, [u64; 4]) {
    let v: serde_json::Value = http_client()
        .get(format!("{base}/v1/stats/series?queue={queue}&range=hour"))
        .header("authorization", format!("Bearer {token}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let sum = |k: &str| -> u64 {
        v[k].as_array()
            .unwrap_or_else(|| panic!("{k} in {v}"))
            .iter()
            .map(|n| n.as_u64().unwrap())
            .sum()
    };
    let totals = [sum("succeeded"), sum("failed"), sum("dead"), sum("retried")];
    (v, totals)
}

async fn page_background(b: &Browser) -> String {
    b.eval("return getComputedStyle(document.body).backgroundColor;")
        .await
        .as_str()
        .unwrap()
        .to_string()
}

/// The highest non-null value of a percentile series.
fn top(v: &serde_json::Value, key: &str) -> Option<f64> {
    v[key]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|x| x.as_f64())
        .reduce(f64::max)
}

/// The charts (docs/charts.md) end to end: real jobs that succeed, fail, are retried and go
/// dead are counted in the series the server rolls up from the store, with plausible
/// percentiles; the counts are the same after a restart (nothing doubled, nothing lost); the
/// dashboard draws them with the vendored library in light and dark (screenshots kept in
/// target/test-artifacts/, following the system's preference and the toggle); and a short
/// retention prunes the rollups with the jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn charts_count_real_jobs_survive_a_restart_render_in_both_themes_and_are_pruned() {
    let env = Env::sqlite();
    let token = "charts-token-7";
    let fast = ["--stats-interval", "200ms", "--queue", "charts"];
    let (mut up, base) = start_up_with(&env, &fast, &[("HOMING_API_TOKEN", token)]).await;
    let counter = Counter::start().await;
    let q = "charts";
    let job = |body: serde_json::Value| {
        let mut b = body;
        b["queue"] = q.into();
        b
    };
    for _ in 0..3 {
        enqueue(
            &base,
            token,
            job(serde_json::json!({"task": "builtin.sleep", "args": {"ms": 300}})),
        )
        .await;
    }
    // Fails for good; fails once then succeeds on its retry; has no handler at all (dead).
    enqueue(
        &base,
        token,
        job(serde_json::json!({"task": "builtin.http", "args": {"url": counter.url("fail=5")}, "max_retries": 0})),
    )
    .await;
    enqueue(
        &base,
        token,
        job(
            serde_json::json!({"task": "builtin.http", "args": {"url": counter.url("fail=1")},
            "max_retries": 3, "retry_policy": {"kind": "fixed", "delay": 100}}),
        ),
    )
    .await;
    enqueue(
        &base,
        token,
        job(serde_json::json!({"task": "nobody.handles.this", "allow_unknown_task": true})),
    )
    .await;
    let want = [4, 1, 1, 1];
    let (v, _) = eventually(
        Duration::from_secs(60),
        "the series to count every outcome",
        || async {
            let (v, totals) = series(&base, token, q).await;
            (totals == want).then_some((v, totals))
        },
    )
    .await;
    assert_eq!(v["step_seconds"], 60);
    assert_eq!(v["t"].as_array().unwrap().len(), 60);
    assert!(
        v["queues"].as_array().unwrap().iter().any(|x| x == q),
        "{v}"
    );
    // Three 300 ms sleeps among four successes and a fast failure: p50 of run time is in
    // the hundreds of ms, p99 not below it; waits are short.
    let run50 = top(&v, "run_p50_ms").expect("a run p50");
    let run99 = top(&v, "run_p99_ms").expect("a run p99");
    assert!((50.0..=5000.0).contains(&run50), "run p50 {run50}: {v}");
    assert!(run99 >= run50, "{v}");
    let wait99 = top(&v, "wait_p99_ms").expect("a wait p99");
    assert!(wait99 < 30_000.0, "wait p99 {wait99}: {v}");
    // Bad input is a 400 with the usual error body.
    let r = http_client()
        .get(format!("{base}/v1/stats/series?range=year"))
        .header("authorization", format!("Bearer {token}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let e: serde_json::Value = r.json().await.unwrap();
    assert!(
        e["error"]["message"].as_str().unwrap().contains("range"),
        "{e}"
    );

    // A restart: the rollups are in the store, and rolling up again doubles nothing.
    assert_eq!(up.terminate(Duration::from_secs(30)), Some(0));
    let (mut up, base) = start_up_with(&env, &fast, &[("HOMING_API_TOKEN", token)]).await;
    let (_, totals) = series(&base, token, q).await;
    assert_eq!(totals, want, "right after the restart");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (_, totals) = series(&base, token, q).await;
    assert_eq!(totals, want, "after several passes of the new server");

    // The dashboard draws the four charts, following the system's dark preference, then the
    // toggle's light and dark.
    let browser = Browser::start(&env).await;
    browser
        .call(
            "POST",
            "/goog/cdp/execute",
            serde_json::json!({"cmd": "Emulation.setEmulatedMedia", "params": {"features": [
                {"name": "prefers-color-scheme", "value": "dark"}]}}),
        )
        .await;
    browser.goto(&format!("{base}/")).await;
    browser
        .wait_for(
            "the token form",
            "return !document.querySelector('#login').hidden;",
        )
        .await;
    browser.type_into("#token-input", token).await;
    browser.click("#token-submit").await;
    let drawn = "return document.querySelectorAll('#charts .chart canvas').length === 4 \
                 && document.querySelector('#chart-outcomes').dataset.nonzero === '1';";
    browser.wait_for("four charts with data", drawn).await;
    let theme = browser
        .eval("return document.documentElement.dataset.theme;")
        .await;
    assert_eq!(theme, "dark", "auto follows prefers-color-scheme");
    let dark_bg = page_background(&browser).await;
    // One queue's charts, then a screenshot of each theme.
    browser
        .eval(&format!(
            "const s = document.querySelector('#chart-queue'); s.value = '{q}'; \
             s.dispatchEvent(new Event('change')); return true;"
        ))
        .await;
    browser.wait_for("the queue's charts", drawn).await;
    browser
        .eval("document.querySelector('#charts').scrollIntoView(); return true;")
        .await;
    let shot = browser.screenshot("charts-dark.png").await;
    assert!(std::fs::metadata(&shot).unwrap().len() > 10_000);
    // auto → light → dark.
    browser.click("#theme-toggle").await;
    let light = browser
        .wait_for(
            "the light theme",
            "return document.documentElement.dataset.theme === 'light' && document.documentElement.dataset.chartsDrawn;",
        )
        .await;
    assert!(light.is_string(), "{light}");
    let light_bg = page_background(&browser).await;
    assert_ne!(
        dark_bg, light_bg,
        "the page's colours change with the theme"
    );
    browser.wait_for("the charts redrawn", drawn).await;
    browser
        .eval("document.querySelector('#charts').scrollIntoView(); return true;")
        .await;
    browser.screenshot("charts-light.png").await;
    browser.click("#theme-toggle").await;
    browser
        .wait_for(
            "the dark theme pinned",
            "return document.documentElement.dataset.theme === 'dark' && document.documentElement.dataset.themeChoice === 'dark';",
        )
        .await;
    // The week: 168 hourly points, from the hourly rollups.
    browser.click("#charts [data-range='week']").await;
    browser
        .wait_for(
            "the week's charts",
            "return document.querySelector('#chart-outcomes').dataset.points === '168' \
             && document.querySelector('#chart-outcomes').dataset.nonzero === '1';",
        )
        .await;
    browser
        .eval("document.querySelector('#charts').scrollIntoView(); return true;")
        .await;
    browser.screenshot("charts-week-dark.png").await;
    // The library is served from the binary, not from elsewhere.
    let scripts = browser
        .eval("return [...document.scripts].map((s) => s.src).join(' ');")
        .await;
    assert!(
        scripts
            .as_str()
            .unwrap()
            .contains(&format!("{base}/dashboard/vendor/uplot.min.js")),
        "{scripts}"
    );
    browser.quit().await;

    // With a 1 s retention the jobs and their rollups are pruned.
    up.terminate(Duration::from_secs(30));
    let (_up, base) = start_up_with(
        &env,
        &[
            "--stats-interval",
            "200ms",
            "--retention",
            "1s",
            "--queue",
            "charts",
        ],
        &[("HOMING_API_TOKEN", token)],
    )
    .await;
    eventually(
        Duration::from_secs(60),
        "the rollups to be pruned with the jobs",
        || async {
            let (_, totals) = series(&base, token, q).await;
            (totals == [0, 0, 0, 0]).then_some(())
        },
    )
    .await;
}

/// Search (docs/operate.md): the args path and substring fields narrow the jobs table, a refused
/// search says why and leaves the rest of the page working, bulk buttons hide while a search
/// narrows the list further than a bulk action would reach, and a worker opens its own view
/// with what liveness uses.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dashboard_searches_jobs_and_shows_a_worker() {
    let env = Env::sqlite();
    let token = "dashboard-token-search";
    let (_up, base) = start_up(&env, &[("HOMING_API_TOKEN", token)]).await;
    let mut ids = Vec::new();
    for (i, who) in ["ann", "bob", "ann"].into_iter().enumerate() {
        ids.push(
            enqueue(
                &base,
                token,
                serde_json::json!({"task": "t.search", "queue": "searchq", "allow_unknown_task": true,
                    "args": {"customer": {"name": who}, "code": format!("{i}0%_off")}}),
            )
            .await,
        );
    }
    let browser = Browser::start(&env).await;
    browser.goto(&format!("{base}/")).await;
    browser
        .wait_for(
            "the token form",
            "return !document.querySelector('#login').hidden;",
        )
        .await;
    browser.type_into("#token-input", token).await;
    browser.click("#token-submit").await;
    browser
        .wait_for(
            "the search fields",
            "return !document.querySelector('#app').hidden && document.querySelector('#f-path') !== null;",
        )
        .await;
    let shown = "return Array.from(document.querySelectorAll('#jobs tbody tr[data-id]')).map((r) => r.dataset.id).join(',');";
    browser.type_into("#f-queue", "searchq").await;
    browser.type_into("#f-path", "customer.name").await;
    browser.type_into("#f-value", "ann").await;
    browser.click("#filters button[type=submit]").await;
    let want = format!("{},{}", ids[2], ids[0]);
    browser
        .wait_for(
            "only ann's jobs",
            &format!("const s = (() => {{ {shown} }})(); return s === '{want}';"),
        )
        .await;
    // A queued filter would offer "Cancel all…", but not while the search narrows the list.
    browser
        .eval("document.querySelector('#f-state').value = 'queued'; return true;")
        .await;
    browser.click("#filters button[type=submit]").await;
    browser
        .wait_for(
            "the queued search",
            &format!("const s = (() => {{ {shown} }})(); return s === '{want}';"),
        )
        .await;
    assert_eq!(
        browser
            .eval("return document.querySelector('#bulk').hidden;")
            .await,
        true
    );
    let shot = browser.screenshot("dashboard-search.png").await;
    eprintln!("screenshot: {}", shot.display());
    // A substring is plain text: "1" then "0%_" matches only the second job's code "10%_off".
    browser
        .eval("for (const id of ['f-path', 'f-value']) document.querySelector('#' + id).value = ''; document.querySelector('#f-state').value = ''; return true;")
        .await;
    browser.type_into("#f-contains", "10%_").await;
    browser.click("#filters button[type=submit]").await;
    browser
        .wait_for(
            "the substring match",
            &format!(
                "const s = (() => {{ {shown} }})(); return s === '{}';",
                ids[1]
            ),
        )
        .await;
    // A bad path is refused with its reason; the rest of the page keeps refreshing.
    browser.type_into("#f-path", "a;DROP").await;
    browser.type_into("#f-value", "1").await;
    browser.click("#filters button[type=submit]").await;
    let msg = browser
        .wait_for(
            "the refusal",
            "const m = document.querySelector('#search-error'); return !m.hidden && m.textContent.includes('args_path') ? m.textContent : null;",
        )
        .await;
    assert!(msg.as_str().unwrap().contains("search refused"), "{msg}");
    assert_eq!(
        browser
            .eval("return document.querySelector('#status').className;")
            .await,
        "status ok"
    );
    let refused = browser.screenshot("dashboard-search-refused.png").await;
    eprintln!("screenshot: {}", refused.display());

    // The worker view of one of the `up` process's live workers.
    let worker = browser
        .wait_for(
            "a worker link",
            "const a = document.querySelector('#workers tr:has(.badge.w-live) a[href^=\"#/workers/\"]'); return a ? a.getAttribute('href') : null;",
        )
        .await;
    browser
        .goto(&format!("{base}/{}", worker.as_str().unwrap()))
        .await;
    let detail = browser
        .wait_for(
            "the worker view",
            "const d = document.querySelector('#worker-detail'); return d && !d.hidden && d.textContent.includes('heartbeat expires in') ? d.textContent : null;",
        )
        .await;
    let detail = detail.as_str().unwrap();
    for part in [
        "liveness",
        "host",
        "pid",
        "concurrency",
        "queues",
        "tasks",
        "Running jobs",
    ] {
        assert!(detail.contains(part), "{part} in {detail}");
    }
    let shot = browser.screenshot("dashboard-worker.png").await;
    eprintln!("screenshot: {}", shot.display());

    // The job view links a job to its follow-up (found by search on args.parent.id) and back.
    let parent = enqueue(
        &base,
        token,
        serde_json::json!({"task": "builtin.noop", "on_success": {"task": "builtin.noop", "args": {"n": 1}}}),
    )
    .await;
    browser.goto(&format!("{base}/#/jobs/{parent}")).await;
    let child = browser
        .wait_for(
            "the follow-up link",
            "const a = document.querySelector('#follow-ups a[href^=\"#/jobs/\"]'); return a ? a.getAttribute('href').slice(7) : null;",
        )
        .await;
    let child = child.as_str().unwrap().to_string();
    assert_ne!(child, parent);
    let shot = browser.screenshot("dashboard-job-links.png").await;
    eprintln!("screenshot: {}", shot.display());
    browser.goto(&format!("{base}/#/jobs/{child}")).await;
    browser
        .wait_for(
            "the link back to the parent",
            &format!("const a = document.querySelector('.job-links a[href=\"#/jobs/{parent}\"]'); return a !== null;"),
        )
        .await;
    browser.quit().await;
}

/// The worker view of docs/workers.md in Chromium: a live worker shows its heartbeat's age
/// against its TTL and its version; after it is killed with SIGKILL mid-job, its view shows
/// when it was declared lost and the reclaimed job as a link that opens the job view.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dashboard_shows_a_live_and_a_lost_worker() {
    let env = Env::sqlite();
    let token = "dashboard-token-workers";
    let (_up, base) = start_up(&env, &[("HOMING_API_TOKEN", token)]).await;
    let mut victim = env.worker("victim", "wview", &["--no-maintenance"]);
    let job = enqueue(
        &base,
        token,
        serde_json::json!({"task": "builtin.sleep", "queue": "wview", "args": {"ms": 600000}}),
    )
    .await;
    let http = http_client();
    let job_json = |id: String| {
        let http = http.clone();
        let base = base.clone();
        async move {
            http.get(format!("{base}/v1/jobs/{id}"))
                .header("authorization", format!("Bearer {token}"))
                .send()
                .await
                .ok()?
                .json::<serde_json::Value>()
                .await
                .ok()
        }
    };
    let running = eventually(Duration::from_secs(30), "the job running", || async {
        job_json(job.clone())
            .await
            .filter(|j| j["state"] == "running")
    })
    .await;
    let worker = running["worker"].as_str().unwrap().to_string();

    let browser = Browser::start(&env).await;
    browser.goto(&format!("{base}/")).await;
    browser
        .wait_for(
            "the token form",
            "return !document.querySelector('#login').hidden;",
        )
        .await;
    browser.type_into("#token-input", token).await;
    browser.click("#token-submit").await;
    browser
        .wait_for("the app", "return !document.querySelector('#app').hidden;")
        .await;
    browser.goto(&format!("{base}/#/workers/{worker}")).await;
    let live = browser
        .wait_for(
            "the live worker's view",
            "const d = document.querySelector('#worker-detail'); return d && !d.hidden && d.querySelector('.hb-bar') && d.textContent.includes('TTL') ? d.textContent : null;",
        )
        .await;
    let live = live.as_str().unwrap();
    for part in [
        "heartbeat TTL",
        "600 ms",
        "version",
        env!("CARGO_PKG_VERSION"),
        "Running jobs",
        "Reclaimed jobs",
    ] {
        assert!(live.contains(part), "{part} in {live}");
    }
    // The job it runs, linked by id under "Running jobs"; its own pid.
    browser
        .wait_for(
            "the running job linked from the live worker's view",
            &format!(
                "return !!document.querySelector('#worker-detail .worker-jobs a[href=\"#/jobs/{job}\"]');"
            ),
        )
        .await;
    let pid = browser
        .eval("const dt = [...document.querySelectorAll('#worker-detail dt')].find((e) => e.textContent === 'pid'); return dt ? dt.nextElementSibling.textContent : null;")
        .await;
    assert_eq!(pid, victim.pid().to_string());
    let shot = browser.screenshot("dashboard-worker-live.png").await;
    eprintln!("screenshot: {}", shot.display());

    victim.kill9();
    let link = format!("#worker-detail .worker-reclaims a[href=\"#/jobs/{job}\"]");
    let lost = browser
        .wait_for(
            "the lost worker's view with its reclaimed job",
            &format!(
                "const d = document.querySelector('#worker-detail'); return d && d.querySelector('{}') && d.textContent.includes('lost at') ? d.textContent : null;",
                link.replace('\'', "\\'")
            ),
        )
        .await;
    let lost = lost.as_str().unwrap();
    assert!(lost.contains("requeued"), "{lost}");
    let shot = browser.screenshot("dashboard-worker-lost.png").await;
    eprintln!("screenshot: {}", shot.display());
    browser.click(&link).await;
    browser
        .wait_for(
            "the reclaimed job's view",
            &format!("const d = document.querySelector('#job-detail'); return d && !d.hidden && d.textContent.includes('{job}');"),
        )
        .await;
    browser.quit().await;
}

/// The job view's full timeline (docs/timeline.md): a job that fails once, then loses its
/// worker to kill -9 mid-run, then succeeds on another worker, shows every run with its epoch
/// and worker, the error, the crash with the worker presumed dead, and the result.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn job_view_shows_the_full_timeline_through_a_failure_and_a_crash() {
    let env = Env::sqlite();
    let token = "dashboard-token-timeline";
    let (_up, base) = start_up(&env, &[("HOMING_API_TOKEN", token)]).await;
    let counter = Counter::start().await;
    // `homing up` serves `default` only: this queue's runs are the two workers'.
    let mut first = env.worker("timeline-w1", "timeline", &["--concurrency", "1"]);
    // Call 1 fails (500: retried after 100 ms); call 2 is held 1.5 s, during which its worker
    // is killed; call 3 succeeds.
    let id = enqueue(
        &base,
        token,
        serde_json::json!({"task": "builtin.http", "queue": "timeline",
            "args": {"url": counter.url("fail=1&delay_ms=1500")},
            "max_retries": 3, "retry_policy": {"kind": "fixed", "delay": 100}}),
    )
    .await;
    eventually(
        Duration::from_secs(60),
        "the run after the failure to call",
        || async { (counter.total() >= 2).then_some(()) },
    )
    .await;
    first.kill9();
    let _second = env.worker("timeline-w2", "timeline", &["--concurrency", "1"]);
    let http = http_client();
    let job = |id: String| {
        let http = http.clone();
        let base = base.clone();
        async move {
            http.get(format!("{base}/v1/jobs/{id}/history"))
                .header("authorization", format!("Bearer {token}"))
                .send()
                .await
                .unwrap()
                .json::<serde_json::Value>()
                .await
                .unwrap()
        }
    };
    // The endpoint reads the timeline, then the row (api/jobs.rs history): a commit between the
    // two reads shows a succeeded row over a timeline without its entry yet. So the wait is for
    // both; an entry that never came would still fail it.
    let h = eventually(
        Duration::from_secs(60),
        "the job to succeed and its timeline to show it",
        || async {
            let h = job(id.clone()).await;
            let last = h["entries"].as_array().and_then(|e| e.last()).cloned();
            (h["job"]["state"] == "succeeded" && last.is_some_and(|e| e["kind"] == "succeeded"))
                .then_some(h)
        },
    )
    .await;
    let kinds: Vec<&str> = h["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .filter(|k| *k != "progress")
        .collect();
    assert_eq!(
        kinds,
        [
            "enqueued",
            "started",
            "retry_scheduled",
            "due",
            "started",
            "crashed",
            "started",
            "succeeded"
        ],
        "{h:#}"
    );
    assert_eq!(counter.total(), 3, "one call per run");

    let browser = Browser::start(&env).await;
    browser.goto(&format!("{base}/#/jobs/{id}")).await;
    browser
        .wait_for(
            "the token form",
            "return !document.querySelector('#login').hidden;",
        )
        .await;
    browser.type_into("#token-input", token).await;
    browser.click("#token-submit").await;
    let rows = browser
        .wait_for(
            "the job's timeline",
            "const rows = [...document.querySelectorAll('#job-timeline tbody tr[data-kind]')]; \
             return rows.some((r) => r.dataset.kind === 'succeeded') ? rows.map((r) => [r.dataset.kind, r.dataset.epoch, r.cells[4].textContent, r.cells[6].textContent]) : null;",
        )
        .await;
    let rows: Vec<(String, String, String, String)> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let c = |i: usize| r[i].as_str().unwrap().to_string();
            (c(0), c(1), c(2), c(3))
        })
        .collect();
    let of = |kind: &str| -> Vec<&(String, String, String, String)> {
        rows.iter().filter(|r| r.0 == kind).collect()
    };
    let starts = of("started");
    assert_eq!(starts.len(), 3, "{rows:?}");
    let epochs: Vec<u64> = starts.iter().map(|r| r.1.parse().unwrap()).collect();
    assert!(epochs[0] < epochs[1] && epochs[1] < epochs[2], "{rows:?}");
    // The failure, under the first run's epoch and worker, with the service's answer.
    let failed = of("retry_scheduled");
    assert_eq!((&failed[0].1, &failed[0].2), (&starts[0].1, &starts[0].2));
    assert!(failed[0].3.contains("500"), "{rows:?}");
    // The crash, under the second run's epoch, naming the killed worker as presumed dead.
    let crashed = of("crashed");
    assert_eq!((&crashed[0].1, &crashed[0].2), (&starts[1].1, &starts[1].2));
    assert!(crashed[0].3.contains("presumed dead"), "{rows:?}");
    // The success on the other worker, with its result.
    let done = of("succeeded");
    assert_eq!((&done[0].1, &done[0].2), (&starts[2].1, &starts[2].2));
    assert_ne!(
        starts[2].2, starts[1].2,
        "the last run is on the second worker"
    );
    browser
        .eval("document.querySelector('#job-timeline').scrollIntoView(); return true;")
        .await;
    let shot = browser.screenshot("dashboard-job-timeline.png").await;
    eprintln!("screenshot: {}", shot.display());
    browser.quit().await;
}

/// Every link and action of the dashboard not covered above (docs/dashboard-tests.md), in one
/// server and one browser session: the job view's links (schedule, workflow, parent steps,
/// follow-up and back) clicked and followed to where they land; a job's own Cancel and Retry
/// buttons; a workflow's cancel button; every search field and the pager; bulk retry and bulk
/// delete with their count and confirmation (declined, then confirmed); the audit log of it
/// all; a read token seeing no write button in a job's or a workflow's view; the dark theme.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dashboard_follows_every_link_and_runs_every_action() {
    const ADMIN: &str = "proof-admin-7";
    const READ: &str = "proof-read-7";
    let env = Env::sqlite();
    let config = env.path().join("config.json");
    std::fs::write(
        &config,
        format!(
            r#"{{"api_tokens": [{{"token": "{READ}", "role": "read", "name": "ops-bob"}}, {{"token": "{ADMIN}", "role": "admin", "name": "ops-alice"}}]}}"#
        ),
    )
    .unwrap();
    let (_up, base) = start_up(&env, &[("HOMING_CONFIG", config.to_str().unwrap())]).await;
    let http = http_client();
    let counter = Counter::start().await;
    let post = |path: String, body: serde_json::Value| {
        let http = http.clone();
        let base = base.clone();
        async move {
            let r = http
                .post(format!("{base}{path}"))
                .header("authorization", format!("Bearer {ADMIN}"))
                .json(&body)
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success(), "{path}: {}", r.status());
            r.json::<serde_json::Value>().await.unwrap()
        }
    };

    // What the links lead to: a schedule, a two-step workflow, a job with a follow-up, and a
    // workflow held on a queue nobody serves (so it can be cancelled).
    let r = http
        .put(format!("{base}/v1/schedules/proof-tick"))
        .header("authorization", format!("Bearer {ADMIN}"))
        .json(&serde_json::json!({"task": "builtin.noop", "every": "1s"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let linked = post(
        "/v1/workflows".into(),
        serde_json::json!({"name": "linked", "steps": {
            "first": {"task": "builtin.noop"},
            "second": {"task": "builtin.noop", "after": ["first"]}}}),
    )
    .await;
    let wf = linked["id"].as_str().unwrap().to_string();
    let first = linked["steps"]["first"].as_str().unwrap().to_string();
    let second = linked["steps"]["second"].as_str().unwrap().to_string();
    let held = post(
        "/v1/workflows".into(),
        serde_json::json!({"name": "held", "steps": {
            "stuck": {"task": "builtin.noop", "queue": "parked"}}}),
    )
    .await;
    let held_wf = held["id"].as_str().unwrap().to_string();
    let parent = enqueue(
        &base,
        ADMIN,
        serde_json::json!({"task": "builtin.noop", "on_success": {"task": "builtin.noop", "args": {"n": 1}}}),
    )
    .await;
    // Thirty jobs on a queue nobody serves, in two batches either side of `cut` (for the time
    // range fields and the pager), and two that fail once (for bulk retry).
    let page_job =
        || serde_json::json!({"task": "t.page", "queue": "pages", "allow_unknown_task": true});
    let mut pages = Vec::new();
    for _ in 0..15 {
        pages.push(enqueue(&base, ADMIN, page_job()).await);
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let cut = homing::time::rfc3339(homing::time::now());
    tokio::time::sleep(Duration::from_millis(20)).await;
    for _ in 0..15 {
        pages.push(enqueue(&base, ADMIN, page_job()).await);
    }
    let mut failing = Vec::new();
    for _ in 0..2 {
        failing.push(
            enqueue(
                &base,
                ADMIN,
                serde_json::json!({"task": "builtin.http", "args": {"url": counter.url("fail=1")}, "max_retries": 0}),
            )
            .await,
        );
    }

    let browser = Browser::start(&env).await;
    let login = |token: &'static str| {
        let browser = &browser;
        async move {
            browser
                .wait_for(
                    "the token form",
                    "return !document.querySelector('#login').hidden;",
                )
                .await;
            browser.type_into("#token-input", token).await;
            browser.click("#token-submit").await;
        }
    };
    let hash = || async { browser.eval("return location.hash;").await };
    let detail_shows = |id: &str| {
        format!("const d = document.querySelector('#job-detail'); return !d.hidden && d.querySelector('h2').textContent.includes('{id}');")
    };
    browser.goto(&format!("{base}/")).await;
    login(ADMIN).await;

    // The schedules table's last job → the job view → its schedule link → the schedule's row.
    let tick_job = browser
        .wait_for(
            "the schedule's last job",
            "const a = document.querySelector('#schedules tr[data-schedule=\"proof-tick\"] a[href^=\"#/jobs/\"]'); return a ? a.getAttribute('href').slice(7) : null;",
        )
        .await;
    let tick_job = tick_job.as_str().unwrap().to_string();
    browser
        .click("#schedules tr[data-schedule=\"proof-tick\"] a[href^=\"#/jobs/\"]")
        .await;
    browser
        .wait_for("the scheduled job's view", &detail_shows(&tick_job))
        .await;
    browser
        .wait_for(
            "the schedule link",
            "return document.querySelector('.job-links a[href=\"#/schedules/proof-tick\"]') !== null;",
        )
        .await;
    browser.screenshot("proof-scheduled-job.png").await;
    browser
        .click(".job-links a[href=\"#/schedules/proof-tick\"]")
        .await;
    browser
        .wait_for(
            "the schedule's row, marked",
            "return document.querySelector('#job-detail').hidden && document.querySelector('#schedules tr.selected[data-schedule=\"proof-tick\"]') !== null;",
        )
        .await;
    assert_eq!(hash().await, "#/schedules/proof-tick");
    browser.screenshot("proof-schedule-link.png").await;

    // The workflows table → the workflow → its second step → the parent step → the workflow.
    browser
        .click(&format!("#workflows a[href=\"#/workflows/{wf}\"]"))
        .await;
    browser
        .wait_for(
            "the workflow's steps succeeded",
            "const rows = document.querySelectorAll('#workflow-steps tbody tr'); return rows.length === 2 && [...rows].every((r) => r.dataset.state === 'succeeded');",
        )
        .await;
    browser
        .click("#workflow-steps tr[data-step=\"second\"] a")
        .await;
    browser
        .wait_for("the second step's view", &detail_shows(&second))
        .await;
    assert_eq!(hash().await, format!("#/jobs/{second}"));
    let after = browser
        .wait_for(
            "the link to the parent step",
            &format!("const a = document.querySelector('.job-links a[href=\"#/jobs/{first}\"]'); return a ? a.parentElement.textContent : null;"),
        )
        .await;
    assert!(after.as_str().unwrap().starts_with("first: "), "{after}");
    browser.screenshot("proof-workflow-step.png").await;
    browser
        .click(&format!(".job-links a[href=\"#/jobs/{first}\"]"))
        .await;
    browser
        .wait_for("the first step's view", &detail_shows(&first))
        .await;
    browser
        .click(&format!("#job-detail a[href=\"#/workflows/{wf}\"]"))
        .await;
    browser
        .wait_for(
            "back on the workflow",
            "return !document.querySelector('#workflow-detail').hidden && document.querySelector('#job-detail').hidden;",
        )
        .await;
    assert_eq!(hash().await, format!("#/workflows/{wf}"));

    // A job → its follow-up → the job it follows.
    browser.goto(&format!("{base}/#/jobs/{parent}")).await;
    let child = browser
        .wait_for(
            "the follow-up link",
            "const a = document.querySelector('#follow-ups a[href^=\"#/jobs/\"]'); return a ? a.getAttribute('href').slice(7) : null;",
        )
        .await;
    let child = child.as_str().unwrap().to_string();
    browser.click("#follow-ups a[href^=\"#/jobs/\"]").await;
    browser
        .wait_for("the follow-up's view", &detail_shows(&child))
        .await;
    browser
        .click(&format!(".job-links a[href=\"#/jobs/{parent}\"]"))
        .await;
    browser
        .wait_for("the parent's view again", &detail_shows(&parent))
        .await;

    // The held workflow's cancel button.
    browser.goto(&format!("{base}/#/workflows/{held_wf}")).await;
    browser
        .wait_for(
            "the cancel workflow button",
            "return [...document.querySelectorAll('#workflow-detail button')].some((b) => b.textContent === 'cancel workflow');",
        )
        .await;
    browser.click("#workflow-detail .actions button").await;
    browser
        .wait_for(
            "the workflow cancelled",
            "const r = document.querySelector('#workflow-steps tr[data-step=\"stuck\"]'); return r && r.dataset.state === 'cancelled' && document.querySelector('#workflow-detail .detail-head .badge').textContent === 'cancelled';",
        )
        .await;
    browser.screenshot("proof-workflow-cancelled.png").await;
    browser.goto(&format!("{base}/#/")).await;

    // Filters and search fields: queue, task, id prefix, created from / before, the pager.
    let shown = "return [...document.querySelectorAll('#jobs tbody tr[data-id]')].map((r) => r.dataset.id);";
    let set = |fields: Vec<(&'static str, String)>| {
        let browser = &browser;
        async move {
            let mut js = String::new();
            for id in [
                "f-state",
                "f-queue",
                "f-task",
                "f-id",
                "f-from",
                "f-to",
                "f-path",
                "f-value",
                "f-contains",
            ] {
                let v = fields
                    .iter()
                    .find(|(k, _)| *k == id)
                    .map(|(_, v)| v.as_str())
                    .unwrap_or("");
                js.push_str(&format!(
                    "document.querySelector('#{id}').value = {};",
                    serde_json::json!(v)
                ));
            }
            js.push_str(
                "document.querySelector('#filters button[type=submit]').click(); return true;",
            );
            browser.eval(&js).await;
        }
    };
    let rows_are = |want: &[String]| {
        let want = serde_json::json!(want).to_string();
        format!("const s = (() => {{ {shown} }})(); return JSON.stringify(s) === '{want}';")
    };
    let newest: Vec<String> = pages.iter().rev().cloned().collect();
    set(vec![
        ("f-queue", "pages".into()),
        ("f-task", "t.page".into()),
    ])
    .await;
    browser
        .wait_for("the newest 25 jobs", &rows_are(&newest[..25]))
        .await;
    assert_eq!(
        browser
            .eval("return [document.querySelector('#next-page').hidden, document.querySelector('#first-page').hidden];")
            .await,
        serde_json::json!([false, true])
    );
    browser.click("#next-page").await;
    browser
        .wait_for("the older 5", &rows_are(&newest[25..]))
        .await;
    assert_eq!(
        browser
            .eval("return [document.querySelector('#next-page').hidden, document.querySelector('#first-page').hidden];")
            .await,
        serde_json::json!([true, false])
    );
    browser.screenshot("proof-older-page.png").await;
    browser.click("#first-page").await;
    browser
        .wait_for("the newest page again", &rows_are(&newest[..25]))
        .await;
    set(vec![("f-task", "t.nothing".into())]).await;
    browser
        .wait_for(
            "no job of another task",
            "return document.querySelector('#jobs tbody tr.empty') !== null;",
        )
        .await;
    // Ids are UUIDv7: the first digits are the creation time, shared by jobs of the same
    // moment; a prefix reaching into the random part picks one job.
    set(vec![("f-id", pages[3][..28].to_string())]).await;
    browser
        .wait_for("the job by id prefix", &rows_are(&pages[3..4]))
        .await;
    set(vec![("f-queue", "pages".into()), ("f-from", cut.clone())]).await;
    browser
        .wait_for("the jobs created from the cut", &rows_are(&newest[..15]))
        .await;
    set(vec![("f-queue", "pages".into()), ("f-to", cut.clone())]).await;
    browser
        .wait_for("the jobs created before the cut", &rows_are(&newest[15..]))
        .await;
    browser.screenshot("proof-search-time.png").await;

    // A queued job's Cancel button, then its Retry button.
    set(vec![("f-queue", "pages".into())]).await;
    let row = format!("#jobs tr[data-id=\"{}\"]", pages[29]);
    browser
        .wait_for(
            "the Cancel button",
            &format!("return document.querySelector('{row} button.cancel') !== null;"),
        )
        .await;
    browser.click(&format!("{row} button.cancel")).await;
    browser
        .wait_for("the job cancelled", &row_is(&pages[29], "cancelled"))
        .await;
    browser.click(&format!("{row} button.retry")).await;
    browser
        .wait_for("the job queued again", &row_is(&pages[29], "queued"))
        .await;

    // Bulk retry of the failed jobs: the count asked, declined, then confirmed.
    for id in &failing {
        support::wait_state(
            &env.client().await,
            id.parse().unwrap(),
            homing::JobState::Failed,
            Duration::from_secs(30),
        )
        .await;
    }
    browser
        .eval("window.__asked = []; window.__answers = [false, true, false, true]; window.confirm = (m) => { window.__asked.push(m); return window.__answers[window.__asked.length - 1]; }; return true;")
        .await;
    set(vec![
        ("f-state", "failed".into()),
        ("f-task", "builtin.http".into()),
    ])
    .await;
    browser
        .wait_for("the Retry all button", "return !document.querySelector('#bulk').hidden && !document.querySelector('#bulk-retry').hidden;")
        .await;
    browser.click("#bulk-retry").await;
    browser
        .wait_for("the first question", "return window.__asked.length === 1;")
        .await;
    browser
        .wait_for("the failed jobs untouched", &row_is(&failing[0], "failed"))
        .await;
    browser.click("#bulk-retry").await;
    browser
        .wait_for(
            "the retry's result",
            "return document.querySelector('#message').textContent.includes('retry: 2 jobs');",
        )
        .await;
    for id in &failing {
        support::wait_state(
            &env.client().await,
            id.parse().unwrap(),
            homing::JobState::Succeeded,
            Duration::from_secs(30),
        )
        .await;
        assert_eq!(counter.count(id), 2, "retried once");
    }

    // Bulk delete of the cancelled jobs of `pages`, the same way.
    post(
        "/v1/jobs/cancel?state=queued&queue=pages".into(),
        serde_json::json!({}),
    )
    .await;
    set(vec![
        ("f-state", "cancelled".into()),
        ("f-queue", "pages".into()),
    ])
    .await;
    browser
        .wait_for("the Delete all button", "return !document.querySelector('#bulk').hidden && !document.querySelector('#bulk-delete').hidden;")
        .await;
    browser.click("#bulk-delete").await;
    browser
        .wait_for("the third question", "return window.__asked.length === 3;")
        .await;
    browser
        .wait_for("the cancelled jobs kept", &row_is(&pages[29], "cancelled"))
        .await;
    browser.click("#bulk-delete").await;
    browser
        .wait_for(
            "the delete's result",
            "return document.querySelector('#message').textContent.includes('delete: 30 jobs') && document.querySelector('#jobs tbody tr.empty') !== null;",
        )
        .await;
    let asked = browser.eval("return window.__asked;").await;
    assert!(
        asked[0]
            .as_str()
            .unwrap()
            .contains("retry 2 jobs (state=failed, task=builtin.http)")
            && asked[2]
                .as_str()
                .unwrap()
                .contains("delete 30 jobs (state=cancelled, queue=pages)"),
        "{asked}"
    );
    browser.screenshot("proof-bulk-delete.png").await;
    let gone = http
        .get(format!("{base}/v1/jobs/{}", pages[0]))
        .header("authorization", format!("Bearer {ADMIN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 404);

    // The audit log names every write the page made, with who made it.
    let actions = browser
        .wait_for(
            "the audit entries",
            "const rows = [...document.querySelectorAll('#audit tbody tr[data-actor=\"ops-alice\"]')].map((r) => r.children[3].textContent); \
             return ['POST /v1/jobs/retry', 'POST /v1/jobs/delete', '/cancel'].every((a) => rows.some((r) => r.includes(a))) ? rows : null;",
        )
        .await;
    assert!(
        actions
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a.as_str().unwrap().contains("/v1/workflows/")),
        "the workflow's cancel is recorded: {actions}"
    );
    browser
        .eval("document.querySelector('#audit').scrollIntoView(); return true;")
        .await;
    browser.screenshot("proof-audit.png").await;

    // A read token: the job view and the workflow view offer no write button.
    let spare = enqueue(
        &base,
        ADMIN,
        serde_json::json!({"task": "builtin.noop", "queue": "parked"}),
    )
    .await;
    browser.click("#logout").await;
    login(READ).await;
    browser.goto(&format!("{base}/#/jobs/{spare}")).await;
    browser
        .wait_for("the queued job's view", &detail_shows(&spare))
        .await;
    browser
        .wait_for(
            "the read token's name",
            "return document.querySelector('#whoami').textContent === 'ops-bob (read)';",
        )
        .await;
    assert_eq!(
        browser
            .eval("return document.querySelectorAll('#job-detail button, #jobs button, #queues button').length;")
            .await,
        0
    );
    browser.screenshot("proof-read-token-job.png").await;
    browser.goto(&format!("{base}/#/workflows/{wf}")).await;
    browser
        .wait_for(
            "the workflow view",
            "return !document.querySelector('#workflow-detail').hidden;",
        )
        .await;
    assert_eq!(
        browser
            .eval("return document.querySelectorAll('#workflow-detail button').length;")
            .await,
        0
    );

    // The job view in the dark theme (the toggle goes auto → light → dark).
    browser.goto(&format!("{base}/#/jobs/{second}")).await;
    browser
        .wait_for("the step's view", &detail_shows(&second))
        .await;
    for _ in 0..2 {
        browser.click("#theme-toggle").await;
    }
    browser
        .wait_for(
            "the dark theme",
            "return document.documentElement.dataset.theme === 'dark';",
        )
        .await;
    browser.screenshot("proof-job-dark.png").await;
    // The view's panel is dark too: its light text must not sit on white.
    let (panel, text) = (
        browser
            .eval("return getComputedStyle(document.querySelector('#job-detail')).backgroundColor;")
            .await,
        browser
            .eval("return getComputedStyle(document.querySelector('#job-detail dd')).color;")
            .await,
    );
    assert_ne!(
        panel, "rgb(255, 255, 255)",
        "the job view in the dark theme (text {text})"
    );
    // The charts' remaining range: the last day, 24 hourly points.
    browser.click("#charts [data-range='day']").await;
    browser
        .wait_for(
            "the day's charts",
            "return document.querySelector('#chart-outcomes').dataset.points === '24';",
        )
        .await;
    browser.quit().await;
}
