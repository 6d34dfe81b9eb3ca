//! Image files of handwritten digits as MNIST-like inputs (the `image` feature).
//!
//! [`digit_from_file`] reads a PNG or JPEG and normalises it the way MNIST's digits were:
//! 28 x 28 grey levels in `[0, 1]`, row by row, light ink on a dark background, the digit
//! fitted into a 20 x 20 box and centred by its centre of mass. It is the two steps
//! [`read_image`] (a file to grey levels) and [`normalise`] (grey levels to an input).
//!
//! Every image file is hostile input: its size, its declared dimensions and its structure are
//! checked before anything is allocated for them, and a file that is cut short or damaged is an
//! [`ImageError`] naming the file rather than a guess. Nothing in a file can make this module
//! panic.
//!
//! ```no_run
//! use std::path::Path;
//! use tandem_mnist::{image::digit_from_file, PIXELS};
//!
//! match digit_from_file(Path::new("seven.png"))? {
//!     Some(x) => assert_eq!(x.len(), PIXELS),
//!     None => println!("no digit found"),
//! }
//! # Ok::<(), tandem_mnist::image::ImageError>(())
//! ```

use std::fs::File;
use std::io::{self, Cursor, Read};
use std::path::{Path, PathBuf};

use ::image::imageops::{self, FilterType};
use ::image::{DynamicImage, ImageBuffer, ImageDecoder, ImageFormat, ImageReader, Limits, Luma};

/// A grey image of 8-bit levels (the `image` crate's), as [`read_image`] returns it and
/// [`normalise`] takes it.
pub use ::image::GrayImage;

use crate::{COLS, ROWS};

/// The widest and tallest image accepted: a 12-megapixel phone photo (4032 x 3024) fits.
pub const MAX_SIDE: u32 = 4096;
/// The most the decoded image may take, in bytes: 4096 x 4096 grey, RGB or RGBA pixels of 8
/// bits, or fewer pixels of 16 bits. Decoding needs the whole picture in memory at once.
pub const MAX_DECODED_BYTES: u64 = 64 << 20;
/// The largest file read. The JPEG decoder holds the whole file in memory (twice, with our
/// copy); no reasonable picture of one digit comes near this.
pub const MAX_FILE_BYTES: u64 = 32 << 20;
/// The longer side of the grey image that is normalised: a larger one is shrunk to this first
/// (averaging its pixels), so that the working planes take a megabyte or two whatever the
/// photo's size. A digit would have to fill less than 1/25 of the picture's longer side to
/// shrink below MNIST's 20 pixels.
pub const WORKING_SIDE: u32 = 512;

/// Why an image file cannot be read. Every variant names the file; the messages say "predict"
/// because that is the command users meet them through (`mnist-train predict`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImageError {
    /// The file cannot be opened.
    #[error("{}: cannot open the image", path.display())]
    Open {
        /// The image file.
        path: PathBuf,
        /// What the system said.
        source: io::Error,
    },
    /// The file cannot be read.
    #[error("{}: cannot read the image", path.display())]
    Read {
        /// The image file.
        path: PathBuf,
        /// What the system said.
        source: io::Error,
    },
    /// The file is larger than [`MAX_FILE_BYTES`].
    #[error(
        "{}: the file is larger than predict accepts (at most {} MiB)",
        path.display(),
        MAX_FILE_BYTES >> 20
    )]
    FileTooLarge {
        /// The image file.
        path: PathBuf,
    },
    /// The file holds no bytes.
    #[error("{}: the file is empty", path.display())]
    EmptyFile {
        /// The image file.
        path: PathBuf,
    },
    /// The file starts neither like a PNG nor like a JPEG.
    #[error("{}: not a PNG or JPEG image", path.display())]
    NotPngOrJpeg {
        /// The image file.
        path: PathBuf,
    },
    /// The file ends before its end-of-image marker (cut short, or its structure is damaged).
    #[error(
        "{}: truncated or damaged image (it ends before its end-of-image marker)",
        path.display()
    )]
    Incomplete {
        /// The image file.
        path: PathBuf,
    },
    /// The declared dimensions are over [`MAX_SIDE`], or the decoded picture would take more
    /// than [`MAX_DECODED_BYTES`].
    #[error(
        "{}: {width}x{height} pixels is more than predict accepts (at most \
         {MAX_SIDE}x{MAX_SIDE} / {:.1} megapixels)",
        path.display(),
        *max_pixels as f64 / 1e6
    )]
    TooManyPixels {
        /// The image file.
        path: PathBuf,
        /// The declared width.
        width: u32,
        /// The declared height.
        height: u32,
        /// The most pixels accepted of this file's pixel type.
        max_pixels: u64,
    },
    /// The decoder refused the file. Its error is part of the message rather than a source:
    /// its text already includes its own cause, which a chain of sources would repeat.
    #[error("{}: {}: {error}", path.display(), decode_fault(error))]
    Decode {
        /// The image file.
        path: PathBuf,
        /// The decoder's error.
        error: ::image::ImageError,
    },
}

/// What a decoder's error means for the file, as said before the decoder's own words.
fn decode_fault(error: &::image::ImageError) -> &'static str {
    use ::image::ImageError as E;
    match error {
        E::Decoding(_) | E::IoError(_) | E::Parameter(_) => "truncated or damaged image",
        E::Unsupported(_) => "unsupported image",
        E::Limits(_) => "the image is larger than predict accepts",
        E::Encoding(_) => "cannot read the image",
    }
}

/// The MNIST-like input for the image file at `path`: [`read_image`], then [`normalise`].
/// `Ok(None)` for a picture with no digit in it (nothing but background).
///
/// # Errors
///
/// [`ImageError`], naming the file, for a file that cannot be read or is not a complete PNG or
/// JPEG within the limits ([`MAX_FILE_BYTES`], [`MAX_SIDE`], [`MAX_DECODED_BYTES`]).
pub fn digit_from_file(path: &Path) -> Result<Option<Vec<f32>>, ImageError> {
    Ok(normalise(read_image(path)?))
}

/// Decodes a PNG or JPEG, recognised by its content rather than its name, into grey levels
/// (transparency over white paper).
///
/// The file may be anything: it is read only up to [`MAX_FILE_BYTES`], its structure must be
/// complete (the decoders quietly fill in the rest of a file that is cut short), and its
/// declared size is checked against [`MAX_SIDE`] and [`MAX_DECODED_BYTES`] before the picture
/// is decoded. The colour picture is dropped as soon as it is grey.
///
/// # Errors
///
/// [`ImageError`], naming the file: it cannot be opened or read, it is empty, too large, not a
/// PNG or JPEG, cut short or damaged (a side of zero pixels is damage to both decoders), or
/// declares more pixels than accepted.
pub fn read_image(path: &Path) -> Result<GrayImage, ImageError> {
    let file = File::open(path).map_err(|source| ImageError::Open {
        path: path.to_owned(),
        source,
    })?;
    let mut bytes = Vec::new();
    // One byte more than accepted tells a file at the limit from a larger one; `take` also
    // bounds what a device or pipe given as the path can make us read.
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| ImageError::Read {
            path: path.to_owned(),
            source,
        })?;
    let named = || path.to_owned();
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(ImageError::FileTooLarge { path: named() });
    }
    let format = if bytes.starts_with(PNG_SIGNATURE) {
        ImageFormat::Png
    } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        ImageFormat::Jpeg
    } else if bytes.is_empty() {
        return Err(ImageError::EmptyFile { path: named() });
    } else {
        return Err(ImageError::NotPngOrJpeg { path: named() });
    };
    let complete = match format {
        ImageFormat::Png => png_is_complete(&bytes),
        _ => jpeg_is_complete(&bytes),
    };
    if !complete {
        return Err(ImageError::Incomplete { path: named() });
    }
    let decode_error = |error| ImageError::Decode {
        path: named(),
        error,
    };

    let mut reader = ImageReader::with_format(Cursor::new(bytes.as_slice()), format);
    // Width and height are checked below, where the error can say what they are; here the
    // limit bounds what the PNG decoder allocates while reading the header chunks.
    reader.limits(limits(None, MAX_DECODED_BYTES));
    let mut decoder = reader.into_decoder().map_err(decode_error)?;
    let (width, height) = decoder.dimensions();
    let decoded_bytes = decoder.total_bytes();
    let bytes_per_pixel = u64::from(decoder.color_type().bytes_per_pixel()).max(1);
    if width > MAX_SIDE || height > MAX_SIDE || decoded_bytes > MAX_DECODED_BYTES {
        let max_pixels =
            (u64::from(MAX_SIDE) * u64::from(MAX_SIDE)).min(MAX_DECODED_BYTES / bytes_per_pixel);
        return Err(ImageError::TooManyPixels {
            path: named(),
            width,
            height,
            max_pixels,
        });
    }
    // What is left of the allocation budget once the picture itself is counted, as
    // `ImageReader::decode` does.
    decoder
        .set_limits(limits(Some(MAX_SIDE), MAX_DECODED_BYTES - decoded_bytes))
        .map_err(decode_error)?;
    let image = DynamicImage::from_decoder(decoder).map_err(decode_error)?;
    // The colour picture goes as soon as it is grey; normalising shrinks it before anything
    // else.
    Ok(greyscale(image))
}

/// Decoding limits: at most `side` pixels each way, at most `bytes` allocated.
fn limits(side: Option<u32>, bytes: u64) -> Limits {
    let mut limits = Limits::default();
    limits.max_image_width = side;
    limits.max_image_height = side;
    limits.max_alloc = Some(bytes);
    limits
}

/// The eight bytes every PNG file starts with.
const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";

/// Whether a PNG's chunks are all there, up to its IEND chunk.
///
/// Each chunk is a 4-byte big-endian length, a 4-byte type, the data and a 4-byte CRC; the
/// decoder checks the CRCs of the chunks it reads, this checks that the file is not cut short
/// (the decoder may stop reading once it has the pixels).
fn png_is_complete(bytes: &[u8]) -> bool {
    let mut at = PNG_SIGNATURE.len();
    loop {
        let Some(&[l0, l1, l2, l3, k0, k1, k2, k3]) = bytes.get(at..at + 8) else {
            return false;
        };
        // The length is the file's word: added with checks, so that a huge one cannot wrap.
        let Some(end) = usize::try_from(u32::from_be_bytes([l0, l1, l2, l3]))
            .ok()
            .and_then(|length| at.checked_add(12)?.checked_add(length))
        else {
            return false;
        };
        if end > bytes.len() {
            return false;
        }
        if [k0, k1, k2, k3] == *b"IEND" {
            return true;
        }
        at = end;
    }
}

/// Whether a JPEG's segments run complete up to an end-of-image marker after its image data.
///
/// The JPEG decoder fills in whatever is missing from a file that is cut short (700 bytes of a
/// 3736-byte digit were classified with p = 0.92), so the structure is checked here. Markers
/// are `FF` and a code, possibly after more `FF` fill bytes; every segment but the standalone
/// markers carries its length. In the entropy-coded data after a start-of-scan, an `FF` byte
/// is always followed by `00` (a stuffed byte) or a restart marker, which are passed over as
/// markers without a length (and the data between them as stray bytes), so any other `FF xx`
/// there is the next marker: an `FF D9` found that way really ends the image.
fn jpeg_is_complete(bytes: &[u8]) -> bool {
    // Past the start-of-image marker the caller recognised the file by.
    let mut at = 2;
    let mut scanned = false;
    loop {
        // Stray bytes between segments are skipped, as libjpeg does, and so is entropy-coded
        // data.
        let Some(ff) = bytes
            .get(at..)
            .and_then(|rest| rest.iter().position(|&b| b == 0xFF))
        else {
            return false;
        };
        at += ff;
        while bytes.get(at) == Some(&0xFF) {
            at += 1;
        }
        let Some(&code) = bytes.get(at) else {
            return false;
        };
        at += 1;
        match code {
            // End of image: complete if there was image data before it.
            0xD9 => return scanned,
            // Markers without a length: TEM, restarts, start of image; 00 is a stuffed byte.
            0x00 | 0x01 | 0xD0..=0xD8 => {}
            _ => {
                let Some(&[hi, lo]) = bytes.get(at..at + 2) else {
                    return false;
                };
                let length = usize::from(u16::from_be_bytes([hi, lo]));
                // The length counts its own two bytes.
                if length < 2 {
                    return false;
                }
                at += length;
                scanned |= code == 0xDA;
            }
        }
    }
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
pub const MIN_CONTRAST: f32 = 8.0;

/// A grey image of `f32` values in `[0, 1]`.
type Plane = ImageBuffer<Luma<f32>, Vec<f32>>;

/// Turns a grey picture of a digit into an MNIST-like input: 28 x 28 grey levels in `[0, 1]`,
/// row by row, white ink on a black background, normalised the way MNIST's digits were; `None`
/// when there is no digit (a blank picture, nothing but background).
///
/// 1. Shrunk (averaging) so that its longer side is at most [`WORKING_SIDE`].
/// 2. Inverted when the border is light on average: MNIST is light ink on dark, most scans
///    and drawings are the opposite.
/// 3. The border's mean is the background level: it is subtracted and the brightest pixel
///    scaled to 1, so grey paper or faint ink look like MNIST's black and white. Less
///    contrast than [`MIN_CONTRAST`] is a blank picture.
/// 4. Framed: a square window centred on the digit (the pixels above 10% of the contrast),
///    padded with background where it leaves the image, sized so that the digit fills 20 of
///    the 28 pixels on its longer side as in MNIST. The aspect ratio is kept, and a small
///    digit in a large photo is not lost.
/// 5. Resized to 28 x 28 with a triangle (bilinear) filter, which averages over the source
///    pixels when shrinking rather than skipping them.
/// 6. Shifted so that its centre of mass is at the centre, as MNIST's digits are.
///
/// An MNIST image itself comes out unchanged (up to a one-pixel shift at most, when its
/// centre of mass is exactly between two pixels). The result has [`PIXELS`](crate::PIXELS) values.
pub fn normalise(grey: GrayImage) -> Option<Vec<f32>> {
    let mut grey = shrink(grey);
    if border_mean(&grey) > 127.5 {
        imageops::invert(&mut grey);
    }
    let background = border_mean(&grey);
    let brightest = grey.pixels().map(|p| f32::from(p.0[0])).fold(0.0, f32::max);
    let contrast = brightest - background;
    if contrast < MIN_CONTRAST {
        return None;
    }
    let ink: Plane = ImageBuffer::from_fn(grey.width(), grey.height(), |x, y| {
        let v = f32::from(grey.get_pixel(x, y).0[0]);
        Luma([((v - background) / contrast).clamp(0.0, 1.0)])
    });
    drop(grey);
    // The brightest pixel is 1 > INK, so there is a box; `None` all the same rather than a
    // panic should that ever change.
    let (x0, y0, w, h) = ink_box(&ink)?;
    let side = w.max(h);
    // At most WORKING_SIDE x 28 / 20 pixels: the cast cannot overflow.
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
    // A copy where the frame is already 28 pixels.
    let small = imageops::resize(&square, COLS as u32, ROWS as u32, FilterType::Triangle);
    Some(centre_mass(&small))
}

/// The picture with its longer side shrunk to [`WORKING_SIDE`] by averaging, if it is longer;
/// no side becomes less than one pixel.
fn shrink(grey: GrayImage) -> GrayImage {
    let (w, h) = grey.dimensions();
    let longer = w.max(h);
    if longer <= WORKING_SIDE {
        return grey;
    }
    let scaled = |side: u32| {
        let side =
            (u64::from(side) * u64::from(WORKING_SIDE) + u64::from(longer) / 2) / u64::from(longer);
        // At most WORKING_SIDE, so the conversion cannot fail.
        u32::try_from(side).unwrap_or(WORKING_SIDE).max(1)
    };
    imageops::thumbnail(&grey, scaled(w), scaled(h))
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

/// Grey levels, with transparency composited over white. Takes the picture so that a colour
/// one is freed as soon as its grey copy exists.
fn greyscale(image: DynamicImage) -> GrayImage {
    if !image.color().has_alpha() {
        return image.into_luma8();
    }
    let with_alpha = image.into_luma_alpha8();
    GrayImage::from_fn(with_alpha.width(), with_alpha.height(), |x, y| {
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

    use super::*;
    use crate::Mnist;

    /// The first 100 MNIST test images.
    fn mnist() -> &'static [GrayImage] {
        static IMAGES: OnceLock<Vec<GrayImage>> = OnceLock::new();
        IMAGES.get_or_init(|| {
            // The repository's data, found from this crate's folder as the other tests do.
            let repository = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/mnist");
            let mnist = Mnist::load(&repository).unwrap();
            (0..100)
                .map(|i| GrayImage::from_raw(28, 28, mnist.test.image(i).to_vec()).unwrap())
                .collect()
        })
    }

    /// The whole pipeline after decoding; `None` for a blank picture.
    fn to_mnist(image: DynamicImage) -> Option<Vec<f32>> {
        normalise(greyscale(image))
    }

    /// The whole pipeline for a picture with a digit in it.
    fn read_digit(image: GrayImage) -> Vec<f32> {
        to_mnist(DynamicImage::ImageLuma8(image)).unwrap()
    }

    fn values(image: &GrayImage) -> Vec<f32> {
        image.pixels().map(|p| f32::from(p.0[0]) / 255.0).collect()
    }

    fn mean_error(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum::<f32>() / a.len() as f32
    }

    /// Asserts that `picture` reads as `image` to within a mean error of 0.06 ([`shifted_error`]).
    #[track_caller]
    fn assert_reads_as(picture: GrayImage, image: &GrayImage) {
        let error = shifted_error(&read_digit(picture), &values(image));
        assert!(error < 0.06, "{error}");
    }

    /// Asserts that each of the first `count` MNIST images reads as itself when scaled to `size`
    /// pixels square, inverted to dark ink and placed with its corner at `at` on a light gray
    /// `width x height` page.
    #[track_caller]
    fn assert_found_on_page(count: usize, size: u32, (width, height): (u32, u32), at: (i64, i64)) {
        for image in &mnist()[..count] {
            let mut digit = imageops::resize(image, size, size, FilterType::Triangle);
            imageops::invert(&mut digit);
            let mut page = GrayImage::from_pixel(width, height, Luma([230]));
            imageops::replace(&mut page, &digit, at.0, at.1);
            assert_reads_as(page, image);
        }
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
            let x = read_digit(image.clone());
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
            // Upscaling and shrinking again blurs by about 0.03 on its own, and the blur makes
            // the digit look a little larger (so it comes out a little smaller).
            assert_reads_as(scan, image);
        }
    }

    #[test]
    fn a_small_digit_in_a_large_picture_is_found() {
        assert_found_on_page(20, 56, (300, 200), (30, 120));
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
        let x = read_digit(wide);
        let (w, h) = extent(&x);
        assert!((19..=21).contains(&h) && (9..=11).contains(&w), "{w} x {h}");
    }

    #[test]
    fn transparency_is_paper_and_blank_images_have_no_digit() {
        // Black ink on a transparent background (as drawing programs save it) reads like the
        // same ink on white paper.
        let inside = |x: u32, y: u32| (12..16).contains(&x) && (5..23).contains(&y);
        let rgba = ::image::RgbaImage::from_fn(28, 28, |x, y| {
            ::image::Rgba([0, 0, 0, if inside(x, y) { 255 } else { 0 }])
        });
        let paper = GrayImage::from_fn(28, 28, |x, y| Luma([if inside(x, y) { 0 } else { 255 }]));
        assert_eq!(
            to_mnist(DynamicImage::ImageRgba8(rgba)).unwrap(),
            read_digit(paper)
        );
        for level in [0, 200, 255] {
            let blank = GrayImage::from_pixel(40, 30, Luma([level]));
            assert_eq!(to_mnist(DynamicImage::ImageLuma8(blank)), None);
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

    #[test]
    fn large_pictures_are_shrunk_first_and_still_read() {
        // A 400-pixel digit on a 2000 x 1500 page: 102 pixels once the page is shrunk.
        assert_found_on_page(5, 400, (2000, 1500), (900, 300));
    }

    #[test]
    fn shrinking_keeps_the_shape_and_at_least_one_pixel() {
        for ((w, h), expected) in [
            ((28, 28), (28, 28)),
            ((512, 100), (512, 100)),
            ((1024, 600), (512, 300)),
            ((1, 5000), (1, 512)),
            ((5000, 3), (512, 1)),
            ((4096, 4096), (512, 512)),
            // 5 x 512 / 1000 = 2.56: rounded, not cut.
            ((1000, 5), (512, 3)),
        ] {
            let shrunk = shrink(GrayImage::new(w, h));
            assert_eq!(shrunk.dimensions(), expected, "{w} x {h}");
        }
    }

    #[test]
    fn thin_and_tiny_pictures_do_not_panic() {
        for (w, h) in [
            (1, 1),
            (1, 2),
            (2, 1),
            (1, 28),
            (28, 1),
            (3, 2),
            (1, 4096),
            (4096, 1),
            (7, 4000),
        ] {
            for pattern in 0..3u32 {
                let image = GrayImage::from_fn(w, h, |x, y| {
                    Luma([match pattern {
                        // One bright pixel in the middle.
                        0 => u8::from(x == w / 2 && y == h / 2) * 255,
                        // Stripes.
                        1 => ((x + y) % 2 * 255) as u8,
                        // A ramp.
                        _ => ((x + y) * 255 / (w + h)) as u8,
                    }])
                });
                if let Some(x) = to_mnist(DynamicImage::ImageLuma8(image)) {
                    assert_eq!(x.len(), COLS * ROWS);
                    assert!(x.iter().all(|v| (0.0..=1.0).contains(v)), "{w} x {h}");
                }
            }
        }
    }

    /// A small real JPEG and PNG of an MNIST digit.
    fn encoded(format: ImageFormat) -> Vec<u8> {
        let mut big = imageops::resize(&mnist()[0], 112, 112, FilterType::Triangle);
        imageops::invert(&mut big);
        let mut bytes = Cursor::new(Vec::new());
        big.write_to(&mut bytes, format).unwrap();
        bytes.into_inner()
    }

    #[test]
    fn every_cut_short_jpeg_or_png_is_incomplete() {
        let jpeg = encoded(ImageFormat::Jpeg);
        assert!(jpeg_is_complete(&jpeg));
        for cut in 0..jpeg.len() {
            assert!(!jpeg_is_complete(&jpeg[..cut]), "{cut} of {}", jpeg.len());
        }
        let png = encoded(ImageFormat::Png);
        assert!(png_is_complete(&png));
        for cut in 0..png.len() {
            assert!(!png_is_complete(&png[..cut]), "{cut} of {}", png.len());
        }
        // Anything after the end is not the image's business.
        assert!(jpeg_is_complete(&[jpeg.as_slice(), b"trailer"].concat()));
        assert!(png_is_complete(&[png.as_slice(), b"trailer"].concat()));
    }

    #[test]
    fn jpeg_markers_are_found_only_where_they_can_be() {
        const SOI: &[u8] = &[0xFF, 0xD8];
        const EOI: &[u8] = &[0xFF, 0xD9];
        // A segment with a length (a quantisation table), and a scan header.
        const DQT: &[u8] = &[0xFF, 0xDB, 0x00, 0x04, 0x12, 0x34];
        const SOS: &[u8] = &[0xFF, 0xDA, 0x00, 0x03, 0x01];
        // Entropy-coded data with a stuffed FF and a restart marker.
        const DATA: &[u8] = &[0x12, 0xFF, 0x00, 0x34, 0xFF, 0xD3, 0x56];
        let complete = [SOI, DQT, SOS, DATA, EOI].concat();
        assert!(jpeg_is_complete(&complete));
        // Fill bytes before a marker.
        assert!(jpeg_is_complete(
            &[SOI, DQT, SOS, DATA, &[0xFF, 0xFF], EOI].concat()
        ));
        // Stray bytes between segments, a marker without a length (TEM) and a comment
        // segment with no data (a length of 2 counts only itself).
        const COM: &[u8] = &[0xFF, 0xFE, 0x00, 0x02];
        assert!(jpeg_is_complete(
            &[SOI, &[0x12, 0x34], &[0xFF, 0x01], DQT, COM, SOS, DATA, EOI].concat()
        ));
        // No image data before the end.
        assert!(!jpeg_is_complete(&[SOI, DQT, EOI].concat()));
        // An end-of-image inside a segment (an Exif thumbnail's) does not end the file.
        let app1 = [&[0xFF, 0xE1, 0x00, 0x06][..], SOS, EOI].concat();
        assert!(!jpeg_is_complete(&[SOI, &app1, SOS, DATA].concat()));
        // A length running past the end, or too short to count itself.
        assert!(!jpeg_is_complete(
            &[SOI, &[0xFF, 0xDB, 0x40, 0x00, 0x12], EOI].concat()
        ));
        assert!(!jpeg_is_complete(
            &[SOI, &[0xFF, 0xDB, 0x00, 0x01], SOS, DATA, EOI].concat()
        ));
    }

    /// `bytes` as the file `name` in `dir`.
    fn file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn files_are_read_by_their_content_not_their_name() {
        let dir = tempfile::tempdir().unwrap();
        for (format, name) in [
            (ImageFormat::Png, "digit.jpg"),
            (ImageFormat::Jpeg, "digit.png"),
        ] {
            let bytes = encoded(format);
            let path = file(dir.path(), name, &bytes);
            let decoded = ::image::load_from_memory_with_format(&bytes, format).unwrap();
            assert_eq!(read_image(&path).unwrap(), decoded.to_luma8(), "{format:?}");
            let digit = digit_from_file(&path).unwrap();
            assert_eq!(digit, to_mnist(decoded), "{format:?}");
            assert_eq!(digit.map(|x| x.len()), Some(COLS * ROWS));
        }
    }

    /// What `read_image` says about the file `name` holding `bytes`.
    fn refusal(name: &str, bytes: &[u8]) -> ImageError {
        let dir = tempfile::tempdir().unwrap();
        read_image(&file(dir.path(), name, bytes)).unwrap_err()
    }

    #[test]
    fn each_unreadable_file_is_refused_for_its_own_reason() {
        let dir = tempfile::tempdir().unwrap();
        let missing = read_image(&dir.path().join("missing.png")).unwrap_err();
        assert!(matches!(missing, ImageError::Open { .. }), "{missing:?}");
        let folder = read_image(dir.path()).unwrap_err();
        assert!(matches!(folder, ImageError::Read { .. }), "{folder:?}");
        let empty = refusal("empty.png", b"");
        assert!(matches!(empty, ImageError::EmptyFile { .. }), "{empty:?}");
        let text = refusal("text.png", b"a digit");
        assert!(matches!(text, ImageError::NotPngOrJpeg { .. }), "{text:?}");
        for format in [ImageFormat::Png, ImageFormat::Jpeg] {
            let bytes = encoded(format);
            let cut = refusal("cut", &bytes[..bytes.len() - 1]);
            assert!(matches!(cut, ImageError::Incomplete { .. }), "{cut:?}");
        }
        // Complete, but a flipped bit in the pixel data no longer matches its chunk's CRC.
        let mut png = encoded(ImageFormat::Png);
        let middle = png.len() / 2;
        png[middle] ^= 0x10;
        let flipped = refusal("flipped.png", &png);
        assert!(matches!(flipped, ImageError::Decode { .. }), "{flipped:?}");
        assert!(
            flipped
                .to_string()
                .contains(": truncated or damaged image: "),
            "{flipped}"
        );
    }

    #[test]
    fn a_side_of_zero_pixels_is_damage_and_an_empty_picture_has_no_digit() {
        // A JPEG's frame header: FF C0, its length, the sample precision, then the height and
        // the width, two bytes each.
        let jpeg = encoded(ImageFormat::Jpeg);
        let frame = jpeg.windows(2).position(|m| m == [0xFF, 0xC0]).unwrap();
        for side in [frame + 5, frame + 7] {
            let mut zero = jpeg.clone();
            zero[side..side + 2].fill(0);
            let error = refusal("zero.jpg", &zero);
            assert!(matches!(error, ImageError::Decode { .. }), "{error:?}");
        }
        // A PNG's header chunk: its length, "IHDR", the width and the height, four bytes each,
        // ..., and a CRC of the type and the data.
        let png = encoded(ImageFormat::Png);
        for side in [16, 20] {
            let mut zero = png.clone();
            zero[side..side + 4].fill(0);
            let mut crc = flate2::Crc::new();
            crc.update(&zero[12..29]);
            zero[29..33].copy_from_slice(&crc.sum().to_be_bytes());
            let error = refusal("zero.png", &zero);
            assert!(matches!(error, ImageError::Decode { .. }), "{error:?}");
        }
        // Were a decoder ever to let one through, it would be blank.
        for (w, h) in [(0, 0), (0, 9), (9, 0)] {
            assert_eq!(normalise(GrayImage::new(w, h)), None);
        }
    }

    #[test]
    fn a_file_of_the_largest_size_is_read_and_one_byte_more_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        for (size, too_large) in [(MAX_FILE_BYTES, false), (MAX_FILE_BYTES + 1, true)] {
            // A PNG signature and zeros (sparse), so no IEND: incomplete, once read whole.
            let path = file(dir.path(), "large.png", PNG_SIGNATURE);
            File::options()
                .write(true)
                .open(&path)
                .and_then(|f| f.set_len(size))
                .unwrap();
            let error = read_image(&path).unwrap_err();
            if too_large {
                assert!(
                    matches!(error, ImageError::FileTooLarge { .. }),
                    "{error:?}"
                );
                assert!(error.to_string().contains("at most 32 MiB"), "{error}");
            } else {
                assert!(matches!(error, ImageError::Incomplete { .. }), "{error:?}");
            }
        }
    }

    #[test]
    fn declared_sizes_are_checked_against_each_limit() {
        use png::BitDepth::{Eight, Sixteen};
        use png::ColorType::{Grayscale, Rgba};
        let grey_pixels = u64::from(MAX_SIDE) * u64::from(MAX_SIDE);
        // 8 bytes a pixel: 64 MiB hold 8 Mi of them.
        let deep_pixels = MAX_DECODED_BYTES / 8;
        for (width, height, color, depth, max_pixels) in [
            (MAX_SIDE + 1, 1, Grayscale, Eight, grey_pixels),
            (1, MAX_SIDE + 1, Grayscale, Eight, grey_pixels),
            // 2897 x 2897 x 8 bytes is just over 64 MiB; 2897 < 4096.
            (2897, 2897, Rgba, Sixteen, deep_pixels),
        ] {
            let error = refusal("huge.png", &header_only_png(width, height, color, depth));
            let ImageError::TooManyPixels {
                width: w,
                height: h,
                max_pixels: most,
                ..
            } = error
            else {
                panic!("{width} x {height}: {error:?}");
            };
            assert_eq!((w, h, most), (width, height, max_pixels));
        }
        // At the limits: 4096 pixels a side, 64 MiB decoded. Accepted, then the missing pixel
        // data is damage.
        for (width, height, color, depth) in [
            (MAX_SIDE, MAX_SIDE, Grayscale, Eight),
            (MAX_SIDE, MAX_SIDE / 2, Rgba, Sixteen),
        ] {
            let error = refusal("limit.png", &header_only_png(width, height, color, depth));
            assert!(matches!(error, ImageError::Decode { .. }), "{error:?}");
            assert!(
                error.to_string().contains("truncated or damaged"),
                "{error}"
            );
        }
    }

    #[test]
    fn the_background_is_the_mean_of_the_outer_ring() {
        for (w, h) in [(40, 40), (100, 60), (60, 100), (7, 3), (1, 1), (45, 21)] {
            let grey = GrayImage::from_fn(w, h, |x, y| Luma([((x * 37 + y * 101) % 256) as u8]));
            // The ring: less than a twentieth of the smaller side (at least one pixel) from
            // the nearest edge.
            let ring = (w.min(h) / 20).max(1);
            let (mut sum, mut count) = (0.0f64, 0.0f64);
            for (x, y, p) in grey.enumerate_pixels() {
                if x.min(y).min(w - 1 - x).min(h - 1 - y) < ring {
                    sum += f64::from(p.0[0]);
                    count += 1.0;
                }
            }
            let expected = (sum / count) as f32;
            assert_eq!(border_mean(&grey), expected, "{w} x {h}");
        }
    }

    /// A 28 x 28 picture of `background` with a 10 x 10 square of `ink` in it.
    fn square_on(background: u8, ink: u8) -> GrayImage {
        GrayImage::from_fn(28, 28, |x, y| {
            let inside = (9..19).contains(&x) && (9..19).contains(&y);
            Luma([if inside { ink } else { background }])
        })
    }

    #[test]
    fn the_thresholds_are_where_they_say() {
        // A border of exactly half grey (127 and 128 in turn) is dark: not inverted, so the
        // white inside is a digit (inverted, it would be black on the border's grey: blank).
        let half = GrayImage::from_fn(28, 28, |x, y| {
            let border = x == 0 || y == 0 || x == 27 || y == 27;
            Luma([if border {
                127 + ((x + y) % 2) as u8
            } else {
                255
            }])
        });
        assert_eq!(border_mean(&half), 127.5);
        assert!(normalise(half).is_some());
        // A contrast of MIN_CONTRAST grey levels is a digit, one level less is blank.
        assert!(normalise(square_on(100, 100 + MIN_CONTRAST as u8)).is_some());
        assert_eq!(normalise(square_on(100, 99 + MIN_CONTRAST as u8)), None);
    }

    #[test]
    fn ink_is_what_is_brighter_than_a_tenth_of_the_contrast() {
        // A 10 x 10 square of 250 in the middle of a black 100 x 100 picture, and one faint
        // pixel far from it: at 25 (a tenth of the contrast) it is not ink and does not
        // change the frame around the square; at 26 it is.
        let square = GrayImage::from_fn(100, 100, |x, y| {
            let inside = (45..55).contains(&x) && (45..55).contains(&y);
            Luma([if inside { 250 } else { 0 }])
        });
        let alone = normalise(square.clone()).unwrap();
        let with_faint = |level| {
            let mut picture = square.clone();
            picture.put_pixel(10, 10, Luma([level]));
            normalise(picture).unwrap()
        };
        assert_eq!(with_faint(25), alone);
        assert_ne!(with_faint(26), alone);
    }

    #[test]
    fn the_frame_is_centred_on_the_digit() {
        // A 25 x 25 square (in a frame of 35 pixels, resampled to 28) comes out symmetric,
        // about its centre of mass, both ways: the frame has as much background on each side.
        let picture = GrayImage::from_fn(60, 50, |x, y| {
            let inside = (12..37).contains(&x) && (20..45).contains(&y);
            Luma([if inside { 255 } else { 0 }])
        });
        let x = normalise(picture).unwrap();
        let at = |c: usize, r: usize| x[r * COLS + c];
        let columns: Vec<f32> = (0..COLS)
            .map(|c| (0..ROWS).map(|r| at(c, r)).sum())
            .collect();
        let rows: Vec<f32> = (0..ROWS)
            .map(|r| (0..COLS).map(|c| at(c, r)).sum())
            .collect();
        for profile in [columns, rows] {
            // The square is centred at 13.5, and moved a whole pixel to MNIST's centre.
            let centre = profile
                .iter()
                .enumerate()
                .map(|(i, v)| i as f32 * v)
                .sum::<f32>()
                / profile.iter().sum::<f32>();
            assert!((centre - MNIST_CENTRE - 0.5).abs() < 1e-3, "{centre}");
            // So each value is mirrored about 14.5.
            for i in 2..COLS {
                let mirror = profile[COLS + 1 - i];
                assert!((profile[i] - mirror).abs() < 1e-4, "{i}: {profile:?}");
            }
        }
    }

    #[test]
    fn partial_transparency_is_blended_with_white() {
        let levels = [
            (0u8, 128u8),
            (0, 1),
            (200, 77),
            (90, 254),
            (255, 0),
            (10, 255),
        ];
        let pixels: Vec<u8> = levels.iter().flat_map(|&(l, a)| [l, a]).collect();
        let image = ::image::GrayAlphaImage::from_raw(levels.len() as u32, 1, pixels).unwrap();
        let grey = greyscale(DynamicImage::ImageLumaA8(image));
        for (i, &(l, a)) in levels.iter().enumerate() {
            // l a / 255 + 255 (255 - a) / 255, to the nearest level, in integers.
            let (l, a) = (u32::from(l), u32::from(a));
            let expected = (2 * (l * a + 255 * (255 - a)) + 255) / 510;
            assert_eq!(
                u32::from(grey.get_pixel(i as u32, 0).0[0]),
                expected,
                "{l}, {a}"
            );
        }
    }

    /// A PNG declaring `width` x `height` pixels of `color` and `depth`, with almost no image
    /// data: enough for everything that is decided from the header, never decoded.
    fn header_only_png(
        width: u32,
        height: u32,
        color: png::ColorType,
        depth: png::BitDepth,
    ) -> Vec<u8> {
        let mut bytes = Vec::new();
        let mut encoder = png::Encoder::new(&mut bytes, width, height);
        encoder.set_color(color);
        encoder.set_depth(depth);
        let mut writer = encoder.write_header().unwrap();
        writer.write_chunk(png::chunk::IDAT, &[0x78, 0x01]).unwrap();
        writer.finish().unwrap();
        bytes
    }

    #[test]
    fn a_huge_png_chunk_length_is_incomplete_not_a_panic() {
        let png = [PNG_SIGNATURE, &[0xFF; 4], b"IHDR", &[0; 16]].concat();
        assert!(!png_is_complete(&png));
    }
}
