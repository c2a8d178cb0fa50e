//! Child processes of a test: stopping them the way an operator would, and
//! finding the components `bulkhead up` started.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Asks `child` to stop (SIGTERM, so `up` stops its own components first:
/// SIGKILL would orphan them), waits up to `grace`, then kills it.
pub fn terminate(child: &mut Child, grace: Duration) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let until = Instant::now() + grace;
    while Instant::now() < until {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The children of `parent` whose command line runs `bulkhead ROLE ...`:
/// pid and the whole command line (arguments joined by spaces), read from
/// `/proc` (the children of each of its threads: a child may have been
/// spawned from any).
pub fn children(parent: u32, role: &str) -> Vec<(u32, String)> {
    let tasks = std::fs::read_dir(format!("/proc/{parent}/task"))
        .into_iter()
        .flatten();
    let lists = tasks.flatten().map(|t| t.path().join("children"));
    let pids: String = lists
        .filter_map(|l| std::fs::read_to_string(l).ok())
        .collect::<Vec<_>>()
        .join(" ");
    let wanted = format!("bulkhead {role} ");
    pids.split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok())
        .filter_map(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args: Vec<String> = raw
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            let program = args.first()?.rsplit('/').next()?.to_owned();
            let line = std::iter::once(program)
                .chain(args[1..].iter().cloned())
                .collect::<Vec<_>>()
                .join(" ");
            (line.starts_with(&wanted) || line == wanted.trim_end()).then_some((pid, line))
        })
        .collect()
}
