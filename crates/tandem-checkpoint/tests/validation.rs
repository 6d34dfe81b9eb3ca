//! What a checkpoint must hold before it loads: F32 tensors only (any other dtype is a mismatch
//! with the model, even where the shapes are right and the data is exactly as long as F32 data
//! would be, so that no size check can catch it: never values reinterpreted as f32), and a step
//! (a file without one is damaged, never a checkpoint of step 0).

mod common;

use std::collections::HashMap;
use std::fs;

use common::{file_with_metadata, layout};
use safetensors::Dtype;
use tandem_checkpoint::{self as checkpoint, CheckpointError};

/// Which dtype each tensor of a test file gets, by name.
type DtypeOf = fn(&str) -> Dtype;

/// A checkpoint file's bytes with step 1 and tensors of the layout's shapes, each of the dtype
/// `dtype_of` gives its name (see [`file_with_metadata`]).
fn file_with(dtype_of: impl Fn(&str) -> Dtype) -> Vec<u8> {
    let metadata = HashMap::from([("step".to_string(), "1".to_string())]);
    file_with_metadata(dtype_of, Some(metadata))
}

#[test]
fn a_tensor_of_another_dtype_is_a_mismatch_even_when_sizes_agree() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("step-0000000001.safetensors");

    // The control: the same file in F32 loads.
    fs::write(&path, file_with(|_| Dtype::F32)).unwrap();
    let loaded = checkpoint::load(&path, &layout()).unwrap();
    assert_eq!(loaded.state.step, 1);
    assert_eq!(loaded.state.params.len(), 9);

    let cases: [(&str, DtypeOf, &str); 5] = [
        // Four bytes a value, like F32: the data has exactly the size the model needs.
        ("all I32", |_| Dtype::I32, "I32"),
        (
            "ema/b U32",
            |n| if n == "ema/b" { Dtype::U32 } else { Dtype::F32 },
            "U32",
        ),
        // Six values two bytes short and three values four bytes long: the total is right.
        (
            "params/w F16, ema/b F64",
            |n| match n {
                "params/w" => Dtype::F16,
                "ema/b" => Dtype::F64,
                _ => Dtype::F32,
            },
            "F16",
        ),
        ("all F64", |_| Dtype::F64, "F64"),
        ("all F16", |_| Dtype::F16, "F16"),
    ];
    for (case, dtype_of, named) in cases {
        fs::write(&path, file_with(dtype_of)).unwrap();
        let err = match checkpoint::load(&path, &layout()) {
            Ok(loaded) => panic!(
                "{case}: loaded as {:?} / {:?}",
                loaded.state.params, loaded.state.slots
            ),
            Err(err) => err,
        };
        assert!(
            matches!(err, CheckpointError::Mismatch { .. }),
            "{case}: {err}"
        );
        let message = err.to_string();
        assert!(
            message.starts_with(&path.display().to_string()),
            "{case}: {message}"
        );
        assert!(
            message.contains(named) && message.contains("F32"),
            "{case}: the message should name {named} and F32: {message}"
        );
    }
}

#[test]
fn a_file_without_a_step_is_damaged_not_step_0() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("step-0000000000.safetensors");
    let other = HashMap::from([("mode".to_string(), "sync".to_string())]);
    for metadata in [None, Some(HashMap::new()), Some(other)] {
        fs::write(&path, file_with_metadata(|_| Dtype::F32, metadata.clone())).unwrap();
        for err in [
            checkpoint::load(&path, &layout()).map(|c| c.state.step),
            checkpoint::read_header(&path).map(|(step, _)| step),
        ]
        .map(|r| r.expect_err("a file without a step loaded"))
        {
            assert!(
                matches!(err, CheckpointError::Corrupt { .. }),
                "{metadata:?}: {err}"
            );
            assert!(err.to_string().contains("step"), "{metadata:?}: {err}");
        }
    }
}

/// A header that lies about its own length, or a file cut inside its header, is damage (not an
/// I/O error, not a panic on the length arithmetic), whether loaded or only its header read.
#[test]
fn a_header_length_that_lies_or_a_cut_header_is_damage() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("step-0000000001.safetensors");
    let good = file_with(|_| Dtype::F32);
    let header_len = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let mut cases: Vec<(String, Vec<u8>)> = [u64::MAX, u64::MAX - 7, 1 << 40]
        .into_iter()
        .map(|claim| {
            let mut bytes = good.clone();
            bytes[..8].copy_from_slice(&claim.to_le_bytes());
            (format!("a header length of {claim}"), bytes)
        })
        .collect();
    for cut in [8, 9, 8 + header_len / 2, 8 + header_len - 1] {
        cases.push((format!("cut at {cut} bytes"), good[..cut].to_vec()));
    }
    for (case, bytes) in cases {
        fs::write(&path, &bytes).unwrap();
        for err in [
            checkpoint::load(&path, &layout()).map(|c| c.state.step),
            checkpoint::read_header(&path).map(|(step, _)| step),
        ]
        .map(|r| r.expect_err("a damaged header loaded"))
        {
            assert!(
                matches!(err, CheckpointError::Corrupt { .. }),
                "{case}: {err}"
            );
        }
    }
}

/// The largest single allocation made on each thread, for the test below.
struct LargestAllocation;

thread_local! {
    static LARGEST: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

// SAFETY: every call is passed on to the system allocator unchanged; the thread-local is only
// read and written (const-initialised, so touching it never allocates).
unsafe impl std::alloc::GlobalAlloc for LargestAllocation {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        let _ = LARGEST.try_with(|l| l.set(l.get().max(layout.size())));
        // SAFETY: the caller's obligations are the system allocator's.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: as above.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: LargestAllocation = LargestAllocation;

/// A small file whose header claims 90 MB (under safetensors' limit) is refused by its size
/// before a buffer for that header is made: a lying file costs nothing.
#[test]
fn a_header_claiming_more_than_the_file_holds_allocates_nothing_for_it() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("step-0000000001.safetensors");
    let mut bytes = file_with(|_| Dtype::F32);
    bytes[..8].copy_from_slice(&90_000_000u64.to_le_bytes());
    fs::write(&path, &bytes).unwrap();
    LARGEST.with(|l| l.set(0));
    let err = checkpoint::read_header(&path).expect_err("a lying header was read");
    assert!(matches!(err, CheckpointError::Corrupt { .. }), "{err}");
    let largest = LARGEST.with(std::cell::Cell::get);
    assert!(
        largest < 1 << 20,
        "allocated {largest} bytes at once for a {}-byte file",
        bytes.len()
    );
}

/// A whole, valid safetensors file without tensors (its header fills it) is a file of another
/// model, not a damaged one: its header reads, and loading it is a mismatch.
#[test]
fn a_file_without_tensors_is_a_mismatch_not_damage() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("step-0000000001.safetensors");
    let metadata = HashMap::from([("step".to_string(), "1".to_string())]);
    let no_tensors: [(&str, safetensors::tensor::TensorView<'_>); 0] = [];
    fs::write(
        &path,
        safetensors::serialize(no_tensors, Some(metadata)).unwrap(),
    )
    .unwrap();
    assert_eq!(checkpoint::read_header(&path).unwrap().0, 1);
    let err = checkpoint::load(&path, &layout()).expect_err("a file without tensors loaded");
    assert!(matches!(err, CheckpointError::Mismatch { .. }), "{err}");
}

/// Serialising a state that does not fit the layout says what it got: the values' bytes.
#[test]
fn serialising_a_state_of_the_wrong_size_says_its_size() {
    let layout = layout(); // 9 values
    for (params, ema) in [(8, 9), (9, 11)] {
        let state = tandem_core::TrainState {
            params: vec![0.5; params],
            slots: vec![tandem_core::Slot {
                name: "ema".into(),
                values: vec![0.5; ema],
            }],
            step: 1,
        };
        let wrong = if params != 9 { params } else { ema };
        match checkpoint::to_bytes(&state, &layout, &Default::default()) {
            Err(safetensors::SafeTensorError::InvalidTensorView(Dtype::F32, shape, bytes)) => {
                assert_eq!((shape, bytes), (vec![9], wrong * 4));
            }
            other => panic!("{params} parameters, {ema} averages: {other:?}"),
        }
    }
}
