//! Small statistics over repeated measurements: median and spread.

/// Median, minimum and maximum of a set of measurements.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// The middle value (mean of the two middle values for an even count).
    pub median: f64,
    /// The smallest value.
    pub min: f64,
    /// The largest value.
    pub max: f64,
    /// How many values there were.
    pub n: usize,
}

impl Summary {
    /// Summarises `values`, ignoring NaNs; `None` when nothing finite is left.
    pub fn of(values: &[f64]) -> Option<Summary> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Summary {
            median,
            min: v[0],
            max: v[n - 1],
            n,
        })
    }

    /// "median (min–max)" with `decimals` digits after the point.
    pub fn show(&self, decimals: usize) -> String {
        if self.n == 1 {
            return format!("{:.decimals$}", self.median);
        }
        format!(
            "{:.decimals$} ({:.decimals$} – {:.decimals$})",
            self.median, self.min, self.max
        )
    }

    /// The spread (max − min) as a percentage of the median: the run-to-run noise.
    pub fn spread_percent(&self) -> f64 {
        if self.median == 0.0 {
            return 0.0;
        }
        (self.max - self.min) / self.median.abs() * 100.0
    }
}

/// Shows an optional summary, or "n/a" when the section measured nothing.
pub fn show_opt(summary: Option<Summary>, decimals: usize) -> String {
    summary.map_or_else(|| "n/a".to_owned(), |s| s.show(decimals))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_and_even() {
        let s = Summary::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        let s = Summary::of(&[4.0, 1.0, 2.0, 3.0]).unwrap();
        assert_eq!(s.median, 2.5);
    }

    #[test]
    fn nothing_finite_is_none() {
        assert!(Summary::of(&[]).is_none());
        assert!(Summary::of(&[f64::NAN]).is_none());
    }

    #[test]
    fn spread_is_relative_to_median() {
        let s = Summary::of(&[90.0, 100.0, 110.0]).unwrap();
        assert!((s.spread_percent() - 20.0).abs() < 1e-9);
    }
}
