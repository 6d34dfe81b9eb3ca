//! A classifier's confusion matrix and its text rendering.

use std::fmt::Write as _;

/// A confusion matrix: `counts[true label][predicted label]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confusion {
    counts: Vec<Vec<u64>>,
}

impl Confusion {
    /// Counts `(labels[i], predictions[i])` pairs over `classes` classes; pairs outside the
    /// classes (which a malformed label file could hold) are left out rather than panicking.
    pub fn new(classes: usize, labels: &[u8], predictions: &[usize]) -> Self {
        let mut counts = vec![vec![0; classes]; classes];
        for (&label, &predicted) in labels.iter().zip(predictions) {
            if let Some(cell) = counts
                .get_mut(usize::from(label))
                .and_then(|row| row.get_mut(predicted))
            {
                *cell += 1;
            }
        }
        Self { counts }
    }

    /// How many examples of class `label` were predicted as `predicted`.
    pub fn count(&self, label: usize, predicted: usize) -> u64 {
        self.counts[label][predicted]
    }

    /// The matrix as aligned text, with each row's total and recall and each column's
    /// precision; zeros off the diagonal are dots, so that the mistakes stand out.
    pub fn render(&self) -> String {
        let classes = self.counts.len();
        let percent = |part: u64, whole: u64| {
            if whole == 0 {
                "-".to_string()
            } else if part == whole {
                // Keeps every cell within 5 characters, so columns never touch.
                "100%".to_string()
            } else {
                format!("{:.1}%", 100.0 * part as f64 / whole as f64)
            }
        };
        let mut out = String::new();
        let _ = write!(out, "{:>9}", "true\\pred");
        for c in 0..classes {
            let _ = write!(out, "{c:>6}");
        }
        let _ = writeln!(out, " | {:>6} {:>6}", "total", "recall");
        for (label, row) in self.counts.iter().enumerate() {
            let _ = write!(out, "{label:>9}");
            for (predicted, &n) in row.iter().enumerate() {
                if n == 0 && predicted != label {
                    let _ = write!(out, "{:>6}", ".");
                } else {
                    let _ = write!(out, "{n:>6}");
                }
            }
            let total: u64 = row.iter().sum();
            let _ = writeln!(out, " | {total:>6} {:>6}", percent(row[label], total));
        }
        let _ = write!(out, "{:>9}", "precision");
        for c in 0..classes {
            let predicted: u64 = self.counts.iter().map(|row| row[c]).sum();
            let _ = write!(out, "{:>6}", percent(self.counts[c][c], predicted));
        }
        let _ = writeln!(out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_rows_by_truth_and_columns_by_prediction() {
        let m = Confusion::new(3, &[0, 0, 1, 2, 2, 2, 7], &[0, 1, 1, 2, 0, 9, 1]);
        assert_eq!(m.count(0, 0), 1);
        assert_eq!(m.count(0, 1), 1);
        assert_eq!(m.count(1, 1), 1);
        assert_eq!(m.count(2, 2), 1);
        assert_eq!(m.count(2, 0), 1);
        // (2, 9) and (7, 1) are outside the classes: dropped, no panic.
        let total: u64 = (0..3)
            .flat_map(|r| (0..3).map(move |c| (r, c)))
            .map(|(r, c)| m.count(r, c))
            .sum();
        assert_eq!(total, 5);
    }

    #[test]
    fn renders_aligned_with_recall_and_precision() {
        let m = Confusion::new(3, &[0, 0, 1, 2, 2], &[0, 1, 1, 2, 0]);
        let text = m.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        assert_eq!(
            lines[0], "true\\pred     0     1     2 |  total recall",
            "{text}"
        );
        assert_eq!(
            lines[1], "        0     1     1     . |      2  50.0%",
            "{text}"
        );
        assert_eq!(
            lines[2], "        1     .     1     . |      1   100%",
            "{text}"
        );
        assert_eq!(lines[4], "precision 50.0% 50.0%  100%", "{text}");
    }
}
