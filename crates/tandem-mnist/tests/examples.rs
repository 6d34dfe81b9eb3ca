//! `Split::into_examples` (feature `tensor`): a split as the model's input.
#![cfg(feature = "tensor")]

use tandem_mnist::{Split, PIXELS};

#[test]
fn a_split_becomes_one_example_per_image() {
    let split = Split {
        images: (0..2 * PIXELS).map(|i| (i % 256) as u8).collect(),
        labels: vec![3, 7],
    };
    let examples = split.clone().into_examples().expect("a consistent split");
    assert_eq!(examples.features(), PIXELS);
    assert_eq!(examples.len(), 2);
    assert_eq!(examples.labels(), &split.labels[..]);
    assert_eq!(examples.values(), &split.images[..]);
}

#[test]
fn images_and_labels_that_disagree_are_refused() {
    let split = Split {
        images: vec![0; PIXELS + 1],
        labels: vec![1],
    };
    assert!(split.into_examples().is_none());
}
