//! Parameters exported for inference in a 16-bit type ([`export`], [`load_export`]): one
//! tensor per parameter span, named as the span (`layer1/weights`...), in `bf16` or `f16`,
//! with string metadata: `export` (the type's name), `step`, and whatever the caller adds. Half
//! a checkpoint's parameters' size, a quarter of a whole SGD checkpoint's, and readable by any
//! safetensors reader.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;

use half::{bf16, f16};
use safetensors::tensor::Dtype;
use tandem_core::{DType, ParamSpan};

use crate::{
    corrupt, io, layout_len, mismatch, parse_step, read_data, read_safetensors_header,
    serialize_sorted, write_atomically, CheckpointError, STEP,
};

/// The metadata key that marks an export and names its type.
pub(crate) const EXPORT: &str = "export";

/// A loaded export.
#[derive(Debug, Clone, PartialEq)]
pub struct Export {
    /// The parameters, converted to `f32` (exactly).
    pub params: Vec<f32>,
    /// The type they were stored in.
    pub dtype: DType,
    /// The step of the state they were exported from.
    pub step: u64,
    /// The metadata the writer stored (without `export` and `step`).
    pub metadata: BTreeMap<String, String>,
}

/// The safetensors type of a 16-bit [`DType`].
fn safetensors_dtype(dtype: DType) -> Option<Dtype> {
    match dtype {
        DType::F32 => None,
        DType::BF16 => Some(Dtype::BF16),
        DType::F16 => Some(Dtype::F16),
    }
}

/// `values` as little-endian `dtype` bytes (round to nearest, ties to even); `None` when a value
/// is not finite there (beyond f16's 65504).
fn encode(values: &[f32], dtype: DType) -> Option<Vec<u8>> {
    let bits: Vec<u16> = match dtype {
        DType::BF16 => values
            .iter()
            .map(|&v| bf16::from_f32(v).to_bits())
            .collect(),
        DType::F16 => values.iter().map(|&v| f16::from_f32(v).to_bits()).collect(),
        DType::F32 => return None,
    };
    let finite = match dtype {
        DType::F16 => bits.iter().all(|&b| f16::from_bits(b).is_finite()),
        _ => bits.iter().all(|&b| bf16::from_bits(b).is_finite()),
    };
    finite.then(|| bits.iter().flat_map(|b| b.to_le_bytes()).collect())
}

/// The bytes of an export of `params` (one model's, in `layout`'s order) in `dtype` (`bf16` or
/// `f16`), exported from step `step`, with `metadata`. Deterministic. Fails, naming the
/// tensor, where a value does not fit the type (f16's largest is 65504), and for `f32` (that
/// is a checkpoint).
pub fn export_bytes(
    params: &[f32],
    layout: &[ParamSpan],
    dtype: DType,
    step: u64,
    metadata: &BTreeMap<String, String>,
) -> Result<Vec<u8>, String> {
    let st_dtype =
        safetensors_dtype(dtype).ok_or_else(|| format!("an export is bf16 or f16, not {dtype}"))?;
    if params.len() != layout_len(layout) {
        return Err(format!(
            "{} parameters for a layout of {}",
            params.len(),
            layout_len(layout)
        ));
    }
    let mut tensors = Vec::with_capacity(layout.len());
    let mut offset = 0;
    for span in layout {
        let values = &params[offset..offset + span.len()];
        offset += span.len();
        let data = encode(values, dtype).ok_or_else(|| {
            format!(
                "{} holds a value that {dtype} cannot hold (its largest is {})",
                span.name,
                match dtype {
                    DType::F16 => "65504",
                    _ => "3.4e38",
                }
            )
        })?;
        tensors.push((span.name.clone(), st_dtype, span.shape.clone(), data));
    }
    let step = step.to_string();
    let mut info: BTreeMap<&str, &str> = metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    info.insert(EXPORT, dtype.name());
    info.insert(STEP, &step);
    serialize_sorted(&tensors, &info).map_err(|e| e.to_string())
}

/// Writes [`export_bytes`] to `path` atomically (a crash leaves the old file or the new one).
pub fn export(
    path: &Path,
    params: &[f32],
    layout: &[ParamSpan],
    dtype: DType,
    step: u64,
    metadata: &BTreeMap<String, String>,
) -> Result<(), CheckpointError> {
    let bytes = export_bytes(params, layout, dtype, step, metadata).map_err(|reason| {
        CheckpointError::Mismatch {
            path: path.to_owned(),
            reason,
        }
    })?;
    write_atomically(path, &bytes)
}

/// Whether the file at `path` says it is an export: its header's metadata has `export` (the
/// header alone is read and checked).
pub fn is_export(path: &Path) -> Result<bool, CheckpointError> {
    let mut file = File::open(path).map_err(io(path))?;
    let len = file.metadata().map_err(io(path))?.len();
    let (_, metadata) = read_safetensors_header(&mut file, len, path)?;
    Ok(metadata.contains_key(EXPORT))
}

/// Reads the export at `path` and validates it whole against `layout`: header and size, one
/// tensor per span of its name and shape in the type the metadata names, every value finite.
pub fn load_export(path: &Path, layout: &[ParamSpan]) -> Result<Export, CheckpointError> {
    let mut file = File::open(path).map_err(io(path))?;
    let len = file.metadata().map_err(io(path))?.len();
    let (tensors, mut metadata) = read_safetensors_header(&mut file, len, path)?;
    let named = metadata
        .remove(EXPORT)
        .ok_or_else(|| corrupt(path, "not an export: no export type in its metadata"))?;
    let dtype = named
        .parse::<DType>()
        .ok()
        .filter(|d| *d != DType::F32)
        .ok_or_else(|| {
            corrupt(
                path,
                format!("its export type {named:?} is not bf16 or f16"),
            )
        })?;
    let step = metadata
        .remove(STEP)
        .ok_or_else(|| corrupt(path, "no step in its metadata"))?;
    let step = parse_step(&step)
        .ok_or_else(|| corrupt(path, format!("its step {step:?} is not a u64")))?;
    let st_dtype = safetensors_dtype(dtype).unwrap_or(Dtype::BF16);
    if tensors.tensors().len() != layout.len() {
        return Err(mismatch(
            path,
            format!(
                "{} tensors where the model has {}",
                tensors.tensors().len(),
                layout.len()
            ),
        ));
    }
    let mut ranges = Vec::with_capacity(layout.len());
    for span in layout {
        let info = tensors
            .info(&span.name)
            .ok_or_else(|| mismatch(path, format!("no tensor {}", span.name)))?;
        if info.dtype != st_dtype || info.shape != span.shape {
            return Err(mismatch(
                path,
                format!(
                    "{} is {:?} {:?}, the model needs {st_dtype:?} {:?}",
                    span.name, info.dtype, info.shape, span.shape
                ),
            ));
        }
        ranges.push((span.name.as_str(), info.data_offsets));
    }
    let data = read_data(&mut file, &tensors, 2 * layout_len(layout), path)?;
    let mut params = Vec::with_capacity(layout_len(layout));
    for (name, (start, end)) in ranges {
        let bytes = data
            .get(start..end)
            .ok_or_else(|| corrupt(path, format!("damaged: {name} lies outside the file")))?;
        let values = bytes.chunks_exact(2).map(|b| {
            let bits = u16::from_le_bytes([b[0], b[1]]);
            match dtype {
                DType::F16 => f16::from_bits(bits).to_f32(),
                _ => bf16::from_bits(bits).to_f32(),
            }
        });
        let start = params.len();
        params.extend(values);
        if params[start..].iter().any(|v| !v.is_finite()) {
            return Err(corrupt(
                path,
                format!("damaged: tensor {name} holds a non-finite value"),
            ));
        }
    }
    Ok(Export {
        params,
        dtype,
        step,
        metadata,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Vec<ParamSpan> {
        vec![
            ParamSpan::new("l/weights", [3, 2], true),
            ParamSpan::new("l/biases", [2], false),
        ]
    }

    #[test]
    fn an_export_round_trips_rounded_and_refuses_what_does_not_fit() {
        let dir = tempfile::tempdir().unwrap();
        let params = [1.0, -2.5, 1.0 + 1.0 / 512.0, 3e-3, 65_000.0, 0.1, 7.0, -0.0];
        let meta = BTreeMap::from([("model".to_string(), "3-2".to_string())]);
        for dtype in [DType::BF16, DType::F16] {
            let path = dir.path().join(format!("{dtype}.safetensors"));
            export(&path, &params, &layout(), dtype, 42, &meta).unwrap();
            assert!(is_export(&path).unwrap());
            let back = load_export(&path, &layout()).unwrap();
            assert_eq!((back.dtype, back.step), (dtype, 42));
            assert_eq!(back.metadata, meta);
            // Read as a checkpoint, it is named for what it is.
            let err = crate::load(&path, &layout()).unwrap_err().to_string();
            assert!(
                err.contains(&format!("a {dtype} export for inference")),
                "{err}"
            );
            for (b, p) in back.params.iter().zip(&params) {
                let expected = match dtype {
                    DType::F16 => f16::from_f32(*p).to_f32(),
                    _ => bf16::from_f32(*p).to_f32(),
                };
                assert_eq!(b.to_bits(), expected.to_bits());
            }
            // 2 bytes a value.
            let size = std::fs::metadata(&path).unwrap().len() as usize;
            assert!(size < 2 * params.len() + 400, "{size}");
            // The same arguments, the same bytes.
            let bytes = std::fs::read(&path).unwrap();
            assert_eq!(
                export_bytes(&params, &layout(), dtype, 42, &meta).unwrap(),
                bytes
            );
            // The other model's layout is refused, naming what differs.
            let other = vec![
                ParamSpan::new("l/weights", [2, 3], true),
                layout()[1].clone(),
            ];
            let err = load_export(&path, &other).unwrap_err().to_string();
            assert!(err.contains("l/weights"), "{err}");
        }
        let too_big = [1e5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let err = export_bytes(&too_big, &layout(), DType::F16, 0, &meta).unwrap_err();
        assert!(err.contains("l/weights") && err.contains("65504"), "{err}");
        assert!(export_bytes(&params, &layout(), DType::F32, 0, &meta).is_err());
        assert!(export_bytes(&params[..7], &layout(), DType::BF16, 0, &meta).is_err());
    }

    #[test]
    fn a_checkpoint_is_not_an_export_and_a_lying_export_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let state = tandem_core::TrainState {
            params: vec![0.5; 8],
            slots: Vec::new(),
            step: 3,
        };
        let ckpt = dir.path().join("step-3.safetensors");
        write_atomically(
            &ckpt,
            &crate::to_bytes(&state, &layout(), &BTreeMap::new()).unwrap(),
        )
        .unwrap();
        assert!(!is_export(&ckpt).unwrap());
        assert!(load_export(&ckpt, &layout())
            .unwrap_err()
            .to_string()
            .contains("not an export"));
        // An export whose metadata names another type than its tensors'.
        let path = dir.path().join("lie.safetensors");
        let tensors: Vec<_> = (layout().iter())
            .map(|span| {
                (
                    span.name.clone(),
                    Dtype::BF16,
                    span.shape.clone(),
                    vec![0; 2 * span.len()],
                )
            })
            .collect();
        let lie = BTreeMap::from([(EXPORT, "f16"), (STEP, "1")]);
        std::fs::write(&path, serialize_sorted(&tensors, &lie).unwrap()).unwrap();
        let err = load_export(&path, &layout()).unwrap_err().to_string();
        assert!(err.contains("the model needs F16"), "{err}");
        let bytes = export_bytes(&[0.5; 8], &layout(), DType::BF16, 1, &BTreeMap::new()).unwrap();
        // Truncated.
        std::fs::write(&path, &bytes[..bytes.len() - 2]).unwrap();
        assert!(load_export(&path, &layout()).is_err());
        // A NaN inside.
        let mut nan = bytes.clone();
        let at = nan.len() - 2;
        nan[at..].copy_from_slice(&bf16::NAN.to_bits().to_le_bytes());
        std::fs::write(&path, &nan).unwrap();
        let err = load_export(&path, &layout()).unwrap_err().to_string();
        assert!(err.contains("non-finite"), "{err}");
    }
}
