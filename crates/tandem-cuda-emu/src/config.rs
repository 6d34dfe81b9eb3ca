//! The driver's configuration: environment variables read once, at `cuInit`.

use crate::codes::{CUresult, CUDA_ERROR_INVALID_VALUE};

/// What `cuInit` read from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `TANDEM_EMU_DEVICES`: how many devices (default 2; 0 makes `cuInit` fail with
    /// `CUDA_ERROR_NO_DEVICE`, like a machine without GPUs).
    pub devices: usize,
    /// `TANDEM_EMU_DRIVER_VERSION`: the CUDA version `cuDriverGetVersion` reports, as
    /// `1000 * major + 10 * minor` (default 13000, CUDA 13.0). PTX newer than it is refused.
    pub driver_version: u32,
    /// `TANDEM_EMU_CAPABILITY`: the compute capability every device reports, as
    /// `10 * major + minor` (default 90, an H100/H200). PTX for a newer target is refused.
    pub capability: u32,
    /// `TANDEM_EMU_MEMORY`: bytes of memory per device (default 16 GiB).
    pub memory: u64,
    /// `TANDEM_EMU_THREADS`: host threads per kernel launch (default: available parallelism).
    pub threads: usize,
    /// `TANDEM_EMU_STATS`: where to write the statistics JSON at process exit, if anywhere
    /// (`%p` in it: the process id).
    pub stats: Option<String>,
    /// `TANDEM_EMU_RACECHECK`: `1` checks every launch's shared memory for data races (a race
    /// fails the launch with `CUDA_ERROR_LAUNCH_FAILED`); `0` or unset: off.
    pub race_check: bool,
}

impl Config {
    /// Reads the configuration from the environment. An invalid value is reported on stderr,
    /// naming the variable, and fails with `CUDA_ERROR_INVALID_VALUE`.
    pub fn from_env() -> Result<Config, CUresult> {
        Config::from_lookup(|name| std::env::var(name).ok())
    }

    /// [`from_env`](Self::from_env) with the variables looked up by `lookup` (for tests).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config, CUresult> {
        let parallelism = std::thread::available_parallelism().map_or(1, |n| n.get());
        let devices = number(&lookup, "TANDEM_EMU_DEVICES", 2, 0, 64)?;
        let driver_version = number(&lookup, "TANDEM_EMU_DRIVER_VERSION", 13000, 1000, 99990)?;
        // From Maxwell (the oldest GPUs CUDA 13.0's driver, R580, still runs) to the Hopper the
        // interpreter is.
        let capability = number(&lookup, "TANDEM_EMU_CAPABILITY", 90, 50, 90)?;
        let memory = number(&lookup, "TANDEM_EMU_MEMORY", 16 << 30, 1, 1 << 40)?;
        let threads = number(&lookup, "TANDEM_EMU_THREADS", parallelism as u64, 1, 1024)?;
        let stats = lookup("TANDEM_EMU_STATS").filter(|path| !path.is_empty());
        let race_check = match lookup("TANDEM_EMU_RACECHECK").as_deref().map(str::trim) {
            None | Some("0") => false,
            Some("1") => true,
            Some(text) => {
                eprintln!(
                    "tandem-cuda-emu: TANDEM_EMU_RACECHECK={text:?} is invalid: expected 0 or 1"
                );
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
        };
        Ok(Config {
            devices: devices as usize,
            driver_version: driver_version as u32,
            capability: capability as u32,
            memory,
            threads: threads as usize,
            stats,
            race_check,
        })
    }
}

/// The integer in variable `name`, `default` when unset, in `min..=max`.
fn number(
    lookup: &impl Fn(&str) -> Option<String>,
    name: &str,
    default: u64,
    min: u64,
    max: u64,
) -> Result<u64, CUresult> {
    let Some(text) = lookup(name) else {
        return Ok(default);
    };
    match text.trim().parse::<u64>() {
        Ok(value) if (min..=max).contains(&value) => Ok(value),
        _ => {
            eprintln!(
                "tandem-cuda-emu: {name}={text:?} is invalid: expected an integer from {min} to {max}"
            );
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_invalid_values() {
        let config = Config::from_lookup(|_| None).unwrap();
        assert_eq!(config.devices, 2);
        assert_eq!(config.driver_version, 13000);
        assert_eq!(config.memory, 16 << 30);
        assert!(config.threads >= 1);
        // `name` set to `v`, nothing else.
        let with = |name: &'static str, v: &str| {
            let v = v.to_string();
            Config::from_lookup(move |asked| (asked == name).then(|| v.clone()))
        };
        assert_eq!(
            with("TANDEM_EMU_THREADS", "x"),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(with("TANDEM_EMU_DEVICES", "0").unwrap().devices, 0);
        assert!(!config.race_check);
        let on = |v: &str| with("TANDEM_EMU_RACECHECK", v);
        assert!(on("1").unwrap().race_check);
        assert!(!on("0").unwrap().race_check);
        assert_eq!(on("yes"), Err(CUDA_ERROR_INVALID_VALUE));
        assert_eq!(on("2"), Err(CUDA_ERROR_INVALID_VALUE));
        // Each number within its range, ends included, and nothing past them.
        assert_eq!(
            with("TANDEM_EMU_DRIVER_VERSION", "99990")
                .unwrap()
                .driver_version,
            99990
        );
        assert_eq!(
            with("TANDEM_EMU_DRIVER_VERSION", "1000")
                .unwrap()
                .driver_version,
            1000
        );
        assert_eq!(
            with("TANDEM_EMU_DRIVER_VERSION", "999"),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(with("TANDEM_EMU_MEMORY", " 4096 ").unwrap().memory, 4096);
        assert_eq!(
            with("TANDEM_EMU_MEMORY", "0"),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(
            with("TANDEM_EMU_THREADS", "1025"),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        // An empty statistics path is none; any other is kept as given.
        assert_eq!(with("TANDEM_EMU_STATS", "").unwrap().stats, None);
        let named = with("TANDEM_EMU_STATS", "/tmp/s-%p.json").unwrap().stats;
        assert_eq!(named.as_deref(), Some("/tmp/s-%p.json"));
    }
}
