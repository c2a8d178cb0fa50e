//! Timestamps: milliseconds since the Unix epoch, always UTC, written as
//! RFC 3339 on the wire and RFC 822 in RSS.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// A UTC instant with millisecond precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(i64);

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];
const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];

impl Timestamp {
    /// From milliseconds since the epoch.
    pub fn from_millis(ms: i64) -> Timestamp {
        Timestamp(ms)
    }

    /// Now.
    pub fn now() -> Timestamp {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp(i64::try_from(since.as_millis()).unwrap_or(i64::MAX))
    }

    /// Milliseconds since the epoch.
    pub fn millis(self) -> i64 {
        self.0
    }

    fn parts(self) -> Parts {
        let days = self.0.div_euclid(86_400_000);
        let in_day = self.0.rem_euclid(86_400_000);
        let (year, month, day) = civil_from_days(days);
        Parts {
            year,
            month,
            day,
            weekday: WEEKDAYS[usize::try_from(days.rem_euclid(7)).unwrap_or(0)],
            hour: in_day / 3_600_000,
            minute: in_day / 60_000 % 60,
            second: in_day / 1000 % 60,
            milli: in_day % 1000,
        }
    }

    /// RFC 822 / RFC 2822 date as RSS wants it: `Mon, 30 Nov 2026 05:26:12 +0000`.
    pub fn rfc822(self) -> String {
        let p = self.parts();
        format!(
            "{}, {:02} {} {:04} {:02}:{:02}:{:02} +0000",
            p.weekday,
            p.day,
            MONTHS[(p.month - 1) as usize],
            p.year,
            p.hour,
            p.minute,
            p.second
        )
    }

    /// Short human form for status pages: `Nov 30, 05:26 UTC`.
    pub fn short(self) -> String {
        let p = self.parts();
        format!(
            "{} {}, {:02}:{:02} UTC",
            MONTHS[(p.month - 1) as usize],
            p.day,
            p.hour,
            p.minute
        )
    }

    /// The UTC day as a status page heads it: `Nov 30, 2026`.
    pub fn date_label(self) -> String {
        let p = self.parts();
        format!("{} {}, {}", MONTHS[(p.month - 1) as usize], p.day, p.year)
    }

    /// Whole UTC days since the epoch.
    pub fn day(self) -> i64 {
        self.0.div_euclid(86_400_000)
    }

    /// The first instant of UTC day `day` (as [`Timestamp::day`] counts).
    pub fn start_of_day(day: i64) -> Timestamp {
        Timestamp(day.saturating_mul(86_400_000))
    }

    /// The UTC calendar month, counted in months since January of year 0
    /// (so consecutive months are consecutive numbers).
    pub fn month(self) -> i64 {
        let (y, m, _) = civil_from_days(self.day());
        y * 12 + i64::from(m) - 1
    }

    /// The first instant of the month after this one.
    pub fn start_of_next_month(self) -> Timestamp {
        let next = self.month() + 1;
        let (y, m) = (next.div_euclid(12), next.rem_euclid(12) as u32 + 1);
        Timestamp::start_of_day(days_from_civil(y, m, 1))
    }

    /// Month abbreviation, day of month and `HH:MM`, for feed markup.
    pub fn feed_parts(self) -> (&'static str, u32, String) {
        let p = self.parts();
        (
            MONTHS[(p.month - 1) as usize],
            p.day,
            format!("{:02}:{:02}", p.hour, p.minute),
        )
    }

    /// Parses RFC 3339 in UTC (`2026-11-30T05:26:12Z`, optional fraction).
    pub fn parse_rfc3339(s: &str) -> Option<Timestamp> {
        let b = s.as_bytes();
        if b.len() < 20
            || b[4] != b'-'
            || b[7] != b'-'
            || b[10] != b'T'
            || b[13] != b':'
            || b[16] != b':'
        {
            return None;
        }
        let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
        let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
        let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
        if !(1..=12).contains(&month)
            || !(1..=31).contains(&day)
            || hour > 23
            || minute > 59
            || second > 60
        {
            return None;
        }
        let rest = s.get(19..)?;
        let (frac, zone) = match rest.strip_prefix('.') {
            Some(f) => {
                let end = f.find(|c: char| !c.is_ascii_digit())?;
                (&f[..end], &f[end..])
            }
            None => ("", rest),
        };
        if zone != "Z" && zone != "+00:00" {
            return None;
        }
        let mut ms = 0i64;
        for (i, c) in frac.bytes().take(3).enumerate() {
            ms += i64::from(c - b'0') * [100, 10, 1][i];
        }
        let days = days_from_civil(year, month as u32, day as u32);
        Some(Timestamp(
            days * 86_400_000 + hour * 3_600_000 + minute * 60_000 + second * 1000 + ms,
        ))
    }
}

struct Parts {
    year: i64,
    month: u32,
    day: u32,
    weekday: &'static str,
    hour: i64,
    minute: i64,
    second: i64,
    milli: i64,
}

impl fmt::Display for Timestamp {
    /// RFC 3339 with milliseconds: `2026-11-30T05:26:12.345Z`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = self.parts();
        write!(
            f,
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
            p.year, p.month, p.day, p.hour, p.minute, p.second, p.milli
        )
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Timestamp::parse_rfc3339(&s)
            .ok_or_else(|| serde::de::Error::custom(format!("`{s}` is not an RFC 3339 UTC time")))
    }
}

/// Howard Hinnant's `civil_from_days`: days since 1970-01-01 to (y, m, d).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// The inverse of [`civil_from_days`].
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        // 2026-11-30T05:26:12.345Z, a Monday (checked with `date -u -d @1796016372`).
        let t = Timestamp::from_millis(1_796_016_372_345);
        assert_eq!(t.to_string(), "2026-11-30T05:26:12.345Z");
        assert_eq!(t.rfc822(), "Mon, 30 Nov 2026 05:26:12 +0000");
        assert_eq!(t.short(), "Nov 30, 05:26 UTC");
        assert_eq!(t.date_label(), "Nov 30, 2026");
        assert_eq!(
            Timestamp::start_of_day(t.day()).to_string(),
            "2026-11-30T00:00:00.000Z"
        );
        assert_eq!(
            Timestamp::from_millis(0).rfc822(),
            "Thu, 01 Jan 1970 00:00:00 +0000"
        );
        assert_eq!(
            Timestamp::from_millis(951_782_400_000).to_string(),
            "2000-02-29T00:00:00.000Z"
        );
    }

    #[test]
    fn months_follow_the_calendar() {
        let t = Timestamp::parse_rfc3339("2026-12-31T23:59:59Z").unwrap();
        assert_eq!(
            t.start_of_next_month().to_string(),
            "2027-01-01T00:00:00.000Z"
        );
        let feb = Timestamp::parse_rfc3339("2028-02-10T00:00:00Z").unwrap();
        assert_eq!(
            feb.start_of_next_month().to_string(),
            "2028-03-01T00:00:00.000Z"
        );
        assert_eq!(feb.month() - t.month(), 14);
    }

    #[test]
    fn parses_what_it_writes() {
        for ms in [0, 951_782_400_000, 1_796_016_372_345, 4_102_444_800_999] {
            let t = Timestamp::from_millis(ms);
            assert_eq!(Timestamp::parse_rfc3339(&t.to_string()), Some(t));
        }
        assert_eq!(
            Timestamp::parse_rfc3339("2026-11-30T05:26:12Z"),
            Some(Timestamp::from_millis(1_796_016_372_000))
        );
        for bad in [
            "",
            "2026-11-30",
            "2026-13-01T00:00:00Z",
            "2026-11-30T05:26:12+01:00",
        ] {
            assert_eq!(Timestamp::parse_rfc3339(bad), None, "{bad}");
        }
    }
}
