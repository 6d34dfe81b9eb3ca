//! The scaling report: both modes at each of several worker counts, as `sweep.md` (a table)
//! and `sweep.png` / `sweep.svg` (final accuracy and examples to the last milestone, against the
//! worker count).

use std::fmt::Write as _;
use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::{
    draw_legend, percent, thousands, write_all, Chart, DrawResult, ReportError, Run, Written,
    COLOURS,
};
use crate::Mode;

/// One worker count of a sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepPoint {
    /// How many workers both modes trained on.
    pub workers: usize,
    /// The devices, as the trainer names them.
    pub devices: Vec<String>,
    /// The runs, sync then async.
    pub runs: Vec<Run>,
}

/// Everything the scaling report shows.
#[derive(Debug, Clone, PartialEq)]
pub struct Sweep {
    /// What was trained, e.g. `"MNIST 784-500-10"`: the start of the charts' title.
    pub title: String,
    /// `sweep.md`'s heading, without the `#`.
    pub heading: String,
    /// The kind of workers (`"sim"`, `"cpu"`), and what their times mean.
    pub kind: String,
    /// The budget in epochs, per mode and worker count.
    pub epochs: u64,
    /// Examples per worker per step.
    pub batch_size: usize,
    /// Seed of the initial parameters and the data order.
    pub seed: u64,
    /// How each mode treats the worker count (the asynchronous rule, warm-up and bound, the
    /// synchronous learning-rate scaling), as the report writes it.
    pub settings: String,
    /// The test accuracies whose first crossing the table times, e.g. `[0.97, 0.98]`.
    pub milestones: Vec<f64>,
    /// The worker counts, in the order trained.
    pub points: Vec<SweepPoint>,
}

impl Sweep {
    /// The highest milestone, whose crossing the chart plots.
    fn target(&self) -> f64 {
        self.milestones.iter().copied().fold(0.0, f64::max)
    }
}

/// Writes `sweep.png`, `sweep.svg` and `sweep.md` into `dir`, creating it if needed.
pub fn write_sweep(sweep: &Sweep, dir: &Path) -> Result<Written, ReportError> {
    write_all(dir, "sweep", sweep, sweep_table(sweep), |t| {
        markdown(sweep, t)
    })
}

impl Chart for Sweep {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        draw(root, self)
    }
}

/// The sweep's table: a row per worker count and mode.
pub fn sweep_table(sweep: &Sweep) -> String {
    let mut header = vec![
        "workers".to_string(),
        "mode".into(),
        "final test accuracy".into(),
    ];
    for &m in &sweep.milestones {
        header.push(format!("time to {}%", percent(m)));
        header.push(format!("examples to {}%", percent(m)));
    }
    header.extend(["staleness (mean / max)".into(), "examples/sec".into()]);
    let mut rows = Vec::new();
    for point in &sweep.points {
        for run in &point.runs {
            let mut row = vec![point.workers.to_string(), run.mode.name().to_string()];
            row.push(
                run.points
                    .last()
                    .map_or("-".into(), |p| format!("{:.4}", p.accuracy)),
            );
            for &m in &sweep.milestones {
                match run.reached(m) {
                    Some(p) => {
                        row.push(format!("{:.1} s", p.seconds));
                        row.push(thousands(p.examples));
                    }
                    None => row.extend(["not reached".into(), "-".into()]),
                }
            }
            row.push(match run.staleness {
                Some((mean, max)) => format!("{mean:.2} / {max}"),
                None => "-".into(),
            });
            row.push(thousands(run.examples_per_sec().round() as u64));
            rows.push(row);
        }
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            rows.iter()
                .map(|r| r[c].len())
                .chain([header[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: &[String]| {
        let mut out = String::from("|");
        for (cell, w) in cells.iter().zip(&widths) {
            let _ = write!(out, " {cell:>w$} |");
        }
        out.push('\n');
        out
    };
    let mut out = line(&header);
    out.push('|');
    for w in &widths {
        let _ = write!(out, "{}:|", "-".repeat(w + 1));
    }
    out.push('\n');
    for row in &rows {
        out.push_str(&line(row));
    }
    out
}

fn markdown(sweep: &Sweep, table: &str) -> String {
    let time_note = match sweep.kind.as_str() {
        "sim" => {
            "Simulated workers (sim:N) take turns on one core, so their times are those of \
             one core doing every worker's work: compare the examples to an accuracy, which are \
             what N equally fast parallel workers would need."
        }
        _ => "Times are wall time on this machine's cores.",
    };
    format!(
        "# {}\n\n\
         {} epoch(s) per mode and worker count, on {} workers, batch {} per worker, seed {}; \
         {}. Test accuracy of the averaged parameters. {time_note} \
         Staleness: how many other updates landed between an async update's read of the \
         parameters and its own application.\n\n{table}\n\
         ![final test accuracy and examples to {}% against the worker count](sweep.png)\n",
        sweep.heading,
        sweep.epochs,
        sweep.kind,
        sweep.batch_size,
        sweep.seed,
        sweep.settings,
        percent(sweep.target()),
    )
}

/// What a panel plots of a run, if it has it.
type Measure<'a> = dyn Fn(&Run) -> Option<f64> + 'a;

/// Two panels: final test accuracy, and examples to the highest milestone, against the worker
/// count (evenly spaced, labelled with the counts).
fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, sweep: &Sweep) -> DrawResult<DB> {
    root.fill(&WHITE)?;
    let title = format!("{}: sync vs async as workers grow", sweep.title);
    // The settings on a line of their own, smaller: on the title's line they ran off the image.
    let settings = format!(
        "{} workers, batch {}, {} epoch(s); {}",
        sweep.kind, sweep.batch_size, sweep.epochs, sweep.settings
    );
    let root = root.titled(&title, ("sans-serif", 28))?;
    let root = root.titled(&settings, ("sans-serif", 18))?;
    let panels = root.split_evenly((2, 1));
    let counts: Vec<usize> = sweep.points.iter().map(|p| p.workers).collect();
    let x_range = x_range(counts.len());
    let label = |v: &f64| worker_label(&counts, *v);
    let final_accuracy = |r: &Run| r.points.last().map(|p| p.accuracy);
    let target = sweep.target();
    let examples_to = |r: &Run| examples_to(r, target);
    let panels_of: [(&str, &str, &Measure); 2] = [
        (
            "Final test accuracy",
            "test accuracy (averaged parameters)",
            &final_accuracy,
        ),
        (
            &format!("Training examples to {}% test accuracy", percent(target)),
            "examples (millions, all workers)",
            &examples_to,
        ),
    ];
    for (area, (caption, y_desc, value)) in panels.iter().zip(panels_of) {
        let lines: Vec<(Mode, Vec<(f64, f64)>)> = [Mode::Sync, Mode::Async]
            .into_iter()
            .map(|mode| (mode, series(sweep, mode, value)))
            .collect();
        let (lo, hi) = padded(lines.iter().flat_map(|(_, l)| l.iter().map(|p| p.1)));
        let mut chart = ChartBuilder::on(area)
            .caption(caption, ("sans-serif", 24))
            .margin(16)
            .x_label_area_size(56)
            .y_label_area_size(90)
            .build_cartesian_2d(x_range.clone(), lo..hi)?;
        chart
            .configure_mesh()
            .x_desc("workers")
            .y_desc(y_desc)
            .x_labels(sweep.points.len() * 4 + 1)
            .x_label_formatter(&label)
            .y_label_formatter(&|v| format!("{v:.3}"))
            .label_style(("sans-serif", 16))
            .axis_desc_style(("sans-serif", 18))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()?;
        for ((mode, points), colour) in lines.into_iter().zip(COLOURS) {
            chart
                .draw_series(LineSeries::new(points.clone(), colour.stroke_width(3)))?
                .label(mode.name())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 24, y)], colour.stroke_width(3))
                });
            chart.draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 5, colour.filled())),
            )?;
        }
        draw_legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    }
    Ok(())
}

/// The x axis of `n` worker counts drawn at 0, 1, 2...: a margin of 0.3 on each side (and
/// room for one count).
fn x_range(n: usize) -> std::ops::Range<f64> {
    -0.3..(n as f64 - 0.7).max(0.3)
}

/// The x axis's label at `v`: the worker count drawn there (at 0, 1, 2...), none between.
fn worker_label(counts: &[usize], v: f64) -> String {
    let i = v.round();
    match counts.get(i as usize) {
        Some(n) if (v - i).abs() < 1e-6 && i >= 0.0 => n.to_string(),
        _ => String::new(),
    }
}

/// A mode's line: `value` of its run at each worker count that has one, at the count's place.
fn series(sweep: &Sweep, mode: Mode, value: &Measure) -> Vec<(f64, f64)> {
    sweep
        .points
        .iter()
        .enumerate()
        .filter_map(|(i, p)| {
            let run = p.runs.iter().find(|r| r.mode == mode)?;
            value(run).map(|v| (i as f64, v))
        })
        .collect()
}

/// The examples (in millions) `run` took to reach `target`, if it did.
fn examples_to(run: &Run, target: f64) -> Option<f64> {
    run.reached(target).map(|p| p.examples as f64 / 1e6)
}

/// A y axis over `values` with a tenth of their spread (at least 0.001) on each side; 0 to 1
/// for none.
fn padded(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let pad = ((hi - lo) * 0.1).max(1e-3);
    (lo - pad, hi + pad)
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::report::Point;

    fn run(mode: Mode, accuracies: &[f64]) -> Run {
        Run {
            mode,
            points: accuracies
                .iter()
                .enumerate()
                .map(|(i, &accuracy)| Point {
                    seconds: i as f64,
                    examples: i as u64 * 1000,
                    accuracy,
                    loss: None,
                })
                .collect(),
            staleness: (mode == Mode::Async).then_some((3.0, 3)),
            failures: Vec::new(),
        }
    }

    fn sweep() -> Sweep {
        Sweep {
            title: "test".into(),
            heading: "a sweep".into(),
            kind: "sim".into(),
            epochs: 1,
            batch_size: 10,
            seed: 1,
            settings: "async rule scaled".into(),
            milestones: vec![0.5, 0.9],
            points: [1, 4]
                .into_iter()
                .map(|workers| SweepPoint {
                    workers,
                    devices: vec![],
                    runs: vec![
                        run(Mode::Sync, &[0.1, 0.6, 0.95]),
                        run(Mode::Async, &[0.1, 0.4, 0.6]),
                    ],
                })
                .collect(),
        }
    }

    #[test]
    fn the_sweep_table_has_a_row_per_count_and_mode_with_what_each_reached() {
        let table = sweep_table(&sweep());
        let rows: Vec<&str> = table.lines().collect();
        assert_eq!(rows.len(), 2 + 4, "{table}");
        assert!(rows[0].contains("examples to 90%"), "{table}");
        let sync4 = rows[4];
        assert!(sync4.contains(" 4 ") && sync4.contains("sync"), "{sync4}");
        assert!(
            sync4.contains("0.9500") && sync4.contains("2,000"),
            "{sync4}"
        );
        let async4 = rows[5];
        assert!(
            async4.contains("not reached") && async4.contains("3.00 / 3"),
            "{async4}"
        );
    }

    #[test]
    fn the_chart_places_each_count_and_its_values() {
        let mut sweep = sweep();
        assert_eq!(sweep.target(), 0.9);
        let labels: Vec<String> = [-0.25, 0.0, 0.5, 1.0, 1.0 + 1e-3, 2.0]
            .map(|v| worker_label(&[1, 4], v))
            .into();
        assert_eq!(labels, ["", "1", "", "4", "", ""]);
        assert_eq!(x_range(3), -0.3..2.3);
        assert_eq!(x_range(0), -0.3..0.3);
        sweep.points[0].runs.retain(|r| r.mode == Mode::Async);
        let to_half = |r: &Run| examples_to(r, 0.5);
        assert_eq!(series(&sweep, Mode::Sync, &to_half), [(1.0, 0.001)]);
        assert_eq!(
            series(&sweep, Mode::Async, &to_half),
            [(0.0, 0.002), (1.0, 0.002)]
        );
        assert_eq!(examples_to(&sweep.points[1].runs[1], 0.9), None);
        let (lo, hi) = padded([0.5, 0.9, 0.7].into_iter());
        assert!(
            (lo - 0.46).abs() < 1e-12 && (hi - 0.94).abs() < 1e-12,
            "{lo} {hi}"
        );
        assert_eq!(padded([0.5].into_iter()), (0.5 - 1e-3, 0.5 + 1e-3));
        assert_eq!(padded(std::iter::empty()), (0.0, 1.0));
    }

    #[test]
    fn the_sweep_writes_its_three_files() {
        let dir = tempfile::tempdir().unwrap();
        let written = write_sweep(&sweep(), dir.path()).unwrap();
        for path in written.paths() {
            assert!(
                fs::metadata(path).unwrap().len() > 100,
                "{}",
                path.display()
            );
        }
        // Each worker count labels its place on both panels' x axes.
        let svg = fs::read_to_string(&written.svg).unwrap();
        for count in ["1", "4"] {
            assert_eq!(
                svg.matches(&format!(">\n{count}\n</text>")).count(),
                2,
                "{count}"
            );
        }
        let png = fs::read(&written.png).unwrap();
        assert_eq!(&png[1..4], b"PNG");
        let md = fs::read_to_string(&written.markdown).unwrap();
        assert!(md.contains("take turns on one core") && md.contains("sweep.png"));
    }
}
