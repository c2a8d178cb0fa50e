//! Per-account spending budgets in neurons, per UTC day and calendar
//! month. Admission reserves a request's maximum cost atomically (one Lua
//! script in Redis when configured, so every gateway shares the counters;
//! one task owning them otherwise) and the answer settles the reservation
//! to the actual cost. The counters never exceed a budget: a reservation
//! that would is refused and counts nothing, and a settlement only gives
//! back. So concurrent requests cannot overshoot at all while the maximum
//! cost bounds the actual one; the stated bound is one request's
//! reservation, the most an estimate could be off.
//!
//! Counters in memory start, for each account, period and process, from
//! the control plane's ledger (what the fleet has already spent this day
//! and month), so a restarted gateway does not forget what was spent; a
//! ledger that cannot be read refuses that account's requests until it
//! can, as a Redis that cannot be reached does.
//!
//! A reservation that is dropped unsettled (the client went away mid-stream,
//! or the worker failed after it started) keeps its whole amount: the
//! gateway cannot see what the worker computed after that, and a budget
//! errs towards refusing. The ledger in the control plane bills what was
//! computed. Accounts without a budget reserve nothing.

use bulkhead_control_api::{Budget, MICRO, Timestamp};
use redis::aio::ConnectionManager;
use std::collections::HashMap;
use tokio::sync::{mpsc, oneshot};

/// Which budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Period {
    /// The UTC day's.
    Daily,
    /// The UTC calendar month's.
    Monthly,
}

impl Period {
    /// `daily` or `monthly`.
    pub fn as_str(self) -> &'static str {
        match self {
            Period::Daily => "daily",
            Period::Monthly => "monthly",
        }
    }

    /// Seconds from `now` until this period starts again.
    pub fn reset_secs(self, now: Timestamp) -> u64 {
        let next = match self {
            Period::Daily => Timestamp::start_of_day(now.day() + 1),
            Period::Monthly => now.start_of_next_month(),
        };
        u64::try_from((next.millis() - now.millis()).max(0))
            .unwrap_or(0)
            .div_ceil(1000)
            .max(1)
    }
}

/// Why a reservation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    /// The request could cost more than what is left of a budget.
    #[error("the account's {} budget of {limit_neurons} neurons is spent", period.as_str())]
    Over {
        /// Which budget.
        period: Period,
        /// Its size.
        limit_neurons: u64,
        /// Seconds until it resets.
        retry_after_secs: u64,
    },
    /// The shared store failed (the request is refused, not let through).
    #[error("budget store unavailable: {0}")]
    Unavailable(String),
}

/// Budget counters; cheap to clone.
#[derive(Debug, Clone)]
pub struct Budgets {
    store: Store,
}

#[derive(Debug, Clone)]
enum Store {
    Memory {
        tx: mpsc::UnboundedSender<Event>,
        /// Where spend so far is read from when an account's period starts
        /// in this process.
        ledger: Option<std::sync::Arc<Ledger>>,
    },
    Redis {
        con: ConnectionManager,
        prefix: String,
        /// Where spend so far is read from when an account's counters for
        /// a period are missing (a flush, an eviction, a restart without
        /// persistence): they are rebuilt before the first reservation.
        ledger: Option<std::sync::Arc<Ledger>>,
    },
}

/// Where a reservation is counted: the account and the periods it fell in.
#[derive(Debug, Clone)]
struct Slot {
    account: String,
    day: i64,
    month: i64,
}

/// The control plane's usage ledger, read through the gateway's client.
#[derive(Clone)]
struct Ledger(bulkhead_control_api::Client);

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Ledger")
    }
}

impl Ledger {
    /// What `account` has spent today and this month, in micro-neurons.
    async fn spent(&self, account: &str, now: Timestamp) -> Result<(u64, u64), BudgetError> {
        let day = |t: Timestamp| t.to_string()[..10].to_owned();
        let today = day(now);
        let path = format!(
            "/admin/v1/usage?account={account}&since={}&until={today}",
            day(now.start_of_month())
        );
        let rows: Vec<bulkhead_control_api::UsageRow> = self.0.get(&path).await.map_err(|e| {
            BudgetError::Unavailable(format!(
                "reading the ledger: {}",
                bulkhead_control_api::error_chain(&e)
            ))
        })?;
        Ok(rows.iter().fold((0, 0), |(d, m), r| {
            let today_too = if r.date == today { r.micro_neurons } else { 0 };
            (d + today_too, m + r.micro_neurons)
        }))
    }
}

/// Why the counters did not reserve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// Over this budget.
    Over(Period),
    /// The account's counters for this period must start from the ledger
    /// first (asked only of stores that have one).
    Unseeded,
}

#[derive(Debug)]
enum Event {
    /// Spend so far from the ledger (applied once per period).
    Seed {
        slot: Slot,
        micro: (u64, u64),
    },
    Reserve {
        slot: Slot,
        micro: u64,
        limits: [Option<u64>; 2],
        /// Refuse while the slot's periods have not started from the ledger.
        seeded_first: bool,
        reply: oneshot::Sender<Result<(), Refusal>>,
    },
    Refund {
        slot: Slot,
        micro: u64,
    },
}

/// A request's reserved cost, in micro-neurons, until it is settled.
#[derive(Debug)]
#[must_use = "a reservation is settled to the request's actual cost"]
pub struct Reservation {
    held: Option<(Store, Slot, u64)>,
}

impl Reservation {
    /// No reservation (the account has no budget).
    pub fn none() -> Reservation {
        Reservation { held: None }
    }

    /// What is reserved, in micro-neurons.
    pub fn micro_neurons(&self) -> u64 {
        self.held.as_ref().map_or(0, |h| h.2)
    }

    /// Settles to what the request cost (`actual` micro-neurons; at most
    /// what was reserved is kept): the rest goes back to the budget.
    pub fn settle(mut self, actual: u64) {
        let Some((store, slot, micro)) = self.held.take() else {
            return;
        };
        let refund = micro.saturating_sub(actual);
        if refund == 0 {
            return;
        }
        match store {
            Store::Memory { tx, .. } => {
                let _ = tx.send(Event::Refund {
                    slot,
                    micro: refund,
                });
            }
            Store::Redis {
                mut con, prefix, ..
            } => {
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    let [d, m] = keys(&prefix, &slot);
                    rt.spawn(async move {
                        let r: Result<i64, _> = redis::Script::new(REFUND_SCRIPT)
                            .key(d)
                            .key(m)
                            .arg(refund)
                            .invoke_async(&mut con)
                            .await;
                        if let Err(e) = r {
                            tracing::warn!(target: "bulkhead::gateway", error = %e, "returning a budget reservation");
                        }
                    });
                }
            }
        }
    }
}

/// KEYS: the day's and the month's spend. ARGV: micro-neurons, the daily
/// and monthly budgets in micro-neurons (-1: none), the keys' lifetimes
/// (s), and whether a missing counter must be seeded first (`1`). Returns
/// 0 (reserved), 1 (over the daily), 2 (over the monthly) or 3 (a counter
/// is missing: seed it from the ledger, then ask again).
const RESERVE_SCRIPT: &str = r"
if ARGV[6] == '1' and (redis.call('EXISTS', KEYS[1]) == 0 or redis.call('EXISTS', KEYS[2]) == 0) then return 3 end
local cost = tonumber(ARGV[1])
local d = tonumber(redis.call('GET', KEYS[1]) or '0')
local m = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[2]) >= 0 and d + cost > tonumber(ARGV[2]) then return 1 end
if tonumber(ARGV[3]) >= 0 and m + cost > tonumber(ARGV[3]) then return 2 end
redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('INCRBY', KEYS[2], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[5])
return 0
";

/// KEYS: the day's and the month's spend. ARGV: micro-neurons to give
/// back. A period that has ended (its key expired) is left alone.
const REFUND_SCRIPT: &str = r"
for _, k in ipairs(KEYS) do
  if redis.call('EXISTS', k) == 1 then
    if redis.call('DECRBY', k, ARGV[1]) < 0 then redis.call('SET', k, 0, 'KEEPTTL') end
  end
end
return 0
";

/// KEYS: the day's and the month's spend. ARGV: what the ledger says was
/// spent in each (micro-neurons) and the keys' lifetimes (s). A counter
/// already there is left alone (another gateway seeded it, or counted
/// since).
const SEED_SCRIPT: &str = r"
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3], 'NX')
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[4], 'NX')
return 0
";

/// How long a day's and a month's counters outlive their period (s).
const KEEP_SECS: [u64; 2] = [2 * 86_400, 32 * 86_400];

fn keys(prefix: &str, slot: &Slot) -> [String; 2] {
    // One hash tag per account keeps its keys in one Redis Cluster slot.
    let base = format!("{prefix}:{{{}}}:budget", slot.account);
    [
        format!("{base}:d:{}", slot.day),
        format!("{base}:m:{}", slot.month),
    ]
}

impl Budgets {
    /// Counters in this process (one task owns them), starting from
    /// nothing.
    pub fn memory() -> Budgets {
        Budgets::in_memory(None)
    }

    /// Counters in this process that start, for each account and period,
    /// from what the control plane's ledger says was spent.
    pub fn memory_from_ledger(control_plane: bulkhead_control_api::Client) -> Budgets {
        Budgets::in_memory(Some(Ledger(control_plane)))
    }

    fn in_memory(ledger: Option<Ledger>) -> Budgets {
        let ledger = ledger.map(std::sync::Arc::new);
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(own(rx));
        Budgets {
            store: Store::Memory { tx, ledger },
        }
    }

    /// Counters in Redis at `url`, under keys starting with `prefix`,
    /// starting from nothing when missing.
    pub async fn redis(url: &str, prefix: &str) -> Result<Budgets, BudgetError> {
        Budgets::in_redis(url, prefix, None).await
    }

    /// Counters in Redis at `url`, under keys starting with `prefix`; an
    /// account's counters for a period that are missing (never made, or
    /// lost to a flush, an eviction or a restart without persistence) are
    /// rebuilt from the control plane's ledger before its first
    /// reservation, so a spent budget stays spent.
    pub async fn redis_from_ledger(
        url: &str,
        prefix: &str,
        control_plane: bulkhead_control_api::Client,
    ) -> Result<Budgets, BudgetError> {
        Budgets::in_redis(url, prefix, Some(Ledger(control_plane))).await
    }

    async fn in_redis(
        url: &str,
        prefix: &str,
        ledger: Option<Ledger>,
    ) -> Result<Budgets, BudgetError> {
        let unavailable = |e: redis::RedisError| BudgetError::Unavailable(e.to_string());
        let con = crate::limits::connect(url).await.map_err(unavailable)?;
        Ok(Budgets {
            store: Store::Redis {
                con,
                prefix: prefix.to_owned(),
                ledger: ledger.map(std::sync::Arc::new),
            },
        })
    }

    /// Reserves `micro` micro-neurons of `account`'s budgets at `now`, or
    /// says which budget it would exceed. An account without a budget
    /// reserves nothing and touches no counter.
    pub async fn reserve(
        &self,
        account: &str,
        budget: &Budget,
        micro: u64,
        now: Timestamp,
    ) -> Result<Reservation, BudgetError> {
        if !budget.limited() {
            return Ok(Reservation::none());
        }
        let limits = [budget.daily_neurons, budget.monthly_neurons]
            .map(|b| b.map(|n| n.saturating_mul(MICRO)));
        let slot = Slot {
            account: account.to_owned(),
            day: now.day(),
            month: now.month(),
        };
        let over = |period: Period| {
            let limit_neurons = match period {
                Period::Daily => budget.daily_neurons,
                Period::Monthly => budget.monthly_neurons,
            };
            BudgetError::Over {
                period,
                limit_neurons: limit_neurons.unwrap_or(0),
                retry_after_secs: period.reset_secs(now),
            }
        };
        let verdict = match &self.store {
            Store::Memory { tx, ledger } => {
                let stopped = || BudgetError::Unavailable("budget counters stopped".to_owned());
                let reserve = |reply| Event::Reserve {
                    slot: slot.clone(),
                    micro,
                    limits,
                    seeded_first: ledger.is_some(),
                    reply,
                };
                let (reply, rx) = oneshot::channel();
                tx.send(reserve(reply)).map_err(|_| stopped())?;
                let verdict = match (rx.await.map_err(|_| stopped())?, ledger) {
                    // The period starts in this process: read the ledger
                    // once, then reserve against it.
                    (Err(Refusal::Unseeded), Some(ledger)) => {
                        let spent = ledger.spent(account, now).await?;
                        tx.send(Event::Seed {
                            slot: slot.clone(),
                            micro: spent,
                        })
                        .map_err(|_| stopped())?;
                        let (reply, rx) = oneshot::channel();
                        tx.send(reserve(reply)).map_err(|_| stopped())?;
                        rx.await.map_err(|_| stopped())?
                    }
                    (verdict, _) => verdict,
                };
                match verdict {
                    Ok(()) => Ok(()),
                    Err(Refusal::Over(p)) => Err(p),
                    // Seeded just before, on the same channel: unreachable
                    // unless the task lost the seed.
                    Err(Refusal::Unseeded) => return Err(stopped()),
                }
            }
            Store::Redis {
                con,
                prefix,
                ledger,
            } => {
                let [d, m] = keys(prefix, &slot);
                let arg = |l: Option<u64>| l.map_or(-1, |v| i64::try_from(v).unwrap_or(i64::MAX));
                let (ld, lm) = (arg(limits[0]), arg(limits[1]));
                let seeded_first = if ledger.is_some() { "1" } else { "0" };
                let args = [
                    micro.to_string(),
                    ld.to_string(),
                    lm.to_string(),
                    KEEP_SECS[0].to_string(),
                    KEEP_SECS[1].to_string(),
                    seeded_first.to_owned(),
                ];
                let reserve = || run_detached(con, RESERVE_SCRIPT, [&d, &m], args.to_vec());
                let mut code = reserve().await?;
                if code == 3
                    && let Some(ledger) = ledger
                {
                    // A counter is missing: rebuild both from the ledger
                    // (a counter still there is kept), then ask again.
                    let (day, month) = ledger.spent(account, now).await?;
                    let seed = [day, month, KEEP_SECS[0], KEEP_SECS[1]].map(|n| n.to_string());
                    run_detached(con, SEED_SCRIPT, [&d, &m], seed.to_vec()).await?;
                    code = reserve().await?;
                }
                match code {
                    0 => Ok(()),
                    1 => Err(Period::Daily),
                    2 => Err(Period::Monthly),
                    _ => {
                        return Err(BudgetError::Unavailable(
                            "the budget counters vanished while they were seeded".to_owned(),
                        ));
                    }
                }
            }
        };
        verdict.map_err(over)?;
        Ok(Reservation {
            held: Some((self.store.clone(), slot, micro)),
        })
    }
}

/// Runs a script on its own task: if the caller is dropped mid-way, the
/// script still runs to the end and a reservation it made stays counted,
/// which errs towards refusing.
async fn run_detached(
    con: &ConnectionManager,
    script: &'static str,
    keys: [&String; 2],
    args: Vec<String>,
) -> Result<i64, BudgetError> {
    let (mut con, keys) = (con.clone(), keys.map(String::clone));
    tokio::spawn(async move {
        let script = redis::Script::new(script);
        let mut call = script.prepare_invoke();
        for k in &keys {
            call.key(k);
        }
        for a in &args {
            call.arg(a);
        }
        call.invoke_async::<i64>(&mut con).await
    })
    .await
    .map_err(|e| BudgetError::Unavailable(e.to_string()))?
    .map_err(|e| BudgetError::Unavailable(e.to_string()))
}

#[derive(Debug, Default)]
struct Spend {
    day: i64,
    day_micro: u64,
    month: i64,
    month_micro: u64,
    /// The day whose counter started from the ledger.
    seeded_day: Option<i64>,
    /// The month whose counter started from the ledger.
    seeded_month: Option<i64>,
}

impl Spend {
    /// Moves to the slot's periods, each starting from nothing when new.
    fn roll(&mut self, slot: &Slot) {
        if self.day != slot.day {
            (self.day, self.day_micro) = (slot.day, 0);
        }
        if self.month != slot.month {
            (self.month, self.month_micro) = (slot.month, 0);
        }
    }
}

async fn own(mut rx: mpsc::UnboundedReceiver<Event>) {
    let mut accounts: HashMap<String, Spend> = HashMap::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Seed { slot, micro } => {
                let s = accounts.entry(slot.account.clone()).or_default();
                s.roll(&slot);
                // The first reading of each period wins (no reservation is
                // made before it); a month already read keeps its count,
                // which holds this process's spend of the earlier days.
                if s.seeded_day != Some(slot.day) {
                    s.seeded_day = Some(slot.day);
                    s.day_micro = s.day_micro.saturating_add(micro.0);
                }
                if s.seeded_month != Some(slot.month) {
                    s.seeded_month = Some(slot.month);
                    s.month_micro = s.month_micro.saturating_add(micro.1);
                }
            }
            Event::Reserve {
                slot,
                micro,
                limits,
                seeded_first,
                reply,
            } => {
                let s = accounts.entry(slot.account.clone()).or_default();
                s.roll(&slot);
                let fits = |spent: u64, limit: Option<u64>| {
                    limit.is_none_or(|l| spent.saturating_add(micro) <= l)
                };
                let seeded = s.seeded_day == Some(slot.day) && s.seeded_month == Some(slot.month);
                // Check both before counting either.
                let verdict = if seeded_first && !seeded {
                    Err(Refusal::Unseeded)
                } else if !fits(s.day_micro, limits[0]) {
                    Err(Refusal::Over(Period::Daily))
                } else if !fits(s.month_micro, limits[1]) {
                    Err(Refusal::Over(Period::Monthly))
                } else {
                    s.day_micro += micro;
                    s.month_micro += micro;
                    Ok(())
                };
                if reply.send(verdict).is_err() && verdict.is_ok() {
                    // The caller went away while we decided: give it back.
                    s.day_micro -= micro;
                    s.month_micro -= micro;
                }
            }
            Event::Refund { slot, micro } => {
                if let Some(s) = accounts.get_mut(&slot.account) {
                    if s.day == slot.day {
                        s.day_micro = s.day_micro.saturating_sub(micro);
                    }
                    if s.month == slot.month {
                        s.month_micro = s.month_micro.saturating_sub(micro);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 1 neuron a day, and requests that may cost 20,000 micro-neurons:
    /// a budget worth exactly 50 of them.
    const COST: u64 = 20_000;
    fn worth_50() -> Budget {
        Budget {
            daily_neurons: Some(1),
            monthly_neurons: None,
            free_neurons_per_day: 0,
        }
    }

    /// Reserves `n` requests at once across `stores` (round robin); the
    /// reservations granted.
    async fn race(stores: &[Budgets], account: &str, n: usize) -> Vec<Reservation> {
        let now = Timestamp::now();
        let tries = (0..n).map(|i| {
            let b = stores[i % stores.len()].clone();
            let account = account.to_owned();
            tokio::spawn(async move { b.reserve(&account, &worth_50(), COST, now).await })
        });
        let mut granted = Vec::new();
        for t in tries {
            match t.await.expect("task") {
                Ok(r) => granted.push(r),
                Err(BudgetError::Over {
                    period: Period::Daily,
                    limit_neurons: 1,
                    retry_after_secs,
                }) => assert!((1..=86_400).contains(&retry_after_secs)),
                Err(e) => panic!("unexpected refusal: {e}"),
            }
        }
        granted
    }

    /// The stated bound: the counted spend never passes the budget, and a
    /// settled request gives back what it did not use.
    async fn holds_the_bound(stores: &[Budgets], account: &str) {
        let granted = race(stores, account, 200).await;
        assert_eq!(
            granted.len(),
            50,
            "200 concurrent requests against a budget worth 50"
        );
        assert!(granted.iter().all(|r| r.micro_neurons() == COST));
        // Half of them cost a quarter of their reservation: room for 25
        // more at full reservation, and not one more.
        for r in granted.into_iter().take(25) {
            r.settle(COST / 4);
        }
        // Settlements are messages (memory) or detached scripts (Redis).
        let mut again = Vec::new();
        for _ in 0..100 {
            again.extend(race(stores, account, 200).await);
            if again.len() >= 18 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        // 25 × 3/4 of a reservation came back: 18 more fit (18.75).
        assert_eq!(again.len(), 18, "what settlement gave back, no more");
        let none = stores[0]
            .reserve(account, &Budget::default(), COST, Timestamp::now())
            .await
            .expect("no budget");
        assert_eq!(
            none.micro_neurons(),
            0,
            "an account without a budget reserves nothing"
        );
    }

    #[tokio::test]
    async fn in_memory_concurrent_requests_cannot_overshoot() {
        holds_the_bound(&[Budgets::memory()], "a").await;
    }

    #[tokio::test]
    async fn two_gateways_share_one_redis_budget() {
        let (url, prefix) = crate::testing::redis("budget");
        let (one, two) = match (
            Budgets::redis(&url, &prefix).await,
            Budgets::redis(&url, &prefix).await,
        ) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return crate::testing::redis_unreachable(&url, &e),
        };
        holds_the_bound(&[one, two], "a").await;
        // The counter both shared is in Redis: 25 settled at a quarter, 25
        // and 18 still reserved whole.
        let client = redis::Client::open(url.as_str()).expect("url");
        let mut con = client
            .get_multiplexed_async_connection()
            .await
            .expect("connection");
        let day: u64 = redis::cmd("GET")
            .arg(format!(
                "{prefix}:{{a}}:budget:d:{}",
                Timestamp::now().day()
            ))
            .query_async(&mut con)
            .await
            .expect("GET");
        assert_eq!(day, 25 * COST / 4 + (25 + 18) * COST);
    }

    #[test]
    fn periods_reset_at_midnight_and_the_first_of_the_month() {
        let t = Timestamp::parse_rfc3339("2026-12-31T23:00:00Z").expect("time");
        assert_eq!(Period::Daily.reset_secs(t), 3600);
        assert_eq!(Period::Monthly.reset_secs(t), 3600);
        let t = Timestamp::parse_rfc3339("2026-12-02T12:00:00Z").expect("time");
        assert_eq!(Period::Daily.reset_secs(t), 12 * 3600);
        assert_eq!(Period::Monthly.reset_secs(t), 29 * 86_400 + 12 * 3600);
    }
}
