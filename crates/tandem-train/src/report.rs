//! The sync-vs-async comparison's report, for any model: the caller trains both modes, fills
//! in a [`Report`] and calls [`write()`], which writes `compare.png` and `compare.svg` (four
//! panels: test accuracy and training loss against wall time and examples seen) and
//! `compare.md` (a table, also returned to be printed).

use std::error::Error as StdError;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use image::codecs::png::PngEncoder;
use image::{ExtendedColorType, ImageEncoder};
use plotters::chart::MeshStyle;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::Mode;

mod measure;
mod sweep;
pub use measure::{measure, segment_ends};
pub use sweep::{sweep_table, write_sweep, Sweep, SweepPoint};

/// Size of the PNG and SVG, in pixels.
const SIZE: (u32, u32) = (1600, 1150);
/// The font every text of the plots uses, registered under plotters' "sans-serif" family.
/// Embedded so that drawing never looks for system fonts (which a CI machine may not have).
const FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

/// Why the report could not be written. Every variant names the file or directory.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The report directory could not be created.
    #[error("{}: cannot create the report directory", path.display())]
    Create {
        /// The directory.
        path: PathBuf,
        /// What the file system said.
        source: std::io::Error,
    },
    /// A report file could not be written.
    #[error("{}: cannot write the report", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// What the file system said.
        source: std::io::Error,
    },
    /// Drawing a chart (or encoding it as PNG) failed.
    #[error("{}: cannot draw the chart", path.display())]
    Draw {
        /// The file the chart was for.
        path: PathBuf,
        /// What plotters or the PNG encoder said.
        source: Box<dyn StdError + Send + Sync>,
    },
    /// The embedded font could not be loaded, so no text could be drawn.
    #[error(
        "{}: cannot draw the chart: the embedded font assets/DejaVuSans.ttf is not a valid font",
        path.display()
    )]
    Font {
        /// The file the chart was for.
        path: PathBuf,
    },
}

impl ReportError {
    fn draw(path: &Path, source: impl StdError + Send + Sync + 'static) -> Self {
        ReportError::Draw {
            path: path.to_path_buf(),
            source: Box::new(source),
        }
    }
}

/// One measurement between two training segments.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    /// Training wall time so far (evaluation excluded), in seconds.
    pub seconds: f64,
    /// Training examples processed so far, by all workers.
    pub examples: u64,
    /// Test accuracy of the averaged parameters, in `[0, 1]`.
    pub accuracy: f64,
    /// Mean training loss over the segment that just ended; `None` before any training, or
    /// when the segment logged no step.
    pub loss: Option<f64>,
}

/// One mode's run.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// Sync or async.
    pub mode: Mode,
    /// The evaluations, the first before any training.
    pub points: Vec<Point>,
    /// Asynchronous only: mean and max staleness over all updates.
    pub staleness: Option<(f64, u64)>,
    /// Asynchronous only: workers that failed while the others carried on.
    pub failures: Vec<String>,
}

impl Run {
    fn last(&self) -> Option<&Point> {
        self.points.last()
    }

    /// Examples per second over the whole run.
    pub fn examples_per_sec(&self) -> f64 {
        self.last()
            .map_or(0.0, |p| p.examples as f64 / p.seconds.max(1e-9))
    }

    /// The first evaluation at or above `accuracy`.
    pub fn reached(&self, accuracy: f64) -> Option<&Point> {
        self.points.iter().find(|p| p.accuracy >= accuracy)
    }
}

/// Everything the report shows.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// What was trained on what, e.g. `"MNIST 784-500-10"`: the start of the charts' title.
    pub title: String,
    /// `compare.md`'s heading, without the `#`.
    pub heading: String,
    /// The devices both modes trained on, one worker each.
    pub devices: Vec<String>,
    /// The budget in epochs (of `budget / epochs` examples each).
    pub epochs: u64,
    /// Examples per worker per step.
    pub batch_size: usize,
    /// Seed of the initial parameters and the data order.
    pub seed: u64,
    /// Evaluations per epoch.
    pub evals_per_epoch: u64,
    /// The budget in training examples.
    pub budget: u64,
    /// The test accuracies whose first crossing the table times, e.g. `[0.97, 0.98]`.
    pub milestones: Vec<f64>,
    /// The runs, sync then async.
    pub runs: Vec<Run>,
}

/// What [`write()`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// `compare.png`.
    pub png: PathBuf,
    /// `compare.svg`.
    pub svg: PathBuf,
    /// `compare.md`.
    pub markdown: PathBuf,
    /// The table of `compare.md` ([`table`]), for the caller to print.
    pub table: String,
}

impl Written {
    /// The three files, in the order written.
    pub fn paths(&self) -> [&Path; 3] {
        [&self.png, &self.svg, &self.markdown]
    }
}

/// Writes `compare.png`, `compare.svg` and `compare.md` into `dir`, creating it if needed.
pub fn write(report: &Report, dir: &Path) -> Result<Written, ReportError> {
    write_all(dir, "compare", report, table(report), |t| {
        markdown(report, t)
    })
}

fn write_file(path: &Path, contents: impl AsRef<[u8]>) -> Result<(), ReportError> {
    fs::write(path, contents).map_err(|source| ReportError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// `1234567` as `1,234,567`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// An accuracy as a percentage with only the decimals it needs: 0.97 as `97`, 0.975 as `97.5`
/// (`{:.0}` would label 0.975 as 98%, another milestone's name).
fn percent(accuracy: f64) -> String {
    let text = format!("{:.2}", accuracy * 100.0);
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The comparison table, in Markdown (which also reads well as plain text).
pub fn table(report: &Report) -> String {
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    let mut row = |name: &str, cell: &dyn Fn(&Run) -> String| {
        rows.push((name.to_string(), report.runs.iter().map(cell).collect()));
    };
    row("final test accuracy (averaged)", &|r| {
        r.last()
            .map_or("-".into(), |p| format!("{:.4}", p.accuracy))
    });
    row("final training loss", &|r| {
        r.last()
            .and_then(|p| p.loss)
            .map_or("-".into(), |l| format!("{l:.4}"))
    });
    row("examples/sec", &|r| {
        thousands(r.examples_per_sec().round() as u64)
    });
    row("training time", &|r| {
        r.last()
            .map_or("-".into(), |p| format!("{:.1} s", p.seconds))
    });
    for &milestone in &report.milestones {
        row(
            &format!("time to {}% test accuracy", percent(milestone)),
            &|r| {
                r.reached(milestone).map_or("not reached".into(), |p| {
                    format!("{:.1} s ({} examples)", p.seconds, thousands(p.examples))
                })
            },
        );
    }
    row("staleness (mean / max)", &|r| match r.staleness {
        Some((mean, max)) => format!("{mean:.2} / {max}"),
        None => "- (never stale)".into(),
    });
    if report.runs.iter().any(|r| !r.failures.is_empty()) {
        row("worker failures", &|r| {
            if r.failures.is_empty() {
                "none".into()
            } else {
                r.failures.join("; ")
            }
        });
    }

    let header: Vec<String> = report.runs.iter().map(|r| r.mode.name().into()).collect();
    let first = rows.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            rows.iter()
                .map(|(_, cells)| cells[c].len())
                .chain([header[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    // Writing into a String cannot fail.
    let mut out = String::new();
    let _ = write!(out, "| {:first$} |", "");
    for (h, w) in header.iter().zip(&widths) {
        let _ = write!(out, " {h:>w$} |");
    }
    let _ = write!(out, "\n|{}|", "-".repeat(first + 2));
    for w in &widths {
        let _ = write!(out, "{}:|", "-".repeat(w + 1));
    }
    out.push('\n');
    for (name, cells) in &rows {
        let _ = write!(out, "| {name:first$} |");
        for (cell, w) in cells.iter().zip(&widths) {
            let _ = write!(out, " {cell:>w$} |");
        }
        out.push('\n');
    }
    out
}

fn setup_line(report: &Report) -> String {
    // The epoch size comes from the report's own numbers, whatever the data set.
    let epoch_size = report
        .budget
        .checked_div(report.epochs)
        .map_or(String::new(), |n| format!(" of {} examples", thousands(n)));
    format!(
        "{} epoch(s){epoch_size} = {} training examples per mode on {} worker(s) [{}], batch {} per worker, seed {}",
        report.epochs,
        thousands(report.budget),
        report.devices.len(),
        report.devices.join(", "),
        report.batch_size,
        report.seed
    )
}

/// `compare.md`.
fn markdown(report: &Report, table: &str) -> String {
    format!(
        "# {}\n\n\
         {}. Test accuracy of the averaged (moving-average) parameters is measured {} time(s) \
         per epoch, between training segments; evaluation time is not counted in the training \
         time. The training loss is the mean over each segment of the loss the strategy logs \
         (the model's batch loss, regularisation included).\n\n\
         {table}\n\
         Times to an accuracy are the training time at the first evaluation at or above it, so \
         they are resolved to one segment ({} of an epoch). Staleness: how many other updates \
         landed between an async update's read of the parameters and its own application.\n\n\
         ![test accuracy and training loss against wall time and examples seen](compare.png)\n",
        report.heading,
        setup_line(report),
        report.evals_per_epoch,
        if report.evals_per_epoch <= 1 {
            "all".to_string()
        } else {
            format!("1/{}", report.evals_per_epoch)
        }
    )
}

/// Registers the embedded font once per process; a failure is remembered, so every chart
/// reports it rather than only the first.
fn register_font(path: &Path) -> Result<(), ReportError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(ReportError::Font {
            path: path.to_path_buf(),
        })
    }
}

/// What a report draws, on any of plotters' backends.
trait Chart {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB>;
}

impl Chart for Report {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        draw(root, self)
    }
}

fn write_png(path: &Path, chart: &impl Chart) -> Result<(), ReportError> {
    register_font(path)?;
    let (w, h) = SIZE;
    let mut pixels = vec![0u8; (w * h * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut pixels, SIZE).into_drawing_area();
        chart.draw(&root).map_err(|e| ReportError::draw(path, e))?;
        root.present().map_err(|e| ReportError::draw(path, e))?;
    }
    // plotters' own PNG encoder would pull in a second version of `image`; encode here, in
    // memory, so that a failed write is reported (a dropped BufWriter would swallow it).
    let mut bytes = Vec::new();
    PngEncoder::new(&mut bytes)
        .write_image(&pixels, w, h, ExtendedColorType::Rgb8)
        .map_err(|e| ReportError::draw(path, e))?;
    write_file(path, bytes)
}

fn write_svg(path: &Path, chart: &impl Chart) -> Result<(), ReportError> {
    register_font(path)?;
    let mut text = String::new();
    {
        let root = SVGBackend::with_string(&mut text, SIZE).into_drawing_area();
        chart.draw(&root).map_err(|e| ReportError::draw(path, e))?;
        root.present().map_err(|e| ReportError::draw(path, e))?;
    }
    write_file(path, text)
}

/// Creates `dir` and writes `chart` into `<name>.png` and `<name>.svg` there, and `markdown`
/// (given the table) into `<name>.md`.
fn write_all(
    dir: &Path,
    name: &str,
    chart: &impl Chart,
    table: String,
    markdown: impl FnOnce(&str) -> String,
) -> Result<Written, ReportError> {
    fs::create_dir_all(dir).map_err(|source| ReportError::Create {
        path: dir.to_path_buf(),
        source,
    })?;
    let written = Written {
        png: dir.join(format!("{name}.png")),
        svg: dir.join(format!("{name}.svg")),
        markdown: dir.join(format!("{name}.md")),
        table,
    };
    write_png(&written.png, chart)?;
    write_svg(&written.svg, chart)?;
    write_file(&written.markdown, markdown(&written.table))?;
    Ok(written)
}

/// Matplotlib's first two colours: distinguishable, also for most colour-blind readers.
const COLOURS: [RGBColor; 2] = [RGBColor(31, 119, 180), RGBColor(255, 127, 14)];

type DrawResult<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// Which quantity a panel plots against which.
#[derive(Clone, Copy)]
enum Axis {
    Seconds,
    Examples,
}

impl Axis {
    fn value(self, p: &Point) -> f64 {
        match self {
            Axis::Seconds => p.seconds,
            Axis::Examples => p.examples as f64,
        }
    }

    fn desc(self) -> &'static str {
        match self {
            Axis::Seconds => "training wall time (s, evaluation excluded)",
            Axis::Examples => "training examples seen (all workers)",
        }
    }

    fn label(self, v: f64) -> String {
        match self {
            Axis::Seconds => tidy(v),
            Axis::Examples if v == 0.0 => "0".into(),
            Axis::Examples if v >= 1e6 => format!("{}M", tidy(v / 1e6)),
            Axis::Examples => format!("{}k", tidy(v / 1e3)),
        }
    }

    fn max(self, report: &Report) -> f64 {
        let max = report
            .runs
            .iter()
            .flat_map(|r| r.points.iter().map(|p| self.value(p)))
            .fold(0.0, f64::max);
        match self {
            // A little room on the right, so the last markers are not cut in half.
            Axis::Seconds => (max * 1.03).max(1e-3),
            Axis::Examples => (max * 1.03).max(1.0),
        }
    }
}

/// The four panels under a title.
fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, report: &Report) -> DrawResult<DB> {
    root.fill(&WHITE)?;
    let title = format!("{}: sync vs async data parallelism", report.title);
    // Many devices are named by their first and last: every name would run off the image.
    let devices = match report.devices.as_slice() {
        [first, _, _, _, .., last] => format!("{first}, ..., {last}"),
        all => all.join(", "),
    };
    let settings = format!(
        "{} worker(s) [{devices}], batch {}, {} epoch(s)",
        report.devices.len(),
        report.batch_size,
        report.epochs
    );
    let root = root.titled(&title, ("sans-serif", 30))?;
    let root = root.titled(&settings, ("sans-serif", 20))?;
    let panels = root.split_evenly((2, 2));
    let lo = accuracy_floor(report);
    for (area, axis) in panels[..2].iter().zip([Axis::Seconds, Axis::Examples]) {
        accuracy_panel(area, report, axis, lo)?;
    }
    for (area, axis) in panels[2..].iter().zip([Axis::Seconds, Axis::Examples]) {
        loss_panel(area, report, axis)?;
    }
    Ok(())
}

/// The bottom of the accuracy axis, in `[0, 0.9]`: 0.9 when every run ends at 0.93 or above
/// (where the differences between good runs are), otherwise a tenth at least 0.05 below the
/// worst final accuracy, so that the ends of all curves stay visible.
fn accuracy_floor(report: &Report) -> f64 {
    // Starting from 1 (and `f64::min` skipping NaN) keeps `worst` in [0, 1] for any input.
    let worst = report
        .runs
        .iter()
        .filter_map(|r| r.last().map(|p| p.accuracy))
        .fold(1.0, f64::min)
        .max(0.0);
    if worst >= 0.93 {
        0.9
    } else {
        ((worst - 0.05) * 10.0).floor().max(0.0) / 10.0
    }
}

/// Cuts a polyline at `y = lo`: plotters does not clip to the chart, so points below the axis
/// would be drawn over the labels. Returns the visible pieces.
fn clip_below(points: &[(f64, f64)], lo: f64) -> Vec<Vec<(f64, f64)>> {
    let mut pieces = Vec::new();
    let mut current: Vec<(f64, f64)> = Vec::new();
    let cross = |a: (f64, f64), b: (f64, f64)| {
        let t = (lo - a.1) / (b.1 - a.1);
        (a.0 + t * (b.0 - a.0), lo)
    };
    for (i, &p) in points.iter().enumerate() {
        let previous = i.checked_sub(1).map(|j| points[j]);
        match (previous, p.1 >= lo) {
            (Some(a), true) if a.1 < lo => current.push(cross(a, p)),
            (Some(a), false) if a.1 >= lo => {
                current.push(cross(a, p));
                pieces.push(std::mem::take(&mut current));
            }
            _ => {}
        }
        if p.1 >= lo {
            current.push(p);
        }
    }
    if !current.is_empty() {
        pieces.push(current);
    }
    pieces
}

/// A panel's chart: `caption` above, room for the axes' labels.
fn panel<'a, 'b, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, Shift>,
    caption: &str,
) -> ChartBuilder<'a, 'b, DB> {
    let mut chart = ChartBuilder::on(area);
    chart
        .caption(caption, ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(56)
        .y_label_area_size(80);
    chart
}

/// The panels' mesh: `axis` described along x, their fonts and grid colour.
fn mesh_style<'m, 'a, 'b, X: Ranged, Y: Ranged, DB: DrawingBackend>(
    mesh: &'m mut MeshStyle<'a, 'b, X, Y, DB>,
    axis: Axis,
) -> &'m mut MeshStyle<'a, 'b, X, Y, DB> {
    mesh.x_desc(axis.desc())
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 18))
        .light_line_style(RGBColor(235, 235, 235))
}

/// The panels' legend, at `position`.
fn draw_legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
) -> DrawResult<DB> {
    chart
        .configure_series_labels()
        .position(position)
        .label_font(("sans-serif", 20))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.4))
        .draw()
}

/// The runs with their colours; more runs than colours reuse them rather than go undrawn.
fn coloured(report: &Report) -> impl Iterator<Item = (&Run, RGBColor)> {
    report.runs.iter().zip(COLOURS.iter().copied().cycle())
}

fn accuracy_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    report: &Report,
    axis: Axis,
    lo: f64,
) -> DrawResult<DB> {
    let caption = match axis {
        Axis::Seconds => "Test accuracy vs wall time",
        Axis::Examples => "Test accuracy vs examples seen",
    };
    let mut chart = panel(area, caption).build_cartesian_2d(0.0..axis.max(report), lo..1.0)?;
    mesh_style(&mut chart.configure_mesh(), axis)
        .y_desc("test accuracy (averaged parameters)")
        .x_label_formatter(&|v| axis.label(*v))
        .y_label_formatter(&|v| format!("{v:.2}"))
        .draw()?;
    for (run, colour) in coloured(report) {
        let points: Vec<(f64, f64)> = run
            .points
            .iter()
            .map(|p| (axis.value(p), p.accuracy))
            .collect();
        let style = colour.stroke_width(3);
        for (i, piece) in clip_below(&points, lo).into_iter().enumerate() {
            let series = chart.draw_series(LineSeries::new(piece, style))?;
            if i == 0 {
                series.label(run.mode.name()).legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 24, y)], colour.stroke_width(3))
                });
            }
        }
        chart.draw_series(
            points
                .iter()
                .filter(|p| p.1 >= lo)
                .map(|&p| Circle::new(p, 4, colour.filled())),
        )?;
    }
    draw_legend(&mut chart, SeriesLabelPosition::LowerRight)
}

/// Ticks of a log axis: 1, 2, 3 and 5 times each power of ten in `min..=max` (plotters'
/// own choice labels only powers of ten, often just one on a loss axis), or only the powers
/// of ten when the axis spans more than three decades.
fn log_ticks(min: f64, max: f64) -> Vec<f64> {
    if !(min > 0.0 && max > min && max.is_finite()) {
        return Vec::new();
    }
    let (first, last) = (min.log10().floor() as i32, max.log10().ceil() as i32);
    let steps: &[f64] = if last - first > 3 {
        &[1.0]
    } else {
        &[1.0, 2.0, 3.0, 5.0]
    };
    (first..=last)
        // Dividing by a power of ten rounds 3 x 0.1 to 0.3, multiplying does not.
        .flat_map(|e| {
            steps.iter().map(move |s| {
                if e < 0 {
                    s / 10f64.powi(-e)
                } else {
                    s * 10f64.powi(e)
                }
            })
        })
        .filter(|v| (min..=max).contains(v))
        .collect()
}

/// A tick value with as many decimals as it needs: 0.05, 0.3, 2.
/// A tick's value without the float noise of its computation (0.6, not 0.6000000000000001).
fn tidy(v: f64) -> String {
    let text = format!("{v:.6}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn short(v: f64) -> String {
    if v <= 0.0 || v >= 1.0 {
        format!("{v:.0}")
    } else {
        let decimals = (-v.log10()).ceil().max(0.0) as usize;
        format!("{v:.decimals$}")
    }
}

/// The loss axis (a log scale: losses span decades, and it keeps the late, small differences
/// visible): the runs' losses with a margin, or 0.01 to 10 where there are none to scale by.
fn loss_range(report: &Report) -> (f64, f64) {
    let losses = report
        .runs
        .iter()
        .flat_map(|r| r.points.iter().filter_map(|p| p.loss));
    let (min, max) = losses.fold((f64::INFINITY, 0.0f64), |(lo, hi), l| {
        (lo.min(l), hi.max(l))
    });
    if min.is_finite() && min > 0.0 {
        (min / 1.25, max * 1.25)
    } else {
        (0.01, 10.0)
    }
}

fn loss_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    report: &Report,
    axis: Axis,
) -> DrawResult<DB> {
    let caption = match axis {
        Axis::Seconds => "Training loss vs wall time",
        Axis::Examples => "Training loss vs examples seen",
    };
    let (min, max) = loss_range(report);
    let mut chart = panel(area, caption).build_cartesian_2d(
        0.0..axis.max(report),
        (min..max).log_scale().with_key_points(log_ticks(min, max)),
    )?;
    mesh_style(&mut chart.configure_mesh(), axis)
        .y_desc("training loss (log scale)")
        .x_label_formatter(&|v| axis.label(*v))
        .y_label_formatter(&|v| short(*v))
        .draw()?;
    for (run, colour) in coloured(report) {
        let points: Vec<(f64, f64)> = run
            .points
            .iter()
            .filter_map(|p| p.loss.map(|l| (axis.value(p), l)))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), colour.stroke_width(3)))?
            .label(run.mode.name())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], colour.stroke_width(3))
            });
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, colour.filled())))?;
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperRight)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clipping_cuts_where_the_line_crosses_and_nowhere_else() {
        // A crossing away from x = 0 and over a run longer than 1: at x = 3.
        let pieces = clip_below(&[(2.0, 0.8), (4.0, 1.0)], 0.9);
        assert_eq!(pieces.len(), 1);
        assert!((pieces[0][0].0 - 3.0).abs() < 1e-9, "{pieces:?}");
        assert_eq!(pieces[0][1], (4.0, 1.0));
        // Two points below in a row: one gap, not two.
        let dip = [(0.0, 0.95), (1.0, 0.5), (2.0, 0.6), (3.0, 0.95)];
        let pieces = clip_below(&dip, 0.9);
        assert_eq!(pieces.iter().map(Vec::len).collect::<Vec<_>>(), [2, 2]);
        // A point on the axis is kept once.
        assert_eq!(
            clip_below(&[(0.0, 0.9), (1.0, 0.95)], 0.9),
            [vec![(0.0, 0.9), (1.0, 0.95)]]
        );
    }

    #[test]
    fn axes_read_their_quantity_and_leave_room_on_the_right() {
        let mut report = report();
        let point = &report.runs[0].points[3];
        assert_eq!(Axis::Seconds.value(point), 1.5);
        assert_eq!(Axis::Examples.value(point), 33_000.0);
        assert_eq!(Axis::Seconds.max(&report), 2.5 * 1.03);
        assert_eq!(Axis::Examples.max(&report), 55_000.0 * 1.03);
        assert_eq!(Axis::Examples.label(0.0), "0");
        for run in &mut report.runs {
            run.points.clear();
        }
        assert_eq!(Axis::Seconds.max(&report), 1e-3);
        assert_eq!(Axis::Examples.max(&report), 1.0);
    }

    #[test]
    fn the_loss_axis_spans_the_losses_with_a_margin() {
        let mut report = report();
        // Losses 1/i for i = 1..=5.
        assert_eq!(loss_range(&report), (1.0 / 5.0 / 1.25, 1.25));
        report.runs[0].points[2].loss = Some(0.0);
        assert_eq!(loss_range(&report), (0.01, 10.0));
        for run in &mut report.runs {
            run.points.iter_mut().for_each(|p| p.loss = None);
        }
        assert_eq!(loss_range(&report), (0.01, 10.0));
    }

    /// The charts as drawn: every panel's axis description, a legend entry per run and panel,
    /// and a marker for every point each panel shows (accuracies above its floor, losses).
    #[test]
    fn every_panel_shows_each_runs_points_and_legend() {
        let tmp = tempfile::tempdir().unwrap();
        let svg = fs::read_to_string(write(&report(), tmp.path()).unwrap().svg).unwrap();
        for desc in [Axis::Seconds.desc(), Axis::Examples.desc()] {
            assert_eq!(svg.matches(desc).count(), 2, "{desc}");
        }
        for mode in ["sync", "async"] {
            assert_eq!(
                svg.matches(&format!(">\n{mode}\n</text>")).count(),
                4,
                "{mode}"
            );
        }
        // 5 of each run's 6 accuracies are above 0.9, in two panels; 5 losses, in two.
        assert_eq!(
            svg.matches("r=\"4\"").count(),
            2 * 2 * 5 + 2 * 2 * 5,
            "{svg:.3000}"
        );
    }

    #[test]
    fn clipping_keeps_what_is_above_and_cuts_at_the_axis() {
        let points = [
            (0.0, 0.1),
            (1.0, 0.95),
            (2.0, 0.97),
            (3.0, 0.85),
            (4.0, 0.99),
        ];
        let pieces = clip_below(&points, 0.9);
        assert_eq!(pieces.len(), 2);
        let (x, y) = pieces[0][0];
        assert!((y - 0.9).abs() < 1e-12 && (x - 0.8 / 0.85).abs() < 1e-9);
        assert_eq!(pieces[0][1..3], [(1.0, 0.95), (2.0, 0.97)]);
        assert_eq!(pieces[0].len(), 4);
        assert_eq!(pieces[1].len(), 2);
        assert_eq!(pieces[1][1], (4.0, 0.99));
        assert!(clip_below(&[(0.0, 0.1)], 0.9).is_empty());
    }

    fn run(mode: Mode, accuracies: &[f64]) -> Run {
        Run {
            mode,
            points: accuracies
                .iter()
                .enumerate()
                .map(|(i, &accuracy)| Point {
                    seconds: i as f64 * 0.5,
                    examples: i as u64 * 11_000,
                    accuracy,
                    loss: (i > 0).then(|| 1.0 / i as f64),
                })
                .collect(),
            staleness: (mode == Mode::Async).then_some((0.93, 4)),
            failures: Vec::new(),
        }
    }

    fn report() -> Report {
        Report {
            title: "Toy 3-2-1".into(),
            heading: "tandem: sync vs async on the toy set".into(),
            devices: vec!["cpu:0".into(), "cpu:1".into()],
            epochs: 1,
            batch_size: 100,
            seed: 1,
            evals_per_epoch: 5,
            budget: 55_000,
            milestones: vec![0.97, 0.98],
            runs: vec![
                run(Mode::Sync, &[0.1, 0.95, 0.971, 0.975, 0.979, 0.98]),
                run(Mode::Async, &[0.1, 0.94, 0.96, 0.965, 0.968, 0.969]),
            ],
        }
    }

    #[test]
    fn the_table_has_both_modes_and_the_milestones() {
        let text = table(&report());
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].contains(" sync |") && lines[0].contains(" async |"),
            "{text}"
        );
        let row = |name: &str| {
            *lines
                .iter()
                .find(|l| l.starts_with(&format!("| {name}")))
                .unwrap_or_else(|| panic!("no {name} in\n{text}"))
        };
        assert!(row("final test accuracy").contains("0.9800 |"), "{text}");
        assert!(row("final test accuracy").contains("0.9690 |"), "{text}");
        assert!(
            row("time to 97%").contains("1.0 s (22,000 examples)"),
            "{text}"
        );
        assert!(row("time to 97%").contains("not reached"), "{text}");
        assert!(
            row("time to 98%").contains("2.5 s (55,000 examples)"),
            "{text}"
        );
        assert!(row("staleness").contains("0.93 / 4"), "{text}");
        assert!(row("examples/sec").contains("22,000"), "{text}");
        assert!(!text.contains("worker failures"), "{text}");
        // Every line has the same width: a table that also reads as plain text.
        assert!(lines.iter().all(|l| l.len() == lines[0].len()), "{text}");
    }

    #[test]
    fn the_milestones_are_the_reports_own() {
        let mut report = report();
        report.milestones = vec![0.5, 0.975];
        report.runs[1].failures = vec!["cpu:1: out of memory".into()];
        let text = table(&report);
        assert!(text.contains("| time to 50% test accuracy"), "{text}");
        assert!(text.contains("| time to 97.5% test accuracy"), "{text}");
        assert!(!text.contains("time to 97% "), "{text}");
        assert!(text.contains("cpu:1: out of memory |"), "{text}");
        report.milestones.clear();
        assert!(!table(&report).contains("time to"));
    }

    #[test]
    fn percentages_have_only_the_decimals_they_need() {
        assert_eq!(percent(0.97), "97");
        assert_eq!(percent(0.975), "97.5");
        assert_eq!(percent(0.9999), "99.99");
        assert_eq!(percent(1.0), "100");
    }

    #[test]
    fn the_markdown_describes_the_setup_from_the_report() {
        let mut report = report();
        report.epochs = 2;
        report.budget = 120_000;
        let md = markdown(&report, &table(&report));
        assert!(
            md.starts_with("# tandem: sync vs async on the toy set\n"),
            "{md}"
        );
        assert!(
            md.contains(
                "2 epoch(s) of 60,000 examples = 120,000 training examples per mode on 2 \
                 worker(s) [cpu:0, cpu:1], batch 100 per worker, seed 1"
            ),
            "{md}"
        );
        assert!(md.contains("5 time(s) per epoch"), "{md}");
        assert!(md.contains("(1/5 of an epoch)"), "{md}");
        assert!(md.contains(&table(&report)), "{md}");
        assert!(md.contains("](compare.png)"), "{md}");
        report.epochs = 0;
        assert!(setup_line(&report).starts_with("0 epoch(s) = 120,000"));
    }

    #[test]
    fn the_accuracy_floor_stays_below_every_final_accuracy() {
        let mut report = report();
        assert_eq!(accuracy_floor(&report), 0.9);
        for worst in (0..=100).map(|i| f64::from(i) / 100.0) {
            report.runs[1] = run(Mode::Async, &[0.1, worst]);
            let lo = accuracy_floor(&report);
            assert!((0.0..1.0).contains(&lo), "{worst}: {lo}");
            assert!(lo <= worst, "{worst}: {lo}");
        }
        report.runs[1] = run(Mode::Async, &[0.1, f64::NAN]);
        assert_eq!(accuracy_floor(&report), 0.9);
        report.runs[1] = run(Mode::Async, &[0.1, -3.0]);
        assert_eq!(accuracy_floor(&report), 0.0);
        report.runs[1] = run(Mode::Async, &[0.1, 0.5]);
        assert_eq!(accuracy_floor(&report), 0.4);
        report.runs.clear();
        assert_eq!(accuracy_floor(&report), 0.9);
    }

    #[test]
    fn log_ticks_are_one_two_three_five() {
        assert_eq!(log_ticks(0.11, 3.5), [0.2, 0.3, 0.5, 1.0, 2.0, 3.0]);
        assert_eq!(log_ticks(0.001, 50.0), [0.001, 0.01, 0.1, 1.0, 10.0]);
        assert!(log_ticks(0.0, 1.0).is_empty());
        assert!(log_ticks(2.0, 2.0).is_empty());
        // Three decades still get their 2, 3 and 5.
        assert_eq!(
            log_ticks(0.01, 10.0),
            [0.01, 0.02, 0.03, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0]
        );
        assert_eq!(short(0.05), "0.05");
        assert_eq!(short(0.3), "0.3");
        assert_eq!(short(2.0), "2");
    }

    #[test]
    fn axis_labels_carry_no_float_noise() {
        assert_eq!(Axis::Seconds.label(0.2 * 3.0), "0.6");
        assert_eq!(Axis::Seconds.label(1.6 - 1e-15), "1.6");
        assert_eq!(Axis::Seconds.label(12.0), "12");
        assert_eq!(Axis::Examples.label(30_000.000_000_004), "30k");
        assert_eq!(Axis::Examples.label(2_500_000.0), "2.5M");
    }

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn writes_a_png_an_svg_and_the_markdown() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("report");
        let report = report();
        let written = write(&report, &dir).unwrap();
        assert_eq!(
            written.paths(),
            [
                dir.join("compare.png").as_path(),
                dir.join("compare.svg").as_path(),
                dir.join("compare.md").as_path(),
            ]
        );
        assert_eq!(written.table, table(&report));
        let image = image::open(&written.png).unwrap();
        assert_eq!((image.width(), image.height()), SIZE);
        let svg = fs::read_to_string(&written.svg).unwrap();
        assert!(svg.starts_with("<svg"), "{svg:.200}");
        assert!(svg.contains("Test accuracy vs wall time"));
        assert!(svg.contains("Training loss vs examples seen"));
        assert!(svg.contains("Toy 3-2-1: sync vs async data parallelism"));
        assert!(svg.contains("async"));
        let md = fs::read_to_string(&written.markdown).unwrap();
        assert_eq!(md, markdown(&report, &written.table));
    }

    #[test]
    fn draws_runs_without_points_or_losses() {
        let tmp = tempfile::tempdir().unwrap();
        let mut report = report();
        report.runs[0].points.clear();
        for p in &mut report.runs[1].points {
            p.loss = None;
        }
        let written = write(&report, tmp.path()).unwrap();
        assert!(written.table.contains("| final test accuracy"));
        assert!(image::open(&written.png).is_ok());
    }

    #[test]
    fn errors_name_the_path() {
        let tmp = tempfile::tempdir().unwrap();
        // A file where the directory should be.
        let file = tmp.path().join("taken");
        fs::write(&file, "").unwrap();
        let err = write(&report(), &file).unwrap_err();
        assert!(matches!(err, ReportError::Create { .. }), "{err:?}");
        assert!(err.to_string().contains("taken"), "{err}");
        // A directory where a file should be.
        fs::create_dir(tmp.path().join("compare.png")).unwrap();
        let err = write(&report(), tmp.path()).unwrap_err();
        assert!(matches!(err, ReportError::Write { .. }), "{err:?}");
        assert!(err.to_string().contains("compare.png"), "{err}");
    }
}
