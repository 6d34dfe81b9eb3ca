//! The subcommands end to end, through the binary: train a quick checkpoint, evaluate it,
//! classify real MNIST test digits written out as image files, and compare the two modes.

mod common;

use std::path::{Path, PathBuf};

use image::codecs::jpeg::JpegEncoder;
use image::imageops::{self, FilterType};
use image::GrayImage;
use tandem_mnist::{Mnist, COLS, ROWS};

use common::{arg, command, data_dir, line_starting, mnist_train, stderr, stdout, succeed};

/// How a digit is written out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// As MNIST has it: white on black, 28 x 28, PNG.
    AsIs,
    /// As a scan would be: black on white, 112 x 112, smoothly upscaled; PNG, or JPEG for 9.
    Scanned,
}

/// Writes the first test image of each digit in both forms. Returns each file with its form
/// and true label.
fn write_digits(dir: &Path) -> Vec<(PathBuf, Form, u8)> {
    let mnist = Mnist::load(&data_dir()).expect("the repository's MNIST copy");
    let test = &mnist.test;
    let mut files = Vec::new();
    for digit in 0..10u8 {
        let index = test
            .labels
            .iter()
            .position(|&l| l == digit)
            .expect("every digit is in the test set");
        let image = GrayImage::from_raw(COLS as u32, ROWS as u32, test.image(index).to_vec())
            .expect("28 x 28 bytes");
        let as_is = dir.join(format!("mnist-{digit}.png"));
        image.save(&as_is).expect("write a PNG");
        files.push((as_is, Form::AsIs, digit));

        let mut large = imageops::resize(&image, 112, 112, FilterType::Triangle);
        imageops::invert(&mut large);
        let scanned = if digit == 9 {
            let path = dir.join(format!("scan-{digit}.jpg"));
            let file = std::fs::File::create(&path).expect("create a JPEG");
            large
                .write_with_encoder(JpegEncoder::new_with_quality(file, 90))
                .expect("write a JPEG");
            path
        } else {
            let path = dir.join(format!("scan-{digit}.png"));
            large.save(&path).expect("write a PNG");
            path
        };
        files.push((scanned, Form::Scanned, digit));
    }
    files
}

/// The `mnist-train` commands of a README section as pasted: each line that runs
/// `cargo run -p mnist-train --` with its continuation lines, comments dropped; the arguments
/// after `--`.
fn pasted_commands(section: &str) -> Vec<Vec<String>> {
    let mut commands = Vec::new();
    let mut lines = section.lines();
    while let Some(line) = lines.next() {
        let Some(rest) = line.strip_prefix("    cargo run -p mnist-train -- ") else {
            continue;
        };
        let mut text = rest.to_owned();
        while text.trim_end().ends_with('\\') {
            text = text.trim_end().trim_end_matches('\\').to_owned();
            text.push(' ');
            text.push_str(lines.next().unwrap_or_default());
        }
        let text = text.split(" #").next().unwrap_or_default();
        commands.push(text.split_whitespace().map(str::to_owned).collect());
    }
    commands
}

/// The first test image of `digit`, white on black, 28 x 28.
fn test_digit(mnist: &Mnist, digit: u8) -> GrayImage {
    let test = &mnist.test;
    let index = test
        .labels
        .iter()
        .position(|&l| l == digit)
        .expect("every digit is in the test set");
    GrayImage::from_raw(COLS as u32, ROWS as u32, test.image(index).to_vec()).expect("28 x 28")
}

#[test]
fn the_readmes_eval_and_predict_commands_run_as_pasted() {
    let readme = include_str!("../../../README.md");
    let start = readme
        .find("### `eval`")
        .expect("README has an eval section");
    let end = readme
        .find("### `compare`")
        .expect("README has a compare section");
    let commands = pasted_commands(&readme[start..end]);
    assert_eq!(commands.len(), 3, "{commands:?}");
    // The images README's predict names, from MNIST test digits: a 7 as MNIST has it, a 2 as
    // a dark-on-light JPEG scan, a 3 on a page three times as wide as high.
    let here = tempfile::tempdir().unwrap();
    let mnist = Mnist::load(&data_dir()).expect("the repository's MNIST copy");
    test_digit(&mnist, 7)
        .save(here.path().join("seven.png"))
        .unwrap();
    let mut two = imageops::resize(&test_digit(&mnist, 2), 112, 112, FilterType::Triangle);
    imageops::invert(&mut two);
    let file = std::fs::File::create(here.path().join("two-scan.jpg")).unwrap();
    two.write_with_encoder(JpegEncoder::new_with_quality(file, 90))
        .unwrap();
    let mut wide = GrayImage::new(3 * COLS as u32, ROWS as u32);
    imageops::overlay(&mut wide, &test_digit(&mnist, 3), COLS as i64, 0);
    wide.save(here.path().join("three-wide.png")).unwrap();

    let said: Vec<String> = commands
        .iter()
        .map(|args| {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            // `--devices auto` on CPU workers even where CUDA is built in: the driver stand-in's
            // one device would run the 20 epochs in its interpreter, for hours.
            let output = command(&args)
                .current_dir(here.path())
                .env("TANDEM_EMU_DEVICES", "0")
                .output()
                .expect("run mnist-train");
            assert!(output.status.success(), "{args:?}: {}", stderr(&output));
            stdout(&output)
        })
        .collect();
    let trained = line_starting(&said[0], "test accuracy:");
    assert_eq!(line_starting(&said[1], "test accuracy:"), trained);
    assert!(
        line_starting(&said[1], "checkpoint:")
            .starts_with("checkpoint:          checkpoints/step-"),
        "{}",
        said[1]
    );
    for answer in ["seven.png: 7 ", "two-scan.jpg: 2 ", "three-wide.png: 3 "] {
        assert!(said[2].contains(answer), "{answer}: {}", said[2]);
    }
}

#[test]
fn eval_and_predict_use_a_trained_checkpoint() {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let checkpoints = tmp.path().join("checkpoints");
    let trained = succeed(&[
        "--steps",
        "300",
        "--checkpoint-dir",
        checkpoints.to_str().expect("a UTF-8 path"),
        "--log-every",
        "0",
        "--devices",
        "cpu:2",
    ]);
    let checkpoint = checkpoints.join("step-0000000300.safetensors");
    let checkpoint_arg = checkpoint.to_str().expect("a UTF-8 path");

    // eval reports exactly the summary's numbers, and a confusion matrix; given the
    // directory, it takes the newest checkpoint there.
    let evaluated = succeed(&["eval", "--checkpoint", checkpoint_arg]);
    let of_dir = succeed(&["eval", "--checkpoint", arg(&checkpoints)]);
    assert_eq!(of_dir, evaluated);
    for prefix in ["test accuracy:", "validation accuracy:"] {
        assert_eq!(
            line_starting(&evaluated, prefix),
            line_starting(&trained, prefix),
            "training said:\n{trained}\neval said:\n{evaluated}"
        );
    }
    let header = line_starting(&evaluated, "true\\pred");
    assert!(
        header.contains('9') && header.contains("recall"),
        "{evaluated}"
    );
    assert!(line_starting(&evaluated, "precision").contains('%'));
    // The matrix's rows add up to the test set.
    let total: u64 = evaluated
        .lines()
        .filter(|l| l.contains(" | ") && !l.starts_with("true"))
        .map(|l| {
            let after = l.split(" | ").nth(1).expect("a total column");
            after
                .split_whitespace()
                .next()
                .expect("a total")
                .parse::<u64>()
                .expect("a number")
        })
        .sum();
    assert_eq!(total, 10_000, "{evaluated}");

    // predict recognises real digits, as MNIST has them and as dark-on-light scans.
    let digits = write_digits(tmp.path());
    let mut args = vec!["predict", "--checkpoint", checkpoint_arg];
    args.extend(
        digits
            .iter()
            .map(|(p, ..)| p.to_str().expect("a UTF-8 path")),
    );
    let predicted = succeed(&args);
    eprintln!("{predicted}");
    let mut answers = Vec::new();
    let mut confidences = Vec::new();
    for (path, form, label) in &digits {
        let prefix = format!("{}: ", path.display());
        let line = line_starting(&predicted, &prefix);
        let rest = &line[prefix.len()..];
        let (digit, p) = rest
            .strip_suffix(')')
            .and_then(|r| r.split_once(" (p = "))
            .unwrap_or_else(|| panic!("not `PATH: D (p = P)`: {line}"));
        let digit: u8 = digit.parse().expect("a digit");
        let p: f32 = p.parse().expect("a probability");
        assert!((0.0..=1.0).contains(&p), "{line}");
        answers.push((*form, digit, *label));
        if digit == *label {
            confidences.push(p);
        }
    }
    // The argmax of 10 classes is always >= 0.1; a trained model is sure of most real digits.
    confidences.sort_by(f32::total_cmp);
    let median = confidences[confidences.len() / 2];
    assert!(median > 0.9, "median confidence {median}:\n{predicted}");
    for form in [Form::AsIs, Form::Scanned] {
        let right = answers
            .iter()
            .filter(|(f, digit, label)| *f == form && digit == label)
            .count();
        assert!(right >= 9, "{form:?}: {right}/10 right:\n{predicted}");
    }
    // Preprocessing recovers the MNIST image from the scan: both forms get the same answer.
    let same = answers
        .chunks(2)
        .filter(|pair| pair[0].1 == pair[1].1)
        .count();
    assert!(same >= 9, "{same}/10 agree:\n{predicted}");

    // A damaged checkpoint is an error naming the file, not a panic.
    let bytes = std::fs::read(&checkpoint).expect("the checkpoint");
    let truncated = tmp.path().join("truncated.safetensors");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).expect("write");
    let output = mnist_train(&["eval", "--checkpoint", truncated.to_str().expect("UTF-8")]);
    assert!(!output.status.success());
    let message = stderr(&output);
    assert!(
        message.contains(&truncated.display().to_string()),
        "{message}"
    );
    assert!(!message.contains("panicked"), "{message}");

    // So is a file that is not an image; the good images are still classified.
    let bad = tmp.path().join("not-an-image.png");
    std::fs::write(&bad, b"hello").expect("write");
    let output = mnist_train(&[
        "predict",
        "--checkpoint",
        checkpoint_arg,
        digits[0].0.to_str().expect("UTF-8"),
        bad.to_str().expect("UTF-8"),
    ]);
    assert!(!output.status.success());
    let message = stderr(&output);
    assert!(message.contains(&bad.display().to_string()), "{message}");
    assert!(!message.contains("panicked"), "{message}");
    assert!(stdout(&output).contains(&digits[0].0.display().to_string()));
}

/// `export` writes the averaged parameters in 16 bits; `eval` and `predict` take the file and
/// agree with the checkpoint to within what the rounding changes; what cannot be exported is
/// refused, and a damaged export is an error naming it.
#[test]
fn an_export_in_sixteen_bits_evaluates_and_predicts_as_its_checkpoint() {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let checkpoints = tmp.path().join("checkpoints");
    let quick = ["--steps", "300", "--log-every", "0", "--devices", "cpu:2"];
    succeed(&[&quick[..], &["--checkpoint-dir", arg(&checkpoints)]].concat());
    let evaluated = succeed(&["eval", "--checkpoint", arg(&checkpoints)]);
    let number = |text: &str, prefix: &str| -> f64 {
        line_starting(text, prefix)[prefix.len()..]
            .split_whitespace()
            .next()
            .and_then(|n| n.trim_end_matches(',').parse().ok())
            .unwrap_or_else(|| panic!("no number after {prefix:?} in {text}"))
    };
    let f32_accuracy = number(&evaluated, "test accuracy:");
    let digits = write_digits(tmp.path());
    let images: Vec<&str> = digits.iter().map(|(p, ..)| arg(p)).collect();
    let predict = |model: &Path| {
        let out = succeed(&[&["predict", "--checkpoint", arg(model)][..], &images].concat());
        // The digits alone: the probabilities may move in the last places.
        out.lines()
            .map(|l| l.split(" (p").next().unwrap_or(l).to_owned())
            .collect::<Vec<_>>()
    };
    let f32_digits = predict(&checkpoints);
    for dtype in ["bf16", "f16"] {
        let file = tmp.path().join(format!("mnist-{dtype}.safetensors"));
        let said = succeed(&["export", "--dtype", dtype, arg(&checkpoints), arg(&file)]);
        assert!(said.contains(&format!("as {dtype} to")), "{said}");
        // Two bytes a parameter, and a header.
        let size = std::fs::metadata(&file).expect("the export").len();
        let params = 784 * 500 + 500 + 500 * 10 + 10;
        assert!((2 * params..2 * params + 1024).contains(&size), "{size}");
        let exported = succeed(&["eval", "--checkpoint", arg(&file)]);
        assert!(
            exported.contains(&format!("averaged parameters in {dtype}")),
            "{exported}"
        );
        let accuracy = number(&exported, "test accuracy:");
        // Rounding the weights moves a handful of the 10,000 test answers at most.
        assert!(
            (accuracy - f32_accuracy).abs() <= 0.002,
            "{dtype}: {accuracy} vs {f32_accuracy}"
        );
        let total = |text: &str| text.lines().filter(|l| l.contains(" | ")).count();
        assert_eq!(total(&exported), total(&evaluated), "{exported}");
        let agree = (predict(&file).iter().zip(&f32_digits))
            .filter(|(a, b)| a == b)
            .count();
        assert!(
            agree + 1 >= f32_digits.len(),
            "{dtype}: {agree} of {}",
            f32_digits.len()
        );
        // An export is no checkpoint to export (or train) from, and says so.
        let again = tmp.path().join(format!("again-{dtype}.safetensors"));
        let re_export = mnist_train(&["export", arg(&file), arg(&again)]);
        assert!(!re_export.status.success() && !again.exists());
        let message = stderr(&re_export);
        assert!(
            message.contains(&format!("a {dtype} export for inference")),
            "{message}"
        );
        // A damaged export names its file.
        let bytes = std::fs::read(&file).expect("the export");
        let damaged = tmp.path().join(format!("damaged-{dtype}.safetensors"));
        std::fs::write(&damaged, &bytes[..bytes.len() - 3]).expect("write");
        let output = mnist_train(&["eval", "--checkpoint", arg(&damaged)]);
        assert!(!output.status.success());
        let message = stderr(&output);
        assert!(
            message.contains(&damaged.display().to_string()),
            "{message}"
        );
        assert!(!message.contains("panicked"), "{message}");
    }
    for (args, says) in [
        (vec!["--dtype", "f32"], "an export is 16-bit"),
        (vec!["--dtype", "fp8"], "expected one of"),
    ] {
        let out = mnist_train(&[&["export"][..], &args, &[arg(&checkpoints), "x"]].concat());
        assert!(
            !out.status.success() && stderr(&out).contains(says),
            "{args:?}"
        );
    }
    let onto_itself = mnist_train(&["export", arg(&checkpoints), arg(&checkpoints)]);
    assert!(
        stderr(&onto_itself).contains("is a directory"),
        "{}",
        stderr(&onto_itself)
    );
    // What is not a plain file (here a named pipe; /dev/stdout alike) is not replaced by one.
    let pipe = tmp.path().join("pipe");
    let made = std::process::Command::new("mkfifo").arg(&pipe).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo");
    let onto_pipe = mnist_train(&["export", arg(&checkpoints), arg(&pipe)]);
    assert!(!onto_pipe.status.success());
    assert!(
        stderr(&onto_pipe).contains("not a regular file"),
        "{}",
        stderr(&onto_pipe)
    );
    let still = std::fs::metadata(&pipe).expect("the pipe");
    assert!(!still.is_file(), "the pipe was replaced by a file");
}

#[test]
fn compare_writes_a_report() {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let report = tmp.path().join("report");
    let printed = succeed(&[
        "compare",
        "--epochs",
        "1",
        "--evals-per-epoch",
        "2",
        "--devices",
        "cpu:2",
        "--report",
        report.to_str().expect("a UTF-8 path"),
    ]);
    let png = image::open(report.join("compare.png")).expect("a decodable PNG");
    assert!(
        png.width() >= 800 && png.height() >= 600,
        "{}x{}",
        png.width(),
        png.height()
    );
    let svg = std::fs::read_to_string(report.join("compare.svg")).expect("the SVG");
    assert!(svg.starts_with("<svg") && svg.contains("Test accuracy vs wall time"));
    let md = std::fs::read_to_string(report.join("compare.md")).expect("the Markdown");
    let header = line_starting(&md, "| ");
    assert!(
        header.contains(" sync |") && header.contains(" async |"),
        "{md}"
    );
    for row in [
        "| final test accuracy",
        "| examples/sec",
        "| time to 97%",
        "| staleness",
    ] {
        line_starting(&md, row);
        // The table is printed too.
        line_starting(&printed, row);
    }
    // One epoch at 2 x 100 examples per sync step reaches well past chance.
    let accuracy: Vec<f64> = line_starting(&md, "| final test accuracy")
        .split('|')
        .filter_map(|c| c.trim().parse().ok())
        .collect();
    assert_eq!(accuracy.len(), 2, "{md}");
    assert!(accuracy.iter().all(|&a| a > 0.9), "{md}");
}

/// Under `mpirun` (as its environment says), what would run once per process on its own is
/// refused: training without the MPI transport, and every subcommand.
#[test]
fn what_mpirun_would_run_once_per_process_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let under_mpirun = |args: &[&str]| {
        let output = command(args)
            .env("OMPI_COMM_WORLD_SIZE", "2")
            .output()
            .unwrap();
        assert!(!output.status.success(), "{args:?}");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let report = tmp.path().join("report");
    let said = under_mpirun(&["compare", "--epochs", "1", "--report", arg(&report)]);
    assert!(
        said.contains("runs in one process") && said.contains("run it without mpirun"),
        "{said}"
    );
    if !cfg!(feature = "mpi") {
        let said = under_mpirun(&["--steps", "2"]);
        assert!(said.contains("this build has no MPI transport"), "{said}");
    }
    assert!(std::fs::read_dir(tmp.path()).unwrap().next().is_none());
}
