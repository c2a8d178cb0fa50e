//! The chaos soak, shortened: `bulkhead bench chaos --requests 1000` over a
//! real `up` whose prefill worker breaks 5% of its page frames while the
//! decode worker is SIGKILLed and both are SIGSTOPped now and then. Every
//! fault kind was injected, and still: no canary byte crossed accounts, no
//! over-long prompt got 200, nothing hung, every pool went back to its
//! baseline, no owner violation.

use serde_json::Value;
use std::process::Command;

#[test]
fn a_thousand_requests_under_chaos_leak_nothing_and_leave_no_page_behind() {
    let out = Command::new(env!("CARGO_BIN_EXE_bulkhead"))
        .args(["bench", "chaos", "--requests", "1000", "--json"])
        .args(["--signal-every-secs", "5", "--frame-faults-percent", "5"])
        .output()
        .expect("bench chaos runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"));
    eprintln!("{v}");
    assert_eq!(v["requests"], 1000, "{v}");
    for kind in [
        "frame_corrupted",
        "frame_delayed",
        "frame_dropped",
        "frame_duplicated",
        "frame_reordered",
        "sigkill",
        "sigstop",
    ] {
        assert!(
            v["faults_injected"][kind].as_u64() > Some(0),
            "{kind} was never injected: {v}"
        );
    }
    assert_eq!(v["cross_tenant_bytes"], 0, "{v}");
    assert_eq!(v["overlong_200"], 0, "{v}");
    assert_eq!(v["hung"], 0, "{v}");
    assert_eq!(v["pools_at_baseline"], true, "{v}");
    assert_eq!(v["owner_violations"], 0, "{v}");
    // The soak did serve: most normal requests were answered.
    let served: u64 = v["outcomes"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.ends_with(" 200"))
        .filter_map(|(_, n)| n.as_u64())
        .sum();
    assert!(served > 200, "{v}");
}
