//! Per-account limits: requests per minute, tokens per minute (prompt
//! estimate plus `max_tokens`, counted at admission) and concurrent
//! requests. In Redis when configured, so every gateway shares them (one
//! Lua script per admission, atomic); in memory otherwise (one task owns the
//! counters). Windows are fixed calendar minutes.

use redis::aio::ConnectionManager;
use std::collections::HashMap;
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
    },
    /// The shared store failed (the request is refused, not let through).
    #[error("rate limit store unavailable: {0}")]
    Unavailable(String),
}

/// An admitted request's concurrency slot; released when dropped.
#[derive(Debug)]
pub struct Permit {
    release: Option<Release>,
}

#[derive(Debug)]
enum Release {
    Memory(mpsc::UnboundedSender<Event>, String),
    Redis(ConnectionManager, String),
}

impl Drop for Permit {
    fn drop(&mut self) {
        match self.release.take() {
            Some(Release::Memory(tx, account)) => {
                let _ = tx.send(Event::Release { account });
            }
            Some(Release::Redis(mut con, key)) => {
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    rt.spawn(async move {
                        let _: Result<i64, _> =
                            redis::cmd("DECR").arg(&key).query_async(&mut con).await;
                    });
                }
            }
            None => {}
        }
    }
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
        reply: oneshot::Sender<Result<(), LimiterError>>,
    },
    Release {
        account: String,
    },
}

const SCRIPT: &str = r"
local r = redis.call('INCR', KEYS[1])
if r == 1 then redis.call('EXPIRE', KEYS[1], 120) end
if r > tonumber(ARGV[1]) then return 1 end
local t = redis.call('INCRBY', KEYS[2], ARGV[4])
if t == tonumber(ARGV[4]) then redis.call('EXPIRE', KEYS[2], 120) end
if t > tonumber(ARGV[2]) then return 2 end
local c = redis.call('INCR', KEYS[3])
redis.call('EXPIRE', KEYS[3], 600)
if c > tonumber(ARGV[3]) then
  redis.call('DECR', KEYS[3])
  return 3
end
return 0
";

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
        let client =
            redis::Client::open(url).map_err(|e| LimiterError::Unavailable(e.to_string()))?;
        let con = ConnectionManager::new(client)
            .await
            .map_err(|e| LimiterError::Unavailable(e.to_string()))?;
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
        match &self.store {
            Store::Memory(tx) => {
                let (reply, rx) = oneshot::channel();
                tx.send(Event::Admit {
                    account: account.to_owned(),
                    tokens,
                    reply,
                })
                .map_err(|_| LimiterError::Unavailable("limiter stopped".to_owned()))?;
                rx.await
                    .map_err(|_| LimiterError::Unavailable("limiter stopped".to_owned()))??;
                Ok(Permit {
                    release: Some(Release::Memory(tx.clone(), account.to_owned())),
                })
            }
            Store::Redis { con, prefix } => {
                let (window, retry) = window();
                let keys = [
                    format!("{prefix}:{account}:{window}:req"),
                    format!("{prefix}:{account}:{window}:tok"),
                    format!("{prefix}:{account}:inflight"),
                ];
                let mut con = con.clone();
                let verdict: i64 = redis::Script::new(SCRIPT)
                    .key(&keys[0])
                    .key(&keys[1])
                    .key(&keys[2])
                    .arg(self.limits.requests_per_minute)
                    .arg(self.limits.tokens_per_minute)
                    .arg(self.limits.concurrency)
                    .arg(tokens)
                    .invoke_async(&mut con)
                    .await
                    .map_err(|e| LimiterError::Unavailable(e.to_string()))?;
                verdict_of(verdict, retry)?;
                let [_, _, inflight] = keys;
                Ok(Permit {
                    release: Some(Release::Redis(con, inflight)),
                })
            }
        }
    }
}

fn verdict_of(v: i64, retry: u64) -> Result<(), LimiterError> {
    let what = match v {
        0 => return Ok(()),
        1 => "requests per minute",
        2 => "tokens per minute",
        _ => {
            return Err(LimiterError::Limited {
                what: "concurrent requests",
                retry_after_secs: 1,
            });
        }
    };
    Err(LimiterError::Limited {
        what,
        retry_after_secs: retry,
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
    in_flight: u64,
}

async fn own(mut rx: mpsc::UnboundedReceiver<Event>, limits: Limits) {
    let mut accounts: HashMap<String, Counters> = HashMap::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Admit {
                account,
                tokens,
                reply,
            } => {
                let (w, retry) = window();
                let c = accounts.entry(account).or_default();
                if c.window != w {
                    c.window = w;
                    c.requests = 0;
                    c.tokens = 0;
                }
                c.requests += 1;
                let verdict = if c.requests > limits.requests_per_minute {
                    1
                } else {
                    c.tokens += tokens;
                    if c.tokens > limits.tokens_per_minute {
                        2
                    } else if c.in_flight >= limits.concurrency {
                        3
                    } else {
                        c.in_flight += 1;
                        0
                    }
                };
                let _ = reply.send(verdict_of(verdict, retry));
            }
            Event::Release { account } => {
                if let Some(c) = accounts.get_mut(&account) {
                    c.in_flight = c.in_flight.saturating_sub(1);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_limits_requests_tokens_and_concurrency() {
        let l = Limiter::memory(Limits {
            requests_per_minute: 100,
            tokens_per_minute: 1000,
            concurrency: 2,
        });
        let a = l.admit("a", 10).await.unwrap();
        let _b = l.admit("a", 10).await.unwrap();
        let e = l.admit("a", 10).await.unwrap_err();
        assert!(
            matches!(
                e,
                LimiterError::Limited {
                    what: "concurrent requests",
                    ..
                }
            ),
            "{e}"
        );
        let _other = l.admit("b", 10).await.unwrap();
        drop(a);
        tokio::task::yield_now().await;
        let _c = l.admit("a", 10).await.unwrap();
        let e = l.admit("b", 5000).await.unwrap_err();
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
    }
}
