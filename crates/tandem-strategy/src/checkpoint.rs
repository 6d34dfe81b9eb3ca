//! Checkpoints of a [`TrainState`] in the safetensors format.
//!
//! A checkpoint holds two tensors per parameter span, `params/NAME` and `ema/NAME` (f32, the
//! span's shape), and string metadata: `step` plus whatever the caller adds (hyper-parameters,
//! mode, device count...). Files are written atomically (temporary file, fsync, rename, fsync of
//! the directory), so a crash leaves either the old file or the new one, never a damaged one.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use tandem_pool::ParamSpan;

use crate::TrainState;

/// File names are `step-NNNNNNNNNN.safetensors`, so they sort by step.
const PREFIX: &str = "step-";
const SUFFIX: &str = ".safetensors";

/// What can go wrong with a checkpoint; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Reading or writing failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Not a readable safetensors file (truncated, corrupted, not a checkpoint).
    #[error("{path}: not a valid checkpoint ({reason})")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A valid file whose tensors do not fit this model.
    #[error("{path}: checkpoint does not match this model: {reason}")]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// What differs.
        reason: String,
    },
    /// A directory without any usable checkpoint.
    #[error("{path}: no usable checkpoint{}", if .skipped.is_empty() { String::new() } else { format!(" ({})", .skipped.join("; ")) })]
    NoneFound {
        /// The directory.
        path: PathBuf,
        /// Why each candidate was rejected.
        skipped: Vec<String>,
    },
}

/// A loaded checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// Parameters, moving average and step.
    pub state: TrainState,
    /// The metadata the writer stored (without `step`, which is in `state`).
    pub metadata: BTreeMap<String, String>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_owned(),
        source,
    }
}

fn le_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Serialises `state` with `layout`'s names and shapes, and `metadata`.
pub fn to_bytes(
    state: &TrainState,
    layout: &[ParamSpan],
    metadata: &BTreeMap<String, String>,
) -> Result<Vec<u8>, safetensors::SafeTensorError> {
    let mut bytes = Vec::new();
    let mut offset = 0;
    for span in layout {
        let range = offset..offset + span.len();
        bytes.push((
            format!("params/{}", span.name),
            span.shape.clone(),
            le_bytes(&state.params[range.clone()]),
        ));
        bytes.push((
            format!("ema/{}", span.name),
            span.shape.clone(),
            le_bytes(&state.ema[range]),
        ));
        offset += span.len();
    }
    let views = bytes
        .iter()
        .map(|(name, shape, data)| {
            Ok((
                name.as_str(),
                TensorView::new(Dtype::F32, shape.clone(), data)?,
            ))
        })
        .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()?;
    let mut info: HashMap<String, String> = metadata.clone().into_iter().collect();
    info.insert("step".into(), state.step.to_string());
    safetensors::serialize(views, Some(info))
}

/// Reads a checkpoint and checks it against `layout`.
pub fn load(path: &Path, layout: &[ParamSpan]) -> Result<Checkpoint, CheckpointError> {
    let bytes = fs::read(path).map_err(io(path))?;
    from_bytes(&bytes, layout).map_err(|e| match e {
        Parse::Corrupt(reason) => CheckpointError::Corrupt {
            path: path.to_owned(),
            reason,
        },
        Parse::Mismatch(reason) => CheckpointError::Mismatch {
            path: path.to_owned(),
            reason,
        },
    })
}

enum Parse {
    Corrupt(String),
    Mismatch(String),
}

fn from_bytes(bytes: &[u8], layout: &[ParamSpan]) -> Result<Checkpoint, Parse> {
    let tensors = SafeTensors::deserialize(bytes).map_err(|e| Parse::Corrupt(e.to_string()))?;
    let (_, header) =
        SafeTensors::read_metadata(bytes).map_err(|e| Parse::Corrupt(e.to_string()))?;
    let mut metadata: BTreeMap<String, String> = header
        .metadata()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    let step = metadata
        .remove("step")
        .ok_or_else(|| Parse::Corrupt("no step in its metadata".into()))?
        .parse::<u64>()
        .map_err(|e| Parse::Corrupt(format!("step: {e}")))?;
    let total: usize = layout.iter().map(ParamSpan::len).sum();
    let mut state = TrainState {
        params: Vec::with_capacity(total),
        ema: Vec::with_capacity(total),
        step,
    };
    for span in layout {
        for (prefix, out) in [("params", &mut state.params), ("ema", &mut state.ema)] {
            let name = format!("{prefix}/{}", span.name);
            let view = tensors
                .tensor(&name)
                .map_err(|_| Parse::Mismatch(format!("no tensor {name}")))?;
            if view.dtype() != Dtype::F32 || view.shape() != span.shape.as_slice() {
                return Err(Parse::Mismatch(format!(
                    "{name} is {:?} {:?}, the model needs F32 {:?}",
                    view.dtype(),
                    view.shape(),
                    span.shape
                )));
            }
            out.extend(
                view.data()
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            );
        }
    }
    let expected = 2 * layout.len();
    if tensors.len() != expected {
        return Err(Parse::Mismatch(format!(
            "{} tensors where the model has {expected}",
            tensors.len()
        )));
    }
    Ok(Checkpoint { state, metadata })
}

/// Writes `bytes` to `path` atomically: a temporary file in the same directory, fsync, rename,
/// fsync of the directory.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io(dir))?;
    tmp.write_all(bytes).map_err(io(tmp.path()))?;
    tmp.as_file().sync_all().map_err(io(tmp.path()))?;
    tmp.persist(path).map_err(|e| CheckpointError::Io {
        path: path.to_owned(),
        source: e.error,
    })?;
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))
}

/// Saves `state` into `dir` as `step-NNNNNNNNNN.safetensors` and deletes all but the newest
/// `keep` checkpoints there (`keep` of 0 keeps everything). Returns the new file's path.
pub fn save_in_dir(
    dir: &Path,
    state: &TrainState,
    layout: &[ParamSpan],
    metadata: &BTreeMap<String, String>,
    keep: usize,
) -> Result<PathBuf, CheckpointError> {
    fs::create_dir_all(dir).map_err(io(dir))?;
    let path = dir.join(format!("{PREFIX}{:010}{SUFFIX}", state.step));
    let bytes = to_bytes(state, layout, metadata).map_err(|e| CheckpointError::Corrupt {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    write_atomically(&path, &bytes)?;
    if keep > 0 {
        for old in list(dir)?.into_iter().rev().skip(keep) {
            fs::remove_file(&old).map_err(io(&old))?;
        }
    }
    Ok(path)
}

/// The checkpoint files in `dir`, oldest first.
pub fn list(dir: &Path) -> Result<Vec<PathBuf>, CheckpointError> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(io(dir))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(PREFIX) && n.ends_with(SUFFIX))
        })
        .collect();
    files.sort();
    Ok(files)
}

/// The newest checkpoint in `dir` that loads and fits `layout`, with the reasons the newer
/// ones were skipped.
pub fn load_newest(
    dir: &Path,
    layout: &[ParamSpan],
) -> Result<(PathBuf, Checkpoint, Vec<String>), CheckpointError> {
    let mut skipped = Vec::new();
    for path in list(dir)?.into_iter().rev() {
        match load(&path, layout) {
            Ok(checkpoint) => return Ok((path, checkpoint, skipped)),
            Err(e) => skipped.push(e.to_string()),
        }
    }
    Err(CheckpointError::NoneFound {
        path: dir.to_owned(),
        skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Vec<ParamSpan> {
        vec![
            ParamSpan {
                name: "w".into(),
                shape: vec![2, 3],
                weight_decay: true,
            },
            ParamSpan {
                name: "b".into(),
                shape: vec![3],
                weight_decay: false,
            },
        ]
    }

    fn state(step: u64) -> TrainState {
        let params: Vec<f32> = (0..9).map(|i| i as f32 * 0.37 - 1.0).collect();
        TrainState {
            ema: params.iter().map(|p| p * 0.5 + f32::EPSILON).collect(),
            params,
            step,
        }
    }

    fn meta() -> BTreeMap<String, String> {
        BTreeMap::from([("mode".to_string(), "sync".to_string())])
    }

    #[test]
    fn round_trip_is_bitwise() {
        let dir = tempfile::tempdir().unwrap();
        let path = save_in_dir(dir.path(), &state(42), &layout(), &meta(), 3).unwrap();
        let loaded = load(&path, &layout()).unwrap();
        assert_eq!(loaded.state, state(42));
        assert_eq!(loaded.metadata, meta());
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&loaded.state.ema), bits(&state(42).ema));
    }

    #[test]
    fn keeps_only_the_newest_and_resumes_from_the_newest_valid() {
        let dir = tempfile::tempdir().unwrap();
        for step in [10, 20, 30, 40] {
            save_in_dir(dir.path(), &state(step), &layout(), &meta(), 3).unwrap();
        }
        let names: Vec<_> = list(dir.path())
            .unwrap()
            .iter()
            .map(|p| p.file_name().unwrap().to_owned())
            .collect();
        assert_eq!(
            names,
            [
                "step-0000000020.safetensors",
                "step-0000000030.safetensors",
                "step-0000000040.safetensors"
            ]
        );
        // Damage the newest: resuming falls back to the one before and says why.
        let newest = dir.path().join("step-0000000040.safetensors");
        let bytes = fs::read(&newest).unwrap();
        fs::write(&newest, &bytes[..bytes.len() / 2]).unwrap();
        let (path, checkpoint, skipped) = load_newest(dir.path(), &layout()).unwrap();
        assert_eq!(checkpoint.state.step, 30);
        assert!(path.ends_with("step-0000000030.safetensors"));
        assert_eq!(skipped.len(), 1);
        assert!(
            skipped[0].contains("step-0000000040.safetensors"),
            "{}",
            skipped[0]
        );
    }

    #[test]
    fn truncated_corrupted_and_mismatched_files_are_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = save_in_dir(dir.path(), &state(1), &layout(), &meta(), 0).unwrap();
        let good = fs::read(&path).unwrap();
        let bad = dir.path().join("bad.safetensors");
        let check = |bytes: &[u8], layout: &[ParamSpan], corrupt: bool| {
            fs::write(&bad, bytes).unwrap();
            let err = load(&bad, layout).unwrap_err();
            assert!(
                err.to_string().starts_with(&bad.display().to_string()),
                "{err}"
            );
            assert_eq!(
                matches!(err, CheckpointError::Corrupt { .. }),
                corrupt,
                "{err}"
            );
            assert_eq!(
                matches!(err, CheckpointError::Mismatch { .. }),
                !corrupt,
                "{err}"
            );
        };
        check(&good[..good.len() - 5], &layout(), true);
        check(&good[..3], &layout(), true);
        check(b"", &layout(), true);
        let mut garbled = good.clone();
        garbled[10] = b'}';
        check(&garbled, &layout(), true);
        let wider = vec![
            ParamSpan {
                name: "w".into(),
                shape: vec![2, 4],
                weight_decay: true,
            },
            ParamSpan {
                name: "b".into(),
                shape: vec![4],
                weight_decay: false,
            },
        ];
        check(&good, &wider, false);
        check(&good, &layout()[..1], false);
        let missing = load(&dir.path().join("nope.safetensors"), &layout()).unwrap_err();
        assert!(matches!(missing, CheckpointError::Io { .. }));
        let empty = tempfile::tempdir().unwrap();
        assert!(matches!(
            load_newest(empty.path(), &layout()),
            Err(CheckpointError::NoneFound { .. })
        ));
    }
}
