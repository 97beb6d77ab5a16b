//! The HTTP API against its own OpenAPI document: the document lists exactly the routes the
//! router serves, and schemathesis (a schema-driven fuzzer, from the test virtualenv) finds no
//! 5xx and no response that differs from the document, following links from a created job to
//! reading, cancelling and retrying it.

mod support;

use std::collections::BTreeSet;
use support::*;

/// `(METHOD, /path/{param})` for every `.route(...)` in the routers' sources: the binary's own
/// and the pipelines' it merges in.
fn router_routes() -> BTreeSet<(String, String)> {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = BTreeSet::new();
    for file in [
        manifest.join("src/api/mod.rs"),
        manifest.join("src/api/remote.rs"),
        manifest.join("../homing-pipelines/src/api/mod.rs"),
    ] {
        let src = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        for part in src.split(".route(").skip(1) {
            let call = balanced_call(part);
            let (path, rest) = call
                .trim_start()
                .strip_prefix('"')
                .and_then(|p| p.split_once('"'))
                .unwrap_or_else(|| panic!("a quoted path in .route({call}"));
            let path = path
                .split('/')
                .map(|seg| match seg.strip_prefix(':') {
                    Some(name) => format!("{{{name}}}"),
                    None => seg.to_string(),
                })
                .collect::<Vec<_>>()
                .join("/");
            for method in ["get", "post", "put", "patch", "delete"] {
                let called = rest.match_indices(&format!("{method}(")).any(|(i, _)| {
                    // A method-router constructor or a chained `.get(`, not `x_get(` or `budget(`.
                    !rest[..i]
                        .chars()
                        .next_back()
                        .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
                });
                if called {
                    out.insert((method.to_uppercase(), path.clone()));
                }
            }
        }
    }
    out
}

/// The text of a call's arguments up to its closing parenthesis (the call's opening one is
/// already consumed), over several lines if need be.
fn balanced_call(s: &str) -> &str {
    let mut depth = 1usize;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return &s[..i];
                }
            }
            _ => {}
        }
    }
    s
}

fn document_routes(doc: &serde_json::Value) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for method in ops.as_object().expect("operations").keys() {
            out.insert((method.to_uppercase(), path.clone()));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn api_conforms_to_its_openapi_document() {
    let venv = test_venv();
    let env = Env::sqlite();
    let token = "fuzz-token-0123456789";
    let (mut up, base) = start_up(&env, &[("HOMING_API_TOKEN", token)]).await;
    let http = http_client();
    let doc: serde_json::Value = http
        .get(format!("{base}/v1/openapi.json"))
        .header("authorization", format!("Bearer {token}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .expect("the OpenAPI document is JSON");
    assert_eq!(doc["openapi"], "3.0.3");
    let routes = router_routes();
    assert!(routes.len() >= 20, "parsed the routers: {routes:?}");
    assert!(
        routes.contains(&("POST".into(), "/v1/documents".into()))
            && routes.contains(&("GET".into(), "/v1/exhibitions/{id}/tracks/{index}".into())),
        "the pipelines' routes are parsed: {routes:?}"
    );
    assert_eq!(
        document_routes(&doc),
        routes,
        "the OpenAPI document and the router list different routes"
    );

    let schema_url = format!("{base}/v1/openapi.json");
    let auth = format!("Authorization: Bearer {token}");
    let workdir = env.path().to_path_buf();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(venv.join("bin/schemathesis"))
            .args([
                "run",
                &schema_url,
                "-H",
                &auth,
                "--checks",
                "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
                "--stateful=links",
                "--hypothesis-max-examples",
                "60",
                "--hypothesis-deadline",
                "none",
                "--hypothesis-derandomize",
                "--request-timeout",
                "10000",
                "--no-color",
            ])
            // Hypothesis keeps a cache in the working directory: not in the source tree.
            .current_dir(&workdir)
            .env("SCHEMATHESIS_TELEMETRY", "false")
            .output()
            .expect("run schemathesis from the test venv")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    up.terminate(std::time::Duration::from_secs(20));
    assert!(
        out.status.success(),
        "schemathesis found problems:\n{stdout}\n{stderr}\n--- server log ---\n{}",
        up.log_text()
    );
    // It really ran: every operation, and many requests per check.
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("not_a_server_error"))
        .unwrap_or_else(|| panic!("no summary in:\n{stdout}"));
    let n: usize = line
        .split_whitespace()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    assert!(n >= 200, "only {n} requests checked:\n{stdout}");
    assert!(!stdout.contains("FAILED"), "{stdout}");
    assert!(
        !up.log_text().contains("panicked"),
        "the server panicked:\n{}",
        up.log_text()
    );
}
