//! Timestamps: milliseconds since the Unix epoch, always UTC, written as
//! RFC 3339 on the wire and RFC 822 in RSS.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use time::format_description::well_known::{Rfc2822, Rfc3339};
use time::{Date, Month, OffsetDateTime, PrimitiveDateTime};

/// A UTC instant with millisecond precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(i64);

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

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

    /// The instant as a calendar date and time in UTC (clamped to the
    /// years the calendar library covers, -9999 to 9999).
    fn utc(self) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp_nanos(i128::from(self.0) * 1_000_000).unwrap_or_else(
            |_| {
                if self.0 < 0 {
                    PrimitiveDateTime::MIN.assume_utc()
                } else {
                    PrimitiveDateTime::MAX.assume_utc()
                }
            },
        )
    }

    fn from_utc(t: OffsetDateTime) -> Timestamp {
        Timestamp(i64::try_from(t.unix_timestamp_nanos().div_euclid(1_000_000)).unwrap_or(0))
    }

    /// RFC 822 / RFC 2822 date as RSS wants it: `Mon, 30 Nov 2026 05:26:12 +0000`.
    pub fn rfc822(self) -> String {
        self.utc().format(&Rfc2822).unwrap_or_default()
    }

    /// Short human form for status pages: `Nov 30, 05:26 UTC`.
    pub fn short(self) -> String {
        let t = self.utc();
        format!(
            "{} {}, {:02}:{:02} UTC",
            month_abbr(t.month()),
            t.day(),
            t.hour(),
            t.minute()
        )
    }

    /// The UTC day as a status page heads it: `Nov 30, 2026`.
    pub fn date_label(self) -> String {
        let t = self.utc();
        format!("{} {}, {}", month_abbr(t.month()), t.day(), t.year())
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
        let t = self.utc();
        i64::from(t.year()) * 12 + i64::from(u8::from(t.month())) - 1
    }

    /// The first instant of this UTC month.
    pub fn start_of_month(self) -> Timestamp {
        let t = self.utc();
        Date::from_calendar_date(t.year(), t.month(), 1)
            .map(|d| Timestamp::from_utc(d.midnight().assume_utc()))
            .unwrap_or(self)
    }

    /// The first instant of the month after this one.
    pub fn start_of_next_month(self) -> Timestamp {
        let t = self.utc();
        let (year, month) = match t.month() {
            Month::December => (t.year() + 1, Month::January),
            m => (t.year(), m.next()),
        };
        Date::from_calendar_date(year, month, 1)
            .map(|d| Timestamp::from_utc(d.midnight().assume_utc()))
            .unwrap_or(Timestamp(i64::MAX))
    }

    /// Month abbreviation, day of month and `HH:MM`, for feed markup.
    pub fn feed_parts(self) -> (&'static str, u32, String) {
        let t = self.utc();
        (
            month_abbr(t.month()),
            u32::from(t.day()),
            format!("{:02}:{:02}", t.hour(), t.minute()),
        )
    }

    /// Parses RFC 3339 in UTC (`2026-11-30T05:26:12Z` or `+00:00`, optional
    /// fraction), strictly: a date that does not exist (`2026-02-31`) or
    /// another offset is refused.
    pub fn parse_rfc3339(s: &str) -> Option<Timestamp> {
        if !(s.ends_with('Z') || s.ends_with("+00:00")) {
            return None;
        }
        OffsetDateTime::parse(s, &Rfc3339)
            .ok()
            .map(Timestamp::from_utc)
    }
}

fn month_abbr(m: Month) -> &'static str {
    MONTHS[usize::from(u8::from(m)) - 1]
}

impl fmt::Display for Timestamp {
    /// RFC 3339 with milliseconds: `2026-11-30T05:26:12.345Z`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = self.utc();
        write!(
            f,
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second(),
            t.millisecond()
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
            "2026-02-31T00:00:00Z",
            "2026-11-30T24:00:00Z",
        ] {
            assert_eq!(Timestamp::parse_rfc3339(bad), None, "{bad}");
        }
    }
}
