//! Per-account limits: requests per minute, tokens per minute (prompt
//! estimate plus `max_tokens`, counted at admission) and concurrent
//! requests. In Redis when configured, so every gateway shares them (one
//! Lua script per admission, atomic); in memory otherwise (one task owns the
//! counters). Windows are fixed calendar minutes.
//!
//! A refused request consumes nothing: all three limits are checked before
//! any counter moves. A request refused for concurrency is told when a slot
//! is expected: when the oldest request in flight should end, from the
//! account's running mean request duration. Admission is cancel-safe: if the caller goes away
//! while it runs, the slot it took is given back. In Redis the requests in
//! flight are a sorted set of request ids with deadlines, so a gateway that
//! dies with requests open cannot leak the account's concurrency.

use redis::aio::ConnectionManager;
use std::collections::HashMap;
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};

/// The limits every account gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Requests per minute.
    pub requests_per_minute: u64,
    /// Tokens per minute.
    pub tokens_per_minute: u64,
    /// Requests in flight at once.
    pub concurrency: u64,
}

/// An account's standing in the current window, as the limiter saw it when
/// it decided (the request itself counted when it was admitted): what the
/// `x-ratelimit-*` headers tell the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// The account's limits.
    pub limits: Limits,
    /// Requests counted in this window.
    pub requests: u64,
    /// Tokens counted in this window.
    pub tokens: u64,
    /// Seconds until the window ends and both counts start again.
    pub reset_secs: u64,
}

impl Quota {
    /// Requests left in this window.
    pub fn remaining_requests(&self) -> u64 {
        self.limits
            .requests_per_minute
            .saturating_sub(self.requests)
    }

    /// Tokens left in this window.
    pub fn remaining_tokens(&self) -> u64 {
        self.limits.tokens_per_minute.saturating_sub(self.tokens)
    }
}

/// Why a request was not admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimiterError {
    /// Over a limit; retry after this many seconds.
    #[error("rate limit exceeded ({what}); retry after {retry_after_secs} s")]
    Limited {
        /// Which limit.
        what: &'static str,
        /// Seconds until it may pass.
        retry_after_secs: u64,
        /// The account's standing when it was refused.
        quota: Quota,
    },
    /// The request alone needs more tokens than a minute allows.
    #[error(
        "the request may use {tokens} tokens, more than the {limit} tokens per minute this account may use"
    )]
    TooLarge {
        /// Its estimate.
        tokens: u64,
        /// The per-minute limit.
        limit: u64,
    },
    /// The shared store failed (the request is refused, not let through).
    #[error("rate limit store unavailable: {0}")]
    Unavailable(String),
}

/// An admitted request's concurrency slot; released when dropped.
#[derive(Debug)]
pub struct Permit {
    release: Option<Release>,
    quota: Quota,
}

impl Permit {
    /// The account's standing once this request was counted.
    pub fn quota(&self) -> Quota {
        self.quota
    }
}

#[derive(Debug)]
enum Release {
    Memory(mpsc::UnboundedSender<Event>, String, Instant),
    Redis(ConnectionManager, String, String),
}

impl Drop for Permit {
    fn drop(&mut self) {
        match self.release.take() {
            Some(Release::Memory(tx, account, started)) => {
                let _ = tx.send(Event::Release { account, started });
            }
            Some(Release::Redis(mut con, base, id)) => {
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    rt.spawn(async move {
                        let now = now_ms();
                        let _: Result<i64, _> = redis::Script::new(RELEASE_SCRIPT)
                            .key(format!("{base}:inflight"))
                            .key(format!("{base}:duration"))
                            .arg(&id)
                            .arg(now)
                            .arg(MAX_REQUEST_MS)
                            .invoke_async(&mut con)
                            .await;
                    });
                }
            }
            None => {}
        }
    }
}

/// Mean request duration assumed before an account has finished any.
const FIRST_GUESS_MS: u64 = 10_000;

/// When a concurrency slot is expected, in whole seconds from now (1 to
/// 60): the oldest request in flight started `oldest_age_ms` ago and
/// requests take `mean_ms` on average.
fn slot_expected_in(oldest_age_ms: u64, mean_ms: u64) -> u64 {
    mean_ms
        .saturating_sub(oldest_age_ms)
        .div_ceil(1000)
        .clamp(1, 60)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(0))
}

/// The limiter; cheap to clone.
#[derive(Debug, Clone)]
pub struct Limiter {
    limits: Limits,
    store: Store,
}

#[derive(Debug, Clone)]
enum Store {
    Memory(mpsc::UnboundedSender<Event>),
    Redis {
        con: ConnectionManager,
        prefix: String,
    },
}

#[derive(Debug)]
enum Event {
    Admit {
        account: String,
        tokens: u64,
        started: Instant,
        reply: oneshot::Sender<Result<Quota, LimiterError>>,
    },
    Release {
        account: String,
        started: Instant,
    },
}

/// KEYS: requests this minute, tokens this minute, in-flight set, mean
/// duration. ARGV: rpm, tpm, concurrency, tokens, now (ms), request id,
/// deadline (ms), in-flight key lifetime (ms), first guess of the mean (ms).
/// Returns {0, requests, tokens} (admitted, counted) or which limit:
/// {1, requests, tokens}, {2, requests, tokens}, or {3, requests, tokens, ms
/// until a slot is expected}.
const SCRIPT: &str = r"
local r = tonumber(redis.call('GET', KEYS[1]) or '0')
local t = tonumber(redis.call('GET', KEYS[2]) or '0')
if r + 1 > tonumber(ARGV[1]) then return {1, r, t} end
if t + tonumber(ARGV[4]) > tonumber(ARGV[2]) then return {2, r, t} end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[5])
if redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[3]) then
  local oldest = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  local age = tonumber(ARGV[5]) - (tonumber(oldest[2]) - tonumber(ARGV[8]))
  local mean = tonumber(redis.call('GET', KEYS[4]) or ARGV[9])
  return {3, r, t, math.max(mean - age, 0)}
end
r = redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], 120)
t = redis.call('INCRBY', KEYS[2], ARGV[4])
redis.call('EXPIRE', KEYS[2], 120)
redis.call('ZADD', KEYS[3], ARGV[7], ARGV[6])
redis.call('PEXPIRE', KEYS[3], ARGV[8])
return {0, r, t}
";

/// KEYS: in-flight set, mean duration. ARGV: request id, now (ms),
/// in-flight lifetime (ms). Folds the request's duration into the mean
/// (weight 1/5) and removes it.
const RELEASE_SCRIPT: &str = r"
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score then
  local took = tonumber(ARGV[2]) - (tonumber(score) - tonumber(ARGV[3]))
  local mean = tonumber(redis.call('GET', KEYS[2]) or tostring(took))
  redis.call('SET', KEYS[2], math.floor(mean * 0.8 + took * 0.2), 'PX', 86400000)
end
return redis.call('ZREM', KEYS[1], ARGV[1])
";

/// The longest a request may hold a concurrency slot in Redis.
const MAX_REQUEST_MS: u64 = 15 * 60 * 1000;

/// A reconnecting connection to the Redis at `url` (the limiter's and the
/// budgets' counters).
pub(crate) async fn connect(url: &str) -> Result<ConnectionManager, redis::RedisError> {
    ConnectionManager::new(redis::Client::open(url)?).await
}

impl Limiter {
    /// Counters in this process (one task owns them).
    pub fn memory(limits: Limits) -> Limiter {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(own(rx, limits));
        Limiter {
            limits,
            store: Store::Memory(tx),
        }
    }

    /// Counters in Redis at `url`, under keys starting with `prefix`.
    pub async fn redis(limits: Limits, url: &str, prefix: &str) -> Result<Limiter, LimiterError> {
        let unavailable = |e: redis::RedisError| LimiterError::Unavailable(e.to_string());
        let con = connect(url).await.map_err(unavailable)?;
        Ok(Limiter {
            limits,
            store: Store::Redis {
                con,
                prefix: prefix.to_owned(),
            },
        })
    }

    /// Admits one request of about `tokens` tokens for `account`, or says
    /// which limit it hit.
    pub async fn admit(&self, account: &str, tokens: u64) -> Result<Permit, LimiterError> {
        if tokens > self.limits.tokens_per_minute {
            return Err(LimiterError::TooLarge {
                tokens,
                limit: self.limits.tokens_per_minute,
            });
        }
        match &self.store {
            Store::Memory(tx) => {
                let (reply, rx) = oneshot::channel();
                let started = Instant::now();
                tx.send(Event::Admit {
                    account: account.to_owned(),
                    tokens,
                    started,
                    reply,
                })
                .map_err(|_| LimiterError::Unavailable("limiter stopped".to_owned()))?;
                let quota = rx
                    .await
                    .map_err(|_| LimiterError::Unavailable("limiter stopped".to_owned()))??;
                Ok(Permit {
                    release: Some(Release::Memory(tx.clone(), account.to_owned(), started)),
                    quota,
                })
            }
            Store::Redis { con, prefix } => {
                // Run detached: if this caller is dropped mid-way, the task
                // still finishes and drops its permit, which gives the slot back.
                let (limits, con, prefix, account) =
                    (self.limits, con.clone(), prefix.clone(), account.to_owned());
                tokio::spawn(redis_admit(limits, con, prefix, account, tokens))
                    .await
                    .map_err(|e| LimiterError::Unavailable(e.to_string()))?
            }
        }
    }
}

async fn redis_admit(
    limits: Limits,
    mut con: ConnectionManager,
    prefix: String,
    account: String,
    tokens: u64,
) -> Result<Permit, LimiterError> {
    let (window, retry) = window();
    // One hash tag per account keeps its keys in one Redis Cluster slot.
    let base = format!("{prefix}:{{{account}}}");
    let inflight = format!("{base}:inflight");
    let mut id = [0u8; 8];
    getrandom::fill(&mut id).map_err(|e| LimiterError::Unavailable(e.to_string()))?;
    let id = hex::encode(id);
    let now = now_ms();
    let verdict: Vec<i64> = redis::Script::new(SCRIPT)
        .key(format!("{base}:{window}:req"))
        .key(format!("{base}:{window}:tok"))
        .key(&inflight)
        .key(format!("{base}:duration"))
        .arg(limits.requests_per_minute)
        .arg(limits.tokens_per_minute)
        .arg(limits.concurrency)
        .arg(tokens)
        .arg(now)
        .arg(&id)
        .arg(now + MAX_REQUEST_MS)
        .arg(MAX_REQUEST_MS)
        .arg(FIRST_GUESS_MS)
        .invoke_async(&mut con)
        .await
        .map_err(|e| LimiterError::Unavailable(e.to_string()))?;
    let at = |i: usize| verdict.get(i).map_or(0, |v| u64::try_from(*v).unwrap_or(0));
    let code = verdict.first().copied().unwrap_or(-1);
    let slot = verdict
        .get(3)
        .map_or(1, |ms| slot_expected_in(0, u64::try_from(*ms).unwrap_or(0)));
    let quota = Quota {
        limits,
        requests: at(1),
        tokens: at(2),
        reset_secs: retry,
    };
    verdict_of(code, quota, slot)?;
    Ok(Permit {
        release: Some(Release::Redis(con, base, id)),
        quota,
    })
}

/// The window ends in `quota.reset_secs`; `slot` is when a concurrency slot
/// is expected (seconds).
fn verdict_of(v: i64, quota: Quota, slot: u64) -> Result<Quota, LimiterError> {
    let what = match v {
        0 => return Ok(quota),
        1 => "requests per minute",
        2 => "tokens per minute",
        _ => {
            return Err(LimiterError::Limited {
                what: "concurrent requests",
                retry_after_secs: slot,
                quota,
            });
        }
    };
    Err(LimiterError::Limited {
        what,
        retry_after_secs: quota.reset_secs,
        quota,
    })
}

/// The current minute window and the seconds until it ends.
fn window() -> (u64, u64) {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    (secs / 60, 60 - secs % 60)
}

#[derive(Debug, Default)]
struct Counters {
    window: u64,
    requests: u64,
    tokens: u64,
    /// When each request in flight started.
    in_flight: Vec<Instant>,
    /// Running mean duration of finished requests.
    mean_ms: Option<u64>,
}

async fn own(mut rx: mpsc::UnboundedReceiver<Event>, limits: Limits) {
    let mut accounts: HashMap<String, Counters> = HashMap::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Admit {
                account,
                tokens,
                started,
                reply,
            } => {
                let (w, retry) = window();
                let c = accounts.entry(account).or_default();
                if c.window != w {
                    c.window = w;
                    c.requests = 0;
                    c.tokens = 0;
                }
                // Check everything before counting anything.
                let verdict = if c.requests + 1 > limits.requests_per_minute {
                    1
                } else if c.tokens + tokens > limits.tokens_per_minute {
                    2
                } else if c.in_flight.len() as u64 >= limits.concurrency {
                    3
                } else {
                    c.requests += 1;
                    c.tokens += tokens;
                    c.in_flight.push(started);
                    0
                };
                let oldest = c.in_flight.iter().min().map_or(0, |s| {
                    u64::try_from(s.elapsed().as_millis()).unwrap_or(u64::MAX)
                });
                let slot = slot_expected_in(oldest, c.mean_ms.unwrap_or(FIRST_GUESS_MS));
                let quota = Quota {
                    limits,
                    requests: c.requests,
                    tokens: c.tokens,
                    reset_secs: retry,
                };
                if reply.send(verdict_of(verdict, quota, slot)).is_err() && verdict == 0 {
                    // The caller went away while we decided: give the slot back.
                    if let Some(i) = c.in_flight.iter().position(|s| *s == started) {
                        c.in_flight.swap_remove(i);
                    }
                }
            }
            Event::Release { account, started } => {
                if let Some(c) = accounts.get_mut(&account)
                    && let Some(i) = c.in_flight.iter().position(|s| *s == started)
                {
                    c.in_flight.swap_remove(i);
                    let took = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                    c.mean_ms = Some(c.mean_ms.map_or(took, |m| (m * 4 + took) / 5));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which limit refused, and when to retry.
    fn refusal(e: &LimiterError) -> (&'static str, u64) {
        match e {
            LimiterError::Limited {
                what,
                retry_after_secs,
                ..
            } => (*what, *retry_after_secs),
            other => panic!("not a limit: {other}"),
        }
    }

    #[test]
    fn a_slot_is_expected_when_the_oldest_request_should_end() {
        assert_eq!(slot_expected_in(2_000, 10_000), 8);
        assert_eq!(slot_expected_in(12_000, 10_000), 1);
        assert_eq!(slot_expected_in(0, 600_000), 60);
    }

    #[tokio::test]
    async fn memory_limits_requests_tokens_and_concurrency() {
        let l = Limiter::memory(Limits {
            requests_per_minute: 100,
            tokens_per_minute: 1000,
            concurrency: 2,
        });
        let a = l.admit("a", 10).await.unwrap();
        let b = l.admit("a", 10).await.unwrap();
        // The second request counted: what the headers tell the client.
        let q = b.quota();
        assert_eq!((q.requests, q.tokens), (2, 20));
        assert_eq!((q.remaining_requests(), q.remaining_tokens()), (98, 980));
        assert!((1..=60).contains(&q.reset_secs), "{q:?}");
        let e = l.admit("a", 10).await.unwrap_err();
        // A refusal counts nothing and says so.
        let LimiterError::Limited { quota, .. } = &e else {
            panic!("{e}")
        };
        assert_eq!((quota.requests, quota.tokens), (2, 20));
        // Nothing finished yet: the first guess of a request's length.
        assert_eq!(refusal(&e), ("concurrent requests", FIRST_GUESS_MS / 1000));
        let _other = l.admit("b", 10).await.unwrap();
        drop(a);
        tokio::task::yield_now().await;
        let _c = l.admit("a", 10).await.unwrap();
        // A request took well under a second: a slot is expected at once.
        let e = l.admit("a", 10).await.unwrap_err();
        assert_eq!(refusal(&e), ("concurrent requests", 1));
        let e = l.admit("b", 995).await.unwrap_err();
        assert!(
            matches!(
                e,
                LimiterError::Limited {
                    what: "tokens per minute",
                    ..
                }
            ),
            "{e}"
        );
        // A refused request consumed nothing: the rest of the budget is there.
        let _d = l.admit("b", 990).await.unwrap();
        let e = l.admit("b", 5000).await.unwrap_err();
        assert!(matches!(e, LimiterError::TooLarge { .. }), "{e}");
    }

    #[tokio::test]
    async fn in_redis_a_concurrency_refusal_says_when_a_slot_is_expected() {
        let (url, prefix) = crate::testing::redis("slot");
        let limits = Limits {
            requests_per_minute: 100,
            tokens_per_minute: 1_000,
            concurrency: 1,
        };
        let l = match Limiter::redis(limits, &url, &prefix).await {
            Ok(l) => l,
            Err(e) => return crate::testing::redis_unreachable(&url, &e),
        };
        let a = l.admit("a", 1).await.expect("admitted");
        let q = a.quota();
        assert_eq!((q.requests, q.tokens, q.remaining_requests()), (1, 1, 99));
        // Nothing finished yet: the first guess of a request's length.
        assert_eq!(
            refusal(&l.admit("a", 1).await.unwrap_err()),
            ("concurrent requests", FIRST_GUESS_MS / 1000)
        );
        drop(a);
        // The release runs in the background; then the mean is what that
        // request took (well under a second).
        let mut again = None;
        for _ in 0..100 {
            if let Ok(p) = l.admit("a", 1).await {
                again = Some(p);
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert!(again.is_some(), "the slot came back");
        assert_eq!(
            refusal(&l.admit("a", 1).await.unwrap_err()),
            ("concurrent requests", 1)
        );
    }
}
