//! Histograms that `/metrics` shows from start-up. An OpenTelemetry
//! histogram reaches the Prometheus registry only with its first
//! observation, so a panel over a rare event (a visibility flip) would read
//! "no data" until the first one. A declared histogram is served empty (every
//! bucket 0) until the instrument of the same name has recorded.

use crate::TelemetryError;
use prometheus::proto::MetricFamily;
use prometheus::{Histogram, HistogramOpts, Registry};
use std::sync::OnceLock;

/// Serves `name` (its Prometheus name, with the unit suffix) as an empty
/// histogram with `bounds` until the instrument behind it records.
pub fn declare_histogram(name: &str, help: &str, bounds: &[f64]) -> Result<(), TelemetryError> {
    let opts = HistogramOpts::new(name, help).buckets(bounds.to_vec());
    let empty =
        Histogram::with_opts(opts).map_err(|e| TelemetryError::Prometheus(e.to_string()))?;
    match declared().register(Box::new(empty)) {
        Ok(()) | Err(prometheus::Error::AlreadyReg) => Ok(()),
        Err(e) => Err(TelemetryError::Prometheus(e.to_string())),
    }
}

/// `families` with the declared histograms they lack added, in name order.
pub(crate) fn with_declared(mut families: Vec<MetricFamily>) -> Vec<MetricFamily> {
    for d in declared().gather() {
        if !families.iter().any(|f| f.name() == d.name()) {
            families.push(d);
        }
    }
    families.sort_by(|a, b| a.name().cmp(b.name()));
    families
}

fn declared() -> &'static Registry {
    static DECLARED: OnceLock<Registry> = OnceLock::new();
    DECLARED.get_or_init(Registry::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_declared_histogram_is_served_empty_until_the_real_one_exists() {
        declare_histogram("declared_test_seconds", "A test.", &[0.1, 1.0]).unwrap();
        declare_histogram("declared_test_seconds", "A test.", &[0.1, 1.0]).unwrap();
        let served = with_declared(Vec::new());
        let f = served
            .iter()
            .find(|f| f.name() == "declared_test_seconds")
            .expect("declared family served");
        let h = f.get_metric()[0].get_histogram();
        assert_eq!(h.get_sample_count(), 0);
        assert_eq!(h.get_bucket().len(), 2);

        let mut real = MetricFamily::default();
        real.set_name("declared_test_seconds".to_owned());
        let served = with_declared(vec![real]);
        let same: Vec<_> = served
            .iter()
            .filter(|f| f.name() == "declared_test_seconds")
            .collect();
        assert_eq!(same.len(), 1, "the recorded family replaces the empty one");
        assert!(same[0].get_metric().is_empty());
    }
}
