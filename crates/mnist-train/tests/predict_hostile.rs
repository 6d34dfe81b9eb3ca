//! `mnist-train predict` against hostile and odd images, end to end through the binary: huge
//! declared sizes, files cut short or damaged, blank pictures, a reader that goes away, 16-bit
//! and one-pixel-wide pictures.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use common::{arg, command, stderr, stdout};
use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::PngEncoder;
use image::imageops::{self, FilterType};
use image::{ExtendedColorType, GrayImage, ImageEncoder, Luma, Rgba, RgbaImage};
use png::BitDepth::{self, Eight, Sixteen};
use png::ColorType::{self, Grayscale};
use tandem_mnist::{Mnist, COLS, ROWS};

/// A checkpoint to classify with, trained once for all the tests here. Its accuracy does not
/// matter: only what predict does with the files is tested.
fn checkpoint() -> &'static str {
    static CHECKPOINT: OnceLock<String> = OnceLock::new();
    CHECKPOINT.get_or_init(|| {
        // In the target directory rather than a temporary one: a static is never dropped, so a
        // temporary directory would be left behind by every run.
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("predict_hostile");
        let _ = std::fs::remove_dir_all(&dir);
        let output = command(&["--steps", "50", "--log-every", "0", "--devices", "cpu:2"])
            .arg("--checkpoint-dir")
            .arg(&dir)
            .output()
            .expect("cannot run mnist-train");
        assert!(
            output.status.success(),
            "training failed:\n{}",
            stderr(&output)
        );
        // The newest checkpoint, whatever training names it.
        let newest = std::fs::read_dir(&dir)
            .expect("the checkpoint directory")
            .map(|entry| entry.expect("a directory entry").path())
            .filter(|path| path.extension().is_some_and(|e| e == "safetensors"))
            .max()
            .expect("a checkpoint");
        arg(&newest).to_owned()
    })
}

/// `mnist-train predict --checkpoint CHECKPOINT IMAGES...`.
fn predict_command(images: &[PathBuf]) -> Command {
    let mut command = command(&["predict", "--checkpoint", checkpoint()]);
    command.args(images);
    command
}

/// Runs `mnist-train predict --checkpoint CHECKPOINT IMAGES...` to the end.
fn predict(images: &[PathBuf]) -> Output {
    predict_command(images)
        .output()
        .expect("cannot run mnist-train")
}

/// The line of `text` for `path`, without the path, if there is one.
fn answer<'a>(text: &'a str, path: &Path) -> Option<&'a str> {
    let prefix = format!("{}: ", path.display());
    text.lines().find_map(|l| l.strip_prefix(prefix.as_str()))
}

/// The first MNIST test image of `digit`.
fn mnist_digit(digit: u8) -> GrayImage {
    let mnist = Mnist::load(&common::data_dir()).expect("the repository's MNIST copy");
    let index = mnist
        .test
        .labels
        .iter()
        .position(|&l| l == digit)
        .expect("every digit is in the test set");
    GrayImage::from_raw(COLS as u32, ROWS as u32, mnist.test.image(index).to_vec())
        .expect("28 x 28 bytes")
}

/// The digit as a scan would have it: black on white, 112 x 112.
fn scanned(digit: u8) -> GrayImage {
    let mut large = imageops::resize(&mnist_digit(digit), 112, 112, FilterType::Triangle);
    imageops::invert(&mut large);
    large
}

fn jpeg(image: &GrayImage) -> Vec<u8> {
    let mut bytes = Vec::new();
    image
        .write_with_encoder(JpegEncoder::new_with_quality(&mut bytes, 90))
        .expect("encode a JPEG");
    bytes
}

fn png(pixels: &[u8], width: u32, height: u32, color: ExtendedColorType) -> Vec<u8> {
    let mut bytes = Vec::new();
    PngEncoder::new(&mut bytes)
        .write_image(pixels, width, height, color)
        .expect("encode a PNG");
    bytes
}

fn grey_png(image: &GrayImage) -> Vec<u8> {
    png(
        image.as_raw(),
        image.width(),
        image.height(),
        ExtendedColorType::L8,
    )
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("write a test image");
    path
}

/// A PNG encoder for `width` x `height` pixels of `color` and `depth`, writing to `bytes`.
fn png_encoder(
    bytes: &mut Vec<u8>,
    width: u32,
    height: u32,
    color: ColorType,
    depth: BitDepth,
) -> png::Encoder<'static, &mut Vec<u8>> {
    let mut encoder = png::Encoder::new(bytes, width, height);
    encoder.set_color(color);
    encoder.set_depth(depth);
    encoder.set_compression(png::Compression::Fast);
    encoder
}

/// A valid PNG of `width` x `height` pixels of zeros, without ever holding them: the rows are
/// streamed through the encoder one at a time, so that 20000 x 20000 grey pixels take a few
/// megabytes at most.
fn zero_png(width: u32, height: u32, color: ColorType, depth: BitDepth) -> Vec<u8> {
    let mut bytes = Vec::new();
    let encoder = png_encoder(&mut bytes, width, height, color, depth);
    let mut writer = encoder.write_header().expect("a PNG header");
    let mut stream = writer.stream_writer().expect("a PNG stream");
    // A row of 8- or 16-bit samples.
    let row = vec![0; width as usize * color.samples() * depth as usize / 8];
    for _ in 0..height {
        stream.write_all(&row).expect("a row of zeros");
    }
    stream.finish().expect("all the rows");
    writer.finish().expect("a whole PNG");
    bytes
}

/// A PNG declaring `width` x `height` grey pixels whose only image data is `idat`.
fn header_only_png(width: u32, height: u32, idat: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::new();
    let encoder = png_encoder(&mut bytes, width, height, Grayscale, Eight);
    let mut writer = encoder.write_header().expect("a PNG header");
    writer
        .write_chunk(png::chunk::IDAT, idat)
        .expect("an IDAT chunk");
    writer.finish().expect("a whole PNG");
    bytes
}

/// `predict` of `images` run to the end under GNU time (`/usr/bin/time -v`), with its peak
/// memory in kilobytes. Not measured in this process (`wait4`): a child spawned from it counts
/// the test's own memory, which it shares until it execs, in its peak.
fn predict_measured(images: &[PathBuf]) -> (Output, u64) {
    let time = Path::new("/usr/bin/time");
    assert!(
        time.exists(),
        "these tests measure predict's memory with GNU time: install it (Debian: `apt install \
         time`) as /usr/bin/time"
    );
    // The same command as `predict` runs, under time.
    let predict = predict_command(images);
    let output = Command::new(time)
        .arg("-v")
        .arg(predict.get_program())
        .args(predict.get_args())
        .envs(
            predict
                .get_envs()
                .filter_map(|(name, value)| Some((name, value?))),
        )
        .output()
        .expect("cannot run /usr/bin/time");
    let report = stderr(&output);
    let kilobytes = report
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("Maximum resident set size (kbytes): ")
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no peak memory in GNU time's report:\n{report}"));
    (output, kilobytes)
}

#[test]
fn the_streamed_pngs_are_valid() {
    // So that the huge ones below really are what a user could give predict.
    let png = zero_png(300, 200, Grayscale, Eight);
    let image = image::load_from_memory(&png).expect("a valid PNG");
    assert_eq!((image.width(), image.height()), (300, 200));
    assert!(image.to_luma8().pixels().all(|p| p.0[0] == 0));
    let png = zero_png(70, 9, ColorType::Rgba, Sixteen);
    let image = image::load_from_memory(&png).expect("a valid PNG");
    assert_eq!(image.color(), image::ColorType::Rgba16);
    assert_eq!((image.width(), image.height()), (70, 9));
}

/// 20000 x 20000 grey pixels in 2.5 MB took 3.9 GB and 14 s; now any image over 4096 pixels a
/// side, or whose pixels would take more than 64 MiB, is refused from its header.
#[test]
fn huge_images_are_refused_at_once_saying_their_size() {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let dir = tmp.path();
    let huge = write(dir, "huge.png", &zero_png(20000, 20000, Grayscale, Eight));
    // The same header with almost no pixel data.
    let header_only = header_only_png(20000, 20000, &[0x78, 0x01]);
    let header_only = write(dir, "header-only.png", &header_only);
    let wide = write(dir, "wide.png", &zero_png(5000, 1, Grayscale, Eight));
    // 4096 x 4096 of 16-bit RGBA would take 128 MiB.
    let deep = zero_png(4096, 4096, ColorType::Rgba, Sixteen);
    let deep = write(dir, "deep.png", &deep);
    let images = [
        huge.clone(),
        header_only.clone(),
        wide.clone(),
        deep.clone(),
    ];

    let (output, kilobytes) = predict_measured(&images);
    let message = stderr(&output);
    assert!(!output.status.success(), "{}", stdout(&output));
    assert!(!message.contains("panicked"), "{message}");
    for (path, expected) in [
        (
            &huge,
            "20000x20000 pixels is more than predict accepts (at most 4096x4096 / 16.8 megapixels)",
        ),
        (
            &header_only,
            "20000x20000 pixels is more than predict accepts",
        ),
        (&wide, "5000x1 pixels is more than predict accepts"),
        (
            &deep,
            "4096x4096 pixels is more than predict accepts (at most 4096x4096 / 8.4 megapixels)",
        ),
    ] {
        let line = format!("{}: {expected}", path.display());
        assert!(message.contains(&line), "no {line:?} in:\n{message}");
    }
    // Nothing is decoded: the huge image alone would be 400 MB once decoded.
    assert!(kilobytes < 100_000, "{kilobytes} kB");
}

/// Images at the size limit are read, in bounded memory.
#[test]
fn images_at_the_limit_are_read() {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let dir = tmp.path();
    let grey = write(dir, "grey.png", &zero_png(4096, 4096, Grayscale, Eight));
    let grey16 = write(dir, "grey16.png", &zero_png(4096, 4096, Grayscale, Sixteen));
    let images = [grey.clone(), grey16.clone()];
    let (output, kilobytes) = predict_measured(&images);
    assert!(output.status.success(), "{}", stderr(&output));
    for path in &images {
        assert_eq!(answer(&stdout(&output), path), Some("no digit found"));
    }
    // 32 MiB for the 16-bit picture, 16 MiB for its grey copy, the working copy is small.
    assert!(kilobytes < 150_000, "{kilobytes} kB");
}

/// 700 of the 3736 bytes of a JPEG 7 were classified as `8 (p = 0.921)`: the decoder fills in
/// the missing part. Cut or damaged JPEGs and PNGs are errors, and the other images still get
/// their answers.
#[test]
fn truncated_or_damaged_images_are_errors() {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let dir = tmp.path();
    let seven = scanned(7);
    let jpeg_bytes = jpeg(&seven);
    let png_bytes = grey_png(&seven);
    let mut good = vec![
        write(dir, "seven.jpg", &jpeg_bytes),
        write(dir, "seven.png", &png_bytes),
    ];
    let mut bad = Vec::new();
    let n = jpeg_bytes.len();
    for cut in [100, 700, n / 2, n * 9 / 10, n - 2, n - 1] {
        bad.push(write(dir, &format!("seven-{cut}.jpg"), &jpeg_bytes[..cut]));
    }
    let n = png_bytes.len();
    // In the header, in the pixel data, just before and in the closing IEND chunk.
    for cut in [20, 40, n / 3, n / 2, n - 12, n - 1] {
        bad.push(write(dir, &format!("seven-{cut}.png"), &png_bytes[..cut]));
    }
    // A flipped bit in the pixel data (the chunk's CRC no longer matches).
    let mut flipped = png_bytes.clone();
    flipped[n / 2] ^= 0x10;
    bad.push(write(dir, "seven-flipped.png", &flipped));
    // A header declaring 4000 x 4000 pixels (within the limit) with almost no data.
    bad.push(write(
        dir,
        "tiny-body.png",
        &header_only_png(4000, 4000, &[0x78, 0x01, 0x01]),
    ));
    good.push(write(dir, "zero.png", &grey_png(&mnist_digit(0))));

    let images: Vec<PathBuf> = good.iter().chain(&bad).cloned().collect();
    let output = predict(&images);
    let (out, message) = (stdout(&output), stderr(&output));
    assert!(!output.status.success(), "{out}");
    assert!(!message.contains("panicked"), "{message}");
    for path in &good {
        let line = answer(&out, path)
            .unwrap_or_else(|| panic!("no answer for {path:?}:\n{out}\n{message}"));
        assert!(line.contains("(p = "), "{line}");
    }
    for path in &bad {
        assert_eq!(answer(&out, path), None, "{out}");
        let expected = format!("{}: truncated or damaged image", path.display());
        assert!(
            message.contains(&expected),
            "no {expected:?} in:\n{message}"
        );
    }
    assert!(message.contains(&format!(
        "cannot classify {} of {}",
        bad.len(),
        images.len()
    )));
}

/// Blank pictures all answered `5 (p = 0.160)`; they have no digit, which is an answer.
#[test]
fn blank_images_have_no_digit() {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let dir = tmp.path();
    let transparent = RgbaImage::from_pixel(50, 40, Rgba([0, 0, 0, 0]));
    let blanks = [
        write(
            dir,
            "dot.png",
            &grey_png(&GrayImage::from_pixel(1, 1, Luma([90]))),
        ),
        write(
            dir,
            "white.png",
            &grey_png(&GrayImage::from_pixel(64, 48, Luma([255]))),
        ),
        write(
            dir,
            "black.png",
            &grey_png(&GrayImage::from_pixel(64, 48, Luma([0]))),
        ),
        write(
            dir,
            "grey.jpg",
            &jpeg(&GrayImage::from_pixel(64, 48, Luma([128]))),
        ),
        write(
            dir,
            "transparent.png",
            &png(transparent.as_raw(), 50, 40, ExtendedColorType::Rgba8),
        ),
    ];
    let seven = write(dir, "seven.png", &grey_png(&scanned(7)));
    let images: Vec<PathBuf> = blanks.iter().chain([&seven]).cloned().collect();
    let output = predict(&images);
    let out = stdout(&output);
    assert!(output.status.success(), "{}", stderr(&output));
    for path in &blanks {
        assert_eq!(answer(&out, path), Some("no digit found"), "{out}");
    }
    let line = answer(&out, &seven).unwrap_or_else(|| panic!("no answer for the 7:\n{out}"));
    assert!(line.contains("(p = "), "{line}");
}

/// `predict ... | head -1` panicked (exit status 101) when head closed the pipe.
#[cfg(unix)]
#[test]
fn a_closed_output_ends_quietly() {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    // Long lines, many of them: more than a pipe holds (64 KiB), so that predict is still
    // writing when the reader goes away however the two are scheduled.
    let name = format!("{}.png", "seven".repeat(40));
    let seven = write(tmp.path(), &name, &grey_png(&scanned(7)));
    let images = vec![seven; 1000];
    let mut child = predict_command(&images)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot run mnist-train");
    let mut reader = BufReader::new(child.stdout.take().expect("a piped stdout"));
    let mut first = String::new();
    reader.read_line(&mut first).expect("the first line");
    assert!(first.contains("(p = "), "{first}");
    // As `head -1` does: read one line and go.
    drop(reader);
    let mut message = String::new();
    child
        .stderr
        .take()
        .expect("a piped stderr")
        .read_to_string(&mut message)
        .expect("stderr");
    let status = child.wait().expect("mnist-train ends");
    assert!(!message.contains("panicked"), "{message}");
    assert_eq!(status.code(), Some(141), "{message}");
}

/// 16-bit pictures read as their 8-bit equivalents; pictures one pixel wide or tall are
/// answered, not a panic.
#[test]
fn deep_and_thin_images_are_read() {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let dir = tmp.path();
    let seven = scanned(7);
    let eight_bit = write(dir, "seven8.png", &grey_png(&seven));
    // Each 8-bit level v is 257 v in 16 bits, big-endian as PNG stores it.
    let deep: Vec<u8> = seven.as_raw().iter().flat_map(|&v| [v, v]).collect();
    let sixteen_bit = write(
        dir,
        "seven16.png",
        &png(&deep, seven.width(), seven.height(), ExtendedColorType::L16),
    );
    let rgba: Vec<u8> = seven
        .as_raw()
        .iter()
        .flat_map(|&v| [v, v, v, v, v, v, 255, 255])
        .collect();
    let rgba16 = write(
        dir,
        "seven-rgba16.png",
        &png(
            &rgba,
            seven.width(),
            seven.height(),
            ExtendedColorType::Rgba16,
        ),
    );
    let line = |w: u32, h: u32| {
        GrayImage::from_fn(w, h, |x, y| Luma([if (x + y) % 7 < 3 { 255 } else { 0 }]))
    };
    let thin = [
        write(dir, "column.png", &grey_png(&line(1, 300))),
        write(dir, "row.png", &grey_png(&line(300, 1))),
        write(dir, "long-row.png", &grey_png(&line(4096, 1))),
        write(dir, "pair.png", &grey_png(&line(2, 1))),
    ];
    let mut images = vec![eight_bit.clone(), sixteen_bit.clone(), rgba16.clone()];
    images.extend(thin.iter().cloned());
    let output = predict(&images);
    let out = stdout(&output);
    assert!(output.status.success(), "{}", stderr(&output));
    let expected = answer(&out, &eight_bit).expect("an answer for the 8-bit 7");
    assert_eq!(answer(&out, &sixteen_bit), Some(expected), "{out}");
    assert_eq!(answer(&out, &rgba16), Some(expected), "{out}");
    for path in &thin {
        assert!(answer(&out, path).is_some(), "{out}");
    }
}
