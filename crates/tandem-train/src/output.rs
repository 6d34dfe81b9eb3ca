//! Output that never panics. `println!` panics when stdout is closed (`mnist-train | head`),
//! and a panic in a worker thread's progress line would fail the worker and lose the run.
//! Here a failed write marks stdout as closed instead: a training run then stops as after a
//! Ctrl-C (checkpoint written), and the process ends with the status a broken pipe gives.

use std::fmt::Display;
use std::io::{ErrorKind, Write};
use std::sync::atomic::{AtomicU8, Ordering};

const OPEN: u8 = 0;
const BROKEN_PIPE: u8 = 1;
const FAILED: u8 = 2;

static STDOUT: AtomicU8 = AtomicU8::new(OPEN);

/// The exit status of a process killed by SIGPIPE (128 + 13), as shells report it.
pub const BROKEN_PIPE_STATUS: i32 = 141;

/// Writes one line to stdout; once a write has failed, nothing more is written.
pub fn line(text: impl Display) {
    if STDOUT.load(Ordering::Relaxed) != OPEN {
        return;
    }
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{text}").and_then(|()| out.flush()) {
        let state = if e.kind() == ErrorKind::BrokenPipe {
            BROKEN_PIPE
        } else {
            warn(format!("cannot write to stdout: {e}"));
            FAILED
        };
        STDOUT.store(state, Ordering::Relaxed);
    }
}

/// Writes one line to stderr, ignoring failure: there is nowhere left to report it.
pub fn warn(text: impl Display) {
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

/// Whether stdout has stopped taking output.
pub fn closed() -> bool {
    STDOUT.load(Ordering::Relaxed) != OPEN
}

/// The status the process should end with because stdout failed, if it did: a broken pipe
/// ends quietly as SIGPIPE would, another failure (a full disk behind a redirect) as an error.
pub fn failure_status() -> Option<i32> {
    match STDOUT.load(Ordering::Relaxed) {
        BROKEN_PIPE => Some(BROKEN_PIPE_STATUS),
        FAILED => Some(1),
        _ => None,
    }
}

/// `println!` through [`output::line`](crate::output::line): never panics on a closed stdout.
#[macro_export]
macro_rules! out {
    () => {
        $crate::output::line("")
    };
    ($($arg:tt)*) => {
        $crate::output::line(format_args!($($arg)*))
    };
}
