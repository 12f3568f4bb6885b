//! A latency histogram with fixed buckets, observed with atomic adds (no
//! lock on the fsync path), and the quantiles `stats` derives from bucket
//! counts the way Prometheus' `histogram_quantile` does.

use std::time::Duration;

use crate::sync::{AtomicU64, Ordering};
use serde::{Deserialize, Serialize};

/// A latency histogram's state: cumulative buckets, so that quantiles can
/// be read over the whole life or, from two snapshots, over an interval.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HistogramStats {
    pub count: u64,
    pub sum_seconds: f64,
    /// (upper bound in seconds, observations at or below it), ascending.
    pub buckets: Vec<(f64, u64)>,
    /// Since the mount, from the buckets.
    pub p50_seconds: Option<f64>,
    pub p99_seconds: Option<f64>,
}

/// Upper bounds (seconds) of the fsync latency buckets: 100 µs (a flush
/// with nothing to sync) to 10 s (a disk in trouble), three per decade so
/// that a quantile read from them is within a factor of about 2.5.
pub const FSYNC_BUCKETS: &[f64] = &[
    0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
    10.0,
];

pub struct Histogram {
    bounds: &'static [f64],
    /// Observations per bucket (not cumulative); one more than `bounds`
    /// for those above the last bound.
    counts: Vec<AtomicU64>,
    sum_ns: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = self.bounds.partition_point(|b| *b < secs);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Cumulative bucket counts, as Prometheus wants them; the count is
    /// the sum of the buckets, so the two always agree.
    pub fn stats(&self) -> HistogramStats {
        let mut cum = 0;
        let mut buckets = Vec::with_capacity(self.bounds.len());
        for (i, b) in self.bounds.iter().enumerate() {
            cum += self.counts[i].load(Ordering::Relaxed);
            buckets.push((*b, cum));
        }
        cum += self.counts[self.bounds.len()].load(Ordering::Relaxed);
        let sum_seconds = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let mut h = HistogramStats {
            count: cum,
            sum_seconds,
            buckets,
            p50_seconds: None,
            p99_seconds: None,
        };
        h.p50_seconds = quantile(0.5, &h.buckets, h.count);
        h.p99_seconds = quantile(0.99, &h.buckets, h.count);
        h
    }
}

/// The `q`-quantile of `count` observations given cumulative finite
/// buckets `(upper bound, observations at or below it)`, interpolated
/// linearly inside the bucket that holds it (Prometheus'
/// `histogram_quantile`; the first bucket starts at 0). An observation
/// above the last bound reads as that bound. `None` without observations.
pub fn quantile(q: f64, buckets: &[(f64, u64)], count: u64) -> Option<f64> {
    if count == 0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * count as f64;
    let (mut lower, mut below) = (0.0, 0u64);
    for &(upper, cum) in buckets {
        if cum as f64 >= rank && cum > below {
            let inside = (cum - below) as f64;
            return Some(lower + (upper - lower) * (rank - below as f64) / inside);
        }
        (lower, below) = (upper, cum);
    }
    buckets.last().map(|b| b.0)
}

/// Bucket counts of what happened between two cumulative readings of one
/// histogram (`later` minus `earlier`), for quantiles over an interval.
pub fn delta(later: &[(f64, u64)], earlier: &[(f64, u64)]) -> Vec<(f64, u64)> {
    later
        .iter()
        .enumerate()
        .map(|(i, &(b, n))| {
            let before = earlier.get(i).filter(|e| e.0 == b).map_or(0, |e| e.1);
            (b, n.saturating_sub(before))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-9)
    }

    #[test]
    fn quantiles_interpolate_inside_the_bucket_that_holds_them() {
        // 10 at or below 1 ms, 10 more in (1 ms, 2 ms], none above.
        let b = [(0.001, 10), (0.002, 20), (0.005, 20)];
        assert!(close(quantile(0.5, &b, 20), 0.001));
        assert!(close(quantile(0.75, &b, 20), 0.0015));
        assert!(close(quantile(0.25, &b, 20), 0.0005));
        assert!(close(quantile(1.0, &b, 20), 0.002));
        assert_eq!(quantile(0.5, &b, 0), None);
    }

    #[test]
    fn observations_above_the_last_bound_read_as_that_bound() {
        let b = [(0.001, 1), (0.002, 1)];
        assert!(close(quantile(0.99, &b, 5), 0.002));
    }

    #[test]
    fn observed_durations_land_in_their_buckets_and_the_sum() {
        let h = Histogram::new(FSYNC_BUCKETS);
        h.observe(Duration::from_micros(50));
        h.observe(Duration::from_micros(100)); // on a bound: that bucket
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(60)); // above every bound
        let s = h.stats();
        assert_eq!(s.count, 4);
        assert_eq!(s.buckets[0], (0.0001, 2));
        assert_eq!(
            s.buckets.iter().find(|b| b.0 == 0.005).map(|b| b.1),
            Some(3)
        );
        assert_eq!(s.buckets.last().map(|b| b.1), Some(3));
        assert!((s.sum_seconds - 60.00315).abs() < 1e-6);
        assert!(close(s.p50_seconds, 0.0001));
        assert!(close(s.p99_seconds, 10.0));
    }

    #[test]
    fn an_interval_s_quantiles_come_from_the_bucket_differences() {
        let h = Histogram::new(FSYNC_BUCKETS);
        for _ in 0..100 {
            h.observe(Duration::from_micros(150));
        }
        let before = h.stats();
        for _ in 0..10 {
            h.observe(Duration::from_millis(40));
        }
        let after = h.stats();
        let d = delta(&after.buckets, &before.buckets);
        let n = after.count - before.count;
        // Over the whole life the median is fast; over the interval slow.
        assert!(after.p50_seconds.unwrap() < 0.0002);
        let p50 = quantile(0.5, &d, n).unwrap();
        assert!((0.02..=0.05).contains(&p50), "{p50}");
    }
}
