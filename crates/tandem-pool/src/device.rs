use std::fmt;
use std::str::FromStr;

/// One place a replica runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    /// A CPU worker: one thread, one core.
    Cpu {
        /// Which CPU worker (0-based).
        worker: usize,
    },
    /// A CUDA GPU (several replicas may share one).
    Cuda {
        /// The GPU's ordinal.
        ordinal: usize,
    },
    /// A simulated worker: a CPU replica that takes turns with the pool's other simulated
    /// workers, so that together they behave as that many equally fast, truly parallel workers
    /// on any machine (the strategies say how), at one core's speed.
    Sim {
        /// Which simulated worker (0-based).
        worker: usize,
    },
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu { worker } => write!(f, "cpu:{worker}"),
            Device::Cuda { ordinal } => write!(f, "cuda:{ordinal}"),
            Device::Sim { worker } => write!(f, "sim:{worker}"),
        }
    }
}

/// The most CPU workers or replicas of one GPU a specification may ask for: each replica holds
/// its own buffers (several MB for MNIST), so a typo such as `cpu:5000` would otherwise
/// allocate gigabytes before anything is said.
pub const MAX_REPLICAS: usize = 256;

/// What `--devices` asked for, before it is checked against the machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSpec {
    /// Every GPU when there are any, else one CPU worker per core.
    Auto,
    /// This many CPU workers.
    Cpu(usize),
    /// GPUs by ordinal, each with a number of replicas (`cuda:0,1` or `cuda:0x4`).
    Cuda(Vec<(usize, usize)>),
    /// This many simulated workers ([`Device::Sim`]).
    Sim(usize),
}

/// A device specification that cannot be parsed or opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// The text is not a device specification.
    #[error(
        "invalid device specification {spec:?}: {reason} \
         (expected auto, cpu:N, sim:N, cuda, cuda:0,1 or cuda:0x4)"
    )]
    Invalid {
        /// The text given.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// CUDA devices were asked for but this build has no CUDA support.
    #[error(
        "{spec:?} asks for CUDA devices, but this binary was built without CUDA; \
         rebuild with `--features cuda` or use cpu:N"
    )]
    BuiltWithoutCuda {
        /// The text given.
        spec: String,
    },
    /// A GPU ordinal that the machine does not have.
    #[error("there is no CUDA device {ordinal}: this machine has {available}")]
    NoSuchGpu {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many GPUs there are.
        available: usize,
    },
    /// The CUDA driver could not be asked.
    #[error("cannot enumerate CUDA devices: {0}")]
    Cuda(#[source] DriverError),
}

/// Why the CUDA driver is present but unusable: the caller's error (the pool knows no CUDA
/// types), shared so that a [`GpuCount`] can be cloned and compared (by its message).
#[derive(Debug, Clone, thiserror::Error)]
#[error(transparent)]
pub struct DriverError(std::sync::Arc<dyn std::error::Error + Send + Sync>);

impl DriverError {
    /// The driver's error `why`.
    pub fn new(why: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(std::sync::Arc::new(why))
    }
}

impl PartialEq for DriverError {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_string() == other.0.to_string()
    }
}

impl Eq for DriverError {}

/// How many CUDA GPUs the machine has, as the caller found out: the pool knows no CUDA, so
/// whoever can ask the driver (a binary built with CUDA support) answers for it. A resolution
/// asks only when the specification needs it (`auto`, `cuda...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuCount {
    /// This build has no CUDA support: `cuda` specifications answer "built without CUDA", and
    /// `auto` means CPU workers.
    NoCuda,
    /// What the CUDA driver said: `Ok(n)` GPUs (0 where there is no driver or no device), or
    /// why the driver is present but unusable.
    Driver(Result<usize, DriverError>),
}

impl FromStr for DeviceSpec {
    type Err = DeviceError;

    fn from_str(text: &str) -> Result<Self, DeviceError> {
        let invalid = |reason: &str| DeviceError::Invalid {
            spec: text.to_owned(),
            reason: reason.to_owned(),
        };
        let count = |n: &str, what: &str| -> Result<usize, DeviceError> {
            n.trim()
                .parse::<usize>()
                .map_err(|_| invalid(&format!("{n:?} is not a {what}")))
        };
        let bounded = |n: &str, what: &str| -> Result<usize, DeviceError> {
            match count(n, what)? {
                n if n > MAX_REPLICAS => Err(invalid(&format!(
                    "{n} is more than the {MAX_REPLICAS} replicas a specification may ask for"
                ))),
                n => Ok(n),
            }
        };
        match text.trim() {
            "auto" => Ok(DeviceSpec::Auto),
            "cpu" => Ok(DeviceSpec::Cpu(1)),
            "sim" => Ok(DeviceSpec::Sim(1)),
            "cuda" => Ok(DeviceSpec::Cuda(Vec::new())),
            t => {
                if let Some(n) = t.strip_prefix("cpu:") {
                    match bounded(n, "worker count")? {
                        0 => Err(invalid("at least one CPU worker is needed")),
                        n => Ok(DeviceSpec::Cpu(n)),
                    }
                } else if let Some(n) = t.strip_prefix("sim:") {
                    match bounded(n, "worker count")? {
                        0 => Err(invalid("at least one simulated worker is needed")),
                        n => Ok(DeviceSpec::Sim(n)),
                    }
                } else if let Some(list) = t.strip_prefix("cuda:") {
                    let gpus = list
                        .split(',')
                        .map(|item| match item.split_once('x') {
                            Some((ordinal, replicas)) => {
                                let replicas = bounded(replicas, "replica count")?;
                                if replicas == 0 {
                                    return Err(invalid("a GPU needs at least one replica"));
                                }
                                Ok((count(ordinal, "GPU ordinal")?, replicas))
                            }
                            None => Ok((count(item, "GPU ordinal")?, 1)),
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    let total: usize = gpus.iter().map(|&(_, r)| r).sum();
                    if total > MAX_REPLICAS {
                        return Err(invalid(&format!(
                            "{total} replicas in all is more than {MAX_REPLICAS}"
                        )));
                    }
                    Ok(DeviceSpec::Cuda(gpus))
                } else {
                    Err(invalid("unknown device kind"))
                }
            }
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Auto => write!(f, "auto"),
            DeviceSpec::Cpu(n) => write!(f, "cpu:{n}"),
            DeviceSpec::Sim(n) => write!(f, "sim:{n}"),
            DeviceSpec::Cuda(gpus) if gpus.is_empty() => write!(f, "cuda"),
            DeviceSpec::Cuda(gpus) => {
                let items: Vec<String> = gpus
                    .iter()
                    .map(|&(o, r)| {
                        if r == 1 {
                            o.to_string()
                        } else {
                            format!("{o}x{r}")
                        }
                    })
                    .collect();
                write!(f, "cuda:{}", items.join(","))
            }
        }
    }
}

/// `n` CPU workers.
fn cpus(n: usize) -> Vec<Device> {
    (0..n).map(|worker| Device::Cpu { worker }).collect()
}

/// What `auto` resolves to, given what asking the driver for GPUs gave and the number of cores,
/// and why it fell back to CPU workers when the driver is there but failed.
fn auto(gpus: GpuCount, cores: usize) -> (Vec<Device>, Option<String>) {
    match gpus {
        GpuCount::Driver(Ok(gpus)) if gpus > 0 => (
            (0..gpus).map(|ordinal| Device::Cuda { ordinal }).collect(),
            None,
        ),
        // No GPU, no driver, or a build without CUDA: CPU workers, as expected.
        GpuCount::Driver(Ok(_)) | GpuCount::NoCuda => (cpus(cores), None),
        GpuCount::Driver(Err(why)) => (
            cpus(cores),
            Some(format!(
                "CUDA driver present but unusable ({why}): training on CPU"
            )),
        ),
    }
}

impl DeviceSpec {
    /// The devices this specification names on this machine, one per replica
    /// ([`resolve_noting`](Self::resolve_noting) without the note). `gpus` is called only by
    /// specifications that need the number of GPUs.
    pub fn resolve(&self, gpus: impl FnOnce() -> GpuCount) -> Result<Vec<Device>, DeviceError> {
        self.resolve_noting(gpus, |_| {})
    }

    /// The devices this specification names on this machine, one per replica, where `gpus`
    /// says how many CUDA GPUs there are (called only by `auto` and `cuda` specifications).
    /// When `auto` falls back to CPU workers although a CUDA driver is there, because it failed
    /// with something other than "no device" (a GPU in exclusive-process mode that another
    /// process holds, a driver older than the kernels, a broken install), `note` is given the
    /// line to tell the user: `CUDA driver present but unusable (...): training on CPU`.
    pub fn resolve_noting(
        &self,
        gpus: impl FnOnce() -> GpuCount,
        note: impl FnOnce(&str),
    ) -> Result<Vec<Device>, DeviceError> {
        let asked = match self {
            DeviceSpec::Cpu(n) => return Ok(cpus(*n)),
            DeviceSpec::Sim(n) => {
                return Ok((0..*n).map(|worker| Device::Sim { worker }).collect())
            }
            DeviceSpec::Auto => {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                let (devices, why) = auto(gpus(), cores);
                if let Some(why) = why {
                    note(&why);
                }
                return Ok(devices);
            }
            DeviceSpec::Cuda(asked) => asked,
        };
        let available = match gpus() {
            GpuCount::NoCuda => {
                return Err(DeviceError::BuiltWithoutCuda {
                    spec: self.to_string(),
                })
            }
            GpuCount::Driver(count) => count.map_err(DeviceError::Cuda)?,
        };
        if asked.is_empty() {
            return match available {
                0 => Err(DeviceError::NoSuchGpu {
                    ordinal: 0,
                    available,
                }),
                n => Ok((0..n).map(|ordinal| Device::Cuda { ordinal }).collect()),
            };
        }
        let mut devices = Vec::new();
        for &(ordinal, replicas) in asked {
            if ordinal >= available {
                return Err(DeviceError::NoSuchGpu { ordinal, available });
            }
            devices.extend(std::iter::repeat_n(Device::Cuda { ordinal }, replicas));
        }
        Ok(devices)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form() {
        assert_eq!("auto".parse(), Ok(DeviceSpec::Auto));
        assert_eq!("cpu:4".parse(), Ok(DeviceSpec::Cpu(4)));
        assert_eq!("cpu".parse(), Ok(DeviceSpec::Cpu(1)));
        assert_eq!("sim:64".parse(), Ok(DeviceSpec::Sim(64)));
        assert_eq!(
            "cuda:0,1".parse(),
            Ok(DeviceSpec::Cuda(vec![(0, 1), (1, 1)]))
        );
        assert_eq!("cuda:0x4".parse(), Ok(DeviceSpec::Cuda(vec![(0, 4)])));
        assert_eq!(
            "cuda:0x2,1".parse(),
            Ok(DeviceSpec::Cuda(vec![(0, 2), (1, 1)]))
        );
        assert_eq!("cuda".parse(), Ok(DeviceSpec::Cuda(vec![])));
    }

    #[test]
    fn display_round_trips() {
        for text in [
            "auto",
            "cpu:3",
            "sim:16",
            "cuda",
            "cuda:0,1",
            "cuda:0x4",
            "cuda:1x2,3",
        ] {
            assert_eq!(text.parse::<DeviceSpec>().unwrap().to_string(), text);
        }
    }

    #[test]
    fn rejects_malformed_specs_with_a_reason() {
        for bad in [
            "cpu:0",
            "cpu:-1",
            "cpu:x",
            "gpu:0",
            "cuda:0x0",
            "cuda:a",
            "cuda:0,",
            "",
            "cpu:257",
            "cpu:5000",
            "sim:0",
            "sim:257",
            "sim:x",
            "cuda:0x1000",
            "cuda:0x200,1x200",
        ] {
            let err = bad.parse::<DeviceSpec>().unwrap_err();
            assert!(matches!(err, DeviceError::Invalid { .. }), "{bad}: {err}");
            assert!(err.to_string().contains("expected auto"), "{err}");
        }
    }

    /// A driver that failed with `why`.
    fn broken(why: &str) -> DriverError {
        DriverError::new(std::io::Error::other(why.to_owned()))
    }

    /// The most replicas a specification may ask for, asked for every way.
    #[test]
    fn exactly_the_most_replicas_is_accepted() {
        assert_eq!("cpu:256".parse(), Ok(DeviceSpec::Cpu(MAX_REPLICAS)));
        assert_eq!("sim:256".parse(), Ok(DeviceSpec::Sim(MAX_REPLICAS)));
        let split = DeviceSpec::Cuda(vec![(0, 128), (1, 128)]);
        assert_eq!("cuda:0x128,1x128".parse(), Ok(split));
        assert_eq!("cuda:0x256".parse(), Ok(DeviceSpec::Cuda(vec![(0, 256)])));
    }

    #[test]
    fn driver_errors_are_equal_when_their_messages_are() {
        assert_eq!(broken("no context"), broken("no context"));
        assert_ne!(broken("no context"), broken("out of memory"));
    }

    #[test]
    fn auto_says_why_it_falls_back_to_the_cpu_only_when_the_driver_is_broken() {
        let cuda = |ordinal| Device::Cuda { ordinal };
        assert_eq!(
            auto(GpuCount::Driver(Ok(2)), 4),
            (vec![cuda(0), cuda(1)], None)
        );
        for quiet in [GpuCount::Driver(Ok(0)), GpuCount::NoCuda] {
            assert_eq!(auto(quiet, 3), (cpus(3), None));
        }
        let why = "initialising the CUDA driver: CUDA error 46";
        let expected = "CUDA driver present but unusable (initialising the CUDA driver: CUDA \
                        error 46): training on CPU";
        let (devices, note) = auto(GpuCount::Driver(Err(broken(why))), 2);
        assert_eq!(devices, cpus(2));
        assert_eq!(note.as_deref(), Some(expected));
        // resolve_noting passes the note on.
        let mut told = None;
        let devices = DeviceSpec::Auto
            .resolve_noting(
                || GpuCount::Driver(Err(broken(why))),
                |n| told = Some(n.to_owned()),
            )
            .unwrap();
        assert!(devices.iter().all(|d| matches!(d, Device::Cpu { .. })));
        assert_eq!(told.as_deref(), Some(expected));
        // Nothing to say for specs other than auto.
        let mut told = 0;
        DeviceSpec::Cpu(2)
            .resolve_noting(|| GpuCount::Driver(Err(broken(why))), |_| told += 1)
            .unwrap();
        assert_eq!(told, 0);
    }

    /// Where the caller counts GPUs, `auto` and `cuda` resolve to them, without a note, and
    /// `cuda:N` and `cuda:NxR` to the ones asked for.
    #[test]
    fn auto_and_cuda_resolve_to_the_gpus_the_caller_counts() {
        let two = || GpuCount::Driver(Ok(2));
        let mut note = None;
        let auto = DeviceSpec::Auto
            .resolve_noting(two, |n| note = Some(n.to_owned()))
            .unwrap();
        assert_eq!(note, None);
        let cuda = |ordinal| Device::Cuda { ordinal };
        assert_eq!(auto, vec![cuda(0), cuda(1)]);
        assert_eq!(DeviceSpec::Cuda(vec![]).resolve(two).unwrap(), auto);
        let spec = "cuda:1x2,0".parse::<DeviceSpec>().unwrap();
        assert_eq!(spec.resolve(two).unwrap(), vec![cuda(1), cuda(1), cuda(0)]);
        assert_eq!(
            "cuda:2".parse::<DeviceSpec>().unwrap().resolve(two),
            Err(DeviceError::NoSuchGpu {
                ordinal: 2,
                available: 2
            })
        );
        let none = || GpuCount::Driver(Ok(0));
        assert_eq!(
            DeviceSpec::Cuda(vec![]).resolve(none),
            Err(DeviceError::NoSuchGpu {
                ordinal: 0,
                available: 0
            })
        );
        let failing = || GpuCount::Driver(Err(broken("counting CUDA devices: CUDA error 999")));
        let err = DeviceSpec::Cuda(vec![(0, 1)]).resolve(failing).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot enumerate CUDA devices: counting CUDA devices: CUDA error 999"
        );
    }

    #[test]
    fn cpu_and_auto_resolve_to_cpu_workers_without_gpus() {
        // A CPU specification never asks for the GPUs.
        let devices = DeviceSpec::Cpu(2)
            .resolve(|| panic!("cpu:2 asked for the GPU count"))
            .unwrap();
        assert_eq!(
            devices,
            vec![Device::Cpu { worker: 0 }, Device::Cpu { worker: 1 }]
        );
        let sims = DeviceSpec::Sim(3)
            .resolve(|| panic!("sim:3 asked for the GPU count"))
            .unwrap();
        assert_eq!(
            sims,
            (0..3)
                .map(|worker| Device::Sim { worker })
                .collect::<Vec<_>>()
        );
        assert_eq!(sims[2].to_string(), "sim:2");
        assert!(!DeviceSpec::Auto
            .resolve(|| GpuCount::NoCuda)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn cuda_specs_say_built_without_cuda() {
        let err = "cuda:0x4"
            .parse::<DeviceSpec>()
            .unwrap()
            .resolve(|| GpuCount::NoCuda)
            .unwrap_err();
        assert_eq!(
            err,
            DeviceError::BuiltWithoutCuda {
                spec: "cuda:0x4".into()
            }
        );
        assert!(err.to_string().contains("built without CUDA"));
    }
}
