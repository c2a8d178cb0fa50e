//! Ninety days of a component's history as Statuspage draws it: one bar per
//! UTC day coloured by the worst status the day saw, and an uptime figure
//! that counts a major outage in full and a partial outage at 30 %
//! (Statuspage's weights; degraded performance and maintenance count as up).
//!
//! Pure: the history comes in as the component changes incident updates made
//! (`store::incidents::status_changes`), so the arithmetic is tested here
//! without a database.

use bulkhead_control_api::{ComponentStatus, Timestamp};

/// Days the page shows, today included.
pub(crate) const DAYS: i64 = 90;

/// One day's bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Day {
    /// Its first instant.
    pub(crate) start: Timestamp,
    /// The worst status seen that day; `None` before the model existed.
    pub(crate) worst: Option<ComponentStatus>,
}

/// A component's bars, oldest first, and its uptime over them in percent.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Uptime {
    pub(crate) days: Vec<Day>,
    pub(crate) percent: f64,
}

/// Draws the bars of a component created at `created` whose status is
/// `current` now, from its `changes` (oldest first, any that fall before
/// the window are ignored).
pub(crate) fn uptime(
    created: Timestamp,
    current: ComponentStatus,
    changes: &[(Timestamp, ComponentStatus, ComponentStatus)],
    now: Timestamp,
) -> Uptime {
    let first_day = now.day() - (DAYS - 1);
    let window = Timestamp::start_of_day(first_day).max(created);
    let changes: Vec<_> = changes.iter().filter(|c| c.0 >= window).collect();
    // The status at the window's start: what the first change in it left.
    let mut status = changes.first().map_or(current, |c| c.1);
    let mut spans = Vec::with_capacity(changes.len() + 1);
    let mut from = window;
    for &&(at, _, new) in &changes {
        spans.push((from, at.min(now), status));
        from = at;
        status = new;
    }
    spans.push((from, now, status));

    let mut days: Vec<Day> = (first_day..=now.day())
        .map(|d| Day {
            start: Timestamp::start_of_day(d),
            worst: None,
        })
        .collect();
    let (mut total, mut down) = (0i64, 0f64);
    for (from, to, s) in spans {
        if to < from {
            continue;
        }
        let len = to.millis() - from.millis();
        total += len;
        down += len as f64 * weight(s);
        for d in from.day()..=to.day() {
            // A span that ends exactly at midnight did not touch that day.
            if d > from.day() && to == Timestamp::start_of_day(d) {
                continue;
            }
            if let Some(day) = usize::try_from(d - first_day)
                .ok()
                .and_then(|i| days.get_mut(i))
            {
                day.worst = Some(match day.worst {
                    Some(w) if severity(w) >= severity(s) => w,
                    _ => s,
                });
            }
        }
    }
    let percent = if total == 0 {
        100.0
    } else {
        100.0 * (1.0 - down / total as f64)
    };
    Uptime { days, percent }
}

fn weight(s: ComponentStatus) -> f64 {
    match s {
        ComponentStatus::MajorOutage => 1.0,
        ComponentStatus::PartialOutage => 0.3,
        _ => 0.0,
    }
}

fn severity(s: ComponentStatus) -> u8 {
    match s {
        ComponentStatus::Operational => 0,
        ComponentStatus::UnderMaintenance => 1,
        ComponentStatus::DegradedPerformance => 2,
        ComponentStatus::PartialOutage => 3,
        ComponentStatus::MajorOutage => 4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ComponentStatus::{DegradedPerformance, MajorOutage, Operational, PartialOutage};

    const DAY: i64 = 86_400_000;

    fn at(day: i64, hour: i64) -> Timestamp {
        Timestamp::from_millis(day * DAY + hour * 3_600_000)
    }

    /// (created, current, changes as (day, hour, old, new), now) and the
    /// expected worst status per day from the end (today last), and uptime.
    #[test]
    fn bars_and_uptime_follow_the_history() {
        let today = 20_000;
        type Case = (
            &'static str,
            Timestamp,
            ComponentStatus,
            Vec<(i64, i64, ComponentStatus, ComponentStatus)>,
            Vec<Option<ComponentStatus>>,
            f64,
        );
        let cases: Vec<Case> = vec![
            (
                "never changed, old model",
                at(today - 400, 0),
                Operational,
                vec![],
                vec![Some(Operational); 3],
                100.0,
            ),
            (
                "created two days ago at noon: older days have no data",
                at(today - 2, 12),
                Operational,
                vec![],
                vec![
                    None,
                    Some(Operational),
                    Some(Operational),
                    Some(Operational),
                ],
                100.0,
            ),
            (
                "a major outage yesterday 06:00-18:00 of an 89.5-day window",
                at(today - 400, 0),
                Operational,
                vec![
                    (today - 1, 6, Operational, MajorOutage),
                    (today - 1, 18, MajorOutage, Operational),
                ],
                vec![Some(Operational), Some(MajorOutage), Some(Operational)],
                100.0 * (1.0 - 12.0 / (89.0 * 24.0 + 12.0)),
            ),
            (
                "partial outage still open since yesterday 12:00 counts 30 %",
                at(today - 400, 0),
                PartialOutage,
                vec![(today - 1, 12, Operational, PartialOutage)],
                vec![Some(Operational), Some(PartialOutage), Some(PartialOutage)],
                100.0 * (1.0 - 0.3 * 24.0 / (89.0 * 24.0 + 12.0)),
            ),
            (
                "the worst of a day wins; degraded counts as up",
                at(today - 400, 0),
                Operational,
                vec![
                    (today - 1, 1, Operational, MajorOutage),
                    (today - 1, 2, MajorOutage, DegradedPerformance),
                    (today - 1, 3, DegradedPerformance, Operational),
                ],
                vec![Some(MajorOutage), Some(Operational)],
                100.0 * (1.0 - 1.0 / (89.0 * 24.0 + 12.0)),
            ),
            (
                "a change before the window only sets the starting status",
                at(today - 400, 0),
                Operational,
                vec![(today - 200, 0, Operational, MajorOutage)],
                vec![Some(Operational); 90],
                100.0,
            ),
        ];
        for (name, created, current, changes, tail, percent) in cases {
            let changes: Vec<_> = changes
                .into_iter()
                .map(|(d, h, o, n)| (at(d, h), o, n))
                .collect();
            let u = uptime(created, current, &changes, at(today, 12));
            assert_eq!(u.days.len(), 90, "{name}");
            assert_eq!(u.days[89].start, at(today, 0), "{name}");
            let got: Vec<_> = u.days[90 - tail.len()..].iter().map(|d| d.worst).collect();
            assert_eq!(got, tail, "{name}");
            assert!(
                (u.percent - percent).abs() < 1e-9,
                "{name}: {} vs {percent}",
                u.percent
            );
        }
    }
}
