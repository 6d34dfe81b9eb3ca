//! Loads the real MNIST files shipped in the repository's `data/mnist`.

use std::path::PathBuf;

use tandem_mnist::{read_idx, Mnist, PIXELS};

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/mnist")
}

#[test]
fn real_mnist_loads_with_the_books_split() {
    let mnist = Mnist::load(&data_dir()).unwrap_or_else(|e| panic!("{e}"));

    assert_eq!(mnist.train.len(), 55_000);
    assert_eq!(mnist.validation.len(), 5_000);
    assert_eq!(mnist.test.len(), 10_000);
    for split in [&mnist.train, &mnist.validation, &mnist.test] {
        assert_eq!(split.images.len(), split.len() * PIXELS);
    }

    // The well-known first labels of each file.
    assert_eq!(mnist.train.labels[..5], [5, 0, 4, 1, 9]);
    assert_eq!(mnist.test.labels[..5], [7, 2, 1, 0, 4]);

    // Every digit is reasonably frequent in the 60,000 training examples.
    let mut counts = [0usize; 10];
    for &label in mnist.train.labels.iter().chain(&mnist.validation.labels) {
        counts[usize::from(label)] += 1;
    }
    assert_eq!(counts.iter().sum::<usize>(), 60_000);
    for (digit, &count) in counts.iter().enumerate() {
        assert!(
            (4_000..=7_000).contains(&count),
            "digit {digit}: {count} examples"
        );
    }

    // Images are ink on a blank background: the corners are 0, and each image has some ink.
    for split in [&mnist.train, &mnist.validation, &mnist.test] {
        for i in (0..split.len()).step_by(997) {
            let image = split.image(i);
            assert_eq!(image[0], 0);
            assert_eq!(image[PIXELS - 1], 0);
            assert!(image.iter().any(|&p| p > 128), "image {i} has no ink");
        }
    }
}

#[test]
fn real_labels_file_reads_as_generic_idx() {
    let idx = read_idx(&data_dir().join("t10k-labels-idx1-ubyte.gz")).unwrap();
    assert_eq!(idx.dims, [10_000]);
    assert_eq!(idx.data[..3], [7, 2, 1]);
}
