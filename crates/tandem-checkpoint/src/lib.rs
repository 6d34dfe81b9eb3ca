//! Checkpoints of a [`TrainState`] in the safetensors format.
//!
//! A checkpoint holds one tensor per parameter span, `params/NAME`, and one per span and
//! optimiser state vector, `SLOT/NAME` (f32, the span's shape; SGD's moving average is
//! `ema/NAME`), and string metadata: `step`, `optimizer_state` (the state vectors' names, in
//! the optimiser's order) plus whatever the caller adds (hyper-parameters, mode, device
//! count...). The same state and metadata always give the same bytes.
//!
//! A run writes into a [`CheckpointDir`], which it holds alone (a lock file) from before its
//! first step: opening it proves the directory writable and sweeps the temporary files a killed
//! writer left. Files are written atomically (temporary file, fsync, rename, fsync of the
//! directory), so a crash, even `kill -9`, leaves either the old file or the new one, never a
//! damaged one. Rotation deletes only the run's own valid checkpoints, by step, never a newer one.
//!
//! A file is validated as a whole before it is used ([`load`]): its header and size first (a
//! file claiming gigabytes is rejected after reading its header), then the tensors against the
//! model's layout, then every value (a NaN anywhere makes the file damaged).

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, ErrorKind, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use safetensors::tensor::{Dtype, Metadata, SafeTensors, TensorView};
use tandem_core::{ParamSpan, Slot, TrainState};

mod export;
pub use export::{export, export_bytes, is_export, load_export, Export};

/// File names are `step-<decimal step>.safetensors`, zero-padded to 10 digits when written.
const PREFIX: &str = "step-";
const SUFFIX: &str = ".safetensors";
/// Every temporary file this module creates starts with this, so a sweep removes only its own.
const TEMP_PREFIX: &str = ".tandem-tmp-";
/// The lock file of a [`CheckpointDir`].
const LOCK_FILE: &str = ".tandem.lock";
/// The largest header safetensors itself accepts.
const MAX_HEADER: u64 = 100_000_000;
/// The bytes before the header: its length, u64 little-endian.
const N_LEN: u64 = 8;
/// The metadata key of the step.
const STEP: &str = "step";
/// The metadata key of the optimiser state's names, comma-separated in the optimiser's order.
const SLOTS: &str = "optimizer_state";
/// What a checkpoint without [`SLOTS`] holds: written before the optimiser seam, by SGD with a
/// moving average.
const SLOTS_BEFORE_THE_OPTIMISER_SEAM: &str = "ema";
/// The most optimiser state vectors a checkpoint may name (Adam has three: `m`, `v` and the
/// moving average).
const MAX_SLOTS: usize = 8;
/// The metadata key that a resumed run may change: not part of `save_in_dir`'s identity.
const END_STEP: &str = "end_step";

/// What can go wrong with a checkpoint; every variant names the file or directory.
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
    /// Not a readable checkpoint: truncated, padded, damaged values, not a checkpoint at all.
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
    /// Another run holds the checkpoint directory.
    #[error("{path} is in use by another run ({holder}): wait for it to end or choose another checkpoint directory")]
    Locked {
        /// The directory.
        path: PathBuf,
        /// Who holds it, e.g. `process 1234`.
        holder: String,
    },
}

/// A loaded checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// Parameters, optimiser state and step.
    pub state: TrainState,
    /// The metadata the writer stored (without `step` and `optimizer_state`, which are in
    /// `state`).
    pub metadata: BTreeMap<String, String>,
}

fn io(path: &Path) -> impl FnOnce(io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_owned(),
        source,
    }
}

fn corrupt(path: &Path, reason: impl Into<String>) -> CheckpointError {
    CheckpointError::Corrupt {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

fn mismatch(path: &Path, reason: impl Into<String>) -> CheckpointError {
    CheckpointError::Mismatch {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

fn le_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn layout_len(layout: &[ParamSpan]) -> usize {
    layout.iter().map(ParamSpan::len).sum()
}

/// The file name of the checkpoint of `step`.
fn file_name(step: u64) -> String {
    format!("{PREFIX}{step:010}{SUFFIX}")
}

/// The step of a strict checkpoint file name, `step-<ascii digits>.safetensors`.
fn parse_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(PREFIX)?.strip_suffix(SUFFIX)?;
    parse_step(digits)
}

/// A step as written: ASCII digits only (no sign, no spaces), within u64.
fn parse_step(digits: &str) -> Option<u64> {
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Serialises `state` with `layout`'s names and shapes, and `metadata`. The bytes depend only
/// on the arguments.
pub fn to_bytes(
    state: &TrainState,
    layout: &[ParamSpan],
    metadata: &BTreeMap<String, String>,
) -> Result<Vec<u8>, safetensors::SafeTensorError> {
    let total = layout_len(layout);
    for values in tensors_of(state).map(|(_, values)| values) {
        if values.len() != total {
            return Err(safetensors::SafeTensorError::InvalidTensorView(
                Dtype::F32,
                vec![total],
                values.len() * 4,
            ));
        }
    }
    let mut tensors = Vec::new();
    let mut offset = 0;
    for span in layout {
        let range = offset..offset + span.len();
        for (prefix, values) in tensors_of(state) {
            tensors.push((
                format!("{prefix}/{}", span.name),
                Dtype::F32,
                span.shape.clone(),
                le_bytes(&values[range.clone()]),
            ));
        }
        offset += span.len();
    }
    let step = state.step.to_string();
    let slots = slot_names(state).join(",");
    let mut info: BTreeMap<&str, &str> = metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    info.insert(STEP, &step);
    info.insert(SLOTS, &slots);
    serialize_sorted(&tensors, &info)
}

/// safetensors' bytes of `tensors` (name, type, shape, little-endian data) with `metadata`,
/// deterministically: safetensors keeps metadata in a `HashMap`, whose order changes from map
/// to map, so the header is written again from sorted maps.
fn serialize_sorted(
    tensors: &[(String, Dtype, Vec<usize>, Vec<u8>)],
    metadata: &BTreeMap<&str, &str>,
) -> Result<Vec<u8>, safetensors::SafeTensorError> {
    let views = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            Ok((name.as_str(), TensorView::new(*dtype, shape.clone(), data)?))
        })
        .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()?;
    // safetensors lays out the data (sorted by dtype, then name) and the tensor entries; without
    // metadata its output is already deterministic.
    let plain = safetensors::serialize(views, None)?;
    let (n, header) = SafeTensors::read_metadata(&plain)?;
    let data = &plain[N_LEN as usize + n..];
    // BTreeMaps serialise in key order whatever serde_json's features are.
    let mut json = BTreeMap::new();
    json.insert("__metadata__".to_string(), serde_json::to_value(metadata)?);
    for (name, tensor) in header.tensors() {
        json.insert(name, serde_json::to_value(tensor)?);
    }
    let mut header_bytes = serde_json::to_vec(&json)?;
    // The same 8-byte alignment padding as safetensors.
    header_bytes.resize(header_bytes.len().next_multiple_of(N_LEN as usize), b' ');
    let mut out = Vec::with_capacity(N_LEN as usize + header_bytes.len() + data.len());
    out.extend((header_bytes.len() as u64).to_le_bytes());
    out.extend(&header_bytes);
    out.extend(data);
    // Never write what safetensors would not read.
    SafeTensors::deserialize(&out)?;
    Ok(out)
}

/// `params` and each optimiser state vector, as the tensor name prefixes.
fn tensors_of(state: &TrainState) -> impl Iterator<Item = (&str, &Vec<f32>)> {
    std::iter::once(("params", &state.params)).chain(
        state
            .slots
            .iter()
            .map(|slot| (slot.name.as_str(), &slot.values)),
    )
}

fn slot_names(state: &TrainState) -> Vec<&str> {
    state.slots.iter().map(|s| s.name.as_str()).collect()
}

/// Whether `name` may name an optimiser state vector: a short lower-case identifier, not
/// `params`.
fn valid_slot_name(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name != "params"
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// The optimiser state's names as `metadata` lists them (removed from it), checked.
fn take_slots(
    metadata: &mut BTreeMap<String, String>,
    path: &Path,
) -> Result<Vec<String>, CheckpointError> {
    let text = metadata
        .remove(SLOTS)
        .unwrap_or_else(|| SLOTS_BEFORE_THE_OPTIMISER_SEAM.to_string());
    let names: Vec<String> = if text.is_empty() {
        Vec::new()
    } else {
        text.split(',').map(str::to_string).collect()
    };
    let distinct: std::collections::BTreeSet<&String> = names.iter().collect();
    if names.len() > MAX_SLOTS
        || distinct.len() != names.len()
        || !names.iter().all(|n| valid_slot_name(n))
    {
        // A hostile file's text may be long: say enough of it to recognise.
        let shown: String = text.chars().take(60).collect();
        let more = if shown.len() < text.len() { "..." } else { "" };
        return Err(corrupt(
            path,
            format!(
                "its {SLOTS} {shown:?}{more} is not a list of up to {MAX_SLOTS} distinct \
                 lower-case names other than params"
            ),
        ));
    }
    Ok(names)
}

/// A checkpoint's header, its size checked against the file's.
struct Header {
    step: u64,
    slots: Vec<String>,
    metadata: BTreeMap<String, String>,
    tensors: Metadata,
}

/// Fills `buf` from `file`. The file's size was checked first, so running out means the file
/// shrank meanwhile: damage, like a truncated file, not an I/O error.
fn read_all(
    file: &mut impl Read,
    buf: &mut [u8],
    path: &Path,
    what: &str,
) -> Result<(), CheckpointError> {
    file.read_exact(buf).map_err(|e| {
        if e.kind() == ErrorKind::UnexpectedEof {
            corrupt(path, format!("damaged: truncated while reading its {what}"))
        } else {
            io(path)(e)
        }
    })
}

/// Reads the tensors' data that follows a checked header: `needed` bytes, which the header's
/// entries must describe exactly (this follows from the checks of each tensor against the
/// model; said outright because it bounds the read).
fn read_data(
    file: &mut impl Read,
    tensors: &Metadata,
    needed: usize,
    path: &Path,
) -> Result<Vec<u8>, CheckpointError> {
    if tensors.data_len() != needed {
        return Err(mismatch(
            path,
            format!(
                "its data is {} bytes, the model needs {needed}",
                tensors.data_len()
            ),
        ));
    }
    let mut data = vec![0; needed];
    read_all(file, &mut data, path, "tensors")?;
    Ok(data)
}

/// Reads and checks the header of the open `file` of `len` bytes, leaving it positioned at the
/// data.
fn read_header_of(file: &mut impl Read, len: u64, path: &Path) -> Result<Header, CheckpointError> {
    let (tensors, mut metadata) = read_safetensors_header(file, len, path)?;
    let step = metadata
        .remove(STEP)
        .ok_or_else(|| corrupt(path, "no step in its metadata"))?;
    let step = parse_step(&step)
        .ok_or_else(|| corrupt(path, format!("its step {step:?} is not a u64")))?;
    let slots = take_slots(&mut metadata, path)?;
    Ok(Header {
        step,
        slots,
        metadata,
        tensors,
    })
}

/// Reads and checks the safetensors header of the open `file` of `len` bytes (its length
/// within safetensors' limit, the data it describes exactly the rest of the file), leaving it
/// positioned at the data: the tensors' entries and the metadata.
fn read_safetensors_header(
    file: &mut impl Read,
    len: u64,
    path: &Path,
) -> Result<(Metadata, BTreeMap<String, String>), CheckpointError> {
    if len < N_LEN {
        return Err(corrupt(
            path,
            format!("damaged: {len} bytes, too short for a safetensors header"),
        ));
    }
    let mut prefix = [0; N_LEN as usize];
    file.read_exact(&mut prefix).map_err(io(path))?;
    let n = u64::from_le_bytes(prefix);
    if n > MAX_HEADER {
        return Err(corrupt(
            path,
            format!("its header claims {n} bytes, more than safetensors' limit of {MAX_HEADER}"),
        ));
    }
    if N_LEN + n > len {
        return Err(corrupt(
            path,
            format!("damaged: its header claims {n} bytes but the file's size is {len} bytes"),
        ));
    }
    // n <= MAX_HEADER, so this fits in memory.
    let mut header = vec![0; n as usize];
    read_all(file, &mut header, path, "header")?;
    let tensors: Metadata =
        serde_json::from_slice(&header).map_err(|e| corrupt(path, format!("its header: {e}")))?;
    let described = (tensors.data_len() as u64).checked_add(N_LEN + n);
    if described != Some(len) {
        return Err(corrupt(
            path,
            format!(
                "damaged: its size is {len} bytes but its header describes {} bytes",
                described.map_or_else(|| "too many".to_string(), |d| d.to_string())
            ),
        ));
    }
    let metadata: BTreeMap<String, String> = tensors
        .metadata()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    Ok((tensors, metadata))
}

/// Reads only the header of the checkpoint at `path` and checks it and the file's size: its
/// step and metadata (without `step` and `optimizer_state`). Cheap whatever the file's size; the tensors are not read
/// (use [`load`] for that).
pub fn read_header(path: &Path) -> Result<(u64, BTreeMap<String, String>), CheckpointError> {
    let mut file = File::open(path).map_err(io(path))?;
    let len = file.metadata().map_err(io(path))?.len();
    let header = read_header_of(&mut file, len, path)?;
    Ok((header.step, header.metadata))
}

/// Reads the checkpoint at `path` and validates it as a whole: header and size, tensors against
/// `layout` (exact count, F32, shapes) before reading any data, then every value finite.
pub fn load(path: &Path, layout: &[ParamSpan]) -> Result<Checkpoint, CheckpointError> {
    let mut file = File::open(path).map_err(io(path))?;
    let len = file.metadata().map_err(io(path))?.len();
    decode(&mut file, len, path, layout)
}

/// [`load`] of a checkpoint's bytes (as [`to_bytes`] writes them) received from `source`,
/// which errors name.
pub fn from_bytes(
    bytes: &[u8],
    source: &Path,
    layout: &[ParamSpan],
) -> Result<Checkpoint, CheckpointError> {
    decode(&mut &bytes[..], bytes.len() as u64, source, layout)
}

/// [`load`] from `file`, `len` bytes long, named `path` in errors.
fn decode(
    file: &mut impl Read,
    len: u64,
    path: &Path,
    layout: &[ParamSpan],
) -> Result<Checkpoint, CheckpointError> {
    let header = read_header_of(file, len, path)?;
    if let Some(dtype) = header.metadata.get(export::EXPORT) {
        return Err(corrupt(
            path,
            format!(
                "a {dtype} export for inference, which holds no optimiser state and no \
                 master weights: eval and predict read it; training and export need a checkpoint"
            ),
        ));
    }
    let tensors = &header.tensors;
    let per_span = 1 + header.slots.len();
    let expected = per_span * layout.len();
    let found = tensors.tensors().len();
    if found != expected {
        return Err(mismatch(
            path,
            format!("{found} tensors where the model has {expected}"),
        ));
    }
    let mut ranges = Vec::with_capacity(expected);
    let prefixes: Vec<&str> = std::iter::once("params")
        .chain(header.slots.iter().map(String::as_str))
        .collect();
    for span in layout {
        for (which, prefix) in prefixes.iter().enumerate() {
            let name = format!("{prefix}/{}", span.name);
            let info = tensors
                .info(&name)
                .ok_or_else(|| mismatch(path, format!("no tensor {name}")))?;
            if info.dtype != Dtype::F32 || info.shape != span.shape {
                return Err(mismatch(
                    path,
                    format!(
                        "{name} is {:?} {:?}, the model needs F32 {:?}",
                        info.dtype, info.shape, span.shape
                    ),
                ));
            }
            ranges.push((which, name, info.data_offsets));
        }
    }
    let data = read_data(file, tensors, per_span * 4 * layout_len(layout), path)?;
    let total = layout_len(layout);
    let mut values_of: Vec<Vec<f32>> = vec![Vec::with_capacity(total); per_span];
    for (which, name, (start, end)) in ranges {
        let bytes = data
            .get(start..end)
            .ok_or_else(|| corrupt(path, format!("damaged: {name} lies outside the file")))?;
        let values: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        if values.iter().any(|v| !v.is_finite()) {
            return Err(corrupt(
                path,
                format!("damaged: tensor {name} holds a non-finite value"),
            ));
        }
        values_of[which].extend(values);
    }
    let mut values_of = values_of.into_iter();
    let state = TrainState {
        params: values_of.next().unwrap_or_default(),
        slots: header
            .slots
            .into_iter()
            .zip(values_of)
            .map(|(name, values)| Slot { name, values })
            .collect(),
        step: header.step,
    };
    Ok(Checkpoint {
        state,
        metadata: header.metadata,
    })
}

/// A temporary file in `dir` of this module's naming, `.tandem-tmp-<what>-XXXXXX`, with the
/// permissions of any file the user writes (0666 less the umask, where tempfile's default
/// 0600 would keep other users of a shared cluster from evaluating the checkpoint).
fn temp_file_in(dir: &Path, what: &str) -> io::Result<tempfile::NamedTempFile> {
    let prefix = format!("{TEMP_PREFIX}{what}-");
    let mut builder = tempfile::Builder::new();
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
    builder.prefix(&prefix).tempfile_in(dir)
}

/// The directory of `path`, `.` for a bare file name.
fn parent_of(path: &Path) -> &Path {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Writes `bytes` to `path` atomically: a temporary file in the same directory (named
/// `.tandem-tmp-...`, which [`CheckpointDir::open`] sweeps if a crash leaves it), fsync, rename,
/// fsync of the directory.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let dir = parent_of(path);
    let what = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("checkpoint");
    let mut tmp = temp_file_in(dir, what).map_err(io(dir))?;
    tmp.write_all(bytes).map_err(io(tmp.path()))?;
    tmp.as_file().sync_all().map_err(io(tmp.path()))?;
    tmp.persist(path).map_err(|e| CheckpointError::Io {
        path: path.to_owned(),
        source: e.error,
    })?;
    sync_dir(dir)
}

fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

/// The checkpoint files in `dir` by parsed step, ascending; other names are ignored.
fn scan(dir: &Path) -> Result<Vec<(u64, PathBuf)>, CheckpointError> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        if let Some(step) = entry.file_name().to_str().and_then(parse_file_name) {
            files.push((step, entry.path()));
        }
    }
    files.sort();
    Ok(files)
}

/// The newest checkpoint in `dir` that loads, fits `layout` and that `accept` accepts.
fn newest_in<E: std::fmt::Display>(
    dir: &Path,
    layout: &[ParamSpan],
    accept: impl Fn(&Checkpoint) -> Result<(), E>,
) -> Result<(PathBuf, Checkpoint, Vec<String>), CheckpointError> {
    let mut skipped = Vec::new();
    for (_, path) in scan(dir)?.into_iter().rev() {
        match load(&path, layout) {
            Ok(checkpoint) => match accept(&checkpoint) {
                Ok(()) => return Ok((path, checkpoint, skipped)),
                Err(reason) => skipped.push(format!("{}: {reason}", path.display())),
            },
            Err(e) => skipped.push(e.to_string()),
        }
    }
    Err(CheckpointError::NoneFound {
        path: dir.to_owned(),
        skipped,
    })
}

/// A checkpoint directory held by one run: the lock file `.tandem.lock` in it is locked until
/// the value is dropped (or the process dies, when the OS releases it).
#[derive(Debug)]
pub struct CheckpointDir {
    dir: PathBuf,
    /// Held for the lock; never read.
    _lock: File,
}

impl CheckpointDir {
    /// Creates `dir` if needed, locks it for this run, proves it writable (a temporary file
    /// written, synced and removed) and removes the temporary files a killed writer left there
    /// (only this module's `.tandem-tmp-` ones). Call it before training, so that a directory
    /// that cannot take checkpoints fails the run before any work is done.
    ///
    /// Fails with [`CheckpointError::Locked`] if another live run holds `dir`; the lock of a
    /// dead process is gone with it, so such a directory is taken over.
    pub fn open(dir: &Path) -> Result<Self, CheckpointError> {
        fs::create_dir_all(dir).map_err(|e| {
            let source = if dir.exists() && !dir.is_dir() {
                io::Error::new(ErrorKind::NotADirectory, "it exists and is not a directory")
            } else {
                e
            };
            CheckpointError::Io {
                path: dir.to_owned(),
                source,
            }
        })?;
        let lock_path = dir.join(LOCK_FILE);
        // Not truncated on open: until the lock is ours, the file names the holder.
        let mut lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(|e| CheckpointError::Io {
                path: lock_path.clone(),
                source: io::Error::new(e.kind(), format!("cannot create the lock file: {e}")),
            })?;
        // A process spawning a child shares the lock's open file with it until it execs, so a
        // lock this process just released can still be held for a moment: a lock naming this
        // process is tried again for a while before it counts as taken.
        let patient_until = Instant::now() + Duration::from_secs(2);
        loop {
            match lock.try_lock() {
                Ok(()) => break,
                Err(fs::TryLockError::WouldBlock)
                    if holder_pid(&lock_path) == Some(std::process::id())
                        && Instant::now() < patient_until =>
                {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(fs::TryLockError::WouldBlock) => {
                    return Err(CheckpointError::Locked {
                        path: dir.to_owned(),
                        holder: holder(&lock_path),
                    })
                }
                Err(fs::TryLockError::Error(e)) => return Err(io(&lock_path)(e)),
            }
        }
        lock.set_len(0)
            .and_then(|()| writeln!(lock, "{}", std::process::id()))
            .map_err(io(&lock_path))?;
        let this = Self {
            dir: dir.to_owned(),
            _lock: lock,
        };
        this.probe()?;
        this.sweep()?;
        Ok(this)
    }

    /// Writes, syncs and removes a temporary file: what every save will do.
    fn probe(&self) -> Result<(), CheckpointError> {
        let written = temp_file_in(&self.dir, "probe").and_then(|mut tmp| {
            tmp.write_all(b"tandem")?;
            tmp.as_file().sync_all()?;
            tmp.close()
        });
        written.map_err(|e| CheckpointError::Io {
            path: self.dir.clone(),
            source: io::Error::new(e.kind(), format!("cannot write checkpoints here: {e}")),
        })
    }

    /// Removes the temporary files of this module's naming: with the lock held, no writer of
    /// ours is alive to own them.
    fn sweep(&self) -> Result<(), CheckpointError> {
        for entry in fs::read_dir(&self.dir).map_err(io(&self.dir))? {
            let entry = entry.map_err(io(&self.dir))?;
            let ours = entry
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(TEMP_PREFIX));
            if ours && entry.file_type().is_ok_and(|t| t.is_file()) {
                remove(&entry.path())?;
            }
        }
        Ok(())
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The checkpoint files (`step-<digits>.safetensors`) by parsed step, ascending; other
    /// names are ignored. Nothing is read: a listed file may still be damaged.
    pub fn checkpoints(&self) -> Result<Vec<(u64, PathBuf)>, CheckpointError> {
        scan(&self.dir)
    }

    /// Saves `state` atomically as `step-NNNNNNNNNN.safetensors` and returns its path, then
    /// rotates: keeps `keep` checkpoints of this run in total, counting the new one (`keep` of
    /// 0 keeps everything).
    ///
    /// Rotation deletes only older checkpoints of this run: a file whose step, parsed from its
    /// name, is below the new one; that loads whole against `layout`; and whose metadata has
    /// the new file's value for every key in `identity` (a key missing on either side means
    /// another run's; `step` is never part of the metadata compared). Files of other runs,
    /// other names, newer steps and damaged files (which cannot be told to be this run's) are
    /// left alone and take no keep slot.
    ///
    /// A state with a non-finite value is not written ([`CheckpointError::Corrupt`]): it would
    /// not load, and rotation would make room for it.
    pub fn save(
        &self,
        state: &TrainState,
        layout: &[ParamSpan],
        metadata: &BTreeMap<String, String>,
        keep: usize,
        identity: &[&str],
    ) -> Result<PathBuf, CheckpointError> {
        let path = self.dir.join(file_name(state.step));
        let total = layout_len(layout);
        if let Some((prefix, values)) = tensors_of(state).find(|(_, v)| v.len() != total) {
            return Err(mismatch(
                &path,
                format!(
                    "the state's {prefix} has {} values, the layout {total}",
                    values.len()
                ),
            ));
        }
        if let Some(name) = slot_names(state).into_iter().find(|n| !valid_slot_name(n)) {
            return Err(mismatch(
                &path,
                format!("the optimiser state {name:?} needs a lower-case name other than params"),
            ));
        }
        let mut offset = 0;
        for span in layout {
            let range = offset..offset + span.len();
            for (prefix, values) in tensors_of(state) {
                if values[range.clone()].iter().any(|v| !v.is_finite()) {
                    return Err(corrupt(
                        &path,
                        format!(
                            "not written, the state is damaged: tensor {prefix}/{} holds a \
                             non-finite value",
                            span.name
                        ),
                    ));
                }
            }
            offset = range.end;
        }
        let bytes = to_bytes(state, layout, metadata).map_err(|e| corrupt(&path, e.to_string()))?;
        write_atomically(&path, &bytes)?;
        if keep > 0 {
            self.rotate(state.step, &path, layout, metadata, keep, identity)?;
        }
        Ok(path)
    }

    fn rotate(
        &self,
        step: u64,
        new: &Path,
        layout: &[ParamSpan],
        metadata: &BTreeMap<String, String>,
        keep: usize,
        identity: &[&str],
    ) -> Result<(), CheckpointError> {
        let mut own = Vec::new();
        for (old_step, old) in self.checkpoints()? {
            if old_step >= step || old == new {
                continue;
            }
            // The header first: cheap, and enough to pass over other runs' files.
            let Ok((_, old_metadata)) = read_header(&old) else {
                continue;
            };
            let same = identity.iter().all(|key| {
                matches!((old_metadata.get(*key), metadata.get(*key)), (Some(a), Some(b)) if a == b)
            });
            if same && load(&old, layout).is_ok() {
                own.push(old);
            }
        }
        // `own` is ascending by step: the oldest go.
        let excess = own.len().saturating_sub(keep - 1);
        for old in &own[..excess] {
            remove(old)?;
        }
        if excess > 0 {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// The newest checkpoint by parsed step that loads whole against `layout` and that `accept`
    /// accepts (e.g. its metadata is this run's), with one line per newer file skipped, naming
    /// it and why.
    pub fn load_newest<E: std::fmt::Display>(
        &self,
        layout: &[ParamSpan],
        accept: impl Fn(&Checkpoint) -> Result<(), E>,
    ) -> Result<(PathBuf, Checkpoint, Vec<String>), CheckpointError> {
        newest_in(&self.dir, layout, accept)
    }
}

/// The pid the holder of a lock wrote into it.
fn holder_pid(lock_path: &Path) -> Option<u32> {
    fs::read_to_string(lock_path)
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
}

/// Removes a file of the locked directory; one already gone (removed by hand meanwhile) is
/// what was wanted.
fn remove(path: &Path) -> Result<(), CheckpointError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(io(path)(e)),
        _ => Ok(()),
    }
}

/// Who holds a lock, from the pid its holder wrote.
fn holder(lock_path: &Path) -> String {
    holder_pid(lock_path).map_or_else(
        || "an unknown process".to_string(),
        |pid| format!("process {pid}"),
    )
}

/// Saves `state` into `dir` through a [`CheckpointDir`] opened for this one save, with every
/// metadata key but `end_step` as the run's identity. Returns the new file's path.
pub fn save_in_dir(
    dir: &Path,
    state: &TrainState,
    layout: &[ParamSpan],
    metadata: &BTreeMap<String, String>,
    keep: usize,
) -> Result<PathBuf, CheckpointError> {
    let identity: Vec<&str> = metadata
        .keys()
        .map(String::as_str)
        .filter(|k| *k != END_STEP)
        .collect();
    CheckpointDir::open(dir)?.save(state, layout, metadata, keep, &identity)
}

/// The checkpoint files in `dir`, oldest (by parsed step) first.
pub fn list(dir: &Path) -> Result<Vec<PathBuf>, CheckpointError> {
    Ok(scan(dir)?.into_iter().map(|(_, p)| p).collect())
}

/// The newest checkpoint in `dir` that loads whole, fits `layout` and that `accept` accepts,
/// with the reasons the newer ones were skipped. Takes no lock: it only reads (a run resuming
/// from another run's directory, which may be read-only).
pub fn load_newest<E: std::fmt::Display>(
    dir: &Path,
    layout: &[ParamSpan],
    accept: impl Fn(&Checkpoint) -> Result<(), E>,
) -> Result<(PathBuf, Checkpoint, Vec<String>), CheckpointError> {
    newest_in(dir, layout, accept)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_parse_strictly() {
        assert_eq!(parse_file_name("step-0000000042.safetensors"), Some(42));
        assert_eq!(
            parse_file_name("step-10000000000.safetensors"),
            Some(10_000_000_000)
        );
        assert_eq!(parse_file_name(&file_name(u64::MAX)), Some(u64::MAX));
        for name in [
            "step-best.safetensors",
            "step-.safetensors",
            "step-+42.safetensors",
            "step- 42.safetensors",
            "step-42.safetensors.tmp",
            "step-99999999999999999999.safetensors",
            ".step-42.safetensors",
        ] {
            assert_eq!(parse_file_name(name), None, "{name}");
        }
    }

    #[test]
    fn temporary_files_carry_the_swept_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let tmp = temp_file_in(dir.path(), "step-0000000001.safetensors").unwrap();
        let name = tmp.path().file_name().unwrap().to_str().unwrap().to_owned();
        assert!(name.starts_with(TEMP_PREFIX), "{name}");
        // A crash leaves such a file: the next open sweeps it.
        tmp.keep().unwrap();
        drop(CheckpointDir::open(dir.path()).unwrap());
        assert!(!dir.path().join(&name).exists());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn files_follow_the_umask_like_any_other_the_user_writes() {
        use std::os::unix::fs::PermissionsExt;
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let umask = status
            .lines()
            .find_map(|line| line.strip_prefix("Umask:"))
            .map(|mask| u32::from_str_radix(mask.trim(), 8).unwrap())
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let tmp = temp_file_in(dir.path(), "probe").unwrap();
        let mode = tmp.as_file().metadata().unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o666 & !umask, "{mode:o} under umask {umask:o}");
    }
}
