//! A `bulkhead up` the benchmarks start as a child process in a fresh data
//! directory: started, waited for until it prints its summary, its output
//! drained, and stopped (SIGTERM, so it stops its components in order) and
//! its directory removed when dropped.

use anyhow::Context;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `bulkhead up`.
#[derive(Debug)]
pub(crate) struct UpChild {
    pub(crate) child: Child,
    pub(crate) dir: PathBuf,
}

impl UpChild {
    /// `bulkhead up ARGS --data-dir DIR` in a fresh directory named after
    /// `tag`, its stderr passed through when `logs`; returns once ready.
    pub(crate) fn start(tag: &str, args: &[&str], logs: bool) -> anyhow::Result<UpChild> {
        UpChild::start_with_env(tag, args, &[], logs)
    }

    /// [`UpChild::start`] with `env` set for `up` and every component it
    /// starts.
    pub(crate) fn start_with_env(
        tag: &str,
        args: &[&str],
        env: &[(&str, &str)],
        logs: bool,
    ) -> anyhow::Result<UpChild> {
        let mut nonce = [0u8; 8];
        getrandom::fill(&mut nonce)?;
        let dir = std::env::temp_dir().join(format!(
            "bulkhead-{tag}-{}-{}",
            std::process::id(),
            hex::encode(nonce)
        ));
        let mut child = Command::new(std::env::current_exe()?)
            .arg("up")
            .args(args)
            .arg("--data-dir")
            .arg(&dir)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(if logs {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .spawn()
            .context("starting bulkhead up")?;
        let stdout = child.stdout.take().context("stdout")?;
        // From here on, dropping it stops it.
        let up = UpChild { child, dir };
        let mut lines = BufReader::new(stdout).lines();
        loop {
            match lines.next() {
                Some(Ok(l)) if l.contains("Ctrl-C stops everything") => break,
                Some(Ok(_)) => {}
                _ => anyhow::bail!("bulkhead up did not start"),
            }
        }
        // Keep draining its output.
        std::thread::spawn(move || for _ in lines {});
        Ok(up)
    }

    /// A JSON file `up` wrote in its data directory.
    pub(crate) fn read(&self, file: &str) -> anyhow::Result<serde_json::Value> {
        let text = std::fs::read_to_string(self.dir.join(file))
            .with_context(|| format!("reading {file}"))?;
        Ok(serde_json::from_str(&text)?)
    }
}

impl Drop for UpChild {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Ok(pid) = i32::try_from(self.child.id()) {
            use nix::sys::signal::{Signal, kill};
            let _ = kill(nix::unistd::Pid::from_raw(pid), Signal::SIGTERM);
            let until = Instant::now() + Duration::from_secs(15);
            while Instant::now() < until {
                if let Ok(Some(_)) = self.child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
