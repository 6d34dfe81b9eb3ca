//! Reads the MNIST handwritten-digit data set from its IDX files.
//!
//! * [`Mnist::load`] reads the four MNIST files from one folder and splits them the way the
//!   TensorFlow multi-GPU MNIST example does: the first 55,000 training examples are
//!   [`Mnist::train`], the last 5,000 [`Mnist::validation`], and the 10,000 `t10k` examples
//!   [`Mnist::test`].
//!   [`Mnist::load_with_validation`] picks another validation size.
//! * [`read_idx`] reads any IDX file of unsigned bytes and returns its dimensions and data.
//!
//! Each file may be gzip-compressed or not: compression is recognised by the gzip magic bytes,
//! not by the file name. For each file [`Mnist::load`] looks for `NAME.gz` first, then plain
//! `NAME`. Every malformed file is answered with an [`MnistError`] that names the file and the
//! fault; nothing in a file's content can make this crate panic, and none is read, or
//! decompressed, past [`MAX_IDX_BYTES`].
//!
//! With the `tensor` feature, `Split::into_examples` turns a split into the model's input, a
//! `tandem_tensor::ExampleSet`.
//!
//! With the `image` feature, the `image` module turns a PNG or JPEG of a handwritten digit
//! into an MNIST-like input (`image::digit_from_file`), reading the file as hostile input.
//!
//! ```
//! use std::path::Path;
//! use tandem_mnist::{Mnist, PIXELS};
//!
//! let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/mnist"));
//! let mnist = Mnist::load(dir)?;
//! assert_eq!(mnist.train.len(), 55_000);
//! assert_eq!(mnist.validation.len(), 5_000);
//! assert_eq!(mnist.test.len(), 10_000);
//!
//! // One image is 28 x 28 grey levels (0 = background), stored row by row.
//! let first = mnist.train.image(0);
//! assert_eq!(first.len(), PIXELS);
//! assert_eq!(mnist.train.labels[0], 5);
//! # Ok::<(), tandem_mnist::MnistError>(())
//! ```
#![warn(missing_docs)]

#[cfg(feature = "image")]
pub mod image;

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use flate2::read::MultiGzDecoder;

/// Rows in one MNIST image.
pub const ROWS: usize = 28;
/// Columns in one MNIST image.
pub const COLS: usize = 28;
/// Pixels (bytes) in one MNIST image: [`ROWS`] x [`COLS`].
pub const PIXELS: usize = ROWS * COLS;
/// Size of the validation set that [`Mnist::load`] takes from the end of the training file.
pub const DEFAULT_VALIDATION: usize = 5_000;

/// The training images file, without the `.gz` suffix.
const TRAIN_IMAGES: &str = "train-images-idx3-ubyte";
/// The training labels file, without the `.gz` suffix.
const TRAIN_LABELS: &str = "train-labels-idx1-ubyte";
/// The test images file, without the `.gz` suffix.
const TEST_IMAGES: &str = "t10k-images-idx3-ubyte";
/// The test labels file, without the `.gz` suffix.
const TEST_LABELS: &str = "t10k-labels-idx1-ubyte";

/// The files the data folder must hold, as said in error messages.
const EXPECTED_FILES: &str = "train-images-idx3-ubyte, train-labels-idx1-ubyte, \
     t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte, each gzipped (NAME.gz, looked for first) \
     or uncompressed (NAME); `--data-dir` selects the folder";

/// The IDX type code of unsigned bytes, the only element type this crate reads.
const TYPE_U8: u8 = 0x08;
/// The two leading bytes of every gzip stream.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// The most bytes an IDX file may hold, decompressed: 1 GiB, far above MNIST's largest file
/// (47 MB) and EMNIST's (640 MB), so that a file that inflates without end (a gzip bomb), or
/// a huge one, is refused before it fills memory.
pub const MAX_IDX_BYTES: u64 = 1 << 30;

/// Everything that can go wrong reading MNIST. Every variant names the file at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MnistError {
    /// The data folder does not exist.
    #[error("{}: data folder not found; it must contain {EXPECTED_FILES}", path.display())]
    MissingDir {
        /// The folder that was looked for.
        path: PathBuf,
    },
    /// A file does not exist.
    #[error("{}: file not found; the MNIST data folder must contain {EXPECTED_FILES}", path.display())]
    Missing {
        /// The file that was looked for (for [`Mnist::load`], without the `.gz` suffix).
        path: PathBuf,
    },
    /// The file exists but could not be read.
    #[error("{}: cannot read: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The file starts like gzip but its gzip stream is corrupt or cut short.
    #[error("{}: bad gzip data: {source}", path.display())]
    Gzip {
        /// The file.
        path: PathBuf,
        /// The decompressor's error.
        source: io::Error,
    },
    /// The file (after decompression) holds no bytes at all.
    #[error("{}: file is empty", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// The file ends inside its IDX header.
    #[error("{}: IDX header cut short: {len} bytes, the header needs {needed}", path.display())]
    TruncatedHeader {
        /// The file.
        path: PathBuf,
        /// The file's (decompressed) length.
        len: usize,
        /// The header length the file needs (4 bytes of magic, 4 per dimension).
        needed: usize,
    },
    /// The magic number is not an IDX one: its first two bytes must be zero and it must
    /// declare at least one dimension.
    #[error("{}: not an IDX file: magic number {magic:#010x}", path.display())]
    BadMagic {
        /// The file.
        path: PathBuf,
        /// The first four bytes, big-endian.
        magic: u32,
    },
    /// The IDX element type is not unsigned bytes (type code 0x08).
    #[error("{}: IDX element type {type_code:#04x} is not unsigned bytes (0x08)", path.display())]
    UnsupportedType {
        /// The file.
        path: PathBuf,
        /// The type code found (the magic number's third byte).
        type_code: u8,
    },
    /// The file has the wrong number of dimensions for what it should hold.
    #[error(
        "{}: {found} dimensions, expected {expected} (magic {:#010x} for {what})",
        path.display(),
        0x0800 | expected,
    )]
    WrongRank {
        /// The file.
        path: PathBuf,
        /// What the file should hold: "images" or "labels".
        what: &'static str,
        /// The number of dimensions expected.
        expected: usize,
        /// The number of dimensions found.
        found: usize,
    },
    /// An image file whose images are not 28 x 28.
    #[error("{}: images are {rows}x{cols}, expected {ROWS}x{COLS}", path.display())]
    WrongImageSize {
        /// The file.
        path: PathBuf,
        /// Rows per image found.
        rows: usize,
        /// Columns per image found.
        cols: usize,
    },
    /// The file holds, or decompresses to, more than [`MAX_IDX_BYTES`].
    #[error(
        "{}: more than {limit} bytes{}, more than an IDX file may hold here",
        path.display(),
        if *.compressed { " once decompressed" } else { "" }
    )]
    TooLong {
        /// The file.
        path: PathBuf,
        /// The most bytes it may hold.
        limit: u64,
        /// Whether it is the gzip data's decompressed bytes that are too many.
        compressed: bool,
    },
    /// The dimensions describe more bytes than can be addressed.
    #[error("{}: dimensions {dims:?} describe more bytes than fit in memory", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The dimensions found.
        dims: Vec<usize>,
    },
    /// The data after the header is shorter than the dimensions say.
    #[error(
        "{}: data truncated: dimensions {dims:?} need {expected} bytes after the header, found {found}",
        path.display()
    )]
    Truncated {
        /// The file.
        path: PathBuf,
        /// The dimensions found.
        dims: Vec<usize>,
        /// Data bytes the dimensions need.
        expected: usize,
        /// Data bytes present.
        found: usize,
    },
    /// The data after the header is longer than the dimensions say.
    #[error(
        "{}: {} trailing bytes: dimensions {dims:?} need {expected} bytes after the header, found {found}",
        path.display(),
        found.saturating_sub(*expected)
    )]
    TrailingBytes {
        /// The file.
        path: PathBuf,
        /// The dimensions found.
        dims: Vec<usize>,
        /// Data bytes the dimensions need.
        expected: usize,
        /// Data bytes present.
        found: usize,
    },
    /// A label that is not a digit.
    #[error("{}: label {label} at index {index} is outside 0..=9", path.display())]
    LabelOutOfRange {
        /// The labels file.
        path: PathBuf,
        /// The label's position in the file.
        index: usize,
        /// The label's value.
        label: u8,
    },
    /// An images file and its labels file hold different numbers of examples.
    #[error(
        "{} holds {images} images but {} holds {labels} labels",
        images_path.display(),
        labels_path.display()
    )]
    CountMismatch {
        /// The images file.
        images_path: PathBuf,
        /// The labels file.
        labels_path: PathBuf,
        /// Images in the images file.
        images: usize,
        /// Labels in the labels file.
        labels: usize,
    },
    /// The requested validation set would leave no training examples.
    #[error(
        "{}: a validation set of {validation} examples leaves no training examples: \
         the file holds {available}, the validation set must be smaller",
        path.display()
    )]
    ValidationTooLarge {
        /// The training labels file.
        path: PathBuf,
        /// The validation size requested.
        validation: usize,
        /// Examples in the training file.
        available: usize,
    },
}

/// The content of an IDX file of unsigned bytes, as returned by [`read_idx`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idx {
    /// The dimensions, outermost first (for MNIST images: count, rows, columns).
    pub dims: Vec<usize>,
    /// The elements in row-major order; its length is the product of `dims`.
    pub data: Vec<u8>,
}

/// Reads an IDX file of unsigned bytes (type code 0x08), gzip-compressed or not.
///
/// Compression is recognised by the gzip magic bytes `1f 8b`, not by the file name. The file
/// must hold exactly as many data bytes as its dimensions say: a truncated file and one with
/// trailing bytes are both errors.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("tiny-idx1-ubyte");
/// // Magic 0x00000801 (unsigned bytes, one dimension), dimension 3, then the data.
/// std::fs::write(&path, [0, 0, 8, 1, 0, 0, 0, 3, 7, 2, 1])?;
///
/// let idx = tandem_mnist::read_idx(&path)?;
/// assert_eq!(idx.dims, [3]);
/// assert_eq!(idx.data, [7, 2, 1]);
/// # Ok(())
/// # }
/// ```
pub fn read_idx(path: &Path) -> Result<Idx, MnistError> {
    let bytes = read_maybe_gzip(path, MAX_IDX_BYTES)?;
    parse_idx(path, bytes)
}

/// Reads the whole file, decompressing it if it starts with the gzip magic bytes; more than
/// `limit` bytes, read or decompressed, is an error (read no further).
fn read_maybe_gzip(path: &Path, limit: u64) -> Result<Vec<u8>, MnistError> {
    let io_error = |source: io::Error| match source.kind() {
        io::ErrorKind::NotFound => MnistError::Missing {
            path: path.to_path_buf(),
        },
        _ => MnistError::Io {
            path: path.to_path_buf(),
            source,
        },
    };
    let too_long = |compressed| MnistError::TooLong {
        path: path.to_path_buf(),
        limit,
        compressed,
    };
    let mut raw = Vec::new();
    let file = fs::File::open(path).map_err(io_error)?;
    file.take(limit.saturating_add(1))
        .read_to_end(&mut raw)
        .map_err(io_error)?;
    if raw.len() as u64 > limit {
        return Err(too_long(false));
    }
    if !raw.starts_with(&GZIP_MAGIC) {
        return Ok(raw);
    }
    // The gzip trailer's last four bytes hold the uncompressed size modulo 2^32: a good
    // capacity hint for a file under 4 GiB, capped so that a lying trailer costs little.
    let hint = match raw.len().checked_sub(4).and_then(|at| raw.get(at..)) {
        Some(&[a, b, c, d]) => u32::from_le_bytes([a, b, c, d]) as usize,
        _ => 0,
    };
    let mut out = Vec::with_capacity(hint.min(raw.len().saturating_mul(64)).min(1 << 28));
    // MultiGzDecoder also checks whatever follows the first gzip member, so trailing garbage
    // after the stream is an error instead of being ignored.
    MultiGzDecoder::new(raw.as_slice())
        .take(limit.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|source| MnistError::Gzip {
            path: path.to_path_buf(),
            source,
        })?;
    if out.len() as u64 > limit {
        return Err(too_long(true));
    }
    Ok(out)
}

/// Parses and checks the IDX header and data length.
fn parse_idx(path: &Path, mut bytes: Vec<u8>) -> Result<Idx, MnistError> {
    let path_buf = || path.to_path_buf();
    if bytes.is_empty() {
        return Err(MnistError::Empty { path: path_buf() });
    }
    let Some(&[m0, m1, type_code, rank]) = bytes.get(..4) else {
        return Err(MnistError::TruncatedHeader {
            path: path_buf(),
            len: bytes.len(),
            needed: 4,
        });
    };
    let magic = u32::from_be_bytes([m0, m1, type_code, rank]);
    if m0 != 0 || m1 != 0 || rank == 0 {
        return Err(MnistError::BadMagic {
            path: path_buf(),
            magic,
        });
    }
    if type_code != TYPE_U8 {
        return Err(MnistError::UnsupportedType {
            path: path_buf(),
            type_code,
        });
    }
    let header_len = 4 + 4 * usize::from(rank);
    let Some(header) = bytes.get(4..header_len) else {
        return Err(MnistError::TruncatedHeader {
            path: path_buf(),
            len: bytes.len(),
            needed: header_len,
        });
    };
    let dims: Vec<usize> = header
        .chunks_exact(4)
        .map(|d| u32::from_be_bytes([d[0], d[1], d[2], d[3]]) as usize)
        .collect();
    let Some(expected) = dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) else {
        return Err(MnistError::TooLarge {
            path: path_buf(),
            dims,
        });
    };
    let found = bytes.len() - header_len;
    if found < expected {
        return Err(MnistError::Truncated {
            path: path_buf(),
            dims,
            expected,
            found,
        });
    }
    if found > expected {
        return Err(MnistError::TrailingBytes {
            path: path_buf(),
            dims,
            expected,
            found,
        });
    }
    bytes.drain(..header_len);
    Ok(Idx { dims, data: bytes })
}

/// Reads an MNIST images file: three dimensions, 28 x 28 images. Returns the image count and
/// the pixels.
fn read_images(path: &Path) -> Result<(usize, Vec<u8>), MnistError> {
    let idx = read_idx(path)?;
    match idx.dims[..] {
        [count, rows, cols] if rows == ROWS && cols == COLS => Ok((count, idx.data)),
        [_, rows, cols] => Err(MnistError::WrongImageSize {
            path: path.to_path_buf(),
            rows,
            cols,
        }),
        _ => Err(MnistError::WrongRank {
            path: path.to_path_buf(),
            what: "images",
            expected: 3,
            found: idx.dims.len(),
        }),
    }
}

/// Reads an MNIST labels file: one dimension, every label a digit.
fn read_labels(path: &Path) -> Result<Vec<u8>, MnistError> {
    let idx = read_idx(path)?;
    if idx.dims.len() != 1 {
        return Err(MnistError::WrongRank {
            path: path.to_path_buf(),
            what: "labels",
            expected: 1,
            found: idx.dims.len(),
        });
    }
    if let Some((index, &label)) = idx.data.iter().enumerate().find(|&(_, &l)| l > 9) {
        return Err(MnistError::LabelOutOfRange {
            path: path.to_path_buf(),
            index,
            label,
        });
    }
    Ok(idx.data)
}

/// Finds `NAME.gz`, else `NAME`, in `dir`.
fn locate(dir: &Path, name: &str) -> Result<PathBuf, MnistError> {
    let gz = dir.join(format!("{name}.gz"));
    if gz.exists() {
        return Ok(gz);
    }
    let plain = dir.join(name);
    if plain.exists() {
        return Ok(plain);
    }
    Err(MnistError::Missing { path: plain })
}

/// Reads one images file and its labels file and checks that they match.
fn read_split(dir: &Path, images: &str, labels: &str) -> Result<Split, MnistError> {
    let images_path = locate(dir, images)?;
    let labels_path = locate(dir, labels)?;
    let (count, pixels) = read_images(&images_path)?;
    let labels = read_labels(&labels_path)?;
    if count != labels.len() {
        return Err(MnistError::CountMismatch {
            images_path,
            labels_path,
            images: count,
            labels: labels.len(),
        });
    }
    Ok(Split {
        images: pixels,
        labels,
    })
}

/// A set of examples: images and their labels, in file order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    /// The images, [`PIXELS`] bytes each, one after another; each image is stored row by row,
    /// one grey level per pixel (0 is background, 255 full ink).
    pub images: Vec<u8>,
    /// The labels, one digit (0 to 9) per image.
    pub labels: Vec<u8>,
}

impl Split {
    /// The number of examples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no examples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The `i`th image's [`PIXELS`] bytes.
    ///
    /// # Panics
    ///
    /// If `i >= self.len()`.
    pub fn image(&self, i: usize) -> &[u8] {
        &self.images[i * PIXELS..(i + 1) * PIXELS]
    }

    /// The split as the model's input: one example of [`PIXELS`] features per image, with its
    /// label. `None` when the images are not [`PIXELS`] bytes per label (a split built by hand;
    /// a loaded one always is).
    #[cfg(feature = "tensor")]
    pub fn into_examples(self) -> Option<tandem_tensor::ExampleSet> {
        tandem_tensor::ExampleSet::new(PIXELS, self.images, self.labels)
    }

    /// Splits off the last `n` examples (requires `n <= self.len()`).
    fn split_off_last(&mut self, n: usize) -> Split {
        let keep = self.len() - n;
        Split {
            images: self.images.split_off(keep * PIXELS),
            labels: self.labels.split_off(keep),
        }
    }
}

/// The MNIST data set, split into training, validation and test sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mnist {
    /// The training set: the training file's examples except the last validation-size ones
    /// (55,000 with [`Mnist::load`]).
    pub train: Split,
    /// The validation set: the training file's last examples (5,000 with [`Mnist::load`]).
    pub validation: Split,
    /// The test set: the 10,000 examples of the `t10k` files.
    pub test: Split,
}

impl Mnist {
    /// Loads MNIST from the folder `dir` with the split of the TensorFlow multi-GPU MNIST
    /// example: 55,000 training, 5,000 validation ([`DEFAULT_VALIDATION`]) and 10,000 test
    /// examples.
    ///
    /// The folder must hold `train-images-idx3-ubyte`, `train-labels-idx1-ubyte`,
    /// `t10k-images-idx3-ubyte` and `t10k-labels-idx1-ubyte`; for each, `NAME.gz` is looked
    /// for first, then plain `NAME`.
    pub fn load(dir: &Path) -> Result<Mnist, MnistError> {
        Mnist::load_with_validation(dir, DEFAULT_VALIDATION)
    }

    /// Loads MNIST from the folder `dir` like [`Mnist::load`], but takes the last
    /// `validation` examples of the training file as the validation set.
    ///
    /// `validation` must be smaller than the training file's example count
    /// ([`MnistError::ValidationTooLarge`] otherwise); 0 gives an empty validation set.
    pub fn load_with_validation(dir: &Path, validation: usize) -> Result<Mnist, MnistError> {
        if !dir.is_dir() {
            return Err(MnistError::MissingDir {
                path: dir.to_path_buf(),
            });
        }
        // Decompressing the training images takes most of the time: read the test files on
        // another thread meanwhile.
        let (train, test) = std::thread::scope(|scope| {
            let test = scope.spawn(|| read_split(dir, TEST_IMAGES, TEST_LABELS));
            let train = read_split(dir, TRAIN_IMAGES, TRAIN_LABELS);
            let test = test
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (train, test)
        });
        let (mut train, test) = (train?, test?);
        if validation >= train.len() {
            return Err(MnistError::ValidationTooLarge {
                path: locate(dir, TRAIN_LABELS)?,
                validation,
                available: train.len(),
            });
        }
        let validation = train.split_off_last(validation);
        Ok(Mnist {
            train,
            validation,
            test,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use flate2::{write::GzEncoder, Compression};

    use super::*;

    /// A file over the limit is refused, read or inflated no further than one byte past it;
    /// one at the limit is read (the real limit, 1 GiB, would take as long to test).
    #[test]
    fn files_over_the_limit_are_refused_plain_or_gzip() {
        let tmp = tempfile::tempdir().unwrap();
        let plain = tmp.path().join("plain");
        let gzip = tmp.path().join("gzip");
        let zipped = |len: usize| {
            let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
            encoder.write_all(&vec![0; len]).unwrap();
            encoder.finish().unwrap()
        };
        for (len, over) in [(1000, false), (1001, true)] {
            fs::write(&plain, vec![0; len]).unwrap();
            fs::write(&gzip, zipped(len)).unwrap();
            for (path, compressed) in [(&plain, false), (&gzip, true)] {
                match (read_maybe_gzip(path, 1000), over) {
                    (Ok(bytes), false) => assert_eq!(bytes.len(), len),
                    (
                        Err(MnistError::TooLong {
                            limit: 1000,
                            compressed: c,
                            ..
                        }),
                        true,
                    ) => {
                        assert_eq!(c, compressed, "{}", path.display());
                    }
                    (other, _) => panic!("{}, {len} bytes: {other:?}", path.display()),
                }
            }
        }
        // A small file that inflates far past the limit (8 MiB of zeros in some 40 KB).
        let bomb = zipped(8 << 20);
        assert!(bomb.len() < 100_000, "{}", bomb.len());
        fs::write(&gzip, bomb).unwrap();
        let err = read_maybe_gzip(&gzip, 100_000).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{}: more than 100000 bytes once decompressed, more than an IDX file may hold \
                 here",
                gzip.display()
            )
        );
    }
}
