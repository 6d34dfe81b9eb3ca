//! IDX reading and MNIST loading on small files written to a temporary folder: round trips,
//! and one test per kind of malformed file.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use flate2::write::GzEncoder;
use flate2::Compression;
use tandem_mnist::{read_idx, Idx, Mnist, MnistError, PIXELS};
use tempfile::TempDir;

/// An IDX file's bytes: magic (0, 0, type code, rank), big-endian dims, then `data`.
fn idx_bytes(type_code: u8, dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut out = vec![0, 0, type_code, dims.len() as u8];
    for d in dims {
        out.extend_from_slice(&d.to_be_bytes());
    }
    out.extend_from_slice(data);
    out
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::default());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

/// `n` images of 28x28 whose pixels are a function of the example and pixel index.
fn images(n: u32, seed: u8) -> Vec<u8> {
    idx_bytes(0x08, &[n, 28, 28], &pixels(n as usize, seed))
}

fn pixels(n: usize, seed: u8) -> Vec<u8> {
    (0..n * PIXELS)
        .map(|i| ((i / PIXELS) as u8).wrapping_mul(31) ^ (i as u8) ^ seed)
        .collect()
}

fn label_values(n: usize, offset: usize) -> Vec<u8> {
    (0..n).map(|i| ((i + offset) % 10) as u8).collect()
}

fn labels(n: usize, offset: usize) -> Vec<u8> {
    idx_bytes(0x08, &[n as u32], &label_values(n, offset))
}

/// A folder holding a valid tiny MNIST (12 training, 4 test examples), all gzipped.
fn tiny_mnist() -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    fs::write(p.join("train-images-idx3-ubyte.gz"), gzip(&images(12, 1))).unwrap();
    fs::write(p.join("train-labels-idx1-ubyte.gz"), gzip(&labels(12, 0))).unwrap();
    fs::write(p.join("t10k-images-idx3-ubyte.gz"), gzip(&images(4, 2))).unwrap();
    fs::write(p.join("t10k-labels-idx1-ubyte.gz"), gzip(&labels(4, 3))).unwrap();
    dir
}

/// Writes `bytes` as `name` in a new temporary folder and reads it with [`read_idx`].
fn read_written(name: &str, bytes: &[u8]) -> (TempDir, PathBuf, Result<Idx, MnistError>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    fs::write(&path, bytes).unwrap();
    let result = read_idx(&path);
    (dir, path, result)
}

/// Checks that the error's message names `path` and contains every one of `needles`.
fn assert_message(err: &MnistError, path: &Path, needles: &[&str]) {
    let msg = err.to_string();
    let shown = path.display().to_string();
    assert!(
        msg.contains(&shown),
        "message {msg:?} does not name {shown}"
    );
    for needle in needles {
        assert!(msg.contains(needle), "message {msg:?} lacks {needle:?}");
    }
}

#[test]
fn round_trip_raw_and_gzip() {
    let data: Vec<u8> = (0..2 * 3 * 4).map(|i| i as u8 * 7).collect();
    let bytes = idx_bytes(0x08, &[2, 3, 4], &data);
    for (name, content) in [("raw", bytes.clone()), ("gz", gzip(&bytes))] {
        let (_dir, _path, result) = read_written(name, &content);
        let idx = result.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(idx.dims, [2, 3, 4], "{name}");
        assert_eq!(idx.data, data, "{name}");
    }
}

#[test]
fn compression_is_detected_by_content_not_name() {
    let bytes = idx_bytes(0x08, &[3], &[4, 5, 6]);
    let (_d1, _p1, gz_named_plain) = read_written("labels-idx1-ubyte", &gzip(&bytes));
    let (_d2, _p2, plain_named_gz) = read_written("labels-idx1-ubyte.gz", &bytes);
    assert_eq!(gz_named_plain.unwrap().data, [4, 5, 6]);
    assert_eq!(plain_named_gz.unwrap().data, [4, 5, 6]);
}

#[test]
fn bad_magic() {
    // Either of the two bytes that must be zero, or both.
    for (first, second) in [(0x12, 0x34), (0x12, 0), (0, 0x34)] {
        let mut bytes = labels(5, 0);
        bytes[0] = first;
        bytes[1] = second;
        let (_dir, path, result) = read_written("bad-magic", &bytes);
        let err = result.unwrap_err();
        let magic = u32::from_be_bytes([first, second, 0x08, 0x01]);
        assert!(
            matches!(err, MnistError::BadMagic { magic: m, .. } if m == magic),
            "{err:?}"
        );
        assert_message(&err, &path, &["not an IDX file", &format!("{magic:#010x}")]);
    }
}

#[test]
fn zero_dimensions_is_bad_magic() {
    let (_dir, path, result) = read_written("rank0", &[0, 0, 8, 0, 1]);
    let err = result.unwrap_err();
    assert!(
        matches!(err, MnistError::BadMagic { magic: 0x0800, .. }),
        "{err:?}"
    );
    assert_message(&err, &path, &["not an IDX file"]);
}

#[test]
fn wrong_type_code() {
    // 0x0D is the IDX code for f32.
    let bytes = idx_bytes(0x0D, &[2], &[0; 8]);
    let (_dir, path, result) = read_written("floats", &bytes);
    let err = result.unwrap_err();
    assert!(
        matches!(
            err,
            MnistError::UnsupportedType {
                type_code: 0x0D,
                ..
            }
        ),
        "{err:?}"
    );
    assert_message(&err, &path, &["0x0d", "unsigned bytes"]);
}

#[test]
fn wrong_dims_count() {
    // A labels file with an images magic (0x00000803), and an images file with two dimensions.
    let dir = tiny_mnist();
    let path = dir.path().join("train-labels-idx1-ubyte.gz");
    fs::write(&path, gzip(&images(12, 0))).unwrap();
    let err = Mnist::load_with_validation(dir.path(), 2).unwrap_err();
    assert!(
        matches!(
            err,
            MnistError::WrongRank {
                expected: 1,
                found: 3,
                ..
            }
        ),
        "{err:?}"
    );
    assert_message(&err, &path, &["3 dimensions, expected 1"]);

    let dir = tiny_mnist();
    let path = dir.path().join("t10k-images-idx3-ubyte.gz");
    fs::write(
        &path,
        gzip(&idx_bytes(0x08, &[4, PIXELS as u32], &pixels(4, 0))),
    )
    .unwrap();
    let err = Mnist::load_with_validation(dir.path(), 2).unwrap_err();
    assert!(
        matches!(
            err,
            MnistError::WrongRank {
                expected: 3,
                found: 2,
                ..
            }
        ),
        "{err:?}"
    );
    assert_message(&err, &path, &["2 dimensions, expected 3"]);
}

#[test]
fn wrong_image_size() {
    for (rows, cols) in [(27u32, 28u32), (28, 27), (28, 29)] {
        let dir = tiny_mnist();
        let path = dir.path().join("train-images-idx3-ubyte.gz");
        let data = vec![0u8; 12 * (rows * cols) as usize];
        fs::write(&path, gzip(&idx_bytes(0x08, &[12, rows, cols], &data))).unwrap();
        let err = Mnist::load_with_validation(dir.path(), 2).unwrap_err();
        assert!(
            matches!(err, MnistError::WrongImageSize { rows: r, cols: c, .. }
                if (r, c) == (rows as usize, cols as usize)),
            "{err:?}"
        );
        assert_message(&err, &path, &[&format!("{rows}x{cols}"), "expected 28x28"]);
    }
}

#[test]
fn truncated_data() {
    let mut bytes = images(3, 0);
    bytes.truncate(bytes.len() - 10);
    for (name, content) in [("raw", bytes.clone()), ("gz", gzip(&bytes))] {
        let (_dir, path, result) = read_written(name, &content);
        let err = result.unwrap_err();
        let expected = 3 * PIXELS;
        assert!(
            matches!(err, MnistError::Truncated { expected: e, found: f, .. }
                if e == expected && f == expected - 10),
            "{name}: {err:?}"
        );
        assert_message(&err, &path, &["truncated", "2352", "2342"]);
    }
}

#[test]
fn truncated_header() {
    // Rank 3 needs a 16-byte header; give it 9 bytes.
    let (_dir, path, result) = read_written("short", &[0, 0, 8, 3, 0, 0, 0, 1, 0]);
    let err = result.unwrap_err();
    assert!(
        matches!(
            err,
            MnistError::TruncatedHeader {
                len: 9,
                needed: 16,
                ..
            }
        ),
        "{err:?}"
    );
    assert_message(&err, &path, &["header"]);

    let (_dir, path, result) = read_written("tiny", &[0, 0]);
    let err = result.unwrap_err();
    assert!(
        matches!(err, MnistError::TruncatedHeader { len: 2, .. }),
        "{err:?}"
    );
    assert_message(&err, &path, &["header"]);
}

#[test]
fn trailing_bytes() {
    let mut bytes = labels(6, 0);
    bytes.extend_from_slice(&[1, 2, 3]);
    for (name, content) in [("raw", bytes.clone()), ("gz", gzip(&bytes))] {
        let (_dir, path, result) = read_written(name, &content);
        let err = result.unwrap_err();
        assert!(
            matches!(
                err,
                MnistError::TrailingBytes {
                    expected: 6,
                    found: 9,
                    ..
                }
            ),
            "{name}: {err:?}"
        );
        assert_message(&err, &path, &["3 trailing bytes"]);
    }
}

#[test]
fn garbage_after_gzip_stream() {
    let mut content = gzip(&labels(6, 0));
    content.extend_from_slice(b"garbage");
    let (_dir, path, result) = read_written("gz-trailing", &content);
    let err = result.unwrap_err();
    assert!(matches!(err, MnistError::Gzip { .. }), "{err:?}");
    assert_message(&err, &path, &["gzip"]);
}

#[test]
fn label_out_of_range() {
    let dir = tiny_mnist();
    let path = dir.path().join("train-labels-idx1-ubyte.gz");
    let mut values = label_values(12, 0);
    values[7] = 12;
    fs::write(&path, gzip(&idx_bytes(0x08, &[12], &values))).unwrap();
    let err = Mnist::load_with_validation(dir.path(), 2).unwrap_err();
    assert!(
        matches!(
            err,
            MnistError::LabelOutOfRange {
                index: 7,
                label: 12,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!("{}: label 12 at index 7 is outside 0..=9", path.display())
    );
}

#[test]
fn image_label_count_mismatch() {
    let dir = tiny_mnist();
    let labels_path = dir.path().join("t10k-labels-idx1-ubyte.gz");
    fs::write(&labels_path, gzip(&labels(5, 0))).unwrap();
    let err = Mnist::load_with_validation(dir.path(), 2).unwrap_err();
    assert!(
        matches!(
            err,
            MnistError::CountMismatch {
                images: 4,
                labels: 5,
                ..
            }
        ),
        "{err:?}"
    );
    let images_path = dir.path().join("t10k-images-idx3-ubyte.gz");
    assert_message(&err, &labels_path, &["4 images", "5 labels"]);
    assert_message(&err, &images_path, &[]);
}

#[test]
fn corrupt_gzip() {
    let bytes = images(4, 9);
    let good = gzip(&bytes);

    // Damage the deflate stream in the middle.
    let mut damaged = good.clone();
    let mid = damaged.len() / 2;
    for b in &mut damaged[mid..mid + 8] {
        *b ^= 0x5a;
    }
    // Cut the stream short.
    let cut = good[..good.len() / 2].to_vec();
    // Corrupt the CRC in the trailer.
    let mut bad_crc = good.clone();
    let at = bad_crc.len() - 8;
    bad_crc[at] ^= 0xff;
    // Only the gzip magic.
    let magic_only = vec![0x1f, 0x8b];

    for (name, content) in [
        ("damaged", damaged),
        ("cut", cut),
        ("bad-crc", bad_crc),
        ("magic-only", magic_only),
    ] {
        let (_dir, path, result) = read_written(name, &content);
        let err = result.unwrap_err();
        assert!(matches!(err, MnistError::Gzip { .. }), "{name}: {err:?}");
        assert_message(&err, &path, &["bad gzip data"]);
    }
}

#[test]
fn empty_file() {
    let (_dir, path, result) = read_written("empty", &[]);
    let err = result.unwrap_err();
    assert!(matches!(err, MnistError::Empty { .. }), "{err:?}");
    assert_message(&err, &path, &["empty"]);

    // An empty file inside a valid gzip stream is empty too.
    let (_dir, path, result) = read_written("empty.gz", &gzip(&[]));
    let err = result.unwrap_err();
    assert!(matches!(err, MnistError::Empty { .. }), "{err:?}");
    assert_message(&err, &path, &["empty"]);
}

#[test]
fn missing_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nothing-here");
    let err = read_idx(&path).unwrap_err();
    assert!(matches!(err, MnistError::Missing { .. }), "{err:?}");
    assert_message(&err, &path, &["not found", "--data-dir"]);

    // In a data folder that lacks one file, loading names that file (neither NAME.gz nor
    // NAME is there), the four expected files and `--data-dir`.
    let dir = tiny_mnist();
    fs::remove_file(dir.path().join("t10k-labels-idx1-ubyte.gz")).unwrap();
    let err = Mnist::load_with_validation(dir.path(), 2).unwrap_err();
    let path = dir.path().join("t10k-labels-idx1-ubyte");
    assert!(
        matches!(&err, MnistError::Missing { path: p } if *p == path),
        "{err:?}"
    );
    assert_message(
        &err,
        &path,
        &[
            "train-images-idx3-ubyte",
            "train-labels-idx1-ubyte",
            "t10k-images-idx3-ubyte",
            "t10k-labels-idx1-ubyte",
            ".gz",
            "--data-dir",
        ],
    );
}

#[test]
fn missing_folder() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no-such-folder");
    let err = Mnist::load(&path).unwrap_err();
    assert!(matches!(err, MnistError::MissingDir { .. }), "{err:?}");
    assert_message(&err, &path, &["train-images-idx3-ubyte", "--data-dir"]);
}

#[test]
fn validation_too_large() {
    let dir = tiny_mnist();
    for validation in [12, 13, usize::MAX] {
        let err = Mnist::load_with_validation(dir.path(), validation).unwrap_err();
        assert!(
            matches!(err, MnistError::ValidationTooLarge { validation: v, available: 12, .. }
                if v == validation),
            "{err:?}"
        );
        let path = dir.path().join("train-labels-idx1-ubyte.gz");
        assert_message(&err, &path, &["validation", "12"]);
    }
}

#[test]
fn loads_and_splits_a_tiny_mnist() {
    let dir = tiny_mnist();
    let mnist = Mnist::load_with_validation(dir.path(), 3).unwrap();
    assert_eq!(
        (mnist.train.len(), mnist.validation.len(), mnist.test.len()),
        (9, 3, 4)
    );
    let all_train = pixels(12, 1);
    assert_eq!(mnist.train.images, all_train[..9 * PIXELS]);
    assert_eq!(mnist.validation.images, all_train[9 * PIXELS..]);
    assert_eq!(mnist.train.labels, label_values(12, 0)[..9]);
    assert_eq!(mnist.validation.labels, label_values(12, 0)[9..]);
    assert_eq!(mnist.test.images, pixels(4, 2));
    assert_eq!(mnist.test.labels, label_values(4, 3));
    assert_eq!(
        mnist.validation.image(1),
        &all_train[10 * PIXELS..11 * PIXELS]
    );
    assert_eq!(mnist.test.image(3), &pixels(4, 2)[3 * PIXELS..]);
    assert!(!mnist.test.is_empty());

    let mnist = Mnist::load_with_validation(dir.path(), 0).unwrap();
    assert_eq!(mnist.train.len(), 12);
    assert!(mnist.validation.is_empty());
}

#[test]
fn uncompressed_files_are_accepted_and_gz_comes_first() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    fs::write(p.join("train-images-idx3-ubyte"), images(6, 1)).unwrap();
    fs::write(p.join("train-labels-idx1-ubyte"), labels(6, 0)).unwrap();
    fs::write(p.join("t10k-images-idx3-ubyte"), images(2, 2)).unwrap();
    fs::write(p.join("t10k-labels-idx1-ubyte"), labels(2, 0)).unwrap();
    let mnist = Mnist::load_with_validation(p, 1).unwrap();
    assert_eq!(mnist.test.labels, [0, 1]);
    assert_eq!(mnist.train.len(), 5);

    // A NAME.gz next to NAME wins.
    fs::write(p.join("t10k-labels-idx1-ubyte.gz"), gzip(&labels(2, 5))).unwrap();
    let mnist = Mnist::load_with_validation(p, 1).unwrap();
    assert_eq!(mnist.test.labels, [5, 6]);
}

#[test]
fn dimensions_whose_product_overflows_are_too_large() {
    // Products past usize: a reader that let them wrap would see a small size, and with that
    // many bytes after the header, a complete file.
    let cases: [&[u32]; 5] = [
        // 2^64: wraps to 0, and an empty body would read fine.
        &[1 << 16, 1 << 16, 1 << 16, 1 << 16],
        &[3, 1 << 31, 1 << 31, 1 << 31, 1 << 31],
        // (2^32 - 1)^2 * (2^33 + 1) = 1 modulo 2^64 (and modulo 2^32), times 10: wraps to 10,
        // and 10 bytes of data would read as a one-dimensional file of 10 values.
        &[u32::MAX, u32::MAX, 3, 2_863_311_531, 10],
        // Wraps to something large: still too large, not merely truncated.
        &[u32::MAX, u32::MAX, u32::MAX],
        &[1 << 16, 1 << 16, 1 << 16, 1 << 16, 5],
    ];
    for dims in cases {
        // As many bytes of data as a wrapped product would want (at most 64): the file is
        // complete for a reader that wraps.
        let wrapped = dims.iter().fold(1usize, |n, &d| n.wrapping_mul(d as usize));
        let data = vec![7u8; wrapped.min(64)];
        for (name, content) in [
            ("raw", idx_bytes(0x08, dims, &data)),
            ("gz", gzip(&idx_bytes(0x08, dims, &data))),
        ] {
            let (_dir, path, result) = read_written(name, &content);
            let err = match result {
                Ok(idx) => panic!(
                    "{dims:?} ({name}): read as dimensions {:?} with {} bytes",
                    idx.dims,
                    idx.data.len()
                ),
                Err(err) => err,
            };
            assert!(
                matches!(&err, MnistError::TooLarge { dims: d, .. }
                    if d.iter().map(|&x| x as u32).eq(dims.iter().copied())),
                "{dims:?} ({name}): {err:?}"
            );
            assert_message(&err, &path, &[]);
        }
    }
}

#[test]
fn a_label_of_ten_is_out_of_range() {
    for (index, label) in [(0usize, 10u8), (3, 10), (2, 11), (1, 255)] {
        let dir = tiny_mnist();
        let path = dir.path().join("t10k-labels-idx1-ubyte.gz");
        let mut values = label_values(4, 3);
        values[index] = label;
        fs::write(&path, gzip(&idx_bytes(0x08, &[4], &values))).unwrap();
        let err = Mnist::load_with_validation(dir.path(), 2).unwrap_err();
        assert!(
            matches!(err, MnistError::LabelOutOfRange { index: i, label: l, .. }
                if i == index && l == label),
            "label {label} at {index}: {err:?}"
        );
        assert_message(&err, &path, &[&format!("label {label}"), "0..=9"]);
    }
    // Nine, the largest class, is fine.
    let dir = tiny_mnist();
    let path = dir.path().join("train-labels-idx1-ubyte.gz");
    fs::write(&path, gzip(&idx_bytes(0x08, &[12], &[9; 12]))).unwrap();
    let mnist = Mnist::load_with_validation(dir.path(), 2).unwrap();
    assert_eq!(mnist.train.labels, [9; 10]);
}
