//! `mnist-train predict`: classifies image files of handwritten digits with a checkpoint.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{bail, Context, Result};
use image::imageops::{self, FilterType};
use image::{DynamicImage, GrayImage, ImageReader, Luma};
use tandem_mnist::{COLS, ROWS};
use tandem_model::Mlp;

use crate::cli::PredictArgs;
use crate::eval::load_checkpoint;

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

/// Turns any picture of a digit into an MNIST-like input: 28 x 28 grey levels in `[0, 1]`,
/// row by row, white ink on a black background.
///
/// 1. Grey levels; transparent pixels count as white paper.
/// 2. Inverted when the border is light on average: MNIST is light ink on dark, most scans
///    and drawings are the opposite.
/// 3. The border's mean is taken as the background level: the image is padded to a square
///    with it, centred, so that resizing keeps the digit's aspect ratio.
/// 4. Resized to 28 x 28 with a triangle (bilinear) filter, which averages over the source
///    pixels when shrinking rather than skipping them.
/// 5. The background level is subtracted and the brightest pixel scaled to 1, so grey paper
///    or faint ink look like MNIST's black background and white strokes.
pub fn to_mnist(image: &DynamicImage) -> Vec<f32> {
    let mut grey = greyscale(image);
    if border_mean(&grey) > 127.5 {
        imageops::invert(&mut grey);
    }
    let background = border_mean(&grey);
    let (w, h) = grey.dimensions();
    let side = w.max(h);
    let fill = Luma([background.round().clamp(0.0, 255.0) as u8]);
    let mut square = GrayImage::from_pixel(side, side, fill);
    imageops::replace(
        &mut square,
        &grey,
        i64::from((side - w) / 2),
        i64::from((side - h) / 2),
    );
    let small = if side as usize == COLS && COLS == ROWS {
        square
    } else {
        imageops::resize(&square, COLS as u32, ROWS as u32, FilterType::Triangle)
    };
    let brightest = small
        .pixels()
        .map(|p| f32::from(p.0[0]))
        .fold(0.0, f32::max);
    let range = brightest - background;
    small
        .pixels()
        .map(|p| {
            if range > 0.0 {
                ((f32::from(p.0[0]) - background) / range).clamp(0.0, 1.0)
            } else {
                // A blank image: nothing but background.
                0.0
            }
        })
        .collect()
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
    use super::*;

    /// A 28 x 28 "digit": a white vertical bar on black.
    fn bar() -> GrayImage {
        GrayImage::from_fn(28, 28, |x, y| {
            Luma([if (12..16).contains(&x) && (5..23).contains(&y) {
                255
            } else {
                0
            }])
        })
    }

    fn values(image: &GrayImage) -> Vec<f32> {
        image.pixels().map(|p| f32::from(p.0[0]) / 255.0).collect()
    }

    #[test]
    fn a_mnist_like_image_is_kept_as_is() {
        let image = bar();
        assert_eq!(
            to_mnist(&DynamicImage::ImageLuma8(image.clone())),
            values(&image)
        );
    }

    #[test]
    fn dark_on_light_and_large_images_become_mnist_like() {
        let mut inverted = imageops::resize(&bar(), 112, 112, FilterType::Nearest);
        imageops::invert(&mut inverted);
        let x = to_mnist(&DynamicImage::ImageLuma8(inverted));
        let expected = values(&bar());
        let worst = x
            .iter()
            .zip(&expected)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(worst < 0.35, "{worst}");
        let err: f32 = x.iter().zip(&expected).map(|(a, b)| (a - b).abs()).sum();
        assert!(err / 784.0 < 0.02, "{err}");
    }

    #[test]
    fn wide_images_are_padded_to_a_square_not_stretched() {
        // A 56 x 28 image with a 4 x 4 white square in its middle: padded to 56 x 56 and
        // halved, the square must stay square (2 x 2) and centred.
        let wide = GrayImage::from_fn(56, 28, |x, y| {
            Luma([if (26..30).contains(&x) && (12..16).contains(&y) {
                255
            } else {
                0
            }])
        });
        let x = to_mnist(&DynamicImage::ImageLuma8(wide));
        let lit: Vec<(usize, usize)> = (0..784)
            .filter(|&i| x[i] > 0.5)
            .map(|i| (i % 28, i / 28))
            .collect();
        assert_eq!(lit, [(13, 13), (14, 13), (13, 14), (14, 14)]);
    }

    #[test]
    fn transparency_is_paper_and_blank_images_are_zero() {
        // Black ink on a transparent background (as drawing programs save it).
        let rgba = image::RgbaImage::from_fn(28, 28, |x, y| {
            if (12..16).contains(&x) && (5..23).contains(&y) {
                image::Rgba([0, 0, 0, 255])
            } else {
                image::Rgba([0, 0, 0, 0])
            }
        });
        assert_eq!(to_mnist(&DynamicImage::ImageRgba8(rgba)), values(&bar()));
        let blank = GrayImage::from_pixel(40, 30, Luma([200]));
        assert!(to_mnist(&DynamicImage::ImageLuma8(blank))
            .iter()
            .all(|&v| v == 0.0));
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
