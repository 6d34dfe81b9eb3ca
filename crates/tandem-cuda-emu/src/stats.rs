//! Counters of what the driver did, written as JSON at process exit when `TANDEM_EMU_STATS`
//! names a file (so tests and CI can check that work really ran on the stand-in driver).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use tandem_ptx::Profile;

/// Counters of one stream (or, summed, of the whole process).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Kernels launched directly on the stream.
    pub kernel_launches: u64,
    /// Graph executions launched on the stream.
    pub graph_launches: u64,
    /// Kernels that ran inside those graphs.
    pub graph_kernels: u64,
    /// Bytes copied host to device.
    pub bytes_htod: u64,
    /// Bytes copied device to host.
    pub bytes_dtoh: u64,
    /// Bytes copied device to device on one device.
    pub bytes_dtod: u64,
    /// Bytes copied between devices.
    pub bytes_peer: u64,
    /// `cuStreamSynchronize` calls.
    pub stream_synchronizations: u64,
    /// Bytes set by memsets.
    pub bytes_memset: u64,
    /// Copies that ran inside graphs (nodes of the graphs launched).
    pub graph_copies: u64,
    /// Memsets that ran inside graphs.
    pub graph_memsets: u64,
    /// Calls of the host that queued work on the stream (a launch, a copy, a memset, a graph
    /// launch, an event's record or wait), capturing or not: what the host spends on a step.
    pub stream_calls: u64,
}

impl Counts {
    fn add(&mut self, other: &Counts) {
        self.kernel_launches += other.kernel_launches;
        self.graph_launches += other.graph_launches;
        self.graph_kernels += other.graph_kernels;
        self.bytes_htod += other.bytes_htod;
        self.bytes_dtoh += other.bytes_dtoh;
        self.bytes_dtod += other.bytes_dtod;
        self.bytes_peer += other.bytes_peer;
        self.stream_synchronizations += other.stream_synchronizations;
        self.bytes_memset += other.bytes_memset;
        self.graph_copies += other.graph_copies;
        self.graph_memsets += other.graph_memsets;
        self.stream_calls += other.stream_calls;
    }

    fn json(&self, out: &mut String) {
        let _ = write!(
            out,
            "\"kernel_launches\": {}, \"graph_launches\": {}, \"graph_kernels\": {}, \
             \"bytes_htod\": {}, \"bytes_dtoh\": {}, \"bytes_dtod\": {}, \"bytes_peer\": {}, \
             \"stream_synchronizations\": {}, \"bytes_memset\": {}, \"graph_copies\": {}, \
             \"graph_memsets\": {}, \"stream_calls\": {}",
            self.kernel_launches,
            self.graph_launches,
            self.graph_kernels,
            self.bytes_htod,
            self.bytes_dtoh,
            self.bytes_dtod,
            self.bytes_peer,
            self.stream_synchronizations,
            self.bytes_memset,
            self.graph_copies,
            self.graph_memsets,
            self.stream_calls
        );
    }
}

/// Process-wide statistics.
#[derive(Debug, Default)]
pub struct Stats {
    /// Per stream, by stream handle (the legacy NULL streams of contexts included).
    pub streams: BTreeMap<u64, (usize, Counts)>,
    /// `cuCtxSynchronize` calls.
    pub context_synchronizations: u64,
    /// `cuEventSynchronize` calls.
    pub event_synchronizations: u64,
    /// Device allocations made.
    pub allocations: u64,
    /// Bytes of those allocations.
    pub allocation_bytes: u64,
    /// What each kernel did, by name, summed over its launches (directly and in graphs).
    pub kernels: BTreeMap<String, KernelCounts>,
}

/// What one kernel's launches did, summed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KernelCounts {
    /// Launches that completed.
    pub launches: u64,
    /// What their threads did.
    pub profile: Profile,
}

/// The statistics of this process.
pub static STATS: Mutex<Stats> = Mutex::new(Stats {
    streams: BTreeMap::new(),
    context_synchronizations: 0,
    event_synchronizations: 0,
    allocations: 0,
    allocation_bytes: 0,
    kernels: BTreeMap::new(),
});

/// Runs `f` on the statistics (a poisoned lock is still usable: counters cannot be left
/// inconsistent in a way that matters).
pub fn with<R>(f: impl FnOnce(&mut Stats) -> R) -> R {
    let mut stats = STATS.lock().unwrap_or_else(|poison| poison.into_inner());
    f(&mut stats)
}

/// Updates the counters of stream `stream` on `device`.
pub fn stream(stream: u64, device: usize, f: impl FnOnce(&mut Counts)) {
    with(|stats| {
        f(&mut stats
            .streams
            .entry(stream)
            .or_insert((device, Counts::default()))
            .1)
    });
}

/// Adds a completed launch of kernel `name` that did `profile`.
pub fn kernel(name: &str, profile: &Profile) {
    with(|stats| {
        let counts = match stats.kernels.get_mut(name) {
            Some(counts) => counts,
            None => stats.kernels.entry(name.to_owned()).or_default(),
        };
        counts.launches += 1;
        counts.profile += *profile;
    })
}

/// The statistics as a JSON object.
pub fn to_json(devices: usize, driver_version: u32) -> String {
    with(|stats| {
        let mut totals = Counts::default();
        for (_, counts) in stats.streams.values() {
            totals.add(counts);
        }
        let mut out = String::from("{\n");
        let _ = writeln!(out, "  \"devices\": {devices},");
        let _ = writeln!(out, "  \"driver_version\": {driver_version},");
        out.push_str("  \"totals\": {");
        totals.json(&mut out);
        let _ = write!(
            out,
            ", \"context_synchronizations\": {}, \"event_synchronizations\": {}, \
             \"allocations\": {}, \"allocation_bytes\": {}}},\n  \"streams\": {{",
            stats.context_synchronizations,
            stats.event_synchronizations,
            stats.allocations,
            stats.allocation_bytes
        );
        for (i, (id, (device, counts))) in stats.streams.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            let _ = write!(out, "{sep}\n    \"{id}\": {{\"device\": {device}, ");
            counts.json(&mut out);
            out.push('}');
        }
        out.push_str("\n  },\n  \"kernels\": {");
        for (i, (name, k)) in stats.kernels.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            let p = &k.profile;
            // Kernel names are C identifiers: nothing to escape.
            let _ = write!(
                out,
                "{sep}\n    \"{name}\": {{\"launches\": {}, \"instructions\": {}, \
                 \"global_bytes_read\": {}, \"global_bytes_written\": {}, \
                 \"shared_loads\": {}, \"shared_stores\": {}, \"fmas\": {}}}",
                k.launches,
                p.instructions,
                p.global_bytes_read,
                p.global_bytes_written,
                p.shared_loads,
                p.shared_stores,
                p.fmas
            );
        }
        out.push_str("\n  }\n}\n");
        out
    })
}

/// Writes [`to_json`] to `path` (`%p` in it replaced by the process id, so that several
/// processes, e.g. one per test binary, each keep their own file), reporting a failure on
/// stderr (nothing else can be done at process exit).
pub fn write(path: &str, devices: usize, driver_version: u32) {
    let path = path.replace("%p", &std::process::id().to_string());
    if let Err(err) = std::fs::write(&path, to_json(devices, driver_version)) {
        eprintln!("tandem-cuda-emu: writing TANDEM_EMU_STATS file {path}: {err}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream's counters with distinct values, each with its name in the JSON.
    fn distinct(scale: u64) -> (Counts, [(&'static str, u64); 12]) {
        let named = [
            ("kernel_launches", 1),
            ("graph_launches", 2),
            ("graph_kernels", 3),
            ("bytes_htod", 4),
            ("bytes_dtoh", 5),
            ("bytes_dtod", 6),
            ("bytes_peer", 7),
            ("stream_synchronizations", 8),
            ("bytes_memset", 9),
            ("graph_copies", 10),
            ("graph_memsets", 11),
            ("stream_calls", 12),
        ]
        .map(|(name, value)| (name, value * scale));
        let [a, b, c, d, e, f, g, h, i, j, k, l] = named.map(|(_, value)| value);
        let counts = Counts {
            kernel_launches: a,
            graph_launches: b,
            graph_kernels: c,
            bytes_htod: d,
            bytes_dtoh: e,
            bytes_dtod: f,
            bytes_peer: g,
            stream_synchronizations: h,
            bytes_memset: i,
            graph_copies: j,
            graph_memsets: k,
            stream_calls: l,
        };
        (counts, named)
    }

    /// Every counter is written under its own name, and a sum adds each to its own.
    #[test]
    fn each_counter_is_written_and_summed_under_its_name() {
        let (mut counts, named) = distinct(1);
        let written = |counts: &Counts| {
            let mut out = String::from("{");
            counts.json(&mut out);
            out.push('}');
            serde_json::from_str::<serde_json::Value>(&out).expect("valid JSON")
        };
        let json = written(&counts);
        for (name, value) in named {
            assert_eq!(json[name], value, "{name}");
        }
        counts.add(&distinct(100).0);
        let json = written(&counts);
        for (name, value) in named {
            assert_eq!(json[name], value * 101, "{name}");
        }
    }
}
