//! What `up` shows a person, and where the rest goes. Every line each
//! component prints goes to its own file under `DATA_DIR/logs/`, rotated by
//! size; the terminal gets the lines that change the platform's state
//! (registrations, a worker's routability, warnings and errors, the
//! prober's findings, anything not logged through tracing) and, once a
//! minute when anything happened, a short summary: the gateway's requests,
//! refusals and failures, and each model's answers and tokens. Each
//! request's own log lines stay in the files. With `--verbose` (or
//! `RUST_LOG` set) every line is streamed as well.
//!
//! One thread owns the files and the tallies, fed by a channel of
//! [`Event`]s; the components' reader threads only send.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A log file is rotated (to `NAME.log.1`, replacing the previous one)
/// once it holds this many bytes.
const ROTATE_BYTES: u64 = 16 << 20;

/// How often the summary is printed (when anything happened).
const SUMMARY_EVERY: Duration = Duration::from_secs(60);

/// What the console thread is told.
#[derive(Debug)]
enum Event {
    /// A line a component printed, on its stdout or (`err`) its stderr.
    Line {
        component: String,
        err: bool,
        text: String,
    },
    /// `component` serves `model` (its answers count for that model).
    Serves { component: String, model: String },
}

/// The sending side of the console: cheap to clone, one per reader.
#[derive(Debug, Clone)]
pub(crate) struct Console {
    tx: mpsc::Sender<Event>,
    dir: PathBuf,
}

impl Console {
    /// Starts the console thread, writing logs under `data_dir/logs`;
    /// `verbose` streams every line to the terminal as well.
    pub(crate) fn start(data_dir: &Path, verbose: bool) -> std::io::Result<Console> {
        let dir = data_dir.join("logs");
        std::fs::create_dir_all(&dir)?;
        let (tx, rx) = mpsc::channel();
        let mut owner = Owner {
            dir: dir.clone(),
            verbose,
            files: BTreeMap::new(),
            serves: BTreeMap::new(),
            tally: Tally::default(),
        };
        std::thread::Builder::new()
            .name("up-console".to_owned())
            .spawn(move || owner.run(&rx))?;
        Ok(Console { tx, dir })
    }

    /// A line `component` printed.
    pub(crate) fn line(&self, component: &str, err: bool, text: String) {
        let _ = self.tx.send(Event::Line {
            component: component.to_owned(),
            err,
            text,
        });
    }

    /// Where `component`'s log file is.
    pub(crate) fn log_path(&self, component: &str) -> PathBuf {
        self.dir.join(format!("{}.log", file_name(component)))
    }

    /// `component` serves `model`.
    pub(crate) fn serves(&self, component: &str, model: &str) {
        let _ = self.tx.send(Event::Serves {
            component: component.to_owned(),
            model: model.to_owned(),
        });
    }
}

/// The console thread's state.
struct Owner {
    dir: PathBuf,
    verbose: bool,
    files: BTreeMap<String, LogFile>,
    serves: BTreeMap<String, String>,
    tally: Tally,
}

impl Owner {
    fn run(&mut self, rx: &mpsc::Receiver<Event>) {
        let mut next = Instant::now() + SUMMARY_EVERY;
        loop {
            match rx.recv_timeout(next.saturating_duration_since(Instant::now())) {
                Ok(Event::Line {
                    component,
                    err,
                    text,
                }) => self.line(&component, err, &text),
                Ok(Event::Serves { component, model }) => {
                    self.serves.insert(component, model);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Some(s) = self.tally.take().render(SUMMARY_EVERY) {
                        println!("{s}");
                    }
                    next = Instant::now() + SUMMARY_EVERY;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    fn line(&mut self, component: &str, err: bool, text: &str) {
        let file = self
            .files
            .entry(component.to_owned())
            .or_insert_with(|| LogFile::new(&self.dir, component));
        file.write(text);
        self.tally.count(
            component,
            self.serves.get(component).map(String::as_str),
            text,
        );
        if self.verbose || shown(text) {
            let out = format!("[{component}] {text}");
            // Never stops on a closed terminal: the components must keep
            // draining into their files.
            if err {
                let _ = writeln!(std::io::stderr().lock(), "{out}");
            } else {
                let _ = writeln!(std::io::stdout().lock(), "{out}");
            }
        }
    }
}

/// One component's log file, rotated by size.
struct LogFile {
    path: PathBuf,
    file: Option<File>,
    bytes: u64,
}

impl LogFile {
    fn new(dir: &Path, component: &str) -> LogFile {
        let path = dir.join(format!("{}.log", file_name(component)));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .ok();
        let bytes = file
            .as_ref()
            .and_then(|f| f.metadata().ok())
            .map_or(0, |m| m.len());
        LogFile { path, file, bytes }
    }

    fn write(&mut self, text: &str) {
        if self.bytes >= ROTATE_BYTES {
            self.file = None;
            let _ = std::fs::rename(&self.path, self.path.with_extension("log.1"));
            self.file = File::create(&self.path).ok();
            self.bytes = 0;
        }
        if let Some(f) = &mut self.file
            && writeln!(f, "{text}").is_ok()
        {
            self.bytes += text.len() as u64 + 1;
        }
    }
}

/// A component's name as a file name: `decode worker` → `decode-worker`.
fn file_name(component: &str) -> String {
    component
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

/// A log line's level, if it is a tracing line (text or JSON).
fn level(line: &str) -> Option<&str> {
    if line.starts_with('{') {
        let start = line.find("\"level\":\"")? + "\"level\":\"".len();
        let len = line[start..].find('"')?;
        return Some(&line[start..start + len]);
    }
    // `2026-12-04T10:41:37.457034Z  INFO ...`: a timestamp, then the level.
    let mut words = line.split_whitespace();
    let stamp = words.next()?;
    if !(stamp.len() > 20 && stamp.ends_with('Z') && stamp.as_bytes()[4] == b'-') {
        return None;
    }
    words
        .next()
        .filter(|l| matches!(*l, "TRACE" | "DEBUG" | "INFO" | "WARN" | "ERROR"))
}

/// Whether a person sees `line` without `--verbose`: warnings and errors,
/// anything not logged through tracing, and information logged outside a
/// request (a request's own lines are routine: they stay in the file).
fn shown(line: &str) -> bool {
    match level(line) {
        None | Some("WARN" | "ERROR") => true,
        Some("INFO") => !in_request(line),
        Some(_) => false,
    }
}

/// Whether a tracing line was logged inside a request's span.
fn in_request(line: &str) -> bool {
    line.contains("http.request{") || line.contains("\"name\":\"http.request\"")
}

/// What happened since the last summary.
#[derive(Debug, Default, PartialEq, Eq)]
struct Tally {
    /// Requests the gateway answered, refused (4xx) and failed (5xx).
    gateway: [u64; 3],
    /// Per model: answers and tokens (prompt and output).
    models: BTreeMap<String, (u64, u64)>,
}

impl Tally {
    /// Counts what `line` of `component` (serving `model`) reports.
    fn count(&mut self, component: &str, model: Option<&str>, line: &str) {
        if component == "gateway" && in_request(line) {
            if let Some(status) = field(line, "served status=") {
                self.gateway[0] += 1;
                match status {
                    400..=499 => self.gateway[1] += 1,
                    500.. => self.gateway[2] += 1,
                    _ => {}
                }
            }
        } else if let Some(model) = model
            && line.contains("bulkhead::worker: generated")
        {
            let tokens = field(line, " prompt_tokens=").unwrap_or(0)
                + field(line, " completion_tokens=").unwrap_or(0);
            let m = self.models.entry(model.to_owned()).or_default();
            m.0 += 1;
            m.1 += tokens;
        }
    }

    /// The tally so far, leaving an empty one.
    fn take(&mut self) -> Tally {
        std::mem::take(self)
    }

    /// One line, or none when nothing happened.
    fn render(&self, period: Duration) -> Option<String> {
        if self.gateway[0] == 0 && self.models.is_empty() {
            return None;
        }
        let [requests, refused, failed] = self.gateway;
        let mut s = format!(
            "bulkhead up: last {} s: gateway {requests} requests ({refused} refused, {failed} failed)",
            period.as_secs()
        );
        for (model, (answers, tokens)) in &self.models {
            s.push_str(&format!("; {model} {answers} answers, {tokens} tokens"));
        }
        Some(s)
    }
}

/// The number right after `key` in `line`.
fn field(line: &str, key: &str) -> Option<u64> {
    let rest = &line[line.find(key)? + key.len()..];
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const REQUEST: &str = "2026-12-04T10:41:37.457910Z  INFO http.request{otel.name=POST /v1/chat/completions http.route=\"/v1/chat/completions\" request_id=\"65b5\" http.response.status_code=200}: bulkhead::http: served status=200 ms=333.6";
    const GENERATED: &str = "2026-12-04T10:41:37.457034Z  INFO http.request{otel.name=POST /v1/generate}:generate{bulkhead.tenant=7 gen_ai.usage.input_tokens=5}: bulkhead::worker: generated prompt_tokens=5 completion_tokens=12 finish_reason=\"length\"";

    /// Data-driven: a line, and whether a person sees it without
    /// `--verbose`.
    #[test]
    fn a_person_sees_state_changes_warnings_and_plain_output_not_requests() {
        let cases = [
            (REQUEST, false),
            (GENERATED, false),
            (
                "2026-12-04T10:41:36.976171Z  INFO bulkhead::worker: registered: routable id=2 name=up-decode",
                true,
            ),
            (
                "2026-12-04T10:41:29.517975Z  WARN bulkhead::worker: registered: NOT routable id=1",
                true,
            ),
            (
                "2026-12-04T10:41:29.517975Z ERROR http.request{x}: bulkhead::http: failed",
                true,
            ),
            (
                "2026-12-04T10:41:29.517975Z DEBUG hyper::proto: flushed 200 bytes",
                false,
            ),
            ("listening http=127.0.0.1:1234", true),
            ("thread 'main' panicked at src/main.rs:1:1", true),
            (
                r#"{"timestamp":"2026-12-04T10:41:37Z","level":"INFO","fields":{"message":"served status=200"},"span":{"name":"http.request"}}"#,
                false,
            ),
            (
                r#"{"timestamp":"2026-12-04T10:41:37Z","level":"INFO","fields":{"message":"registered: routable"}}"#,
                true,
            ),
            (
                r#"{"timestamp":"2026-12-04T10:41:37Z","level":"WARN","fields":{"message":"x"},"span":{"name":"http.request"}}"#,
                true,
            ),
        ];
        for (line, want) in cases {
            assert_eq!(shown(line), want, "{line}");
        }
    }

    #[test]
    fn the_summary_counts_gateway_outcomes_and_each_models_answers_and_tokens() {
        let mut t = Tally::default();
        assert_eq!(t.render(SUMMARY_EVERY), None, "nothing happened");
        t.count("gateway", None, REQUEST);
        t.count(
            "gateway",
            None,
            &REQUEST.replace("status=200", "status=429"),
        );
        t.count(
            "gateway",
            None,
            &REQUEST.replace("status=200", "status=502"),
        );
        // Not a request's line: not counted.
        t.count(
            "gateway",
            None,
            "2026-12-04T10:41:37.457910Z  INFO bulkhead::gateway: served status=200",
        );
        t.count("decode worker", Some("@cf/a"), GENERATED);
        t.count("decode worker", Some("@cf/a"), GENERATED);
        t.count("q8-decode worker", Some("@cf/b"), GENERATED);
        // A worker whose model is unknown is not counted for any.
        t.count("other worker", None, GENERATED);
        let s = t.take().render(SUMMARY_EVERY).expect("a summary");
        assert_eq!(
            s,
            "bulkhead up: last 60 s: gateway 3 requests (1 refused, 1 failed); @cf/a 2 answers, 34 tokens; @cf/b 1 answers, 17 tokens"
        );
        assert_eq!(t, Tally::default(), "taking the tally empties it");
    }

    #[test]
    fn a_log_file_is_rotated_once_it_is_full() {
        let dir = std::env::temp_dir().join(format!("bulkhead-console-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let mut f = LogFile::new(&dir, "decode worker");
        f.write("first");
        f.bytes = ROTATE_BYTES;
        f.write("second");
        let read = |p: &str| std::fs::read_to_string(dir.join(p)).expect("log");
        assert_eq!(read("decode-worker.log.1"), "first\n");
        assert_eq!(read("decode-worker.log"), "second\n");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
