//! `mnist-train predict`: classifies image files of handwritten digits with a checkpoint.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{bail, Context, Result};
use image::imageops::{self, FilterType};
use image::{DynamicImage, GrayImage, ImageBuffer, ImageReader, Luma};
use tandem_mnist::{COLS, ROWS};
use tandem_model::Mlp;

use crate::cli::PredictArgs;
use crate::eval::load_checkpoint;

/// `mnist-train predict`: prints `PATH: DIGIT (p = PROBABILITY)` for each image.
pub fn run(args: &PredictArgs) -> Result<()> {
    let saved = load_checkpoint(&args.checkpoint)?;
    // Every image gets its line or its error: one unreadable file should not hide the answers
    // for the others, but it must still fail the command.
    let mut failures = Vec::new();
    for path in &args.images {
        match classify(&saved.state.ema, path) {
            Ok((digit, p)) => println!("{}: {digit} (p = {p:.3})", path.display()),
            Err(e) => failures.push(format!("{e:#}")),
        }
    }
    if !failures.is_empty() {
        let mut message = format!(
            "cannot classify {} of {} image(s):",
            failures.len(),
            args.images.len()
        );
        for failure in failures {
            let _ = write!(message, "\n  {failure}");
        }
        bail!(message);
    }
    Ok(())
}

/// The most probable digit of the image at `path` and its probability.
fn classify(params: &[f32], path: &Path) -> Result<(usize, f32)> {
    let image = read_image(path)?;
    let x = to_mnist(&image);
    let probabilities = Mlp::MNIST
        .probabilities(params, &x)
        .with_context(|| format!("{}: cannot classify", path.display()))?;
    let digit = tandem_tensor::cpu::argmax(&probabilities);
    Ok((digit, probabilities[digit]))
}

/// Decodes a PNG or JPEG, recognised by its content rather than its name.
pub fn read_image(path: &Path) -> Result<DynamicImage> {
    let context = || format!("{}: cannot read the image", path.display());
    let image = ImageReader::open(path)
        .and_then(ImageReader::with_guessed_format)
        .with_context(context)?
        .decode()
        .with_context(context)?;
    if image.width() == 0 || image.height() == 0 {
        bail!("{}: the image is empty", path.display());
    }
    Ok(image)
}

/// MNIST fits each digit into a 20 x 20 box (keeping its aspect ratio) inside the 28 x 28
/// image.
const DIGIT_BOX: f32 = 20.0;
/// Where MNIST puts a digit's centre of mass (pixel indices, both axes).
const MNIST_CENTRE: f32 = 14.0;
/// Ink is what is brighter than the background by this fraction of the contrast; fainter
/// pixels (JPEG noise, paper texture) do not count when finding the digit's extent.
const INK: f32 = 0.1;
/// A contrast (in grey levels) below which the image is taken as blank.
const MIN_CONTRAST: f32 = 8.0;

/// A grey image of `f32` values in `[0, 1]`.
type Plane = ImageBuffer<Luma<f32>, Vec<f32>>;

/// Turns any picture of a digit into an MNIST-like input: 28 x 28 grey levels in `[0, 1]`,
/// row by row, white ink on a black background, normalised the way MNIST's digits were.
///
/// 1. Grey levels; transparent pixels count as white paper.
/// 2. Inverted when the border is light on average: MNIST is light ink on dark, most scans
///    and drawings are the opposite.
/// 3. The border's mean is the background level: it is subtracted and the brightest pixel
///    scaled to 1, so grey paper or faint ink look like MNIST's black and white.
/// 4. Framed: a square window centred on the digit (the pixels above 10% of the contrast),
///    padded with background where it leaves the image, sized so that the digit fills 20 of
///    the 28 pixels on its longer side as in MNIST. The aspect ratio is kept, and a small
///    digit in a large photo is not lost.
/// 5. Resized to 28 x 28 with a triangle (bilinear) filter, which averages over the source
///    pixels when shrinking rather than skipping them.
/// 6. Shifted so that its centre of mass is at the centre, as MNIST's digits are.
///
/// An MNIST image itself comes out unchanged (up to a one-pixel shift at most, when its
/// centre of mass is exactly between two pixels).
pub fn to_mnist(image: &DynamicImage) -> Vec<f32> {
    let mut grey = greyscale(image);
    if border_mean(&grey) > 127.5 {
        imageops::invert(&mut grey);
    }
    let background = border_mean(&grey);
    let brightest = grey.pixels().map(|p| f32::from(p.0[0])).fold(0.0, f32::max);
    let contrast = brightest - background;
    if contrast < MIN_CONTRAST {
        // A blank image: nothing but background.
        return vec![0.0; COLS * ROWS];
    }
    let ink: Plane = ImageBuffer::from_fn(grey.width(), grey.height(), |x, y| {
        let v = f32::from(grey.get_pixel(x, y).0[0]);
        Luma([((v - background) / contrast).clamp(0.0, 1.0)])
    });
    let Some((x0, y0, w, h)) = ink_box(&ink) else {
        return vec![0.0; COLS * ROWS];
    };
    let side = w.max(h);
    let frame = ((side as f32 * COLS as f32 / DIGIT_BOX).round() as u32).max(side);
    // The square window centred on the digit, taken from the whole image rather than from the
    // box, so that the faint edges of the strokes below the ink threshold are kept.
    let left = i64::from(x0) - i64::from((frame - w) / 2);
    let top = i64::from(y0) - i64::from((frame - h) / 2);
    let square: Plane = ImageBuffer::from_fn(frame, frame, |x, y| {
        let (sx, sy) = (left + i64::from(x), top + i64::from(y));
        match (u32::try_from(sx), u32::try_from(sy)) {
            (Ok(sx), Ok(sy)) if sx < ink.width() && sy < ink.height() => *ink.get_pixel(sx, sy),
            _ => Luma([0.0]),
        }
    });
    let small = if frame as usize == COLS && COLS == ROWS {
        square
    } else {
        imageops::resize(&square, COLS as u32, ROWS as u32, FilterType::Triangle)
    };
    centre_mass(&small)
}

/// The smallest rectangle `(x, y, width, height)` holding every pixel brighter than [`INK`].
fn ink_box(ink: &Plane) -> Option<(u32, u32, u32, u32)> {
    let mut bounds: Option<(u32, u32, u32, u32)> = None;
    for (x, y, p) in ink.enumerate_pixels() {
        if p.0[0] > INK {
            let (x0, y0, x1, y1) = bounds.unwrap_or((x, y, x, y));
            bounds = Some((x0.min(x), y0.min(y), x1.max(x), y1.max(y)));
        }
    }
    bounds.map(|(x0, y0, x1, y1)| (x0, y0, x1 - x0 + 1, y1 - y0 + 1))
}

/// The image's values, row by row, shifted by whole pixels so that the centre of mass is at
/// [`MNIST_CENTRE`] (what falls off the edge is lost, what comes in is background).
fn centre_mass(plane: &Plane) -> Vec<f32> {
    let (w, h) = plane.dimensions();
    let (mut mass, mut mx, mut my) = (0.0f64, 0.0f64, 0.0f64);
    for (x, y, p) in plane.enumerate_pixels() {
        let v = f64::from(p.0[0]);
        mass += v;
        mx += v * f64::from(x);
        my += v * f64::from(y);
    }
    let shift = |moment: f64| {
        if mass > 0.0 {
            (f64::from(MNIST_CENTRE) - moment / mass).round() as i64
        } else {
            0
        }
    };
    let (dx, dy) = (shift(mx), shift(my));
    let mut out = vec![0.0; (w * h) as usize];
    for (x, y, p) in plane.enumerate_pixels() {
        let (tx, ty) = (i64::from(x) + dx, i64::from(y) + dy);
        if (0..i64::from(w)).contains(&tx) && (0..i64::from(h)).contains(&ty) {
            out[(ty * i64::from(w) + tx) as usize] = p.0[0];
        }
    }
    out
}

/// Grey levels, with transparency composited over white.
fn greyscale(image: &DynamicImage) -> GrayImage {
    if !image.color().has_alpha() {
        return image.to_luma8();
    }
    let with_alpha = image.to_luma_alpha8();
    GrayImage::from_fn(image.width(), image.height(), |x, y| {
        let [l, a] = with_alpha.get_pixel(x, y).0;
        let (l, a) = (f32::from(l), f32::from(a) / 255.0);
        Luma([(l * a + 255.0 * (1.0 - a)).round() as u8])
    })
}

/// The mean grey level of the outermost ring of pixels (1/20 of the smaller side, at least
/// one pixel): where a digit's background is.
fn border_mean(grey: &GrayImage) -> f32 {
    let (w, h) = grey.dimensions();
    let ring = (w.min(h) / 20).max(1);
    let (mut sum, mut count) = (0.0f64, 0u64);
    for (x, y, p) in grey.enumerate_pixels() {
        if x < ring || y < ring || x + ring >= w || y + ring >= h {
            sum += f64::from(p.0[0]);
            count += 1;
        }
    }
    (sum / count.max(1) as f64) as f32
}

#[cfg(test)]
mod tests {
    use std::sync::OnceLock;

    use tandem_mnist::Mnist;

    use super::*;

    /// The first 100 MNIST test images.
    fn mnist() -> &'static [GrayImage] {
        static IMAGES: OnceLock<Vec<GrayImage>> = OnceLock::new();
        IMAGES.get_or_init(|| {
            let mnist = Mnist::load(&crate::data::default_data_dir()).unwrap();
            (0..100)
                .map(|i| GrayImage::from_raw(28, 28, mnist.test.image(i).to_vec()).unwrap())
                .collect()
        })
    }

    fn values(image: &GrayImage) -> Vec<f32> {
        image.pixels().map(|p| f32::from(p.0[0]) / 255.0).collect()
    }

    fn mean_error(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum::<f32>() / a.len() as f32
    }

    /// The mean error of `a` against `b` shifted by at most one pixel either way: a resampled
    /// digit's centre of mass may round to the next pixel, which no classifier minds.
    fn shifted_error(a: &[f32], b: &[f32]) -> f32 {
        let mut best = f32::INFINITY;
        for dy in -1i32..=1 {
            for dx in -1i32..=1 {
                let moved: Vec<f32> = (0..784i32)
                    .map(|i| {
                        let (x, y) = (i % 28 - dx, i / 28 - dy);
                        if (0..28).contains(&x) && (0..28).contains(&y) {
                            b[(y * 28 + x) as usize]
                        } else {
                            0.0
                        }
                    })
                    .collect();
                best = best.min(mean_error(a, &moved));
            }
        }
        best
    }

    /// The extent `(width, height)` of the pixels above one half.
    fn extent(x: &[f32]) -> (usize, usize) {
        let lit: Vec<(usize, usize)> = (0..784)
            .filter(|&i| x[i] > 0.5)
            .map(|i| (i % 28, i / 28))
            .collect();
        let span = |v: Vec<usize>| v.iter().max().unwrap() - v.iter().min().unwrap() + 1;
        (
            span(lit.iter().map(|p| p.0).collect()),
            span(lit.iter().map(|p| p.1).collect()),
        )
    }

    #[test]
    fn mnist_images_come_out_as_they_are() {
        let mut unchanged = 0;
        for image in mnist() {
            let x = to_mnist(&DynamicImage::ImageLuma8(image.clone()));
            let brightest = image.pixels().map(|p| p.0[0]).max().unwrap();
            // Scaled so that the brightest pixel is 1; nothing else changes.
            let expected: Vec<f32> = image
                .pixels()
                .map(|p| f32::from(p.0[0]) / f32::from(brightest))
                .collect();
            if mean_error(&x, &expected) < 1e-6 {
                unchanged += 1;
            }
        }
        assert!(unchanged >= 95, "{unchanged}/100 unchanged");
    }

    #[test]
    fn dark_on_light_and_large_images_become_mnist_like() {
        for image in &mnist()[..20] {
            let mut scan = imageops::resize(image, 112, 112, FilterType::Triangle);
            imageops::invert(&mut scan);
            let x = to_mnist(&DynamicImage::ImageLuma8(scan));
            // Upscaling and shrinking again blurs by about 0.03 on its own, and the blur makes
            // the digit look a little larger (so it comes out a little smaller).
            let error = shifted_error(&x, &values(image));
            assert!(error < 0.06, "{error}");
        }
    }

    #[test]
    fn a_small_digit_in_a_large_picture_is_found() {
        for image in &mnist()[..20] {
            let mut digit = imageops::resize(image, 56, 56, FilterType::Triangle);
            imageops::invert(&mut digit);
            let mut page = GrayImage::from_pixel(300, 200, Luma([230]));
            imageops::replace(&mut page, &digit, 30, 120);
            let x = to_mnist(&DynamicImage::ImageLuma8(page));
            let error = shifted_error(&x, &values(image));
            assert!(error < 0.06, "{error}");
        }
    }

    #[test]
    fn the_aspect_ratio_is_kept() {
        // A 4 x 8 white bar in a wide black image: 20 pixels tall in the result, so 10 wide.
        let wide = GrayImage::from_fn(56, 28, |x, y| {
            Luma([if (10..14).contains(&x) && (3..11).contains(&y) {
                255
            } else {
                0
            }])
        });
        let x = to_mnist(&DynamicImage::ImageLuma8(wide));
        let (w, h) = extent(&x);
        assert!((19..=21).contains(&h) && (9..=11).contains(&w), "{w} x {h}");
    }

    #[test]
    fn transparency_is_paper_and_blank_images_are_zero() {
        // Black ink on a transparent background (as drawing programs save it) reads like the
        // same ink on white paper.
        let inside = |x: u32, y: u32| (12..16).contains(&x) && (5..23).contains(&y);
        let rgba = image::RgbaImage::from_fn(28, 28, |x, y| {
            image::Rgba([0, 0, 0, if inside(x, y) { 255 } else { 0 }])
        });
        let paper = GrayImage::from_fn(28, 28, |x, y| Luma([if inside(x, y) { 0 } else { 255 }]));
        assert_eq!(
            to_mnist(&DynamicImage::ImageRgba8(rgba)),
            to_mnist(&DynamicImage::ImageLuma8(paper))
        );
        for level in [0, 200, 255] {
            let blank = GrayImage::from_pixel(40, 30, Luma([level]));
            assert!(to_mnist(&DynamicImage::ImageLuma8(blank))
                .iter()
                .all(|&v| v == 0.0));
        }
    }

    #[test]
    fn unreadable_files_are_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("digit.png");
        std::fs::write(&text, b"not an image").unwrap();
        let missing = dir.path().join("missing.png");
        for path in [text, missing] {
            let err = format!("{:#}", read_image(&path).unwrap_err());
            assert!(err.starts_with(&path.display().to_string()), "{err}");
        }
    }
}
