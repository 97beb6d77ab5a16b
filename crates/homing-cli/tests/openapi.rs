//! The HTTP API against its own OpenAPI document: the document lists exactly the routes the
//! router serves, and schemathesis (a schema-driven fuzzer, from the test virtualenv) finds no
//! 5xx and no response that differs from the document, following links from a created job to
//! reading, cancelling and retrying it.

mod support;

use std::collections::BTreeSet;
use support::*;

/// `(METHOD, /path/{id})` for every `.route(...)` in the router's source.
fn router_routes() -> BTreeSet<(String, String)> {
    let src = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/api/mod.rs"),
    )
    .expect("read src/api/mod.rs");
    let mut out = BTreeSet::new();
    for part in src.split(".route(\"").skip(1) {
        let (path, rest) = part.split_once('"').expect("a quoted path");
        let rest = rest.lines().next().unwrap_or("");
        let path = path.replace(":id", "{id}");
        for method in ["get", "post", "put", "patch", "delete"] {
            if rest.contains(&format!("{method}(")) {
                out.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    out
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
    assert!(routes.len() >= 14, "parsed the router: {routes:?}");
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
