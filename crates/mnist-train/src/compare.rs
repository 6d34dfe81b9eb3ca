//! `mnist-train compare`: trains sync and then async with the same budget of examples on the
//! same devices, measures test accuracy and training loss along the way, and writes a report:
//! `compare.png` and `compare.svg` (four panels) and `compare.md` (a table, also printed).

use std::fmt::Write as _;
use std::fs;
use std::io::BufWriter;
use std::path::Path;
use std::sync::{Mutex, Once};

use anyhow::{anyhow, Context, Result};
use image::codecs::png::PngEncoder;
use image::{ExtendedColorType, ImageEncoder};
use plotters::chart::MeshStyle;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;
use tandem_model::Mlp;
use tandem_strategy::{Epochs, Hyper, Observer, StepReport, TrainReport};
use tandem_tensor::CpuBackend;

use crate::cli::{CompareArgs, DEFAULT_INIT_STDDEV};
use crate::data::{self, Data};
use crate::session::{initial_state, Mode, RunConfig, Session};

/// The test accuracies whose first crossing the report times.
const MILESTONES: [f64; 2] = [0.97, 0.98];
/// Size of the PNG and SVG, in pixels.
const SIZE: (u32, u32) = (1600, 1150);
/// The font every text of the plots uses, registered under plotters' "sans-serif" family.
/// Embedded so that drawing never looks for system fonts (which a CI machine may not have).
const FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

/// One measurement between two training segments.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    /// Training wall time so far (evaluation excluded), in seconds.
    pub seconds: f64,
    /// Training examples processed so far, by all workers.
    pub examples: u64,
    /// Test accuracy of the averaged parameters.
    pub accuracy: f64,
    /// Mean training loss (data loss plus L2, as in the progress lines) over the segment that
    /// just ended; `None` before any training, or when the segment logged no step.
    pub loss: Option<f64>,
}

/// One mode's run.
#[derive(Debug, Clone)]
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
#[derive(Debug, Clone)]
pub struct Report {
    /// The devices both modes trained on, one worker each.
    pub devices: Vec<String>,
    /// The budget in epochs of 55,000 examples.
    pub epochs: u64,
    /// Examples per worker per step.
    pub batch_size: usize,
    /// Seed of the initial weights and the data order.
    pub seed: u64,
    /// Evaluations per epoch.
    pub evals_per_epoch: u64,
    /// The budget in training examples.
    pub budget: u64,
    /// Sync, then async.
    pub runs: Vec<Run>,
}

/// `mnist-train compare`: trains both modes, then writes and prints the report.
pub fn run(args: &CompareArgs) -> Result<()> {
    // Create the report directory before training, so a bad path fails in a second, not after
    // minutes of training.
    fs::create_dir_all(&args.report).with_context(|| {
        format!(
            "{}: cannot create the report directory",
            args.report.display()
        )
    })?;
    let data = data::load(args.data_dir.as_deref())?;
    let mut runs = Vec::new();
    let mut devices = Vec::new();
    for mode in [Mode::Sync, Mode::Async] {
        let (run, names) = train(mode, args, &data)?;
        runs.push(run);
        devices = names;
    }
    let report = Report {
        devices,
        epochs: args.epochs,
        batch_size: args.batch_size as usize,
        seed: args.seed,
        evals_per_epoch: args.evals_per_epoch,
        budget: args.epochs * data.train.len() as u64,
        runs,
    };
    let png = args.report.join("compare.png");
    let svg = args.report.join("compare.svg");
    let md = args.report.join("compare.md");
    write_png(&png, &report)?;
    write_svg(&svg, &report)?;
    let table = table(&report);
    fs::write(&md, markdown(&report, &table))
        .with_context(|| format!("{}: cannot write the report", md.display()))?;
    out!();
    out!("{}", table.trim_end());
    out!();
    for path in [&png, &svg, &md] {
        out!("wrote {}", path.display());
    }
    Ok(())
}

/// Collects the training loss the strategy reports, to average it over each segment.
#[derive(Default)]
struct Losses {
    sum_count: Mutex<(f64, u64)>,
}

impl Losses {
    /// The mean since the last call, if any step was logged.
    fn take_mean(&self) -> Option<f64> {
        let mut guard = self.sum_count.lock().unwrap_or_else(|p| p.into_inner());
        let (sum, count) = std::mem::take(&mut *guard);
        (count > 0).then(|| sum / count as f64)
    }
}

impl Observer for Losses {
    fn on_log(&self, report: &StepReport) {
        let mut guard = self.sum_count.lock().unwrap_or_else(|p| p.into_inner());
        guard.0 += f64::from(report.loss);
        guard.1 += 1;
    }
}

/// The global steps at which a run of `count` epochs stops to evaluate, `per_epoch` times an
/// epoch: equal shares of the budget of examples, each ending at the first step by which its
/// examples are drawn ([`Epochs::steps_for`]; the last at [`Epochs::end_step`]), without
/// repeats (a tiny budget may have fewer segments).
fn segment_ends(epochs: Epochs, count: u64, per_epoch: u64) -> Vec<u64> {
    let budget = count * epochs.examples();
    let segments = count * per_epoch;
    let end = epochs.steps_for(budget);
    let mut ends: Vec<u64> = (1..=segments)
        .map(|i| epochs.steps_for(budget * i / segments).min(end))
        .collect();
    ends.dedup();
    ends.retain(|&s| s > 0);
    ends
}

/// Trains one mode for the budget, evaluating between segments.
fn train(mode: Mode, args: &CompareArgs, data: &Data) -> Result<(Run, Vec<String>)> {
    let workers = args.devices.resolve(crate::session::gpu_count)?.len();
    let mut config = RunConfig {
        mode,
        workers,
        // The reference's hyper-parameters, as training's defaults.
        hyper: Hyper {
            batch_size: args.batch_size as usize,
            seed: args.seed,
            log_every: 0,
            ..Hyper::default()
        },
        end_step: 0,
        save_every: None,
    };
    let epochs = config.epochs(data.train.len());
    let ends = segment_ends(epochs, args.epochs, args.evals_per_epoch);
    config.end_step = ends.last().copied().unwrap_or(0);
    // About 20 loss samples per segment, but never a sum of squares over all parameters (the
    // L2 term of a logged loss) more often than every 10th step: it would slow training down.
    let per_segment = config.end_step / ends.len().max(1) as u64;
    config.hyper.log_every = (per_segment / 20).clamp(1, 10);

    let state = initial_state(DEFAULT_INIT_STDDEV, args.seed);
    let mut session = Session::open(&args.devices, config, &data.train, state)?;
    let config = session.config.clone();
    out!(
        "{}: {} worker(s) [{}], batch {} per worker, {} steps ({} examples)",
        mode.name(),
        config.workers,
        session.devices.join(", "),
        config.hyper.batch_size,
        config.end_step,
        config.end_step * config.examples_per_step()
    );
    let test_accuracy = |session: &Session| {
        Mlp::MNIST
            .evaluate(&CpuBackend, &session.state.ema, &data.test)
            .context("cannot evaluate on the test set")
    };
    let mut points = vec![Point {
        seconds: 0.0,
        examples: 0,
        accuracy: test_accuracy(&session)?,
        loss: None,
    }];
    let losses = Losses::default();
    let (mut seconds, mut examples) = (0.0, 0);
    let (mut staleness_sum, mut staleness_max, mut async_steps) = (0.0, 0, 0);
    let mut failures = Vec::new();
    for (i, &to) in ends.iter().enumerate() {
        let report: TrainReport = session.advance(to, &losses)?;
        seconds += report.elapsed.as_secs_f64();
        examples += report.examples;
        if let Some(s) = report.staleness {
            staleness_sum += s.mean * report.steps as f64;
            staleness_max = staleness_max.max(s.max);
            async_steps += report.steps;
        }
        failures.extend(report.failures.iter().map(ToString::to_string));
        // Evaluation happens here, between segments: outside `report.elapsed`.
        let point = Point {
            seconds,
            examples,
            accuracy: test_accuracy(&session)?,
            loss: losses.take_mean(),
        };
        points.push(point);
        let last = i + 1 == ends.len();
        if last || ((i + 1) as u64).is_multiple_of(args.evals_per_epoch) {
            out!(
                "  epoch {:>5.2}: test accuracy {:.4}, loss {}, {:.1} s",
                epochs.epoch_at(to),
                point.accuracy,
                point.loss.map_or("-".into(), |l| format!("{l:.4}")),
                seconds
            );
        }
    }
    let staleness =
        (mode == Mode::Async).then(|| (staleness_sum / async_steps.max(1) as f64, staleness_max));
    Ok((
        Run {
            mode,
            points,
            staleness,
            failures,
        },
        session.devices.clone(),
    ))
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
    for milestone in MILESTONES {
        row(
            &format!("time to {:.0}% test accuracy", milestone * 100.0),
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
    format!(
        "{} epoch(s) = {} training examples per mode on {} worker(s) [{}], batch {} per worker, seed {}",
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
        "# tandem: synchronous vs asynchronous data parallelism on MNIST\n\n\
         {}. Test accuracy of the averaged (moving-average) parameters is measured {} time(s) \
         per epoch, between training segments; evaluation time is not counted in the training \
         time. The training loss is the mean over each segment of the loss the progress lines \
         report (batch loss plus L2).\n\n\
         {table}\n\
         Times to an accuracy are the training time at the first evaluation at or above it, so \
         they are resolved to one segment ({} of an epoch). Staleness: how many other updates \
         landed between an async update's read of the parameters and its own application.\n\n\
         ![test accuracy and training loss against wall time and examples seen](compare.png)\n",
        setup_line(report),
        report.evals_per_epoch,
        if report.evals_per_epoch == 1 {
            "all".to_string()
        } else {
            format!("1/{}", report.evals_per_epoch)
        }
    )
}

/// Registers the embedded font once per process.
fn register_font() -> Result<()> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        result = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
            .map_err(|_| anyhow!("the embedded font assets/DejaVuSans.ttf is not a valid font"));
    });
    result
}

fn write_png(path: &Path, report: &Report) -> Result<()> {
    register_font()?;
    let (w, h) = SIZE;
    let mut pixels = vec![0u8; (w * h * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut pixels, SIZE).into_drawing_area();
        draw(&root, report).map_err(|e| anyhow!("cannot draw {}: {e}", path.display()))?;
        root.present()
            .map_err(|e| anyhow!("cannot draw {}: {e}", path.display()))?;
    }
    // plotters' own PNG encoder would pull in a second version of `image`; encode here.
    let file = fs::File::create(path)
        .with_context(|| format!("{}: cannot create the file", path.display()))?;
    PngEncoder::new(BufWriter::new(file))
        .write_image(&pixels, w, h, ExtendedColorType::Rgb8)
        .with_context(|| format!("{}: cannot write the PNG", path.display()))
}

fn write_svg(path: &Path, report: &Report) -> Result<()> {
    register_font()?;
    let mut text = String::new();
    {
        let root = SVGBackend::with_string(&mut text, SIZE).into_drawing_area();
        draw(&root, report).map_err(|e| anyhow!("cannot draw {}: {e}", path.display()))?;
        root.present()
            .map_err(|e| anyhow!("cannot draw {}: {e}", path.display()))?;
    }
    fs::write(path, text).with_context(|| format!("{}: cannot write the SVG", path.display()))
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
            Axis::Seconds => format!("{v}"),
            Axis::Examples if v == 0.0 => "0".into(),
            Axis::Examples if v >= 1e6 => format!("{}M", v / 1e6),
            Axis::Examples => format!("{}k", v / 1e3),
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
    let title = format!(
        "MNIST 784-500-10: sync vs async data parallelism on {} worker(s) [{}], batch {}, {} epoch(s)",
        report.devices.len(),
        report.devices.join(", "),
        report.batch_size,
        report.epochs
    );
    let root = root.titled(&title, ("sans-serif", 30))?;
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

/// The bottom of the accuracy axis: 0.9 when every run ends above 0.93 (the interesting
/// part of MNIST), lower otherwise so that the ends of the curves stay visible.
fn accuracy_floor(report: &Report) -> f64 {
    let worst = report
        .runs
        .iter()
        .filter_map(|r| r.last().map(|p| p.accuracy))
        .fold(1.0, f64::min);
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
    for (run, colour) in report.runs.iter().zip(COLOURS) {
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
fn short(v: f64) -> String {
    if v <= 0.0 || v >= 1.0 {
        format!("{v:.0}")
    } else {
        let decimals = (-v.log10()).ceil().max(0.0) as usize;
        format!("{v:.decimals$}")
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
    let losses = report
        .runs
        .iter()
        .flat_map(|r| r.points.iter().filter_map(|p| p.loss));
    let (min, max) = losses.fold((f64::INFINITY, 0.0f64), |(lo, hi), l| {
        (lo.min(l), hi.max(l))
    });
    // Losses span decades: a log axis keeps the late, small differences visible.
    let (min, max) = if min.is_finite() && min > 0.0 {
        (min / 1.25, max * 1.25)
    } else {
        (0.01, 10.0)
    };
    let mut chart = panel(area, caption).build_cartesian_2d(
        0.0..axis.max(report),
        (min..max).log_scale().with_key_points(log_ticks(min, max)),
    )?;
    mesh_style(&mut chart.configure_mesh(), axis)
        .y_desc("training loss (log scale)")
        .x_label_formatter(&|v| axis.label(*v))
        .y_label_formatter(&|v| short(*v))
        .draw()?;
    for (run, colour) in report.runs.iter().zip(COLOURS) {
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
    fn segments_split_the_budget_into_whole_steps() {
        assert_eq!(segment_ends(Epochs::new(1000, 100), 1, 4), [3, 5, 8, 10]);
        assert_eq!(segment_ends(Epochs::new(1000, 300), 1, 4), [1, 2, 3, 4]);
        // More segments than steps: no repeats, no empty segment.
        assert_eq!(segment_ends(Epochs::new(200, 100), 1, 5), [1, 2]);
        assert_eq!(segment_ends(Epochs::new(55_000, 200), 10, 5).len(), 50);
        // A non-dividing batch: whole epochs end where Epochs says they do.
        let odd = Epochs::new(55_000, 192);
        let ends = segment_ends(odd, 3, 2);
        assert_eq!(ends[1], odd.end_step(1).unwrap());
        assert_eq!(ends[3], odd.end_step(2).unwrap());
        assert_eq!(ends[5], odd.end_step(3).unwrap());
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
            devices: vec!["cpu:0".into(), "cpu:1".into()],
            epochs: 1,
            batch_size: 100,
            seed: 1,
            evals_per_epoch: 5,
            budget: 55_000,
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
            lines[0].contains("sync") && lines[0].contains("async"),
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
        // Every line has the same width: a table that also reads as plain text.
        assert!(lines.iter().all(|l| l.len() == lines[0].len()), "{text}");
    }

    #[test]
    fn log_ticks_are_one_two_three_five() {
        assert_eq!(log_ticks(0.11, 3.5), [0.2, 0.3, 0.5, 1.0, 2.0, 3.0]);
        assert_eq!(log_ticks(0.001, 50.0), [0.001, 0.01, 0.1, 1.0, 10.0]);
        assert!(log_ticks(0.0, 1.0).is_empty());
        assert_eq!(short(0.05), "0.05");
        assert_eq!(short(0.3), "0.3");
        assert_eq!(short(2.0), "2");
    }

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn draws_a_png_and_an_svg() {
        let dir = tempfile::tempdir().unwrap();
        let (png, svg) = (dir.path().join("c.png"), dir.path().join("c.svg"));
        write_png(&png, &report()).unwrap();
        write_svg(&svg, &report()).unwrap();
        let image = image::open(&png).unwrap();
        assert_eq!((image.width(), image.height()), SIZE);
        let svg = fs::read_to_string(&svg).unwrap();
        assert!(svg.contains("Test accuracy vs wall time"));
        assert!(svg.contains("async"));
    }
}
